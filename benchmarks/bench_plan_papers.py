"""The planner against the papers' own clusters: predicted vs measured end-to-end speedup of
every published compressed run (ZeRO++ Table 1, LoCo Table 11, SDP4Bit Tables 2 and 4; the
transcriptions, with the paper line of every number and every assumption, are in
``benchmarks/data/plan_papers/``).

    python benchmarks/bench_plan_papers.py                    # all papers (< 1 min)
    python benchmarks/bench_plan_papers.py --papers sdp4bit   # one paper

A row is one compressed run and the baseline run of the same model, batch and layout. Each
transcribed row becomes a run of ``hfcompress plan --calibrate`` (``cost/calibrate.py``: the
model, layout, ``grad_accum``, the baseline's collective dtypes as ``weight_bytes`` /
``grad_bytes``, and ``step_s``, the measured seconds per step from the paper's number: TFLOPs
per GPU through ``ModelShape.train_flops``, or the cluster's tokens/s through the tokens of one
step). The planner prices it as ``hfcompress plan`` does (``calibrate.StepPredictor``: compute
from the baseline's step minus the baseline's exposed communication, communication per the
engine, ``step_model.Engine``), at the effective inter-node bandwidth that
``calibrate.fit_inter_node`` fits LEAVE-ONE-OUT: on the runs of the other rows
of the same cluster and layout (and their baselines), or, for a row alone in its layout, on the
same cluster's layouts with as many DP ranks per node (x) and DP groups per node (k), else all
its other layouts (``fit_scope`` says which; ``n/a`` where the cluster has no other row). The
error is the predicted speedup over the measured one, minus 1. The fitted bandwidth of each
cluster and layout (on all its rows) is printed next to the paper's stated figure. A fit
that the runs do not determine (``calibrate.Fit.problem``: on a search bound, or flat) is
marked and its row not counted as within the target. The ``zero3`` rows (DeepSpeed ZeRO-3,
nothing hidden) are also priced with FSDP2's overlap (``*_overlapped``: the
``fsdp2_each_batch`` engine), the mapping they were priced with before.

Engines (the CSV's ``engine``): ZeRO-3 re-gathers each layer's weights in backward; Megatron-LM's
distributed optimizer gathers them once per step and reduces the gradients once per step, after
the last of its ``accum`` micro-batches (LoCo's rows: accumulation 4 / 2 / 1).

Writes ``plan_papers.csv`` (per row), ``plan_papers_fits.csv`` (per cluster and layout),
``plan_papers.md`` (the table for BENCHMARKS.md) and ``plan_papers_meta.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hfcompress.config import CompressionConfig, get_config  # noqa: E402
from hfcompress.cost.calibrate import (Fit, MeasuredRun, StepPredictor,  # noqa: E402
                                       fit_inter_node, parse_runs)
from hfcompress.cost.cluster import ClusterLayout  # noqa: E402
from hfcompress.cost.model_shape import ModelShape  # noqa: E402
from hfcompress.cost.step_model import DTYPE_BYTES, ENGINE_SPECS, Engine  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "plan_papers"
OUT = ROOT / "benchmarks" / "results" / "plan_papers"
PAPERS = ("zeropp", "loco", "sdp4bit")
TARGET = 0.25          # issue 31: every row within 25%
#: ZeRO-3 as if it overlapped as FSDP2 does (the ``*_overlapped`` columns)
OVERLAPPED = ENGINE_SPECS["fsdp2_each_batch"]
FIELDS = ["row_id", "paper", "table", "line", "cluster", "layout", "model", "seq_len",
          "global_batch", "accum", "preset", "engine", "measured_speedup", "predicted_speedup",
          "error", "within_target", "fit_scope", "fit_rows", "fitted_gbps",
          "stated_gbps", "predicted_at_stated", "error_at_stated", "baseline_step_s",
          "compute_s", "predicted_step_s", "exposed_s", "codec_s", "fit_problem",
          "predicted_overlapped", "error_overlapped", "fitted_gbps_overlapped"]
FIT_FIELDS = ["paper", "cluster", "layout", "engine", "rows", "stated_gbps", "fitted_gbps",
              "fitted_over_stated", "in_sample_error_min", "in_sample_error_max",
              "fit_problem", "fitted_gbps_overlapped"]


def load_rows(paper: str) -> list[dict]:
    """The rows of ``data/plan_papers/<paper>.csv`` (strings, as written)."""
    with open(DATA / f"{paper}.csv", newline="") as f:
        return list(csv.DictReader(f))


def config_of(preset: str) -> CompressionConfig:
    """Our configuration of a paper's method: a preset, or hpZ alone (ZeRO++ Table 4)."""
    if preset == "hpz":
        return CompressionConfig(name="hpz", hpz=True)
    return get_config(preset)


def shape_of(row: dict) -> ModelShape:
    """The row's model as the planner's LLaMA-style shape. A GPT MLP (``mlp=gelu``: two
    hidden x ffn matrices) becomes the gated MLP of the same parameter count: width 2/3 ffn
    (rounded to 128); GPT's biases and LayerNorm betas (< 0.1% of the values) are left out."""
    ffn = int(row["ffn"])
    if row["mlp"] == "gelu":
        ffn = 128 * round(2 * ffn / 3 / 128)
    return ModelShape(hidden=int(row["hidden"]), layers=int(row["layers"]), ffn=ffn,
                      vocab=int(row["vocab"]), heads=int(row["heads"]),
                      kv_heads=int(row["kv_heads"]) if row["kv_heads"] else None,
                      name=row["model"])


def layout_of(row: dict) -> ClusterLayout:
    return ClusterLayout(nodes=int(row["nodes"]), gpus_per_node=int(row["gpus_per_node"]),
                         tp=int(row["tp"]), pp=int(row["pp"]))


def step_seconds(row: dict, shape: ModelShape) -> float:
    """Seconds per optimizer step of a row: from TFLOPs per GPU (the step's training FLOPs
    over all GPUs; the papers' FLOP formulas are not given: any constant factor scales every
    step of a cluster alike and goes into the fitted bandwidth) or the cluster's tokens/s."""
    tokens = int(row["global_batch"]) * int(row["seq_len"])
    value = float(row["value"])
    if row["unit"] == "TFLOPs":
        gpus = int(row["nodes"]) * int(row["gpus_per_node"])
        return shape.train_flops(tokens, int(row["seq_len"])) / gpus / (value * 1e12)
    if row["unit"] == "tokens/s":
        return tokens / value
    raise ValueError(f"row {row['row_id']}: unit {row['unit']!r} is neither TFLOPs nor tokens/s")


def run_of(row: dict) -> dict:
    """The row as a run of ``hfcompress plan --calibrate`` (``cost/calibrate.py``'s keys; the
    preset may be a CompressionConfig: hpZ alone)."""
    shape = shape_of(row)
    run = dict(hidden=shape.hidden, layers=shape.layers, ffn=shape.mlp_width,
               vocab=shape.vocab, heads=shape.n_heads, seq_len=int(row["seq_len"]),
               micro_batch=int(row["micro_batch"]), grad_accum=int(row["accum"]),
               nodes=int(row["nodes"]), gpus_per_node=int(row["gpus_per_node"]),
               tp=int(row["tp"]), pp=int(row["pp"]),
               preset=row["preset"] if row["preset"] != "hpz" else config_of("hpz"),
               step_s=step_seconds(row, shape), weight_bytes=DTYPE_BYTES[row["weight_dtype"]],
               grad_bytes=DTYPE_BYTES[row["grad_dtype"]])
    if row["kv_heads"]:
        run["kv_heads"] = int(row["kv_heads"])
    return run


@dataclass
class Cluster:
    """One paper's cluster priced under one engine: its rows as calibration runs, and one
    :class:`StepPredictor` over all of them (its memo shared by every fit of the cluster)."""

    runs: dict[str, MeasuredRun]       # row_id -> run
    predict: StepPredictor
    intra_node_gbps: float
    engine: Engine


@dataclass
class Case:
    """One compressed run and its baseline: what the planner must predict."""

    row: dict
    base: dict
    cluster: Cluster

    @property
    def run(self) -> MeasuredRun:
        return self.cluster.runs[self.row["row_id"]]

    @property
    def base_run(self) -> MeasuredRun:
        return self.cluster.runs[self.base["row_id"]]

    @property
    def group(self) -> tuple[str, str, str]:
        r = self.row
        return r["paper"], r["cluster"], self.layout_name

    @property
    def layout_name(self) -> str:
        r = self.row
        return f"{r['nodes']}x{r['gpus_per_node']} tp{r['tp']} pp{r['pp']}"

    @property
    def link_sharing(self) -> tuple[int, int]:
        """(x DP ranks per node, k DP groups per node): how the DP collectives use a node's
        link, what a bandwidth fitted on another layout must share to carry over best."""
        return self.run.layout.dp_per_node, self.run.layout.groups_per_node

    @property
    def measured_speedup(self) -> float:
        return self.base_run.step_s / self.run.step_s

    def predicted_speedup(self, gbps: float) -> float:
        return self.cluster.predict(self.base_run, gbps) / self.cluster.predict(self.run, gbps)


def load_cases(papers, overlap: bool = False) -> list[Case]:
    """The benchmarked compressed rows with their baselines, their clusters' runs priced
    under the rows' engine (``overlap=True``: ``zero3`` rows under :data:`OVERLAPPED`)."""
    cases = []
    for paper in papers:
        rows = [r for r in load_rows(paper) if r["benchmark"] == "yes"]
        by_id = {r["row_id"]: r for r in rows}
        clusters = {}
        for name in dict.fromkeys(r["cluster"] for r in rows):
            members = [r for r in rows if r["cluster"] == name]
            (engine, intra), = {(r["engine"], float(r["intra_node_gbps"])) for r in members}
            spec = OVERLAPPED if overlap and engine == "zero3" else ENGINE_SPECS[engine]
            runs = parse_runs([run_of(r) for r in members], source=f"{paper} {name}")
            clusters[name] = Cluster(dict(zip((r["row_id"] for r in members), runs)),
                                     StepPredictor(runs, intra_node_gbps=intra, engine=spec),
                                     intra, spec)
        cases += [Case(r, by_id[r["baseline_row"]], clusters[r["cluster"]]) for r in rows
                  if r["baseline_row"]]
    return cases


def fit_gbps(cases: list[Case]) -> Fit:
    """``calibrate.fit_inter_node`` on the runs of ``cases`` and their baselines (one
    cluster's: its predictor)."""
    runs = list({id(r): r for c in cases for r in (c.base_run, c.run)}.values())
    cluster = cases[0].cluster
    return fit_inter_node(runs, intra_node_gbps=cluster.intra_node_gbps,
                          engine=cluster.engine, predict=cluster.predict)


def leave_one_out(cases: list[Case]) -> list[dict]:
    """Per case: the bandwidth fitted without it (its layout, else its cluster) and the
    predicted speedup at that bandwidth (and at the stated one)."""
    out = []
    for case in cases:
        same_layout = [c for c in cases if c.group == case.group and c is not case]
        same_cluster = [c for c in cases if c.row["paper"] == case.row["paper"]
                        and c.row["cluster"] == case.row["cluster"] and c.group != case.group]
        same_sharing = [c for c in same_cluster if c.link_sharing == case.link_sharing]
        scope, fit_on = (("layout", same_layout) if same_layout else
                         ("cluster, same x and k", same_sharing) if same_sharing else
                         ("cluster, other layouts", same_cluster) if same_cluster else
                         ("n/a", []))
        rec = dict(row_id=case.row["row_id"], paper=case.row["paper"],
                   table=case.row["table"], line=case.row["line"],
                   cluster=case.row["cluster"], layout=case.layout_name,
                   model=case.row["model"], seq_len=case.row["seq_len"],
                   global_batch=case.row["global_batch"], accum=case.row["accum"],
                   preset=case.row["preset"], engine=case.row["engine"],
                   measured_speedup=case.measured_speedup, fit_scope=scope,
                   fit_rows=len(fit_on), baseline_step_s=case.base_run.step_s,
                   stated_gbps=case.row["stated_inter_node_gbps"])
        if fit_on:
            fit = fit_gbps(fit_on)
            gbps = fit.gbps
            run = case.cluster.predict.cost(case.run, gbps)
            pred = case.predicted_speedup(gbps)
            rec.update(fitted_gbps=gbps, predicted_speedup=pred, fit_problem=fit.problem or "",
                       error=pred / case.measured_speedup - 1,
                       within_target=abs(pred / case.measured_speedup - 1) <= TARGET
                       and not fit.problem,
                       compute_s=run.compute_s, predicted_step_s=run.step_s,
                       exposed_s=run.exposed_s, codec_s=run.codec_s)
        if rec["stated_gbps"]:
            at_stated = case.predicted_speedup(float(rec["stated_gbps"]))
            rec.update(predicted_at_stated=at_stated,
                       error_at_stated=at_stated / case.measured_speedup - 1)
        out.append(rec)
    return out


def add_overlapped(results: list[dict], fits: list[dict], papers) -> None:
    """The ``zero3`` rows again with FSDP2's overlap (``*_overlapped`` columns): what the
    measured ZeRO-3 runs would have been had their prefetch and reduce-scatters hidden."""
    cases = [c for c in load_cases(papers, overlap=True) if c.row["engine"] == "zero3"]
    by_id = {r["row_id"]: r for r in leave_one_out(cases)}
    for r in results:
        if r["row_id"] in by_id and "error" in by_id[r["row_id"]]:
            other = by_id[r["row_id"]]
            r.update(predicted_overlapped=other["predicted_speedup"],
                     error_overlapped=other["error"], fitted_gbps_overlapped=other["fitted_gbps"])
    by_group = {(f["paper"], f["cluster"], f["layout"]): f for f in group_fits(cases)}
    for f in fits:
        other = by_group.get((f["paper"], f["cluster"], f["layout"]))
        if other:
            f["fitted_gbps_overlapped"] = other["fitted_gbps"]


def group_fits(cases: list[Case]) -> list[dict]:
    """Per cluster and layout: the bandwidth fitted on all its rows vs the stated one."""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault(c.group, []).append(c)
    out = []
    for (paper, cluster, layout), members in groups.items():
        fit = fit_gbps(members)
        gbps = fit.gbps
        errors = [c.predicted_speedup(gbps) / c.measured_speedup - 1 for c in members]
        stated = members[0].row["stated_inter_node_gbps"]
        out.append(dict(paper=paper, cluster=cluster, layout=layout,
                        engine=members[0].cluster.engine.name, rows=len(members),
                        stated_gbps=stated, fitted_gbps=gbps,
                        fitted_over_stated=gbps / float(stated) if stated else "",
                        in_sample_error_min=min(errors), in_sample_error_max=max(errors),
                        fit_problem=fit.problem or ""))
    return out


def fmt(value, spec: str = ".3g") -> str:
    if value == "" or value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, spec) if isinstance(value, float) else str(value)


def markdown(results: list[dict], fits: list[dict]) -> str:
    lines = ["| paper | table (line) | cluster | layout | model | seq x batch (accum) | preset | "
             "measured | predicted | error | fit on | fitted Gbit/s | error at stated Gbit/s | "
             "error, overlapped as FSDP2 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['paper']} | {r['table']} ({r['line']}) | {r['cluster']} | {r['layout']} | "
            f"{r['model']} | {r['seq_len']} x {r['global_batch']} ({r['accum']}) | "
            f"{r['preset']} | {fmt(r['measured_speedup'], '.2f')}x | "
            f"{fmt(r.get('predicted_speedup'), '.2f')}x | {fmt(r.get('error'), '+.0%')} | "
            f"{r['fit_scope']} ({r['fit_rows']}) | {fmt(r.get('fitted_gbps'), '.0f')} | "
            f"{fmt(r.get('error_at_stated'), '+.0%')} | "
            f"{fmt(r.get('error_overlapped'), '+.0%')} |")
    lines += ["", "| paper | cluster | layout | rows | stated Gbit/s | fitted Gbit/s | "
              "fitted / stated | in-sample error | fitted Gbit/s, overlapped as FSDP2 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for f in fits:
        lines.append(f"| {f['paper']} | {f['cluster']} | {f['layout']} | {f['rows']} | "
                     f"{fmt(f['stated_gbps'])} | {fmt(f['fitted_gbps'], '.0f')} | "
                     f"{fmt(f['fitted_over_stated'], '.2f')} | "
                     f"{fmt(f['in_sample_error_min'], '+.0%')} .. "
                     f"{fmt(f['in_sample_error_max'], '+.0%')} | "
                     f"{fmt(f.get('fitted_gbps_overlapped'), '.0f')} |")
    return "\n".join(lines) + "\n"


def summary(results: list[dict]) -> list[str]:
    out = []
    for paper in dict.fromkeys(r["paper"] for r in results):
        errs = [r["error"] for r in results if r["paper"] == paper and "error" in r]
        na = sum(1 for r in results if r["paper"] == paper and "error" not in r)
        if errs:
            within = sum(1 for r in results if r["paper"] == paper and r.get("within_target"))
            undetermined = sum(1 for r in results if r["paper"] == paper and r.get("fit_problem"))
            out.append(f"{paper}: {len(errs)} rows predicted, error {min(errs):+.0%} .. "
                       f"{max(errs):+.0%} (median |error| "
                       f"{statistics.median(abs(e) for e in errs):.0%}), {within} within "
                       f"{TARGET:.0%} on a determined fit" + (f", {na} n/a" if na else "")
                       + (f", {undetermined} on a fit the runs do not determine"
                          if undetermined else ""))
            flat = [r["error_overlapped"] for r in results
                    if r["paper"] == paper and "error_overlapped" in r]
            if flat:
                out.append(f"{paper} (zero3 rows) overlapped as FSDP2: error "
                           f"{min(flat):+.0%} .. {max(flat):+.0%}, "
                           f"{sum(abs(e) <= TARGET for e in flat)} of {len(flat)} within "
                           f"{TARGET:.0%}")
        elif na:
            out.append(f"{paper}: {na} rows n/a")
    return out


def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                        for k, v in r.items()})


def main(argv: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--papers", default=",".join(PAPERS),
                    help=f"comma-separated, of {', '.join(PAPERS)}")
    ap.add_argument("--out", default=str(OUT), help="results folder (default %(default)s)")
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args(argv)
    papers = [p for p in args.papers.split(",") if p]
    unknown = sorted(set(papers) - set(PAPERS))
    if unknown:
        ap.error(f"unknown paper(s) {', '.join(unknown)}: choose from {', '.join(PAPERS)}")
    start = time.perf_counter()
    cases = load_cases(papers)
    results = leave_one_out(cases)
    fits = group_fits(cases)
    add_overlapped(results, fits, papers)
    print(markdown(results, fits))
    for line in summary(results):
        print(line)
    print(f"({len(results)} rows in {time.perf_counter() - start:.1f} s)")
    if not args.no_save:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / "plan_papers.csv", FIELDS, results)
        write_csv(out / "plan_papers_fits.csv", FIT_FIELDS, fits)
        (out / "plan_papers.md").write_text(markdown(results, fits))
        write_csv(out / "plan_papers_meta.csv", ["key", "value"], [
            dict(key="command", value=" ".join(["python benchmarks/bench_plan_papers.py",
                                                *(argv if argv is not None else sys.argv[1:])])),
            dict(key="papers", value=",".join(papers)),
            dict(key="data", value="benchmarks/data/plan_papers/*.csv"),
            dict(key="fit", value="calibrate.fit_inter_node leave-one-out per cluster "
                 "and layout (else the cluster's layouts with the same x and k, else its other "
                 "layouts) on the rows' runs and their baselines: squared log error of "
                 "predicted steps"),
            dict(key="date", value=time.strftime("%Y-%m-%d %H:%M"))])
    return results, fits


if __name__ == "__main__":
    main()
