"""Fit a cluster's effective inter-node bandwidth to training steps measured on it
(``hfcompress plan --calibrate FILE``), under the planner's own byte model.

Stated link rates mislead (SDP4Bit's H800 cluster behaved like 0.13-0.14 of its 3.2 Tbit/s per
node, its A100 cluster like 1.1-1.7x of 100 Gbit/s: BENCHMARKS.md, "Planner vs the papers'
clusters"); one bandwidth fitted to a few measured runs of one cluster predicts the next run
there.

A run is a JSON object with ``hidden``, ``layers``, ``seq_len``, ``micro_batch``, ``nodes``,
``gpus_per_node``, ``tp``, ``pp``, ``preset`` and ``step_s`` (measured seconds per optimizer
step), and optionally ``ffn``, ``vocab``, ``heads``, ``kv_heads``, ``experts``, ``cp``,
``grad_accum`` (micro-batches per step, 1), ``weight_bytes`` (bytes per value of the exact
weight all-gather: 2 for bf16 / fp16, 4 for fp32) and ``grad_bytes`` (of the exact gradient
reduction: 4 for fp32, 2 for bf16 / fp16, e.g. DeepSpeed ZeRO-3's fp16 reduce-scatter); a run
without them takes the fit's (``hfcompress plan --gather-dtype`` / ``--reduce-dtype``). Its
compute time comes from the ``none`` run of the same model, sequence, batch, accumulation,
layout and dtypes (``compute_from_baseline`` at the candidate bandwidth: that run's step minus
its exposed communication), else from ``gpu_tflops`` (:meth:`ModelShape.compute_seconds`,
times ``grad_accum``). Communication per step follows the engine (``step_model.Engine``:
under ``fsdp2`` the weights are gathered every micro-batch, the gradients reduced once). The
fit minimizes the sum of squared log errors of predicted vs measured step seconds over
0.1 .. 100000 Gbit/s: a log-spaced grid, then golden-section search around its best point
(robust to the plateaus full overlap makes; no scipy).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from ..config import CompressionConfig, get_config
from .cluster import ClusterLayout
from .links import ClusterLinks
from .model_shape import ModelShape
from .step_model import Engine, StepCost, compute_from_baseline, price_step

REQUIRED = ("hidden", "layers", "seq_len", "micro_batch", "nodes", "gpus_per_node", "tp", "pp",
            "preset", "step_s")
OPTIONAL_SHAPE = ("ffn", "vocab", "heads", "kv_heads", "experts")
VALUE_BYTES = (2, 4)        # weight_bytes / grad_bytes: bf16 / fp16, fp32
LOW_GBPS, HIGH_GBPS = 0.1, 100000.0


class CalibrationError(ValueError):
    """Runs that cannot be fitted (the message names the run and what to fix)."""


@dataclass(frozen=True)
class MeasuredRun:
    """One measured optimizer step: the model, the layout, the tokens, the preset (a name,
    or from Python a :class:`CompressionConfig`) and the exact collectives' bytes per value
    (None: the fit's)."""

    index: int
    shape: ModelShape
    layout: ClusterLayout
    seq_len: int
    micro_batch: int
    grad_accum: int
    preset: str | CompressionConfig
    step_s: float
    weight_bytes: int | None = None
    grad_bytes: int | None = None

    @property
    def setting(self) -> tuple:
        """What a ``none`` run must share to be this run's baseline."""
        return (self.shape, self.layout, self.seq_len, self.micro_batch, self.grad_accum,
                self.weight_bytes, self.grad_bytes)

    @property
    def is_baseline(self) -> bool:
        """A run of the exact ``none`` preset (its name or its configuration)."""
        return get_config(self.preset) == get_config("none")

    @property
    def preset_name(self) -> str:
        return get_config(self.preset).name


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
            grad_accum = int(run.get("grad_accum", 1))
            if grad_accum < 1:
                raise ValueError(f"grad_accum={run['grad_accum']!r} must be >= 1")
            for key in ("weight_bytes", "grad_bytes"):
                if run.get(key) not in (None, *VALUE_BYTES):
                    raise ValueError(f"{key}={run[key]!r}: bytes per value of the exact "
                                     f"collective, 2 (bf16 / fp16) or 4 (fp32)")
            runs.append(MeasuredRun(i, shape, layout, int(run["seq_len"]),
                                    int(run["micro_batch"]), grad_accum, run["preset"], step_s,
                                    run.get("weight_bytes"), run.get("grad_bytes")))
        except (TypeError, ValueError) as e:
            raise CalibrationError(f"{source}: run {i}: {e}") from e
    return runs


Predict = Callable[[MeasuredRun, float], float]


class StepPredictor:
    """``predictor(run, inter_node_gbps)``: the planner's step seconds for ``run`` at that
    bandwidth (``cost(run, gbps)``: its :class:`StepCost`, memoized: a fit's grid points
    recur), its compute from its ``none`` baseline (median of them) or ``gpu_tflops``; the
    runs' missing dtypes are ``weight_bytes`` / ``grad_bytes``."""

    def __init__(self, runs: list[MeasuredRun], *, intra_node_gbps: float,
                 engine: str | Engine = "fsdp2", gpu_tflops: float | None = None,
                 weight_bytes: int = 2, grad_bytes: int = 4, codec_scale: float = 1.0) -> None:
        self.intra_node_gbps, self.engine, self.gpu_tflops = intra_node_gbps, engine, gpu_tflops
        self.codec_scale = codec_scale
        self.weight_bytes, self.grad_bytes = weight_bytes, grad_bytes
        self.baselines: dict[tuple, list[float]] = {}
        for r in runs:
            if r.is_baseline:
                self.baselines.setdefault(r.setting, []).append(r.step_s)
        for r in runs:
            if r.setting not in self.baselines and gpu_tflops is None:
                raise CalibrationError(
                    f"run {r.index} ({r.preset_name}) has no 'none' run of the same model, "
                    f"seq_len, micro_batch, grad_accum, layout and dtypes to take its compute "
                    f"time from: add that run or give --gpu-tflops")
        self._computes: dict[tuple, float] = {}      # (setting, Gbit/s) -> compute
        self._costs: dict[tuple, StepCost] = {}      # (run, Gbit/s) -> StepCost

    def __call__(self, run: MeasuredRun, inter_node_gbps: float) -> float:
        return self.cost(run, inter_node_gbps).step_s

    def _kwargs(self, run: MeasuredRun) -> dict:
        return dict(engine=self.engine, grad_accum=run.grad_accum,
                    weight_bytes=run.weight_bytes or self.weight_bytes,
                    grad_bytes=run.grad_bytes or self.grad_bytes,
                    activation_bytes=run.shape.activation_bytes(run.layout, run.micro_batch,
                                                                run.seq_len))

    def compute(self, run: MeasuredRun, links: ClusterLinks) -> float:
        """Compute seconds of ``run``'s optimizer step (module doc)."""
        if run.setting not in self.baselines:
            return run.grad_accum * run.shape.compute_seconds(
                run.layout, run.micro_batch, run.seq_len, self.gpu_tflops)
        key = (run.setting, links.inter_node_gbps)
        if key not in self._computes:
            exact = get_config("none")
            self._computes[key] = compute_from_baseline(
                statistics.median(self.baselines[run.setting]),
                run.shape.unit_counts(run.layout, exact.exact_patterns, exact.min_numel),
                run.layout, links, **self._kwargs(run))
        return self._computes[key]

    def cost(self, run: MeasuredRun, inter_node_gbps: float) -> StepCost:
        key = (run, inter_node_gbps)
        if key not in self._costs:
            links = ClusterLinks(inter_node_gbps=inter_node_gbps,
                                 intra_node_gbps=self.intra_node_gbps)
            config = get_config(run.preset)
            units = run.shape.unit_counts(run.layout, config.exact_patterns, config.min_numel)
            self._costs[key] = price_step(config, units, run.layout, links,
                                          compute_s=self.compute(run, links),
                                          codec_scale=self.codec_scale, **self._kwargs(run))
        return self._costs[key]


@dataclass(frozen=True)
class Fit:
    """A fitted inter-node bandwidth and whether the runs determine it: ``bound`` says
    which search bound it ended on (the runs only say the links are at most / at least
    that), ``flat`` that every bandwidth predicts the same steps (nothing to fit)."""

    gbps: float
    bound: str | None = None
    flat: bool = False

    @property
    def problem(self) -> str | None:
        """Why the fit should not be trusted, or None."""
        if self.flat:
            return ("the runs predict the same step at every bandwidth (their communication "
                    "is hidden or absent): they cannot identify it; add runs where "
                    "communication shows (more nodes, a slower link, a larger model)")
        if self.bound == "low":
            return (f"the fit ended on the search's lower bound, {LOW_GBPS:g} Gbit/s: the "
                    f"measured steps are slower than any bandwidth explains (compute of the "
                    f"'none' run too low? other overheads?)")
        if self.bound == "high":
            return (f"the fit ended on the search's upper bound, {HIGH_GBPS:g} Gbit/s: the "
                    f"measured steps are faster than the model allows at any bandwidth (a "
                    f"'none' baseline from a slower setting? more overlap than modelled?)")
        return None


def fit_inter_node(runs: list[dict] | list[MeasuredRun], *, intra_node_gbps: float,
                   engine: str | Engine = "fsdp2", gpu_tflops: float | None = None,
                   weight_bytes: int = 2, grad_bytes: int = 4, codec_scale: float = 1.0,
                   predict: Predict | None = None) -> Fit:
    """The effective inter-node Gbit/s per node minimizing the squared log error of the
    predicted vs measured step seconds of ``runs`` (module doc), with whether it is
    determined (:class:`Fit`). ``predict`` replaces the planner's prediction: a
    :class:`StepPredictor` of more runs (its memo shared between fits: leave-one-out), or a
    test's."""
    if not runs or not all(isinstance(r, MeasuredRun) for r in runs):
        runs = parse_runs(runs)
    if all(r.is_baseline for r in runs):
        raise CalibrationError("only 'none' runs: each is its own compute baseline, so its "
                               "predicted step is the measured one at any bandwidth. Add a run "
                               "of a compressed preset (same model, batch and layout as a "
                               "'none' run, or any with --gpu-tflops)")
    predict = predict or StepPredictor(runs, intra_node_gbps=intra_node_gbps, engine=engine,
                                       gpu_tflops=gpu_tflops, weight_bytes=weight_bytes,
                                       grad_bytes=grad_bytes, codec_scale=codec_scale)

    def loss(log_gbps: float) -> float:
        gbps = math.exp(log_gbps)
        return sum(math.log(max(predict(r, gbps), 1e-12) / r.step_s) ** 2 for r in runs)

    low, high = math.log(LOW_GBPS), math.log(HIGH_GBPS)
    best = minimize_1d(loss, low, high)
    ends = (loss(low), loss(high))
    flat = max(ends) - min(ends) <= 1e-12 * max(1.0, max(ends)) \
        and abs(loss(best) - ends[0]) <= 1e-12 * max(1.0, ends[0])
    edge = (high - low) * 1e-3
    bound = "low" if best <= low + edge else "high" if best >= high - edge else None
    return Fit(math.exp(best), None if flat else bound, flat)


def fit_inter_node_gbps(runs: list[dict] | list[MeasuredRun], **kw) -> float:
    """:func:`fit_inter_node`'s bandwidth alone (Gbit/s per node)."""
    return fit_inter_node(runs, **kw).gbps


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
