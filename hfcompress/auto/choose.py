"""The choice of ``comm_compressor="auto"``: probe, predict every candidate plan, pick.

Every rank probes (``probe.py``: the links on the real groups, the codecs on this device,
the compressed collectives as a whole at a capped size, whose time beyond the wire is the
model's codec cost: ``cost_model.collective_codec_seconds``); over a sub-mesh (FSDP2 x TP,
native HSDP) each rank probes its own data-parallel group, every group at once (world
barriers: the k groups of a node share its link as in training). The measurements are agreed
over the world (the slowest rank's), world rank 0 predicts each candidate's exposed
communication time per step (``cost_model.py``) and picks, and its choice and table are
broadcast over the world, so every rank of every DP group installs the same collectives (one
config: checkpoints, the cross-rank settings check, the meter). Native HSDP prices its
replica all-reduce too (``hsdp_cost``): the plan chooses its ``all_reduce`` option beside
the shard group's collectives. Pins (``AutoSettings.pins``, ``HFCOMPRESS_AUTO``) fix some
collective kinds; the others are still chosen.

Rule: the cheapest predicted plan, except that a plan compressing more collective kinds must
be predicted more than ``margin`` (default 5%) faster than one compressing fewer: when links
are fast, compression that would save a little in the model is not worth its risk of costing
time (the model's error is of that order).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..comm import Topology
from ..config import DDP_ROLES, FSDP_ROLES, AutoSettings, CompressionConfig
from ..cost.step_model import BACKWARD_SHARE
from ..cost.units import Unit
from ..integrations.fsdp import fsdp_units
from ..integrations.hpz_switch import LayerResharding
from ..integrations.memory import HPZ_SHARE, gib, hpz_fits
from .candidates import HPZ_OPTIONS, OPTIONS, PIN_ENV, Plan, candidates, pins_from_env
from .cost_model import (Cost, GroupLayout, built, collective_codec_seconds, ddp_cost,
                         ddp_needs, fsdp_cost, fsdp_needs)
from .probe import (CodecSeconds, ProbedLinks, agree, codec_rate, probe_collectives,
                    probe_links)

logger = logging.getLogger(__name__)
CODEC_CAP = 1 << 22   # values timed per scheme at most (the rate per value is what counts)
CONTEXT_CAP = 1 << 20  # values per rank of the whole-collective timings


@dataclass
class Choice:
    """What ``auto`` decided and why: the plan, the predicted table, the probe's facts."""

    kind: str
    plan: Plan
    table: list[dict[str, Any]]
    links: dict[str, Any]
    codecs: dict[str, Any]
    layout: dict[str, Any]
    pins: dict[str, str]
    probe_s: float
    overlap: float
    history: list[dict[str, Any]] = field(default_factory=list)
    cover_share: float = 0.0     # of the compute that hides all calls but the last (DDP)

    def predicted(self, plan: Plan | None = None) -> dict[str, Any] | None:
        """The table's row of ``plan`` (default: the chosen one); None if not predicted
        (a plan restored from a checkpoint that this probe's pins excluded)."""
        label = (plan or self.plan).label
        return next((r for r in self.table if r["plan"] == label), None)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "chosen": self.plan.label, "plan": asdict(self.plan),
                "evidence": self.plan.evidence(), "table": self.table, "links": self.links,
                "codecs": self.codecs, "layout": self.layout, "pins": self.pins,
                "probe_s": self.probe_s, "overlap": self.overlap,
                "cover_share": self.cover_share, "history": self.history}

    def lines(self) -> list[str]:
        """The decision and the predicted table, for the log."""
        out = [f"hfcompress auto ({self.kind}, {self.layout['nodes']} nodes x "
               f"{self.layout['ranks_per_node']} ranks, probe {self.probe_s:.1f} s): chose "
               f"{self.plan.label!r}" + (f" (pinned: {self.pins})" if self.pins else "")]
        out.append(f"  {'plan':<44}{'wire ms':>9}{'codec ms':>10}{'exposed ms':>12}")
        for r in self.table:
            mark = "*" if r["plan"] == self.plan.label else " "
            out.append(f" {mark}{r['plan']:<44}{1e3 * r['wire_s']:>9.1f}"
                       f"{1e3 * r['codec_s']:>10.1f}{1e3 * r['exposed_s']:>12.1f}")
        return out


def check_env_agrees() -> None:
    """``HFCOMPRESS_AUTO`` must be the same on every rank (else the ranks would probe and
    pick among different plans and desync): ValueError on every rank, naming each value."""
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, os.environ.get(PIN_ENV))
    if len(set(values)) > 1:
        each = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
        raise ValueError(f"hfcompress auto: {PIN_ENV} differs across ranks ({each}); set the "
                         f"same value on every rank (or unset it everywhere)")


def check_same_layout(*topologies: Topology) -> None:
    """Every DP group must have the same layout (x ranks per node, y nodes), as every
    device mesh gives them: the groups probe the same primitives at once and run one plan.
    ValueError on every rank otherwise, naming each rank's."""
    mine = [(t.ranks_per_node, t.num_nodes) for t in topologies]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if any(v != every[0] for v in every):
        each = ", ".join(f"rank {r}: {v}" for r, v in enumerate(every))
        raise ValueError(f"hfcompress auto: the data-parallel groups have different node "
                         f"layouts ((ranks per node, nodes): {each}); auto probes them at "
                         f"once and runs one plan on all: build the mesh with "
                         f"init_device_mesh (TP innermost), or pick a preset (e.g. 'sdp4bit')")


def _settings(settings: AutoSettings, kinds: tuple[str, ...]) -> dict[str, str]:
    check_env_agrees()
    pins = dict(settings.pins)
    pins.update(pins_from_env())            # the environment wins over the config
    unused = sorted(set(pins) - set(kinds))
    if unused and dist.get_rank() == 0:
        logger.warning(f"hfcompress auto: pins {unused} do not apply here (this engine "
                       f"chooses {', '.join(kinds)}); ignored")
    return {k: v for k, v in pins.items() if k in kinds}


def _codecs(needed: dict[str, tuple[str, int, torch.dtype]], world: int,
            device: torch.device, reps: int) -> dict[str, CodecSeconds]:
    """Codec rates of the options in ``needed`` (option -> (kind, numel, dtype)), agreed."""
    rates = {opt: codec_rate(built(kind, opt, world), min(n, CODEC_CAP), dtype, device, reps)
             for opt, (kind, n, dtype) in needed.items()}
    flat = agree([v for r in rates.values() for v in (r.compress_s, r.decompress_s)], device)
    return {opt: CodecSeconds(flat[2 * i], flat[2 * i + 1]) for i, opt in enumerate(rates)}


def _pick(rows: list[dict[str, Any]], margin: float) -> str:
    """The cheapest plan, unless one compressing fewer kinds is within ``margin`` of it."""
    best = min(r["exposed_s"] for r in rows)
    ok = [r for r in rows if r["exposed_s"] <= best * (1 + margin)]
    return min(ok, key=lambda r: (r["compressed_kinds"], r["exposed_s"]))["plan"]


def _decide(plans: list[Plan], cost_of, margin: float, overlap: float,
            compute_s: float | None, cover_share: float = 0.0
            ) -> tuple[Plan, list[dict[str, Any]]]:
    """Every plan's predicted row (``cover_share`` of a known compute hides all calls but
    the last: DDP's buckets, ``cost_model.Cost.exposed``); world rank 0's pick
    (:func:`_pick`) and rows, broadcast to every rank of the world (over a sub-mesh: to
    every DP group)."""
    rows = []
    cover = cover_share * (compute_s or 0.0)
    for plan in plans:
        cost = cost_of(plan)
        exposed = cost.exposed(overlap, cover)
        rows.append({"plan": plan.label, "wire_s": cost.wire, "codec_s": cost.codec,
                     "tail_s": cost.tail,
                     "exposed_s": exposed, "compressed_kinds": len(plan.evidence()),
                     "parts": {k: {"wire_s": v[0], "codec_s": v[1]}
                               for k, v in cost.parts.items()},
                     "step_s": None if compute_s is None else compute_s + exposed})
    box = [(_pick(rows, margin), rows) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)          # every rank installs rank 0's choice
    label, rows = box[0]
    return next(p for p in plans if p.label == label), rows


def hpz_available(resharding: LayerResharding | None, units: list[Unit], weight_bytes: int,
                  device: torch.device, pinned: str | None) -> tuple[bool, str]:
    """Whether ``auto`` may choose hpZ here, and why (for the choice's layout facts); the
    memory agreed over the world (every DP group runs world rank 0's choice). ValueError
    if the ``pinned`` weights option needs hpZ and it is not available."""
    if resharding is None or not resharding.available:
        ok, why = False, resharding.unavailable if resharding else "not an auto install"
    else:
        held = resharding.held_bytes(units, weight_bytes)
        ok = hpz_fits(held, device)
        why = (f"available: holds {gib(held)} per rank" if ok else f"the layers' weights "
               f"({gib(held)} per rank) exceed {HPZ_SHARE:.0%} of the memory available")
    if pinned in HPZ_OPTIONS and not ok:
        raise ValueError(f"hfcompress auto: weights={pinned} is pinned, but hpZ is not "
                         f"available here ({why}); pin weights=qwz or qwd instead")
    return ok, why


def choose_fsdp(model: nn.Module, modules: list[tuple[str, nn.Module]], topology: Topology,
                settings: AutoSettings, exact_patterns=("norm", "bias"), min_numel: int = 0,
                compute_s: float | None = None, replicas: Topology | None = None,
                resharding: LayerResharding | None = None) -> Choice:
    """Probe and choose the FSDP2 plan (weight all-gather, gradient hops) for ``model`` on
    its DP group ``topology``; ``replicas`` (native HSDP: the replica group's topology):
    its gradient all-reduce is chosen and priced too; ``resharding``: the layers' hpZ
    switch (the hpZ options are candidates where it is available and their weights fit)."""
    t0 = time.perf_counter()
    units, wdt, gdt, device = fsdp_units(model, modules, exact_patterns, min_numel)
    units = resharding.as_sharded(units) if resharding is not None else units
    x, y, w = topology.ranks_per_node, topology.num_nodes, topology.world_size
    layout = GroupLayout(w, x, wdt.itemsize, gdt.itemsize)
    check_same_layout(topology, *([replicas] if replicas else []))
    pins = _settings(settings, FSDP_ROLES + (DDP_ROLES if replicas else ()))
    hpz, hpz_why = hpz_available(resharding, units, wdt.itemsize, device, pins.get("weights"))
    plans = candidates("fsdp2", x, y, pins, hpz=hpz)
    links = probe_links(topology, fsdp_needs(layout), device, settings.reps)
    s = max(u.numel for u in units)
    sizes = {"weights": (s, wdt), "grad_intra": (y * s, gdt), "grad_inter": (s, gdt)}
    needed = {p.option(k): (k, *sizes[k]) for p in plans for k in sizes
              if p.option(k) != "exact"}
    codecs = _codecs(needed, w, device, settings.reps)
    n = min(s, CONTEXT_CAP)
    weights = {p.option("weights"): fresh("weights", p.option("weights")) for p in plans
               if p.option("weights") != "exact"}
    grads = {f"{p.grad_intra}+{p.grad_inter}": (fresh("grad_intra", p.grad_intra),
                                                fresh("grad_inter", p.grad_inter))
             for p in plans if (p.grad_intra, p.grad_inter) != ("exact", "exact")}
    timed = probe_collectives(topology, weights, grads, n, wdt, gdt, device, settings.reps)
    measured = collective_codec_seconds(timed, n, layout, links, codecs)

    kind, facts, shape = "fsdp2", links.to_dict(), {}
    if replicas is not None:
        kind, replica = "hsdp", GroupLayout(replicas.world_size, replicas.ranks_per_node,
                                            wdt.itemsize, gdt.itemsize)
        plans = [dataclasses.replace(p, all_reduce=a.all_reduce) for p in plans
                 for a in candidates("hsdp", replica.ranks_per_node, replica.nodes, pins)]
        rlinks = probe_links(replicas, ddp_needs(replica), device, settings.reps,
                             links_file=False)
        codecs.update(_codecs({p.all_reduce: ("all_reduce", s, gdt) for p in plans
                               if p.all_reduce != "exact"}, replica.world, device,
                              settings.reps))
        facts.update({f"replica:{k}": v for k, v in rlinks.to_dict().items()})
        shape = {"replicas": {**asdict(replica), "nodes": replica.nodes}}

    def cost_of(plan: Plan) -> Cost:
        if replicas is None:
            return fsdp_cost(plan, units, layout, links, codecs, measured)
        return hsdp_cost(plan, units, layout, links, replica, rlinks, codecs, measured)

    probe_s = time.perf_counter() - t0
    plan, rows = _decide(plans, cost_of, settings.margin, settings.overlap, compute_s)
    return Choice(kind, plan, rows, facts,
                  {**_codec_dict(codecs), **{k: {"ns_per_value": 1e9 * v}
                                             for k, v in measured.items()}},
                  {**asdict(layout), "nodes": layout.nodes, "units": len(units),
                   "values_per_rank": sum(u.numel + u.exact_numel for u in units),
                   "hpz": hpz_why, **shape},
                  pins, probe_s, settings.overlap)


def hsdp_cost(plan: Plan, units: list[Unit], layout: GroupLayout, links: ProbedLinks,
              replica: GroupLayout, rlinks: ProbedLinks, codecs: dict[str, CodecSeconds],
              measured: dict[str, float]) -> Cost:
    """Seconds per step of native HSDP under ``plan``: the shard group's FSDP2 collectives
    (:func:`~.cost_model.fsdp_cost`) and, per unit, the replica all-reduce of its gradient
    shard (FSDP2's all-reduce hook: one call per unit, its exact values exactly) on the
    replica group's probed links (:func:`~.cost_model.ddp_cost`)."""
    cost = fsdp_cost(plan, units, layout, links, codecs, measured)
    for u in units:
        for numel, p in ((u.numel, plan), (u.exact_numel, Plan())):
            if numel:
                part = ddp_cost(p, numel, replica, rlinks, codecs, bucket_bytes=4 * numel)
                for name, (wire, codec) in part.parts.items():
                    cost.add(name, wire, codec)
    return cost


def replica_config(config: CompressionConfig) -> CompressionConfig:
    """What the replica all-reduce of native HSDP runs under an ``auto`` plan's ``config``:
    its ``all_reduce`` option alone (``exact`` runs exactly, not the gradient scheme
    ``grad_inter`` a preset's all-reduce falls back to: ``integrations.ddp.ddp_scheme``), as
    :func:`hsdp_cost` priced it."""
    return dataclasses.replace(config, weights=None, grad_intra=None, grad_inter=None,
                               two_hop=False)


def choose_ddp(model: nn.Module, topology: Topology, group_size: int,
               settings: AutoSettings, compute_s: float | None = None) -> Choice:
    """Probe and choose the DDP all-reduce scheme for ``model``'s gradients."""
    t0 = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    numel = sum(p.numel() for p in params)
    layout = GroupLayout(group_size, topology.ranks_per_node, 4, 4)
    pins = _settings(settings, DDP_ROLES)
    plans = candidates("ddp", topology.ranks_per_node, topology.num_nodes, pins)
    links = probe_links(topology, ddp_needs(layout), device, settings.reps)
    needed = {p.all_reduce: ("all_reduce", numel, torch.float32) for p in plans
              if p.all_reduce != "exact"}
    codecs = _codecs(needed, group_size, device, settings.reps)
    probe_s = time.perf_counter() - t0
    plan, rows = _decide(plans, lambda p: ddp_cost(p, numel, layout, links, codecs),
                         settings.margin, settings.overlap, compute_s, BACKWARD_SHARE)
    return Choice("ddp", plan, rows, links.to_dict(), _codec_dict(codecs),
                  {**asdict(layout), "nodes": layout.nodes, "values": numel},
                  pins, probe_s, settings.overlap, cover_share=BACKWARD_SHARE)


def fresh(kind: str, option: str):
    """A new compressor of one option as the collectives build it (None = exact)."""
    scheme = OPTIONS[kind][option][0]
    return None if scheme is None else scheme.build()


def _codec_dict(codecs: dict[str, CodecSeconds]) -> dict[str, Any]:
    return {k: {"compress_ns_per_value": 1e9 * r.compress_s,
                "decompress_ns_per_value": 1e9 * r.decompress_s} for k, r in codecs.items()}


__all__ = ["Choice", "choose_ddp", "choose_fsdp", "replica_config"]
