"""``hfcompress probe``: measure the links of a job's real data-parallel groups at
its model's message sizes, and this device's codec rates, once, into the links file
(``cost/links_file.py``) that ``hfcompress plan --links`` and ``auto`` reuse.

Every rank of the world takes part (under torchrun / accelerate launch). The world is split
as :class:`~hfcompress.cost.cluster.ClusterLayout` splits it: nodes of X ranks, TP innermost,
so the DP group of TP index j holds the ranks j, j + tp, ...; k = tp of them share each
node's link. For the presets given, the phases of every unit's collectives
(``cost/collectives.py``) name the primitives and groups to time and their send buffers
(capped at ``max_bytes``): each ``primitive@group`` is timed at a 4 KiB latency point and at
its two largest (capped) sizes with ``probe.time_sizes``, all k groups at once (so they share
a node's link as in training), and fitted as ``latency + bytes / bandwidth``
(``probe.Fit``). A node link's effective bandwidth is what it carried per second: the bytes
NCCL's ring / direct algorithm puts on it (``cost/link_bytes.py``, times k) over the fitted
bandwidth time of the largest size, summed over the phases that cross nodes; the intra-node
one likewise from the phases that stay in a node (with x = 1, an all-gather over each node's
ranks). The codecs are the presets' schemes as they send in steady state
(``Compressor.steady``), timed by ``probe.codec_rate`` at the largest count a collective hands
them (capped). Every number is agreed (the slowest rank's), so every rank holds the same
result.
"""

from __future__ import annotations

import platform
import time
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from ..comm import Topology
from ..comm.topology import divisors, node_split
from ..comm.traffic import Phase, group_size
from ..config import get_config
from ..cost.cluster import ClusterLayout
from ..cost.codec_rates import rate_key
from ..cost.collectives import Senders, ddp_collectives, unit_collectives
from ..cost.link_bytes import phase_bytes
from ..cost.model_shape import ModelShape
from ..cost.units import Unit
from ..cost.links_file import VERSION
from .probe import SMALL_BYTES, Fit, agree, codec_rate, time_sizes

STAND_IN_VALUES = 1 << 20   # without a model: one unit of this many values per rank
WEIGHT_BYTES, GRAD_BYTES = 2, 4     # bf16 all-gathers, fp32 reduce-scatters (the planner's)
CODEC_BLOCK = 2048          # codec sizes are multiples of every scheme's group (qWD's 2048)


def probe_layout(world: int, shape: ModelShape | None, *, tp: int,
                 ranks_per_node: int | None, presets: list[str]
                 ) -> tuple[ClusterLayout, list[tuple[Unit, int]]]:
    """The layout a probe of ``world`` ranks measures and the ``(unit, count)`` pairs it
    times (``shape`` None: the stand-in unit), from the arguments alone: ValueError naming
    the fix for an unknown preset, a ``ranks_per_node`` that does not divide the world or a
    ``tp`` that does not divide it or the model, before any process group is made."""
    if not presets:
        raise ValueError("no preset to probe: name at least one, e.g. --presets sdp4bit")
    for name in presets:
        get_config(name)
    big_x = node_split(world, ranks_per_node).ranks_per_node
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or big_x % tp:
        raise ValueError(f"tp={tp!r} must divide the {big_x} ranks per node (TP stays inside "
                         f"a node): one of {', '.join(map(str, divisors(big_x)))}")
    layout = ClusterLayout(world // big_x, big_x, tp=tp)
    if shape is None:
        return layout, [(Unit("stand-in", STAND_IN_VALUES), 1)]
    return layout, shape.unit_counts(layout)


def dp_group(tp: int) -> dist.ProcessGroup:
    """This rank's data-parallel group: the ranks of its TP index (TP innermost); every
    rank creates all of them, in one order."""
    world = dist.get_world_size()
    groups = [dist.new_group(list(range(j, world, tp))) for j in range(tp)]
    return groups[dist.get_rank() % tp]


def node_group(ranks_per_node: int) -> dist.ProcessGroup:
    """All ranks of this rank's node (every rank creates every node's group)."""
    world, x = dist.get_world_size(), ranks_per_node
    groups = [dist.new_group(list(range(n, n + x))) for n in range(0, world, x)]
    return groups[dist.get_rank() // x]


def _work(presets: list[str], units: list[tuple[Unit, int]], layout: ClusterLayout
          ) -> tuple[dict[tuple[str, str], set[float]], dict[str, tuple[Any, int, torch.dtype]]]:
    """The send buffers of each (primitive, group) the presets' collectives run on
    ``layout`` (a group of the DP world when only one hop exists, as ``auto`` times it),
    and per rate key the steady compressor, the most values one call hands it, its dtype
    (``units``: ``(unit, count)`` pairs; a unit's count matters to DDP's one buffer only)."""
    x, y = layout.dp_per_node, layout.dp_nodes
    both = x > 1 and y > 1
    sizes: dict[tuple[str, str], set[float]] = defaultdict(set)
    codecs: dict[str, tuple[Any, int, torch.dtype]] = {}
    for name in presets:
        config = get_config(name)
        senders = Senders.of(config, layout.dp, x)
        loco = config.loco_hops(x) if config.loco is not None else ()
        if senders.ddp:
            colls = ddp_collectives(senders, layout.dp * sum(n * u.numel for u, n in units),
                                    layout.dp * sum(n * u.exact_numel for u, n in units), y)
        else:
            colls = [c for u, _ in units
                     for c in unit_collectives(senders, u, y, WEIGHT_BYTES, GRAD_BYTES)]
        for c in colls:
            for p in c.phases:
                sizes[(p.primitive, p.group if both else "world")].add(p.nbytes)
            for w in c.codec:
                key = rate_key(getattr(config, w.role), w.role in loco)
                dtype = torch.bfloat16 if w.role == "weights" else torch.float32
                most = max(int(w.compressed), codecs.get(key, (None, 0))[1])
                codecs[key] = (getattr(senders, w.role).steady(), most, dtype)
    return sizes, codecs


def probe_sizes(nbytes: set[float], max_bytes: int) -> tuple[int, int, int]:
    """(latency point, the two largest send buffers, capped at ``max_bytes``; a quarter of
    the largest when only one size remains)."""
    big = sorted({min(int(b), max_bytes) for b in nbytes if b > SMALL_BYTES})
    large = big[-1] if big else max_bytes
    mid = big[-2] if len(big) > 1 else max(large // 4, SMALL_BYTES + 1)
    return SMALL_BYTES, mid, large


def _phase(primitive: str, group: str, nbytes: int, ranks: int) -> Phase:
    """The phase of one probe call (``probe._primitive``'s buffers)."""
    per_peer = {"all_gather": nbytes, "all_reduce": 2 * nbytes / ranks}.get(
        primitive, nbytes // ranks)
    return Phase(primitive, group, nbytes, per_peer)


def _entry(fit: Fit, sizes: tuple[int, ...], seconds: list[float], phase: Phase, x: int,
           y: int, k: int) -> dict[str, Any]:
    """A fit's file entry, with what a node link / a GPU's intra link carried per second."""
    b = phase_bytes(phase, x, y)
    busy = phase.nbytes / fit.bytes_per_s      # the bandwidth part of the largest size's time
    out = {"latency_us": fit.latency_s * 1e6, "MB_per_s": fit.bytes_per_s / 1e6,
           "sizes_bytes": list(sizes), "seconds": seconds, "steps": b.steps,
           "algorithm": b.algorithm, "node_link_bytes": b.link * k, "gpu_intra_bytes": b.intra,
           "busy_s": busy}
    if b.link > 0:
        out["node_link_gbps"] = b.link * k * 8 / busy / 1e9
    elif b.intra > 0:
        out["gpu_intra_gbps"] = b.intra * 8 / busy / 1e9
    return out


def _effective(fits: dict[str, dict[str, Any]], kind: str) -> tuple[float | None, float | None]:
    """(Gbit/s, latency us per step) over the fits that load ``kind`` (``node_link`` /
    ``gpu_intra``): their bytes over their busy seconds; None when none does."""
    used = [f for f in fits.values() if f"{kind}_gbps" in f]
    if not used:
        return None, None
    gbps = sum(f[f"{kind}_bytes"] for f in used) * 8 / sum(f["busy_s"] for f in used) / 1e9
    steps = sum(f["steps"] for f in used)
    return gbps, sum(f["latency_us"] for f in used) / max(steps, 1)


def probe_cluster(shape: ModelShape | None, *, tp: int = 1, ranks_per_node: int | None = None,
                  presets: list[str], device: torch.device, max_bytes: int = 4 << 20,
                  reps: int = 3) -> dict[str, Any]:
    """Measure (module doc) and return the links file's content, the same on every rank.
    ``shape`` None: one stand-in unit of :data:`STAND_IN_VALUES` values per rank."""
    t0 = time.perf_counter()
    layout, units = probe_layout(dist.get_world_size(), shape, tp=tp,
                                 ranks_per_node=ranks_per_node, presets=presets)
    big_x = layout.gpus_per_node
    topology = Topology(ranks_per_node, group=dp_group(tp))
    x, y, k = layout.dp_per_node, layout.dp_nodes, layout.groups_per_node
    sizes, codecs = _work(presets, units, layout)
    groups = {"world": topology.group, "intra": topology.intra_group,
              "inter": topology.inter_group}
    plan = [(p, g, groups[g], probe_sizes(n, max_bytes)) for (p, g), n in sorted(sizes.items())]
    if x == 1 and big_x > 1:     # the DP group stays off the intra links: time the node's
        largest = max(n for *_, s in plan for n in s)
        plan.append(("all_gather", "node", node_group(big_x),
                     probe_sizes({largest}, max_bytes)))
    raw = time_sizes([(p, group, s) for p, _, group, s in plan], device, reps, dist.group.WORLD)
    fits = {}
    for i, (prim, gname, _, s) in enumerate(plan):
        seconds = raw[3 * i:3 * i + 3]
        lay = (big_x, 1, 1) if gname == "node" else (x, y, k)
        ranks = big_x if gname == "node" else group_size(gname, x, y)
        phase = _phase(prim, "intra" if gname == "node" else gname, s[-1], ranks)
        fits[f"{prim}@{gname}"] = _entry(Fit.from_points(*zip(s, seconds)), s, seconds,
                                         phase, *lay)
    inter, inter_latency = _effective(fits, "node_link")
    intra, intra_latency = _effective(fits, "gpu_intra")
    cap = max(CODEC_BLOCK, max_bytes // 4 // CODEC_BLOCK * CODEC_BLOCK)
    counts = {key: max(CODEC_BLOCK, min(n, cap) // CODEC_BLOCK * CODEC_BLOCK)
              for key, (_, n, _) in codecs.items()}
    rates = [codec_rate(c, counts[key], dtype, device, reps)
             for key, (c, _, dtype) in sorted(codecs.items())]
    flat = agree([v for r in rates for v in (r.compress_s, r.decompress_s)]
                 + [time.perf_counter() - t0], device)
    codec = {key: {"compress_values_per_s": 1 / flat[2 * i],
                   "decompress_values_per_s": 1 / flat[2 * i + 1], "values": counts[key],
                   "dtype": str(codecs[key][2]).replace("torch.", "")}
             for i, key in enumerate(sorted(codecs))}
    return {
        "version": VERSION,
        "layout": {"nodes": layout.nodes, "gpus_per_node": layout.gpus_per_node, "tp": tp,
                   "dp": layout.dp, "dp_per_node": x, "dp_nodes": y, "groups_per_node": k},
        "model": None if shape is None else shape.describe(),
        "presets": presets, "max_bytes": max_bytes, "reps": reps, "fits": fits,
        "inter_node_gbps": inter, "intra_node_gbps": intra,
        "inter_latency_us": inter_latency, "intra_latency_us": intra_latency,
        "codec_rates": codec, "device": device_name(device), "torch": torch.__version__,
        "probe_s": flat[-1],
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"
