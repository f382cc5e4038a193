"""The planner (``hfcompress plan``): each preset priced on a cluster (``report.py``), with
where its links, codec rates and compute come from. ValueError on a bad input."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config import get_config
from .calibrate import Fit, fit_inter_node, load_runs
from .cluster import ClusterLayout
from .collectives import BUCKET_BYTES
from .gpus import GpuAssumption, assume_gpu
from .links import DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS, NOMINAL_EFFICIENCY, ClusterLinks
from .links_file import cluster_links, codec_rates, describe_layout, load
from .model_shape import ModelShape
from .report import plan_report
from .step_model import DTYPE_BYTES, compute_from_baseline

#: presets whose training loss the benchmarks keep within 1% of ``none`` (BENCHMARKS.md "Loss
#: kept", at both learning rates): not ``zeropp`` (int4 gradients, +3.6% at lr 3e-3,
#: auto/candidates.py), ``qw`` (4-bit weights, +1.7%) nor the DDP presets (another engine)
LOSS_KEEPING = ("none", "qwd", "tlq_hs", "sdp4bit", "loco")


def plan(shape: ModelShape, presets: list[str], *, nodes: int, gpus_per_node: int = 8,
         tp: int = 1, pp: int = 1, cp: int = 1, engine: str = "fsdp2", seq_len: int = 4096,
         micro_batch: int = 1, grad_accum: int = 1, gather_dtype: str = "bf16",
         reduce_dtype: str = "fp32", step_time: float | None = None,
         gpu_tflops: float | None = None, inter_node_gbps: float | None = None,
         nominal_inter_node_gbps: float | None = None, intra_node_gbps: float | None = None,
         links_file: str | None = None, calibrate: str | None = None, gpu: str | None = None,
         gpu_memory_gb: float | None = None, hbm_gbps: float | None = None,
         bucket_bytes: int = BUCKET_BYTES) -> dict[str, Any]:
    """The plan report: ``presets`` (``none`` always) priced on this layout. Links: the
    given Gbit/s (``nominal_inter_node_gbps``: the data sheet's, times the papers' median
    efficiency, the answers at its extremes added), else the ``links_file``'s, else the
    defaults; the inter-node one fitted to the ``calibrate`` runs when given. Compute: the
    measured ``step_time`` of ``none``, else ``gpu_tflops`` (exactly one). GPU memory and
    codec rates: ``cost/gpus.assume_gpu``. ``bucket_bytes``: DDP's buckets."""
    for name in presets:
        get_config(name)
    if inter_node_gbps is not None and nominal_inter_node_gbps is not None:
        raise ValueError("give --inter-node-gbps (effective) or --nominal-inter-node-gbps "
                         "(the data sheet's), not both")
    assumed = assume_gpu(gpu, gpu_memory_gb, hbm_gbps)
    layout = ClusterLayout(nodes, gpus_per_node, tp=tp, pp=pp, cp=cp)
    measured = load(links_file) if links_file else None
    nominal = None if nominal_inter_node_gbps is None else \
        nominal_inter_node_gbps * NOMINAL_EFFICIENCY[1]
    links = _links(measured, inter_node_gbps or nominal, intra_node_gbps)
    dtypes = dict(weight_bytes=DTYPE_BYTES[gather_dtype], grad_bytes=DTYPE_BYTES[reduce_dtype])
    runs = load_runs(calibrate) if calibrate else None
    fit = None if runs is None else fit_inter_node(
        runs, intra_node_gbps=links.intra_node_gbps, engine=engine, gpu_tflops=gpu_tflops,
        codec_scale=assumed.codec_scale, **dtypes)
    if fit is not None:
        links = dataclasses.replace(links, inter_node_gbps=fit.gbps)
    codecs = None if measured is None else codec_rates(measured)

    def price(at: ClusterLinks) -> dict[str, Any]:
        return _price(shape, presets, layout, at, step_time=step_time, gpu_tflops=gpu_tflops,
                      engine=engine, seq_len=seq_len, micro_batch=micro_batch,
                      grad_accum=grad_accum, gpu=assumed, dtypes=dtypes,
                      bucket_bytes=bucket_bytes, codecs=codecs)
    report = price(links)
    report["links"].update(_sources(measured, links_file, inter_node_gbps or nominal,
                                    intra_node_gbps))
    if measured is not None:
        report["links"]["measured_layout"] = measured["layout"]
        report["codec"]["source"] = f"measured by hfcompress probe on {measured['device']}"
    if nominal is not None and fit is None:
        report["links"].update(_nominal_range(price, links, nominal_inter_node_gbps))
    if fit is not None:
        _add_fit(report, fit, len(runs), calibrate)
    if step_time is not None and report["presets"]["none"]["step_s"] > step_time * 1.01:
        report["warning"] = (f"on these links none's step would take "
                             f"{report['presets']['none']['step_s']:.4g} s, more than the "
                             f"measured {step_time:g} s: the links are faster than "
                             f"{links.inter_node_gbps:g} Gbit/s per node; fit them to "
                             f"measured runs with --calibrate")
    return report


def _price(shape: ModelShape, presets: list[str], layout: ClusterLayout, links: ClusterLinks,
           *, step_time: float | None, gpu_tflops: float | None, engine: str, seq_len: int,
           micro_batch: int, grad_accum: int, gpu: GpuAssumption, dtypes: dict,
           bucket_bytes: int, codecs: dict | None) -> dict[str, Any]:
    """The report on ``links``: compute from ``step_time`` (on these links) or
    ``gpu_tflops``, every preset priced."""
    if step_time is not None:
        compute = _compute_from_step(step_time, shape, layout, links, engine, grad_accum,
                                     dict(dtypes, bucket_bytes=bucket_bytes,
                                          activation_bytes=shape.activation_bytes(
                                              layout, micro_batch, seq_len)))
        source = f"the measured none step, {step_time:g} s, minus its exposed communication"
    else:
        compute = grad_accum * shape.compute_seconds(layout, micro_batch, seq_len, gpu_tflops)
        source = f"6 x params x tokens + attention at {gpu_tflops:g} TFLOP/s per GPU"
    return plan_report(shape, layout, links, presets=presets, compute_s=compute,
                       compute_source=source, engine=engine, seq_len=seq_len,
                       micro_batch=micro_batch, grad_accum=grad_accum, gpu=gpu,
                       loss_keeping=LOSS_KEEPING, codec_rates=codecs,
                       bucket_bytes=bucket_bytes, **dtypes)


def _nominal_range(price, links: ClusterLinks, nominal_gbps: float) -> dict[str, Any]:
    """The report's links entries for a nominal bandwidth: the efficiency used, and each
    preset's speedup (and the recommendation) at the papers' lowest and highest."""
    low, mid, high = NOMINAL_EFFICIENCY
    ends = {}
    for name, eff in (("low", low), ("high", high)):
        at = price(dataclasses.replace(links, inter_node_gbps=nominal_gbps * eff))
        ends[name] = {"efficiency": eff, "inter_node_gbps": nominal_gbps * eff,
                      "speedups": {k: p["speedup"] for k, p in at["presets"].items()},
                      "recommendation": at["recommendation"]["preset"]}
    return {"nominal_inter_node_gbps": nominal_gbps, "efficiency": mid,
            "source": f"--nominal-inter-node-gbps {nominal_gbps:g} x {mid:g}, the median "
                      f"effective / stated of the papers' fitted clusters",
            "nominal_range": ends}


def _add_fit(report: dict[str, Any], fit: Fit, runs: int, path: str) -> None:
    """The calibration's entries: where the bandwidth came from, and whether the runs
    determine it."""
    report["links"]["source"] = f"fitted to {runs} runs of {path}"
    report["fitted_inter_node_gbps"] = fit.gbps
    report["calibration_runs"] = runs
    report["calibration_problem"] = fit.problem      # None: the runs determine it
    if fit.problem:
        report["recommendation"]["why"] += " (on a calibration the runs do not determine)"


def _compute_from_step(step_time: float, shape: ModelShape, layout: ClusterLayout,
                       links: ClusterLinks, engine: str, grad_accum: int, dtypes: dict) -> float:
    """Compute seconds per step: the measured step of ``none`` minus its exposed
    communication on these links."""
    none = get_config("none")
    units = shape.unit_counts(layout, none.exact_patterns, none.min_numel)
    return compute_from_baseline(step_time, units, layout, links, engine=engine,
                                 grad_accum=grad_accum, **dtypes)


def _links(measured: dict | None, inter_node_gbps: float | None,
           intra_node_gbps: float | None) -> ClusterLinks:
    """The given Gbit/s, else the links file's, else the defaults."""
    given = ClusterLinks(inter_node_gbps or DEFAULT_INTER_GBPS,
                         intra_node_gbps or DEFAULT_INTRA_GBPS)
    if measured is None:
        return given
    return cluster_links(measured, given, inter_node_gbps=inter_node_gbps,
                         intra_node_gbps=intra_node_gbps)


def _sources(measured: dict | None, links_file: str | None, inter_node_gbps: float | None,
             intra_node_gbps: float | None) -> dict[str, str]:
    """Where the inter- and intra-node bandwidths come from (the report's links ``source`` /
    ``intra_source``): the flag, the links file, or the default."""
    given = {"inter_node_gbps": inter_node_gbps, "intra_node_gbps": intra_node_gbps}

    def source(key: str, default: float) -> str:
        flag = f"--{key.replace('_', '-')}"
        if given[key] is not None:
            return f"given: {flag}"
        if measured is not None and measured[key] is not None:
            return f"measured by hfcompress probe ({links_file}) on " \
                   f"{describe_layout(measured)}, {measured['device']}"
        unmeasured = "" if measured is None else f", {links_file} measured none"
        return f"the default {default:g}{unmeasured}: set {flag} or --links"

    return {"source": source("inter_node_gbps", DEFAULT_INTER_GBPS),
            "intra_source": source("intra_node_gbps", DEFAULT_INTRA_GBPS)}
