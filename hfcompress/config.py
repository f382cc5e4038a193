"""``CompressionConfig`` and the named presets users type (docs/architecture.md, "Presets").

A preset is only a named configuration: any weight scheme composes with any gradient scheme
and with LoCo error feedback. Every configuration value is immutable (frozen dataclasses,
read-only parameter mappings), so a preset can be shared without being changed behind
anyone's back. Edit a copy with :func:`dataclasses.replace`::

    cfg = dataclasses.replace(get_config("loco"), loco=LoCoSettings(beta=0.5), seed=1)
    cfg = dataclasses.replace(cfg, grad_inter=Scheme("int", {"bits": 8, "group_size": 128}))

``"auto"`` is not a configuration but a request (:class:`AutoSettings`): :func:`resolve` tells
the two apart, ``hfcompress.apply`` turns the request into a configuration after probing.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Sequence

from .compressors import Compressor, get_compressor
from .compressors.registry import NOT_COMPRESSORS


def _frozen(mapping: Mapping[str, Any] | None, what: str) -> Mapping[str, Any]:
    if mapping is None:
        return MappingProxyType({})
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{what} must be a mapping (e.g. {{'bits': 4}}), got {mapping!r}")
    return MappingProxyType(dict(mapping))


def _hash_items(mapping: Mapping[str, Any]) -> int:
    return hash(tuple(sorted((k, repr(v)) for k, v in mapping.items())))


@dataclass(frozen=True)
class Scheme:
    """A registered compressor name and its parameters (a read-only mapping; builds fresh
    instances). ``to_dict()`` / ``from_dict()`` for logs and checkpoints."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Scheme name must be a registered compressor name, got {self.name!r}")
        object.__setattr__(self, "params", _frozen(self.params, f"Scheme({self.name!r}) params"))

    def __hash__(self) -> int:
        return hash((self.name, _hash_items(self.params)))

    def __reduce__(self):     # a mappingproxy does not pickle: rebuild from a dict
        return (Scheme, (self.name, dict(self.params)))

    def build(self) -> Compressor:
        return get_compressor(self.name, **self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Scheme | None:
        return None if d is None else cls(d["name"], d.get("params") or {})


def describe(scheme: Scheme | None) -> str:
    """``"hadamard 4-bit"``, ``"exact (uncompressed)"``, ... for messages."""
    if scheme is None:
        return "exact (uncompressed)"
    bits = scheme.params.get("bits")
    return f"{scheme.name} {bits}-bit" if bits is not None else scheme.name


@dataclass(frozen=True)
class LoCoSettings:
    """LoCo error feedback (LoCo Alg. 1) around the gradient schemes of the hops that run
    (:meth:`CompressionConfig.loco_hops`): the moving-average weight ``beta`` of the new
    error (Eq. (5); 1 = plain error feedback, Eq. (4)), the reset period ``reset_every`` T_c
    in optimizer steps (Eq. (7); None: never) and the 8-bit error's scale (``"group"``:
    absmax per 128 values, a fixed float s_e, or None: a float32 error). The defaults are
    the authors' (DeepSpeed ``err_beta=0.8``, i.e. beta = 0.2; T_c = 512 as in LoCo 3.2);
    BENCHMARKS.md, "LoCo ablation", measures them at small scale against plain feedback and
    no feedback: beta 0.5 did no better there, so they stay. Feedback pays where the quantizer
    loses: int4 groups of 2048 lose 1.0-1.7% of the loss alone and LoCo recovers 71-73% of
    that (8 of 8 seeds); the ``loco`` preset's int4 groups of 128 lose 0.15% or less, and
    feedback there does not help (-0.11% to +0.32% against the quantizer alone)."""

    beta: float = 0.2
    reset_every: int | None = 512
    error_scale: str | float | None = "group"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def wrap(self, inner: Compressor) -> Compressor:
        """``inner`` with this error feedback (the one place a LoCo compressor is built)."""
        return get_compressor("loco", inner=inner, **self.to_dict())


AUTO = "auto"


@dataclass(frozen=True)
class AutoSettings:
    """Settings of ``comm_compressor="auto"`` (``hfcompress/auto``): choose each collective's
    scheme from a start-up probe of the links and this device, among the loss-keeping ones.
    A request beside :class:`CompressionConfig`, not a configuration: ``apply`` resolves it.

    - ``pins``: collective kind -> option that is not chosen but fixed (e.g.
      ``{"weights": "qwd"}``; ``HFCOMPRESS_AUTO="weights=qwd,grad_inter=hs4"`` overrides);
    - ``reprobe_every``: probe and choose again every N optimizer steps (0 = never),
      switching only at a step boundary (under DDP the re-probe also learns the compute the
      buckets hide behind);
    - ``overlap``: share of the wire time hidden behind compute (0: none, as measured on
      CPU / gloo); ``margin``: how much faster (relative) a plan compressing more collective
      kinds must be predicted to be; ``reps``: timed repetitions per probe measurement.
    """

    name: ClassVar[str] = AUTO

    pins: Mapping[str, str] = field(default_factory=dict)
    reprobe_every: int = 0
    overlap: float = 0.0
    margin: float = 0.05
    reps: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "pins", _frozen(self.pins, "AutoSettings pins"))
        if isinstance(self.reprobe_every, bool) or not isinstance(self.reprobe_every, int) \
                or self.reprobe_every < 0:
            raise ValueError(f"reprobe_every={self.reprobe_every!r} must be an int >= 0")
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f"overlap={self.overlap!r} must be in [0, 1)")
        if self.margin < 0 or self.reps < 1:
            raise ValueError(f"margin={self.margin!r} must be >= 0 and reps={self.reps!r} >= 1")

    def __hash__(self) -> int:
        return hash((_hash_items(self.pins), self.reprobe_every, self.overlap, self.margin,
                     self.reps))

    def __reduce__(self):
        return (AutoSettings, (dict(self.pins), self.reprobe_every, self.overlap, self.margin,
                               self.reps))

    def to_dict(self) -> dict[str, Any]:
        return {"pins": dict(self.pins), "reprobe_every": self.reprobe_every,
                "overlap": self.overlap, "margin": self.margin, "reps": self.reps}


#: the collective roles, each a :class:`CompressionConfig` field holding its Scheme: the
#: FSDP2 weight all-gather, the reduce-scatter's intra- and inter-node hops (a 1-hop one runs
#: ``grad_inter``), and the DDP / HSDP replica all-reduce
GRAD_ROLES = ("grad_intra", "grad_inter")
FSDP_ROLES = ("weights",) + GRAD_ROLES
DDP_ROLES = ("all_reduce",)
ROLES = FSDP_ROLES + DDP_ROLES


@dataclass(frozen=True)
class CompressionConfig:
    """What each collective sends (immutable: edit with ``dataclasses.replace``).

    - ``weights``: the all-gather scheme (FSDP forward/backward weights); None = exact.
    - ``grad_intra`` / ``grad_inter``: the reduce-scatter schemes of the intra-node and the
      inter-node all-to-all hop (``two_hop=True``, ZeRO++ B.3 / SDP4Bit 3.2); with
      ``two_hop=False`` only ``grad_inter`` is used, as a 1-hop all-to-all. None = exact.
    - ``loco``: LoCo error feedback (:class:`LoCoSettings`, LoCo Alg. 1) wrapping the
      gradient scheme of each hop that runs (:meth:`loco_hops`); None = no error feedback.
    - ``all_reduce``: the DDP / HSDP replica all-reduce scheme (Global-QSGD; e.g.
      ``Scheme("global_qsgd", {"block_size": 1024})``: one global scale per 1024 values).
    - ``hpz``: the backward all-gather stays inside the node (ZeRO++ 3.3).
    - ``exact_patterns`` / ``min_numel``: parameters whose name contains one of the patterns
      (a sequence of strings), or with fewer than ``min_numel`` values, are communicated
      exactly (QSDP keeps norms, biases and small tensors in full precision).
    - ``seed``: base seed of the stochastic schemes; each rank, module and direction draws
      its own stream from it (a scheme's own ``seed`` parameter replaces it).
    """

    weights: Scheme | None = None
    grad_intra: Scheme | None = None
    grad_inter: Scheme | None = None
    two_hop: bool = False
    loco: LoCoSettings | None = None
    all_reduce: Scheme | None = None
    hpz: bool = False
    exact_patterns: tuple[str, ...] = ("norm", "bias")
    min_numel: int = 0
    seed: int = 0
    name: str = "custom"

    def __post_init__(self) -> None:
        for key in ROLES:
            value = getattr(self, key)
            if value is not None and not isinstance(value, Scheme):
                raise TypeError(f"CompressionConfig.{key} must be a Scheme or None, got "
                                f"{value!r}")
        if isinstance(self.loco, Mapping):      # LoCo settings given as a dict, as before
            object.__setattr__(self, "loco", LoCoSettings(**self.loco))
        elif self.loco is not None and not isinstance(self.loco, LoCoSettings):
            raise TypeError(f"CompressionConfig.loco must be LoCoSettings or None, got "
                            f"{self.loco!r}")
        patterns = self.exact_patterns
        if isinstance(patterns, (str, bytes)):
            raise TypeError(f"exact_patterns={patterns!r} is one string, which would match "
                            f"letter by letter: pass a sequence of name patterns, e.g. "
                            f"exact_patterns=({patterns!r},)")
        patterns = tuple(patterns)
        bad = [p for p in patterns if not isinstance(p, str)]
        if bad:
            raise TypeError(f"exact_patterns must be strings (parameter name substrings), got "
                            f"{bad!r}")
        object.__setattr__(self, "exact_patterns", patterns)
        for key in ("two_hop", "hpz"):
            if not isinstance(getattr(self, key), bool):   # "false" would be truthy
                raise TypeError(f"CompressionConfig.{key} must be True or False, got "
                                f"{getattr(self, key)!r}")
        for key, low in (("min_numel", 0), ("seed", None)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"CompressionConfig.{key} must be an int, got {value!r}")
            if low is not None and value < low:
                raise ValueError(f"CompressionConfig.{key} must be >= {low}, got {value}")
            object.__setattr__(self, key, int(value))
        if not isinstance(self.name, str):
            raise TypeError(f"CompressionConfig.name must be a string, got {self.name!r}")

    @property
    def compresses_fsdp(self) -> bool:
        """Whether anything FSDP2 sends (all-gather, reduce-scatter) is compressed."""
        return bool(self.weights or self.grad_intra or self.grad_inter or self.loco)

    @property
    def all_reduce_scheme(self) -> Scheme | None:
        """The scheme an all-reduce (DDP, the HSDP replicas) runs: ``all_reduce``, else the
        gradient scheme ``grad_inter``; None = exact."""
        return self.all_reduce or self.grad_inter

    def ddp_config(self) -> CompressionConfig:
        """What this config runs under DDP (``integrations/ddp.py``): its ``all_reduce``
        scheme, else its gradient scheme ``grad_inter``, LoCo kept; weight schemes, hpZ and
        the 2-hop layout dropped. ValueError if it compresses nothing DDP sends."""
        scheme = self.all_reduce_scheme
        if scheme is None and (self.weights is not None or self.grad_intra is not None
                               or self.loco is not None):
            raise ValueError(f"comm_compressor {self.name!r} compresses only FSDP's collectives "
                             f"(weights: {describe(self.weights)}); DDP sends only gradients "
                             f"through its all-reduce. Run with FSDP2 (fsdp=True, fsdp_config="
                             f"{{'version': 2}}, or an accelerate FSDP config), or pick a "
                             f"gradient preset such as 'loco' or 'global_qsgd'")
        return dataclasses.replace(self, weights=None, grad_intra=None, grad_inter=None,
                                   two_hop=False, hpz=False, all_reduce=scheme)

    def runs_two_hop(self, ranks_per_node: int) -> bool:
        """Whether the reduce-scatter runs as the 2-hop all-to-all at ``ranks_per_node``. A
        2-hop config whose intra-node hop is exact (QSDP 5.1's hierarchical reduce-scatter:
        exact inside the node, compressed across) is the 1-hop all-to-all at one rank per
        node, with its numbers."""
        return self.two_hop and (ranks_per_node > 1 or self.grad_intra is not None)

    def loco_hop(self, ranks_per_node: int) -> str:
        """The gradient scheme LoCo's error feedback wraps: that of the hop that leaves the
        rank first, ``"grad_intra"`` on a 2-hop layout with several ranks per node (the
        intra-node hop runs), else ``"grad_inter"``."""
        return "grad_intra" if self.two_hop and ranks_per_node > 1 else "grad_inter"

    def loco_hops(self, ranks_per_node: int) -> tuple[str, ...]:
        """The gradient schemes LoCo's error feedback wraps, first hop first: that of the hop
        that leaves the rank first (Alg. 1 on the rank's gradient) and, on a 2-hop layout with
        several ranks per node, the inter-node hop's too (the node's partial sums): the
        authors' LoCo-Zero++ (LoCo 5.2; their DeepSpeed ``all_to_all_loco_quant_reduce``)
        keeps an 8-bit error per hop, so neither 4-bit quantization's error accumulates."""
        first = self.loco_hop(ranks_per_node)
        return (first, "grad_inter") if first == "grad_intra" else (first,)

    def with_loco(self, hops: Mapping[str, Compressor | None],
                  ranks_per_node: int) -> dict[str, Compressor | None]:
        """``hops`` (``"grad_intra"`` / ``"grad_inter"`` -> compressor as built, None: exact)
        with LoCo error feedback on each of :meth:`loco_hops` that compresses; ValueError if
        the first one sends exactly (there is nothing to feed the error back into)."""
        hops = dict(hops)
        if self.loco is None:
            return hops
        first, *rest = self.loco_hops(ranks_per_node)
        if hops[first] is None:
            raise ValueError(f"config {self.name!r}: loco error feedback needs a gradient "
                             f"scheme on the {first.removeprefix('grad_')}-node hop")
        for hop in (first, *rest):
            if hops[hop] is not None:
                hops[hop] = self.loco.wrap(hops[hop])
        return hops

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and numbers (logs, checkpoints; :meth:`from_dict` reads it)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to_dict() if isinstance(v, (Scheme, LoCoSettings)) else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompressionConfig:
        """The config of a :meth:`to_dict` (also of checkpoints saved before configs were
        frozen, whose dicts carry ``"auto": None``)."""
        d = upgrade_dict(d)
        if AUTO in d:
            raise ValueError("this dict describes the 'auto' request, not a configuration; "
                             "use AutoSettings(**d['auto'])")
        kw = dict(d)
        for key in ROLES:
            kw[key] = Scheme.from_dict(kw.get(key))
        return cls(**kw)


def is_exact(name: str, numel: int, patterns: Sequence[str], min_numel: int) -> bool:
    """A parameter whose name contains one of ``patterns``, or with fewer than ``min_numel``
    values (its full, unsharded size), is communicated exactly (``exact_patterns`` /
    ``min_numel`` of :class:`CompressionConfig`)."""
    return numel < min_numel or any(p in name for p in patterns)


def upgrade_dict(d: Mapping[str, Any]) -> dict[str, Any]:
    """A saved configuration dict in today's format: before configs were frozen, every dict
    carried an ``"auto"`` field (None; or the ``AutoSettings`` of a ``"auto"`` request,
    whose other fields were the defaults). Checkpoint readers compare through this."""
    d = dict(d)
    if AUTO not in d:
        return d
    auto = d.pop(AUTO)
    return d if auto is None else request_dict(AutoSettings(**auto))


def request_dict(request: CompressionConfig | AutoSettings) -> dict[str, Any]:
    """What was asked for, as plain data: a config's ``to_dict()``, or ``{"name": "auto",
    "auto": settings}`` for the automatic choice (checkpoints compare it on resume)."""
    if isinstance(request, AutoSettings):
        return {"name": AUTO, AUTO: request.to_dict()}
    return request.to_dict()


_INT4_W = Scheme("int", {"bits": 4, "group_size": 2048, "rounding": "nearest"})
_INT8_W = Scheme("int", {"bits": 8, "group_size": 2048, "rounding": "nearest"})
_QWD = Scheme("qwd")
_INT4_G = Scheme("int", {"bits": 4, "group_size": 128, "rounding": "stochastic"})
_INT8_G = Scheme("int", {"bits": 8, "group_size": 128, "rounding": "stochastic"})
_INT4_N = Scheme("int", {"bits": 4, "group_size": 128, "rounding": "nearest"})   # LoCo 3.1
_HS8 = Scheme("hadamard", {"bits": 8, "group_size": 128, "hadamard_size": 32})
_HS4 = Scheme("hadamard", {"bits": 4, "group_size": 128, "hadamard_size": 32})
_LOCO = LoCoSettings(beta=0.2, reset_every=512, error_scale="group")

_PRESETS: dict[str, dict[str, Any]] = {
    "none": {},
    "qw": {"weights": _INT4_W},
    "qwd": {"weights": _QWD},
    "ulq": {"grad_intra": _INT4_G, "grad_inter": _INT4_G, "two_hop": True},
    "tlq": {"grad_intra": _INT8_G, "grad_inter": _INT4_G, "two_hop": True},
    "tlq_hs": {"grad_intra": _HS8, "grad_inter": _HS4, "two_hop": True},
    "sdp4bit": {"weights": _QWD, "grad_intra": _HS8, "grad_inter": _HS4, "two_hop": True},
    "zeropp": {"weights": _INT8_W, "hpz": True, "grad_intra": _INT4_G, "grad_inter": _INT4_G,
               "two_hop": True},
    # QSDP 5.1: hierarchical reduce-scatter (exact inside the node, compressed across)
    "qsdp": {"weights": Scheme("random_shift", {"bits": 8, "bucket_size": 1024}),
             "grad_inter": Scheme("qsgd", {"bits": 8, "bucket_size": 1024}), "two_hop": True,
             "min_numel": 1024},
    "qsdp_learned": {"weights": Scheme("learned", {"bits": 5, "bucket_size": 1024}),
                     "grad_inter": Scheme("learned", {"bits": 4, "bucket_size": 1024}),
                     "two_hop": True, "min_numel": 1024},
    "global_qsgd": {"all_reduce": Scheme("global_qsgd", {"bits": 8})},
    "global_qsgd_exp": {"all_reduce": Scheme("global_qsgd_exp", {"bits": 8})},
    "loco": {"grad_intra": _INT4_N, "grad_inter": _INT4_N, "two_hop": True, "loco": _LOCO},
    "loco_zeropp": {"weights": _INT8_W, "hpz": True, "grad_intra": _INT4_G,
                    "grad_inter": _INT4_G, "two_hop": True, "loco": _LOCO},
}


#: preset name -> the fields of its :class:`CompressionConfig` (read-only)
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {k: MappingProxyType(v) for k, v in _PRESETS.items()})
NOT_COMPRESSORS.update({p: (f"a preset (a configuration of several compressors, one per "
                            f"collective): use hfcompress.apply(model, {p!r}) or "
                            f"hfcompress.TrainingArguments(comm_compressor={p!r}); "
                            f"hfcompress.list_presets() lists the presets") for p in PRESETS})


def list_presets() -> list[str]:
    """The fixed presets ``comm_compressor=`` / ``hfcompress.apply(model, name)`` take
    (``get_config``); ``"auto"`` (:data:`AUTO`) is accepted too and chooses among them."""
    return list(PRESETS)


def get_config(preset: str | CompressionConfig) -> CompressionConfig:
    """The :class:`CompressionConfig` of a preset name (a config passes through). Configs
    are immutable: edit a copy with ``dataclasses.replace(get_config(name), ...)``."""
    if isinstance(preset, CompressionConfig):
        return preset
    if isinstance(preset, AutoSettings) or preset == AUTO:
        raise ValueError("'auto' is not a fixed configuration but a request to choose one "
                         "from a probe: pass it to hfcompress.apply / comm_compressor as is "
                         "(hfcompress.config.resolve tells the two apart)")
    if preset not in PRESETS:
        close = difflib.get_close_matches(str(preset), [*PRESETS, AUTO], n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown comm_compressor preset {preset!r}.{hint} "
                         f"Valid presets: {', '.join(PRESETS)}, or {AUTO!r} (chosen from the "
                         f"measured links)")
    return CompressionConfig(name=preset, **PRESETS[preset])


def resolve(request: str | CompressionConfig | AutoSettings) -> CompressionConfig | AutoSettings:
    """What ``apply`` / the Trainer were asked for, resolved once: a preset name or a config
    gives the :class:`CompressionConfig`; ``"auto"`` or :class:`AutoSettings` the settings of
    the automatic choice. ValueError (listing the presets) for an unknown name."""
    if isinstance(request, AutoSettings):
        return request
    if isinstance(request, str) and request == AUTO:
        return AutoSettings()
    return get_config(request)
