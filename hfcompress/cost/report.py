"""What ``hfcompress plan`` prints: the presets priced for one model on one cluster
(``cost/step_model.py``), as one JSON-ready dict and as a table, with a recommendation.

Seconds and bytes are per optimizer step: ``grad_accum`` micro-batches, each gathering the
weights and reducing the gradients (FSDP2's default), so the micro-batch's
:class:`~hfcompress.cost.step_model.StepCost` times ``grad_accum``; compressor state is per
GPU. Link bytes are what the backend's algorithm puts on a node's link (all its DP groups);
meter bytes what hfcompress's WireMeter counts for the same collectives (direct sends to
every peer), the figure the benchmarks report.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..config import get_config
from .cluster import ClusterLayout
from .links import ClusterLinks
from .model_shape import ModelShape
from .step_model import StepCost, price_step

#: a compressed preset must beat ``none`` by more than this to be recommended
MARGIN = 0.03
GB = 1e9


def collective_rows(cost: StepCost, grad_accum: int) -> list[dict[str, Any]]:
    """Each collective of the step (summed over the units), its seconds and bytes for
    ``grad_accum`` micro-batches."""
    scaled = ("link_bytes_per_node", "meter_bytes_per_node", "intra_bytes_per_gpu", "wire_s",
              "codec_s")
    return [{k: v * grad_accum if k in scaled else v for k, v in asdict(c).items()}
            for c in cost.collectives]


def preset_entry(cost: StepCost, baseline_step_s: float, grad_accum: int) -> dict[str, Any]:
    """A preset's seconds, bytes and speedup over ``none``'s ``baseline_step_s``."""
    step = cost.step_s * grad_accum
    collectives = collective_rows(cost, grad_accum)
    return {
        "step_s": step, "speedup": baseline_step_s / step,
        "compute_s": cost.compute_s * grad_accum, "wire_s": cost.wire_s * grad_accum,
        "exposed_s": cost.exposed_s * grad_accum, "codec_s": cost.codec_s * grad_accum,
        "full_overlap_s": cost.full_overlap_s * grad_accum,
        "full_overlap_speedup": baseline_step_s / (cost.full_overlap_s * grad_accum),
        "state_bytes_per_gpu": cost.state_bytes_per_gpu,
        "link_bytes_per_node": sum(c["link_bytes_per_node"] for c in collectives),
        "meter_bytes_per_node": sum(c["meter_bytes_per_node"] for c in collectives),
        "collectives": collectives,
    }


def recommend(presets: dict[str, dict[str, Any]], loss_keeping: tuple[str, ...]
              ) -> dict[str, Any]:
    """The fastest loss-keeping preset, or ``none`` ("don't compress") when none of them
    beats it by more than :data:`MARGIN`, with the reason."""
    base = presets["none"]
    rivals = {k: v for k, v in presets.items() if k != "none" and k in loss_keeping}
    if not rivals:
        return {"preset": "none", "why": "no loss-keeping compressed preset was priced"}
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
                seq_len: int, micro_batch: int, grad_accum: int = 1,
                loss_keeping: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every preset of ``presets`` (``none`` first, added if missing: the baseline) priced
    for ``shape`` on ``layout`` / ``links`` with ``compute_s`` seconds of compute per
    micro-batch, as one JSON-ready dict (module doc)."""
    names = ["none"] + [p for p in presets if p != "none"]
    costs, unavailable = {}, {}
    for name in names:
        config = get_config(name)
        units = shape.units(layout, config.exact_patterns, config.min_numel)
        try:
            costs[name] = price_step(config, units, layout, links, compute_s=compute_s,
                                     engine=engine)
        except ValueError as e:   # a scheme that cannot serve this layout (none always can)
            if name == "none":
                raise
            unavailable[name] = str(e)
    baseline = costs["none"].step_s * grad_accum
    entries = {name: {**preset_entry(cost, baseline, grad_accum),
                      "loss_keeping": name in loss_keeping} for name, cost in costs.items()}
    return {
        "model": {"description": shape.describe(), "params": shape.params,
                  "active_params": shape.active_params, "hidden": shape.hidden,
                  "layers": shape.layers, "ffn": shape.mlp_width, "vocab": shape.vocab,
                  "heads": shape.n_heads, "kv_heads": shape.n_kv_heads,
                  "experts": shape.experts, "tied_embeddings": shape.tied_embeddings},
        "layout": {"nodes": layout.nodes, "gpus_per_node": layout.gpus_per_node,
                   "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "dp": layout.dp,
                   "dp_per_node": layout.dp_per_node,
                   "groups_per_node": layout.groups_per_node, "dp_nodes": layout.dp_nodes},
        "links": {"inter_node_gbps": links.inter_node_gbps,
                  "intra_node_gbps": links.intra_node_gbps,
                  "inter_latency_us": links.inter_latency_us,
                  "intra_latency_us": links.intra_latency_us},
        "engine": engine,
        "compute_s": compute_s * grad_accum, "compute_source": compute_source,
        "tokens_per_step": layout.dp * micro_batch * seq_len * grad_accum,
        "presets": entries, "unavailable": unavailable,
        "recommendation": recommend(entries, loss_keeping),
    }


def _gb(value: float) -> str:
    value /= GB
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def render_text(report: dict[str, Any]) -> str:
    """The report as the table ``hfcompress plan`` prints."""
    lay, links, presets = report["layout"], report["links"], report["presets"]
    lines = [f"model: {report['model']['description']}",
             f"layout: {lay['nodes']} nodes x {lay['gpus_per_node']} GPUs, tp {lay['tp']} pp "
             f"{lay['pp']} cp {lay['cp']}: DP size {lay['dp']} = {lay['dp_per_node']} DP ranks "
             f"per node (x) x {lay['dp_nodes']} nodes per DP group (y); {lay['groups_per_node']} "
             f"DP group(s) share each node's link (k)",
             f"links (effective): {links['inter_node_gbps']:.4g} Gbit/s per node between nodes"
             f"{' (' + links['source'] + ')' if links.get('source') else ''}, "
             f"{links['intra_node_gbps']:.4g} Gbit/s per GPU inside a node; engine "
             f"{report['engine']}",
             f"compute: {report['compute_s']:.4g} s per step ({report['compute_source']}); "
             f"{report['tokens_per_step']} tokens per step over the cluster",
             ""]
    w = max(len(name) for name in presets) + 2
    head = (f"{'preset':<{w}}{'step s':>9}{'speedup':>9}{'comm s':>9}{'exposed s':>11}"
            f"{'codec s':>9}{'overlap-limit s':>17}{'state GB/GPU':>14}{'link GB/node':>14}"
            f"{'meter GB/node':>15}")
    lines.append(head)
    for name, p in presets.items():
        mark = "" if p["loss_keeping"] else "*"
        lines.append(f"{name + mark:<{w}}{p['step_s']:>9.4g}{p['speedup']:>8.3f}x"
                     f"{p['wire_s']:>9.4g}{p['exposed_s']:>11.4g}{p['codec_s']:>9.4g}"
                     f"{p['full_overlap_s']:>17.4g}{_gb(p['state_bytes_per_gpu']):>14}"
                     f"{_gb(p['link_bytes_per_node']):>14}{_gb(p['meter_bytes_per_node']):>15}")
    if not all(p["loss_keeping"] for p in presets.values()):
        lines.append("* not among the loss-keeping presets (never recommended)")
    for name, why in report["unavailable"].items():
        lines.append(f"{name}: cannot run on this layout: {why}")
    lines += ["", "inter-node GB per node per step, per collective (algorithm on the link; "
                  "under 0.1% of a preset's bytes, e.g. the exact norms: --json only):"]
    for name, p in presets.items():
        parts = [f"{c['name']} {_gb(c['link_bytes_per_node'])} ({c['algorithm']})"
                 for c in p["collectives"]
                 if c["link_bytes_per_node"] > 1e-3 * p["link_bytes_per_node"]]
        lines.append(f"  {name:<{w}}{', '.join(parts) or 'nothing crosses the node links'}")
    base = presets["none"]
    if base["link_bytes_per_node"] > 0:
        ratio = base["meter_bytes_per_node"] / base["link_bytes_per_node"]
        lines.append(f"the WireMeter counts direct sends: none's "
                     f"{_gb(base['meter_bytes_per_node'])} GB per node is {ratio:.3g}x the "
                     f"{_gb(base['link_bytes_per_node'])} GB its ring collectives put on the link")
    rec = report["recommendation"]
    lines += ["", f"recommendation: {rec['preset']}: {rec['why']}"]
    if "fitted_inter_node_gbps" in report:
        lines.append(f"calibration: {report['fitted_inter_node_gbps']:.4g} Gbit/s effective "
                     f"inter-node bandwidth fitted to {report['calibration_runs']} measured runs")
    return "\n".join(lines)
