"""What ``hfcompress plan`` prints: the presets priced for one model on one cluster
(``cost/step_model.py``), as one JSON-ready dict and as a table, with a recommendation.

Seconds and bytes are per optimizer step of ``grad_accum`` micro-batches: compute for all of
them, each collective as often as the engine runs it (``step_model.Engine``: under ``fsdp2``
the weights are gathered every micro-batch, the gradients reduced once per step;
``times_per_step`` in each collective's row). Link bytes are what the backend's algorithm puts
on a node's link (all its DP groups); meter bytes what hfcompress's WireMeter counts for the
same collectives (direct sends to every peer), the figure the benchmarks report.

Memory per GPU: the compressor's state (qWD references, LoCo errors, ...) plus the model's
sharded training state (``ModelShape.train_state_bytes``: 18 bytes per parameter value a GPU
holds, bf16 parameter + fp32 master + two fp32 Adam moments + fp32 gradient; activations not
counted). A GPU memory is always assumed (``cost/gpus.py``: the ``--gpu``'s, the given
GB, else 80 GB, said so): a preset whose sum exceeds it is marked "does not fit" and never
recommended.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..config import get_config
from .cluster import ClusterLayout
from .collectives import BUCKET_BYTES
from .links import ClusterLinks
from .codec_rates import PER_CALL_S
from .gpus import GpuAssumption, assume_gpu
from .model_shape import ModelShape
from .step_model import StepCost, engine_spec, price_step

#: a compressed preset must beat ``none`` by more than this to be recommended
MARGIN = 0.03
GB = 1e9


def preset_entry(cost: StepCost, baseline_step_s: float, train_state_bytes: int,
                 gpu_memory_gb: float) -> dict[str, Any]:
    """A preset's seconds, bytes, memory and speedup over ``none``'s ``baseline_step_s``."""
    collectives = [asdict(c) for c in cost.collectives]
    memory = train_state_bytes + cost.state_bytes_per_gpu
    entry = {
        "step_s": cost.step_s, "speedup": baseline_step_s / cost.step_s,
        "compute_s": cost.compute_s, "wire_s": cost.wire_s, "exposed_s": cost.exposed_s,
        "codec_s": cost.codec_s, "bubble_s": cost.bubble_s,
        "full_overlap_s": cost.full_overlap_s,
        "full_overlap_speedup": baseline_step_s / cost.full_overlap_s,
        "state_bytes_per_gpu": cost.state_bytes_per_gpu,
        "memory_bytes_per_gpu": memory,
        "link_bytes_per_node": sum(c["link_bytes_per_node"] for c in collectives),
        "meter_bytes_per_node": sum(c["meter_bytes_per_node"] for c in collectives),
        "collectives": collectives,
        "fits_gpu_memory": memory <= gpu_memory_gb * GB,
    }
    return entry


def recommend(presets: dict[str, dict[str, Any]], loss_keeping: tuple[str, ...]
              ) -> dict[str, Any]:
    """The fastest loss-keeping preset that fits the GPU's memory, or ``none`` ("don't
    compress") when none of them beats it by more than :data:`MARGIN`, with the reason."""
    base = presets["none"]
    rivals = {k: v for k, v in presets.items() if k != "none" and k in loss_keeping
              and v["fits_gpu_memory"]}
    if not rivals:
        return {"preset": "none", "why": "no loss-keeping compressed preset was priced" +
                (" that fits the GPU's memory" if any(
                    k in loss_keeping and not v["fits_gpu_memory"]
                    for k, v in presets.items()) else "")}
    best = max(rivals, key=lambda k: rivals[k]["speedup"])
    gain = rivals[best]["speedup"] - 1.0
    if gain > MARGIN:
        saved = base["exposed_s"] + base["codec_s"] - rivals[best]["exposed_s"] - \
            rivals[best]["codec_s"]
        return {"preset": best, "speedup": rivals[best]["speedup"],
                "why": f"the fastest loss-keeping preset, {rivals[best]['speedup']:.2f}x "
                       f"none's speed: it cuts the exposed communication and codec by "
                       f"{saved:.3g} s per step"}
    exposed_share = base["exposed_s"] / base["step_s"]
    if base["wire_s"] <= base["compute_s"] and exposed_share < MARGIN:
        reason = (f"compute-bound: none's {base['wire_s']:.3g} s of communication hides behind "
                  f"{base['compute_s']:.3g} s of compute")
    elif exposed_share < MARGIN:
        reason = f"links fast: none's exposed communication is {exposed_share:.1%} of its step"
    else:
        reason = (f"it saves little: {rivals[best]['exposed_s']:.3g} s exposed + "
                  f"{rivals[best]['codec_s']:.3g} s codec against none's "
                  f"{base['exposed_s']:.3g} s exposed")
    return {"preset": "none", "best_compressed": best, "speedup": rivals[best]["speedup"],
            "why": f"don't compress: the best loss-keeping preset, {best}, is {gain:+.1%} "
                   f"against none ({reason})"}


def plan_report(shape: ModelShape, layout: ClusterLayout, links: ClusterLinks, *,
                presets: list[str], compute_s: float, compute_source: str, engine: str,
                seq_len: int, micro_batch: int, grad_accum: int = 1, weight_bytes: int = 2,
                grad_bytes: int = 4, gpu: GpuAssumption | None = None,
                loss_keeping: tuple[str, ...] = (),
                codec_rates: dict[str, Any] | None = None,
                bucket_bytes: int = BUCKET_BYTES) -> dict[str, Any]:
    """Every preset of ``presets`` (``none`` first, added if missing: the baseline) priced
    for ``shape`` on ``layout`` / ``links`` with ``compute_s`` seconds of compute per
    optimizer step of ``grad_accum`` micro-batches, the exact collectives at
    ``weight_bytes`` / ``grad_bytes`` per value, the codecs at ``codec_rates``
    (``price_step``'s; None: the H200's, scaled to ``gpu``), on ``gpu`` (None: the
    default assumption, ``cost/gpus.assume_gpu``), as one JSON-ready dict (module doc)."""
    gpu = gpu or assume_gpu()
    activation_bytes = shape.activation_bytes(layout, micro_batch, seq_len)
    names = ["none"] + [p for p in presets if p != "none"]
    costs, unavailable = {}, {}
    for name in names:
        config = get_config(name)
        units = shape.unit_counts(layout, config.exact_patterns, config.min_numel)
        try:
            costs[name] = price_step(config, units, layout, links, compute_s=compute_s,
                                     engine=engine, grad_accum=grad_accum,
                                     weight_bytes=weight_bytes, grad_bytes=grad_bytes,
                                     codec_rates=codec_rates, codec_scale=gpu.codec_scale,
                                     bucket_bytes=bucket_bytes,
                                     activation_bytes=activation_bytes)
        except ValueError as e:   # a scheme that cannot serve this layout (none always can)
            if name == "none":
                raise
            unavailable[name] = str(e)
    train_state = _train_state(shape, layout, engine)
    entries = {name: {**preset_entry(cost, costs["none"].step_s, train_state, gpu.memory_gb),
                      "loss_keeping": name in loss_keeping} for name, cost in costs.items()}
    report = {
        "model": _model_entry(shape),
        "layout": {k: getattr(layout, k) for k in LAYOUT_KEYS},
        "links": {"inter_node_gbps": links.inter_node_gbps,
                  "intra_node_gbps": links.intra_node_gbps,
                  "inter_latency_us": links.inter_latency_us,
                  "intra_latency_us": links.intra_latency_us},
        "engine": engine, "grad_accum": grad_accum,
        "weight_bytes": weight_bytes, "grad_bytes": grad_bytes,
        "compute_s": compute_s, "compute_source": compute_source,
        "tokens_per_step": layout.dp * micro_batch * seq_len * grad_accum,
        "train_state_bytes_per_gpu": train_state, "gpu": gpu.name,
        "gpu_memory_gb": gpu.memory_gb, "gpu_memory_source": gpu.memory_source,
        "presets": entries, "unavailable": unavailable,
        "recommendation": recommend(entries, loss_keeping),
        "codec": _codec_entry(costs, gpu, codec_rates is not None),
    }
    if not entries["none"]["fits_gpu_memory"]:
        report["memory_warning"] = (
            f"the model's training state alone, {train_state / GB:.4g} GB per GPU, exceeds "
            f"{gpu.memory_gb:g} GB: " + _more_gpus(engine))
    return report


def _more_gpus(engine: str) -> str:
    """What to change when the training state does not fit: more GPUs to shard over (DDP
    keeps a whole copy on every GPU whatever the node count)."""
    if engine_spec(engine).replicated:
        return ("DDP keeps the whole state on every GPU, more nodes do not shrink it: shard "
                "it (--engine fsdp2 or zero3) or split the model (--tp, --pp)")
    return "shard it over more GPUs (--tp, --pp, --nodes)"


LAYOUT_KEYS = ("nodes", "gpus_per_node", "tp", "pp", "cp", "dp", "dp_per_node",
               "groups_per_node", "dp_nodes")


def _model_entry(shape: ModelShape) -> dict[str, Any]:
    return {"description": shape.describe(), "params": shape.params,
            "active_params": shape.active_params, "hidden": shape.hidden,
            "layers": shape.layers, "ffn": shape.mlp_width, "vocab": shape.vocab,
            "heads": shape.n_heads, "kv_heads": shape.n_kv_heads,
            "experts": shape.experts, "tied_embeddings": shape.tied_embeddings}


def _train_state(shape: ModelShape, layout: ClusterLayout, engine: str) -> int:
    """The model's training state per GPU: sharded, or whole under the ``ddp`` engine."""
    return shape.train_state_bytes(layout) * (layout.dp if engine_spec(engine).replicated
                                              else 1)


def _codec_entry(costs: dict[str, StepCost], gpu: GpuAssumption, given: bool) -> dict:
    """Where the codec rates come from, their scale, and the keys only estimated."""
    return {"source": "given (codec_rates)" if given else gpu.codec_source,
            "scale": gpu.codec_scale, "per_call_s": PER_CALL_S,
            "estimated": {k: v for c in costs.values() for k, v in c.estimated_rates.items()}}


def _gb(value: float) -> str:
    value /= GB
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _header(report: dict[str, Any]) -> list[str]:
    """The model, layout, links (each bandwidth with its source) and compute lines."""
    lay, links = report["layout"], report["links"]
    return [f"model: {report['model']['description']}",
            f"layout: {lay['nodes']} nodes x {lay['gpus_per_node']} GPUs, tp {lay['tp']} pp "
            f"{lay['pp']} cp {lay['cp']}: DP size {lay['dp']} = {lay['dp_per_node']} DP ranks "
            f"per node (x) x {lay['dp_nodes']} nodes per DP group (y); {lay['groups_per_node']} "
            f"DP group(s) share each node's link (k)",
            f"links (effective): {links['inter_node_gbps']:.4g} Gbit/s per node between nodes"
            f"{' (' + links['source'] + ')' if links.get('source') else ''}, "
            f"{links['intra_node_gbps']:.4g} Gbit/s per GPU inside a node"
            f"{' (' + links['intra_source'] + ')' if links.get('intra_source') else ''}; engine "
            f"{report['engine']}",
            f"gpu: {report['gpu'] + ', ' if report['gpu'] else ''}{report['gpu_memory_gb']:g} GB "
            f"per GPU ({report['gpu_memory_source']})",
            f"compute: {report['compute_s']:.4g} s per step of {report['grad_accum']} "
            f"micro-batch(es) ({report['compute_source']}); {report['tokens_per_step']} tokens "
            f"per step over the cluster; exact collectives: weights {report['weight_bytes']} B, "
            f"gradients {report['grad_bytes']} B per value",
            ""]


def _memory_lines(report: dict[str, Any]) -> list[str]:
    """The memory footnote, and a "does not fit" line with its bytes per preset over."""
    presets, limit = report["presets"], report["gpu_memory_gb"]
    over = {k: p for k, p in presets.items() if not p["fits_gpu_memory"]}
    lines = [f"memory: compressor state + the model's training state (sharded; whole under "
             f"ddp), "
             f"{_gb(report['train_state_bytes_per_gpu'])} GB per GPU (18 B per parameter: bf16 "
             f"+ fp32 master + 2 fp32 Adam moments + fp32 gradient; activations not counted), "
             f"against {limit:g} GB per GPU ({report['gpu_memory_source']})" +
             (", all within it" if not over else "")]
    lines += [f"! {name} does not fit: {_gb(p['memory_bytes_per_gpu'])} GB per GPU "
              f"({_gb(p['state_bytes_per_gpu'])} GB of compressor state) > {limit:g} GB "
              f"(never recommended)" for name, p in over.items()]
    return lines


def _nominal_lines(links: dict[str, Any]) -> list[str]:
    """With a nominal bandwidth: the answers at the papers' lowest and highest efficiency."""
    if "nominal_range" not in links:
        return []
    out = [f"nominal {links['nominal_inter_node_gbps']:g} Gbit/s: priced at x "
           f"{links['efficiency']:g}; the papers' clusters ranged:"]
    for end in links["nominal_range"].values():
        speedups = ", ".join(f"{k} {v:.2f}x" for k, v in end["speedups"].items() if k != "none")
        out.append(f"  x {end['efficiency']:g} ({end['inter_node_gbps']:.4g} Gbit/s): "
                   f"recommendation {end['recommendation']}; {speedups}")
    out.append("  measure the effective bandwidth (hfcompress probe) or fit it (--calibrate) "
               "to narrow this")
    return out


def render_text(report: dict[str, Any]) -> str:
    """The report as the table ``hfcompress plan`` prints."""
    presets = report["presets"]
    lines = _header(report)
    w = max(len(name) for name in presets) + 3
    head = (f"{'preset':<{w}}{'step s':>10}{'speedup':>9}{'comm s':>10}{'exposed s':>11}"
            f"{'codec s':>10}{'overlap-limit s':>17}{'state GB/GPU':>14}{'memory GB/GPU':>15}"
            f"{'link GB/node':>14}{'meter GB/node':>15}")
    lines.append(head)
    for name, p in presets.items():
        mark = ("" if p["loss_keeping"] else "*") + ("" if p["fits_gpu_memory"] else "!")
        mem = f"{_gb(p['memory_bytes_per_gpu']):>15}"
        lines.append(f"{name + mark:<{w}}{p['step_s']:>10.4g}{p['speedup']:>8.3f}x"
                     f"{p['wire_s']:>10.4g}{p['exposed_s']:>11.4g}{p['codec_s']:>10.4g}"
                     f"{p['full_overlap_s']:>17.4g}{_gb(p['state_bytes_per_gpu']):>14}{mem}"
                     f"{_gb(p['link_bytes_per_node']):>14}{_gb(p['meter_bytes_per_node']):>15}")
    if not all(p["loss_keeping"] for p in presets.values()):
        lines.append("* not among the loss-keeping presets (never recommended)")
    lines += _memory_lines(report)
    if base_bubble := presets["none"]["bubble_s"]:
        lines.append(f"pipeline: a {base_bubble:.4g} s bubble per step (1F1B: pp - 1 "
                     f"micro-batches' compute; in step s) and the stages' activation sends "
                     f"(pipeline_sends, exposed)")
    if "memory_warning" in report:
        lines.append(f"warning: {report['memory_warning']}")
    for name, why in report["unavailable"].items():
        lines.append(f"{name}: cannot run on this layout: {why}")
    lines += ["", "inter-node GB per node per step, per collective (algorithm on the link; "
                  "under 0.1% of a preset's bytes, e.g. the exact norms: --json only):"]
    for name, p in presets.items():
        parts = [f"{c['name']} {_gb(c['link_bytes_per_node'])} ({c['algorithm']}"
                 f"{', x' + str(c['times_per_step']) if c['times_per_step'] > 1 else ''})"
                 for c in p["collectives"]
                 if c["link_bytes_per_node"] > 1e-3 * p["link_bytes_per_node"]]
        lines.append(f"  {name:<{w}}{', '.join(parts) or 'nothing crosses the node links'}")
    base = presets["none"]
    if base["link_bytes_per_node"] > 0:
        ratio = base["meter_bytes_per_node"] / base["link_bytes_per_node"]
        lines.append(f"the WireMeter counts direct sends: none's "
                     f"{_gb(base['meter_bytes_per_node'])} GB per node is {ratio:.3g}x the "
                     f"{_gb(base['link_bytes_per_node'])} GB its ring collectives put on the link")
    codec = report["codec"]
    lines += ["", f"codec rates: {codec['source']}; each compressed call costs at least "
                  f"{codec['per_call_s'] * 1e3:.2g} ms (host work and launches)"]
    lines += [f"  estimated, not measured: {key}: {why}"
              for key, why in codec["estimated"].items()]
    rec = report["recommendation"]
    lines += ["", f"recommendation: {rec['preset']}: {rec['why']}"]
    lines += _nominal_lines(report["links"])
    if "fitted_inter_node_gbps" in report:
        lines.append(f"calibration: {report['fitted_inter_node_gbps']:.4g} Gbit/s effective "
                     f"inter-node bandwidth fitted to {report['calibration_runs']} measured runs")
        if report.get("calibration_problem"):
            lines.append(f"warning: calibration not determined: "
                         f"{report['calibration_problem']}; the numbers above use it anyway: "
                         f"give --inter-node-gbps instead, or better runs")
    return "\n".join(lines)
