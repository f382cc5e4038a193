"""``hfcompress compare RUN...``: a table of training runs and a plot of their losses.

Each RUN is an output directory of ``trainer_examples/`` (or its ``summary.json``). The
table has one row per run: preset, engine, world size (nodes x ranks per node), steps, the
last logged training loss (``diverged`` for a run that ended with NaN / Inf losses, whatever
Hugging Face's loss filter logged), the evaluation loss (``nan`` when it was NaN), the
inter-node bytes sent, the compression ratio (uncompressed / sent bytes, all links), the
wall time of training, steps per second, and the steady-state communication time per step;
a note for each diverged run. The plot shows the training loss against
the step and against the wall-clock time of training (matplotlib; skipped with a message
when it is not installed).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

SUMMARY = "summary.json"
COLUMNS = ("run", "preset", "engine", "world", "steps", "loss", "eval loss", "inter-node MiB",
           "ratio", "wall s", "steps/s", "comm s/step")


class SummaryError(ValueError):
    """A ``summary.json`` that cannot be read (the message names the file)."""


def load_run(path: str) -> dict[str, Any]:
    """The ``summary.json`` of a run directory (or the file itself), with its ``run`` name."""
    file = path if path.endswith(".json") else os.path.join(path, SUMMARY)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no {SUMMARY} (a trainer_examples run writes it in "
                                f"its --output_dir when training ends)")
    try:
        with open(file) as f:
            summary = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError is a ValueError
        raise SummaryError(f"{file}: not a valid summary ({e}); the run was interrupted "
                           f"while writing it, or the file was edited: re-run it or leave it "
                           f"out") from None
    if not isinstance(summary, dict):
        raise SummaryError(f"{file}: not a valid summary (a JSON {type(summary).__name__}, "
                           f"expected an object); re-run the run or leave it out")
    summary.setdefault("run", os.path.basename(os.path.dirname(os.path.abspath(file))))
    return summary


def _num(value: Any, fmt: str, nan: str = "-") -> str:
    """``value`` formatted; ``-`` when not measured (None), ``nan`` (a loss) when NaN."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return nan
    return format(value, fmt)


def diverged(s: dict[str, Any]) -> bool:
    """The run ended with NaN / Inf losses (``summary.json``'s ``diverged``, or a NaN last
    training loss in a summary written before that key)."""
    last = s.get("train_loss_last")
    return bool(s.get("diverged")) or (isinstance(last, float) and not math.isfinite(last))


def row(s: dict[str, Any]) -> dict[str, str]:
    """One table row of a summary (``-`` for what the run did not measure)."""
    world = s.get("world_size")
    if world is not None and s.get("ranks_per_node"):
        world = f"{world} ({world // s['ranks_per_node']}x{s['ranks_per_node']})"
    inter = s.get("comm_inter_node_bytes")
    preset = str(s.get("comm_compressor") or "-")
    if s.get("comm_auto"):                     # "auto(weights=qwd,grad_inter=hs4)"
        preset = f"auto({s['comm_auto']['chosen'].replace(' ', ',')})"
    return {"run": s["run"], "preset": preset,
            "engine": str(s.get("engine") or "-"), "world": str(world or "-"),
            "steps": _num(s.get("steps"), "d"),
            "loss": "diverged" if diverged(s) else _num(s.get("train_loss_last"), ".4f"),
            "eval loss": _num(s.get("eval_loss"), ".4f", nan="nan"),
            "inter-node MiB": _num(None if inter is None else inter / 2**20, ".1f"),
            "ratio": _num(s.get("comm_ratio"), ".2f"),
            "wall s": _num(s.get("train_runtime_s"), ".1f"),
            "steps/s": _num(s.get("steps_per_second"), ".3f"),
            "comm s/step": _num(s.get("comm_steady_s_per_step"), ".4f")}


def format_table(summaries: list[dict[str, Any]]) -> str:
    rows = [row(s) for s in summaries]
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(width[c]) if c == "run" else c.rjust(width[c]) for c in COLUMNS)]
    lines += ["  ".join(r[c].ljust(width[c]) if c == "run" else r[c].rjust(width[c])
                        for c in COLUMNS) for r in rows]
    return "\n".join(lines)


def notes(summaries: list[dict[str, Any]]) -> list[str]:
    """Runs that diverged (when, and that their losses compare with nothing); compressed
    runs whose collectives took longer than the exact ones of a ``none`` run in the same
    layout (engine, world, ranks per node): compression cost more than it saved on that
    link."""
    out = []
    for s in summaries:
        if diverged(s):
            at = s.get("diverged_at_step")
            out.append(f"note: {s['run']} diverged (NaN / Inf"
                       + (f" from step {at}" if at is not None else "") + "): its losses "
                       "are not comparable; Hugging Face logs such steps' loss as 0.0 "
                       "(logging_nan_inf_filter)")
    layout = ("engine", "world_size", "ranks_per_node")
    for base in (s for s in summaries if s.get("comm_compressor") == "none"):
        t0 = base.get("comm_steady_s_per_step")
        for s in summaries:
            t = s.get("comm_steady_s_per_step")
            if s is base or s.get("comm_compressor") in (None, "none") or t is None \
                    or t0 is None or any(s.get(k) != base.get(k) for k in layout):
                continue
            if t >= t0:
                out.append(f"note: {s['run']} spent {t:.4f} s per step in communication, "
                           f"{base['run']} (exact) {t0:.4f} s: on this link compression costs "
                           f"more time than the bytes it saves")
    return out


def plot(summaries: list[dict[str, Any]], path: str) -> str:
    """Training loss vs step and vs wall-clock time, one line per run; returns a message."""
    try:
        import matplotlib
    except ImportError:
        return ("plot skipped: matplotlib is not installed (pip install matplotlib); the "
                "table above has every number")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for s in summaries:
        history = s.get("train_loss_history") or []
        if not history:
            continue
        label = f"{s['run']} ({s.get('comm_compressor') or '-'})"
        by_step.plot([h["step"] for h in history], [h["loss"] for h in history], ".-",
                     label=label)
        if all("time_s" in h for h in history):
            by_time.plot([h["time_s"] for h in history], [h["loss"] for h in history], ".-",
                         label=label)
    by_step.set(xlabel="step", ylabel="training loss", title="loss vs step")
    by_time.set(xlabel="wall-clock time of training (s)", ylabel="training loss",
                title="loss vs wall-clock")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: {path}"


def default_plot_path(runs: list[str]) -> str:
    """``compare.png`` in the runs' common parent folder (e.g. ``runs/compare.png``)."""
    dirs = [os.path.dirname(os.path.abspath(r)) if r.endswith(".json") else os.path.abspath(r)
            for r in runs]
    parent = os.path.dirname(os.path.commonpath(dirs)) if len(set(dirs)) == 1 \
        else os.path.commonpath(dirs)
    return os.path.relpath(os.path.join(parent, "compare.png"))


def compare(runs: list[str], plot_path: str | None = None, make_plot: bool = True) -> int:
    """Print the table (and notes), save the plot; 2 when a run has no summary."""
    try:
        summaries = [load_run(r) for r in runs]
    except (FileNotFoundError, SummaryError) as e:
        print(f"hfcompress compare: {e}")
        return 2
    print(format_table(summaries))
    for line in notes(summaries):
        print(line)
    if make_plot:
        print(plot(summaries, plot_path or default_plot_path(runs)))
    return 0
