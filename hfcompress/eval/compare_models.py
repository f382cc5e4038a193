"""Score tables: one model, or several against a baseline (like LoCo Table 2), with standard
errors; saved as JSON or CSV.

The standard error of a difference is ``sqrt(se_a^2 + se_b^2)``, i.e. treating the two runs
as independent samples. Both models see the same items, so the paired error is usually
smaller: the stated one is conservative.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any

from .harness import check_checkpoint, evaluate, model_label
from .errors import EvalError
from .task_registry import CHANCE, check_names, task_names


def score_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (task, metric, filter) of an ``evaluate`` result."""
    rows = []
    for task, metrics in result["results"].items():  # tasks, then group aggregates
        for key, value in metrics.items():
            if ("," not in key or "_stderr," in key or isinstance(value, bool)
                    or not isinstance(value, (int, float))):
                continue
            metric, filt = key.split(",", 1)
            rows.append({"task": task, "metric": metric, "filter": filt, "value": value,
                         "stderr": metrics.get(f"{metric}_stderr,{filt}", math.nan),
                         "n": metrics.get("sample_len")})
    return rows


def comparison_rows(results: list[dict[str, Any]], baseline: int = 0) -> list[dict[str, Any]]:
    """Rows of every model's scores with ``delta`` (and its stderr) to ``results[baseline]``."""
    base = {(r["task"], r["metric"], r["filter"]): r for r in score_rows(results[baseline])}
    rows = []
    for res in results:
        for r in score_rows(res):
            b = base.get((r["task"], r["metric"], r["filter"]))
            delta = r["value"] - b["value"] if b else math.nan
            dse = math.hypot(r["stderr"], b["stderr"]) if b else math.nan
            rows.append({"model": res["model"], **r, "baseline": results[baseline]["model"],
                         "delta": delta, "delta_stderr": dse})
    return rows


def _pm(v: float, se: float, sign: bool = False) -> str:
    s = f"{v:+.4f}" if sign else f"{v:.4f}"
    return s if math.isnan(se) else f"{s} ± {se:.4f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Text table: a column per model (score ± stderr), then delta ± stderr per non-baseline."""
    models = list(dict.fromkeys(r.get("model", "score") for r in rows))
    base = rows[0].get("baseline") if rows else None
    keys = list(dict.fromkeys((r["task"], r["metric"], r["filter"]) for r in rows))
    cell = {(r.get("model", "score"), r["task"], r["metric"], r["filter"]): r for r in rows}
    others = [m for m in models if base is not None and m != base]
    head = ["task", "metric"] + models + [f"Δ {m}" for m in others]
    body = []
    for k in keys:
        metric = k[1] if k[2] == "none" else f"{k[1]} ({k[2]})"
        line = [k[0], metric]
        line += [_pm(c["value"], c["stderr"]) if (c := cell.get((m, *k))) else "-"
                 for m in models]
        line += [_pm(c["delta"], c["delta_stderr"], sign=True) if (c := cell.get((m, *k)))
                 else "-" for m in others]
        body.append(line)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = lambda line: "  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(x) for x in body])


def chance_level(task: str) -> float | None:
    """The score of guessing on ``task``'s main metric: 0.25 for the four-choice MMLU tasks
    (hub, offline and arithmetic), 0 for GSM8K exact match, None if unknown."""
    if task in CHANCE:
        return CHANCE[task]
    if task.startswith(("mmlu", "arith_mmlu")):
        return 0.25
    if task.startswith(("gsm8k", "arith_gsm8k")):
        return 0.0
    return None


def chance_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per model and task whose accuracy / exact match is within two standard
    errors (at least 0.01) of guessing: such scores cannot tell compressors apart."""
    notes = []
    for r in rows:
        c = chance_level(r["task"])
        if c is None or not r["metric"].startswith(("acc", "exact_match")):
            continue
        se = 0.0 if math.isnan(r["stderr"]) else r["stderr"]
        if abs(r["value"] - c) <= max(2 * se, 0.01):
            notes.append(f"note: {r.get('model', 'score')} scores {r['value']:.4f} on "
                         f"{r['task']} ({r['metric']}), chance level {c:g}: the model is "
                         f"too small or too little trained for this task to show a "
                         f"difference")
    return notes


def check_output(path: str) -> None:
    if not path.endswith((".json", ".csv")):
        raise EvalError(f"cannot save to {path!r}: use a .json or .csv file name")


def save(rows: list[dict[str, Any]], path: str) -> None:
    """Write rows as ``.json`` (a list of objects) or ``.csv`` (by the file's suffix)."""
    check_output(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".json"):
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
    else:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)


def compare_models(models: list, tasks: list[str] | str, *, names: list[str] | None = None,
                   baseline: int = 0, **eval_kwargs) -> tuple[list[dict], list[dict]]:
    """Evaluate each model (checkpoint path, hub id or in-memory model) on the same tasks.

    Returns ``(results, rows)``: the ``evaluate`` dicts and ``comparison_rows``.
    """
    if len(models) < 1 or not 0 <= baseline < len(models):
        raise EvalError(f"need at least one model and 0 <= baseline < {len(models)}")
    if names is not None and len(names) != len(models):
        raise EvalError(f"{len(names)} names for {len(models)} models")
    labels = [model_label(m, names[i] if names else None) for i, m in enumerate(models)]
    if len(set(labels)) != len(labels):
        raise EvalError(f"model labels must differ, got {labels}: pass names=")
    for m in models:  # fail before the first (long) evaluation, not after it
        if isinstance(m, str):
            check_checkpoint(m, need_tokenizer=eval_kwargs.get("tokenizer") is None)
    check_names(task_names(tasks), eval_kwargs.get("include_path"))
    results = [evaluate(m, tasks, name=label, **eval_kwargs) for m, label in zip(models, labels)]
    return results, comparison_rows(results, baseline)
