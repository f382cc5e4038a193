"""Fit a cluster's effective inter-node bandwidth to training steps measured on it
(``hfcompress plan --calibrate FILE``), under the planner's own byte model.

Stated link rates mislead (SDP4Bit's H800 cluster behaved like 0.13-0.16 of its 3.2 Tbit/s per
node, its A100 cluster like 1.1-1.7x of 100 Gbit/s; docs/DESIGN "Cost at cluster scale"); one
bandwidth fitted to a few measured runs of one cluster predicts the next run there.

A run is a JSON object with ``hidden``, ``layers``, ``seq_len``, ``micro_batch``, ``nodes``,
``gpus_per_node``, ``tp``, ``pp``, ``preset`` and ``step_s`` (measured seconds per step), and
optionally ``ffn``, ``vocab``, ``heads``, ``kv_heads``, ``experts``, ``cp``, ``grad_accum``.
Its compute time comes from the ``none`` run of the same model, sequence, batch and layout
(``compute_from_baseline`` at the candidate bandwidth: that run's step minus its exposed
communication), else from ``gpu_tflops`` (:meth:`ModelShape.compute_seconds`). The fit
minimizes the sum of squared log errors of predicted vs measured step seconds over
0.1 .. 100000 Gbit/s: a log-spaced grid, then golden-section search around its best point
(robust to the plateaus full overlap makes; no scipy).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from ..config import get_config
from .cluster import ClusterLayout
from .links import ClusterLinks
from .model_shape import ModelShape
from .step_model import compute_from_baseline, price_step

REQUIRED = ("hidden", "layers", "seq_len", "micro_batch", "nodes", "gpus_per_node", "tp", "pp",
            "preset", "step_s")
OPTIONAL_SHAPE = ("ffn", "vocab", "heads", "kv_heads", "experts")
LOW_GBPS, HIGH_GBPS = 0.1, 100000.0


class CalibrationError(ValueError):
    """Runs that cannot be fitted (the message names the run and what to fix)."""


@dataclass(frozen=True)
class MeasuredRun:
    """One measured training step: the model, the layout, the tokens and the preset."""

    index: int
    shape: ModelShape
    layout: ClusterLayout
    seq_len: int
    micro_batch: int
    grad_accum: int
    preset: str
    step_s: float

    @property
    def setting(self) -> tuple:
        """What a ``none`` run must share to be this run's baseline."""
        return (self.shape, self.layout, self.seq_len, self.micro_batch, self.grad_accum)


def load_runs(path: str) -> list[MeasuredRun]:
    """The runs of a JSON file (a list of objects, module doc); CalibrationError otherwise."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CalibrationError(f"cannot read the calibration runs {path!r}: {e}") from e
    return parse_runs(data, source=path)


def parse_runs(data: Any, source: str = "runs") -> list[MeasuredRun]:
    """Validated :class:`MeasuredRun` s of a list of run dicts (module doc)."""
    if not isinstance(data, list) or not data:
        raise CalibrationError(f"{source}: expected a non-empty JSON list of runs, each an "
                               f"object with {', '.join(REQUIRED)}")
    runs = []
    for i, run in enumerate(data):
        if not isinstance(run, dict):
            raise CalibrationError(f"{source}: run {i} is {type(run).__name__}, not an object")
        missing = [k for k in REQUIRED if k not in run]
        if missing:
            raise CalibrationError(f"{source}: run {i} has no {', '.join(map(repr, missing))} "
                                   f"(every run needs {', '.join(REQUIRED)})")
        try:
            shape = ModelShape(hidden=run["hidden"], layers=run["layers"],
                               **{k: run[k] for k in OPTIONAL_SHAPE if k in run})
            layout = ClusterLayout(nodes=run["nodes"], gpus_per_node=run["gpus_per_node"],
                                   tp=run["tp"], pp=run["pp"], cp=run.get("cp", 1))
            get_config(run["preset"])
            step_s = float(run["step_s"])
            if not step_s > 0:
                raise ValueError(f"step_s={run['step_s']!r} must be > 0 seconds")
            runs.append(MeasuredRun(i, shape, layout, int(run["seq_len"]),
                                    int(run["micro_batch"]), int(run.get("grad_accum", 1)),
                                    run["preset"], step_s))
        except (TypeError, ValueError) as e:
            raise CalibrationError(f"{source}: run {i}: {e}") from e
    return runs


Predict = Callable[[MeasuredRun, float], float]


def step_predictor(runs: list[MeasuredRun], *, intra_node_gbps: float, engine: str = "fsdp2",
                   gpu_tflops: float | None = None) -> Predict:
    """``predict(run, inter_node_gbps)``: the planner's step seconds for ``run`` at that
    bandwidth, its compute from its ``none`` baseline (median of them) or ``gpu_tflops``."""
    baselines: dict[tuple, list[float]] = {}
    for r in runs:
        if r.preset == "none":
            baselines.setdefault(r.setting, []).append(r.step_s)
    for r in runs:
        if r.setting not in baselines and gpu_tflops is None:
            raise CalibrationError(f"run {r.index} ({r.preset}) has no 'none' run of the same "
                                   f"model, seq_len, micro_batch and layout to take its compute "
                                   f"time from: add that run or give --gpu-tflops")

    computes: dict[tuple, float] = {}      # (setting, Gbit/s) -> baseline compute

    def compute(run: MeasuredRun, links: ClusterLinks) -> float:
        if run.setting not in baselines:
            return run.shape.compute_seconds(run.layout, run.micro_batch, run.seq_len,
                                             gpu_tflops)
        key = (run.setting, links.inter_node_gbps)
        if key not in computes:
            exact = get_config("none")
            computes[key] = compute_from_baseline(
                statistics.median(baselines[run.setting]) / run.grad_accum,
                run.shape.units(run.layout, exact.exact_patterns, exact.min_numel),
                run.layout, links, engine=engine)
        return computes[key]

    def predict(run: MeasuredRun, inter_node_gbps: float) -> float:
        links = ClusterLinks(inter_node_gbps=inter_node_gbps, intra_node_gbps=intra_node_gbps)
        config = get_config(run.preset)
        units = run.shape.units(run.layout, config.exact_patterns, config.min_numel)
        cost = price_step(config, units, run.layout, links, compute_s=compute(run, links),
                          engine=engine)
        return cost.step_s * run.grad_accum

    return predict


def fit_inter_node_gbps(runs: list[dict] | list[MeasuredRun], *, intra_node_gbps: float,
                        engine: str = "fsdp2", gpu_tflops: float | None = None,
                        predict: Predict | None = None) -> float:
    """The effective inter-node Gbit/s per node minimizing the squared log error of the
    predicted vs measured step seconds of ``runs`` (module doc). ``predict`` replaces the
    planner's prediction (tests)."""
    if not runs or not all(isinstance(r, MeasuredRun) for r in runs):
        runs = parse_runs(runs)
    if all(r.preset == "none" for r in runs):
        raise CalibrationError("only 'none' runs: each is its own compute baseline, so its "
                               "predicted step is the measured one at any bandwidth. Add a run "
                               "of a compressed preset (same model, batch and layout as a "
                               "'none' run, or any with --gpu-tflops)")
    predict = predict or step_predictor(runs, intra_node_gbps=intra_node_gbps, engine=engine,
                                        gpu_tflops=gpu_tflops)

    def loss(log_gbps: float) -> float:
        gbps = math.exp(log_gbps)
        return sum(math.log(max(predict(r, gbps), 1e-12) / r.step_s) ** 2 for r in runs)

    return math.exp(minimize_1d(loss, math.log(LOW_GBPS), math.log(HIGH_GBPS)))


def minimize_1d(f: Callable[[float], float], low: float, high: float, grid: int = 41,
                tol: float = 1e-5) -> float:
    """The argmin of ``f`` on [low, high]: the best of a ``grid``-point scan (the lowest on
    a plateau), refined by golden-section search between its neighbours."""
    xs = [low + (high - low) * i / (grid - 1) for i in range(grid)]
    values = [f(x) for x in xs]
    best = min(range(grid), key=values.__getitem__)
    a, b = xs[max(best - 1, 0)], xs[min(best + 1, grid - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    x = (a + b) / 2
    return x if f(x) <= values[best] else xs[best]
