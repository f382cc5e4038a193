"""The planner's price of one training step on a cluster: the collectives of
``cost/collectives.py`` on a node's links (``cost/link_bytes.py``), the codec at the GPU's
rates (``cost/codec_rates.py``), compute, and what the engine overlaps.

- **Wire**: per unit and collective, each phase takes ``steps x latency + max(link bytes x k
  / inter-node bandwidth, intra bytes / intra-node bandwidth)``: the k DP groups of a node
  share its link, a phase crossing nodes is as slow as the slower of its two parts; the
  phases of a call run one after the other, at the real (per-unit) message sizes.
- **2-hop gradients** (ZeRO++ F.1.2, SDP4Bit 3.2) are pipelined: the intra-node hop of unit
  i + 1 (or chunk c + 1) runs while the inter-node hop of unit i is on the network, on the
  other link: max(sum of hop 1, sum of hop 2) + the faster hop of the unit reduced first
  (the last decoder layer in forward order: backward starts there; the root, which FSDP2
  does not re-gather, reduces last).
- **Codec**: never hidden (it runs on the same GPU as the compute).
- **Engine** (:class:`Engine`, ``engine=``): what hides behind compute and how often each
  collective runs in an optimizer step of ``grad_accum`` micro-batches (compute: all of them).

  Overlap rule: the collectives an engine overlaps share the node's link and hide behind
  one compute (``cover`` of it: all of it, or backward's 2/3 for DDP, whose forward has
  nothing to reduce), per micro-batch: exposed = (grad_accum - 1) x max(0, E - c) +
  max(tail, E + O - c) + the rest, where c is one micro-batch's cover, E the overlapped
  collectives run every micro-batch (per micro-batch), O those run once per step (in the
  last one), and tail the gradient reduction of the last unit (bucket), which starts only
  when backward ends.

  ``"fsdp2"`` (FSDP2 under the HF Trainer / Accelerate): prefetching hides the weight
  all-gathers, and unit i's reduce-scatter runs while backward computes unit i - 1. Every
  micro-batch gathers each layer in forward and again in backward; the gradients are
  reduced once per step: the Trainer and ``Accelerator.accumulate`` run the accumulation
  micro-batches under ``Accelerator.no_sync``, which for FSDP2 calls
  ``set_requires_gradient_sync(False)`` (FSDP2 then skips ``foreach_reduce``, hfcompress's
  reduce-scatter included, and keeps the unsharded gradient).

  ``"fsdp2_each_batch"``: FSDP2 reducing every micro-batch (accelerate's
  ``sync_each_batch=True``, a loop without ``set_requires_gradient_sync``).

  ``"zero3"``: DeepSpeed ZeRO-3 as the ZeRO++ paper measured it: gathers and
  reduce-scatters every micro-batch, each layer gathered again in backward, nothing hidden
  (its published runs fit that best: BENCHMARKS.md, "Planner vs the papers' clusters",
  24 of 24 rows within 25%, against 9 in the column "overlapped as FSDP2").

  ``"megatron"``: Megatron-style data parallelism exposes everything (its gradient
  all-reduce / reduce-scatter after the last micro-batch's backward, its parameter
  all-gather before forward) and its distributed optimizer gathers the parameters once per
  step: no unit is gathered again in backward nor per micro-batch.

  ``"ddp"``: DistributedDataParallel (and Global-QSGD's setting): no gathers; every rank
  all-reduces the whole gradient in buckets of ``bucket_bytes`` (DDP's ``bucket_cap_mb``),
  each launched as backward finishes it: hidden behind backward (2/3 of the compute: 2 of
  the 6 x params x tokens FLOPs are forward) but the last bucket. Every preset runs its DDP
  form (``CompressionConfig.ddp_config``: ``all_reduce``, else ``grad_inter``); the
  training state is replicated, not sharded.

  **Pipeline parallelism** (``layout.pp`` > 1): the 1F1B bubble, (pp - 1) micro-batches'
  compute beside the step's ``grad_accum`` (Narayanan et al. 2021, 2.2: a bubble fraction
  (pp - 1) / (m + pp - 1) of the step), idle time that hides nothing; and the activations
  each stage sends to the next and their gradients back (``activation_bytes`` per
  micro-batch, direction and DP rank; the stages take whole nodes, so every byte crosses a
  node link), on the critical path: exposed.

  Step = compute + bubble + exposed + codec; the full-overlap limit = max(compute, wire) +
  bubble + codec.
- **Grouping**: units of equal shape have equal collectives: each shape is priced once and
  its sums multiplied by its count (the same numbers as a loop over the units, to rounding).
  The units come one by one or as ``(unit, count)`` pairs (``ModelShape.unit_counts``: a
  model of any depth priced at the cost of its distinct shapes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from ..comm.traffic import Phase
from ..config import ROLES, CompressionConfig, get_config
from .cluster import ClusterLayout
from .codec_rates import PER_CALL_S, default_rates, estimated, rate_key
from .collectives import BUCKET_BYTES, Collective, Senders, Work, ddp_collectives, unit_collectives
from .link_bytes import phase_bytes
from .links import ClusterLinks
from .state import all_reduce_state_bytes, estimate_state_bytes, total
from .units import Unit


@dataclass(frozen=True)
class Engine:
    """What a training engine does with a step's collectives (module docstring)."""

    name: str
    hides_gathers: bool               # prefetch overlaps the weight all-gathers with compute
    backward_gather: bool             # each layer gathered again in backward (ZeRO-3, FSDP2)
    gathers_per_micro_batch: bool     # every accumulation micro-batch gathers the weights
    reduces_per_micro_batch: bool     # every accumulation micro-batch reduces its gradients
    hides_reduces: bool = False       # the gradient reduction overlaps backward
    cover: float = 1.0                # the share of compute that hides overlapped ones
    replicated: bool = False          # DDP: all-reduce of the whole gradient, no sharding

    def times_per_step(self, part: str, grad_accum: int) -> int:
        """How often a collective of ``part`` (``Collective.part``) runs per optimizer step."""
        every = self.gathers_per_micro_batch if part == "weights" else \
            self.reduces_per_micro_batch
        return grad_accum if every else 1

    def overlaps(self, part: str) -> bool:
        """Whether a collective of ``part`` may hide behind compute."""
        return self.hides_gathers if part == "weights" else self.hides_reduces


#: the share of a step's compute that is backward (which DDP's buckets hide behind)
BACKWARD_SHARE = 2 / 3
ENGINE_SPECS = {
    "fsdp2": Engine("fsdp2", hides_gathers=True, backward_gather=True,
                    gathers_per_micro_batch=True, reduces_per_micro_batch=False,
                    hides_reduces=True),
    "fsdp2_each_batch": Engine("fsdp2_each_batch", hides_gathers=True, backward_gather=True,
                               gathers_per_micro_batch=True, reduces_per_micro_batch=True,
                               hides_reduces=True),
    "zero3": Engine("zero3", hides_gathers=False, backward_gather=True,
                    gathers_per_micro_batch=True, reduces_per_micro_batch=True),
    "megatron": Engine("megatron", hides_gathers=False, backward_gather=False,
                       gathers_per_micro_batch=False, reduces_per_micro_batch=False),
    "ddp": Engine("ddp", hides_gathers=False, backward_gather=False,
                  gathers_per_micro_batch=False, reduces_per_micro_batch=False,
                  hides_reduces=True, cover=BACKWARD_SHARE, replicated=True),
}
ENGINES = tuple(ENGINE_SPECS)
#: bytes per value of an exact collective's dtype (``hfcompress plan --gather-dtype`` /
#: ``--reduce-dtype``; ``weight_bytes`` / ``grad_bytes``)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def engine_spec(engine: str | Engine) -> Engine:
    """The :class:`Engine` of a name of :data:`ENGINES` (an Engine passes through)."""
    if isinstance(engine, Engine):
        return engine
    if engine not in ENGINE_SPECS:
        raise ValueError(f"engine={engine!r}: choose one of {', '.join(ENGINES)}")
    return ENGINE_SPECS[engine]


@dataclass
class CollectiveCost:
    """One collective of every unit, per optimizer step (``times_per_step`` calls each)."""

    name: str                 # weights_fwd | weights_bwd | grads | exact_* | all_reduce
    part: str                 # weights | grads | all_reduce (``Collective.part``)
    times_per_step: int       # grad_accum when the engine runs it every micro-batch, else 1
    algorithm: str            # "ring" | "direct" (all-to-all) | "2-hop" | "ring+..."
    link_bytes_per_node: float   # inter-node bytes one node sends (all k groups of the node)
    meter_bytes_per_node: float  # what hfcompress's WireMeter counts for the same
    intra_bytes_per_gpu: float
    wire_s: float
    codec_s: float
    overlappable: bool        # may hide behind compute under the engine
    calls: int = 1            # calls per run of it (DDP: its buckets)


@dataclass
class StepCost:
    """One optimizer step (all its micro-batches)."""

    preset: str
    collectives: list[CollectiveCost]
    compute_s: float
    wire_s: float             # all communication, serial
    exposed_s: float          # communication not hidden behind compute (engine's overlap)
    codec_s: float
    step_s: float             # compute_s + bubble_s + exposed_s + codec_s
    full_overlap_s: float     # the limit: max(compute_s, wire_s) + bubble_s + codec_s
    state_bytes_per_gpu: int  # compressor state (qWD references, LoCo errors, ...)
    bubble_s: float = 0.0     # the pipeline's 1F1B bubble
    #: rate key -> how its default rates were estimated (keys no GPU run measured)
    estimated_rates: dict[str, str] = dataclasses.field(default_factory=dict)


class _Pricer:
    """Seconds and bytes of collectives on one layout's links (cached per unit shape)."""

    def __init__(self, config: CompressionConfig, layout: ClusterLayout, links: ClusterLinks,
                 codec_rates: dict[str, float | tuple[float, float]] | None,
                 codec_scale: float = 1.0) -> None:
        self.x, self.y, self.k = layout.dp_per_node, layout.dp_nodes, layout.groups_per_node
        self.links = links
        loco = config.loco_hops(self.x) if config.loco is not None else ()
        given = codec_rates or {}
        self.rates = {}     # role -> (compress, weight decode, gradient decode-sum) values/s
        self.estimated: dict[str, str] = {}
        for role in ROLES:
            scheme = getattr(config, role)
            if scheme is None:
                continue
            key = rate_key(scheme, role in loco)
            rate = given.get(key, given.get(scheme.name))
            if isinstance(rate, tuple):     # measured (compress, decompress): hfcompress probe
                self.rates[role] = (rate[0], rate[1], rate[1])
            elif rate:
                self.rates[role] = (rate, rate, rate)
            else:
                self.rates[role] = tuple(codec_scale * r for r in default_rates(key))
                if (note := estimated(key)) is not None:
                    self.estimated[key] = note

    def phase(self, p: Phase) -> tuple[float, float, float, float, str]:
        """(link bytes of the node, meter bytes of the node, intra bytes per GPU, seconds,
        algorithm) of one call."""
        b = phase_bytes(p, self.x, self.y)
        link, meter = b.link * self.k, b.meter * self.k
        latency = (self.links.inter_latency_us if b.crosses else self.links.intra_latency_us)
        seconds = b.steps * latency * 1e-6 + max(link / self.links.inter_bytes_per_s,
                                                 b.intra / self.links.intra_bytes_per_s)
        return link, meter, b.intra, seconds, b.algorithm

    def codec(self, w: Work) -> float:
        """Seconds of one call's codec work (a gradient hop decodes by summing peers)."""
        compress, weight_decode, grad_decode = self.rates[w.role]
        decode = grad_decode if w.role.startswith("grad") else weight_decode
        return w.compressed / compress + w.decompressed / decode

    def collective(self, c: Collective) -> dict:
        """Bytes, seconds per hop, codec seconds and algorithm of ``c`` (its calls)."""
        out = {"link": 0.0, "meter": 0.0, "intra": 0.0, "hop1": 0.0, "hop2": 0.0,
               "algorithms": []}
        for p in c.phases:
            link, meter, intra, seconds, algorithm = self.phase(p)
            out["link"] += c.calls * link
            out["meter"] += c.calls * meter
            out["intra"] += c.calls * intra
            out["hop1" if c.two_hop and p.group == "intra" else "hop2"] += c.calls * seconds
            if algorithm not in out["algorithms"]:
                out["algorithms"].append(algorithm)
        # a compressed call lasts at least its host work (codec_rates.PER_CALL_S), which
        # runs while the device codes and sends: it shows only beyond codec + wire
        codec = sum(self.codec(w) for w in c.codec)
        floor = c.calls * PER_CALL_S - out["hop1"] - out["hop2"] if c.codec else 0.0
        out["codec"] = max(codec, floor)
        out["algorithm"] = "2-hop" if c.two_hop else "+".join(out["algorithms"])
        return out


Units = Sequence[Unit | tuple[Unit, int]]


def counted(units: Units) -> list[tuple[Unit, int]]:
    """``units`` (forward order) as ``(unit, count)`` pairs: a bare unit counts once."""
    return [u if isinstance(u, tuple) else (u, 1) for u in units]


def _unit_groups(units: list[tuple[Unit, int]]) -> tuple[dict[Unit, int], Unit | None]:
    """The units' shapes (name dropped) with their counts, in forward order of first
    appearance, and the shape backward reduces first: the last unit it gathers again (the
    last layer; the root, which FSDP2 does not re-gather, reduces last), else the first."""
    counts: dict[Unit, int] = {}
    first = None
    for u, n in units:
        key = Unit("", u.numel, u.exact_numel, u.backward_gather)
        counts[key] = counts.get(key, 0) + n
        if u.backward_gather or first is None:
            first = key
    return counts, first


def _collectives(senders: Senders, units: list[tuple[Unit, int]], nodes: int,
                 weight_bytes: int, grad_bytes: int, ddp: bool,
                 bucket_bytes: int) -> list[tuple[int, bool, list[Collective]]]:
    """Per unit shape (DDP: one list for the whole model): its count, whether backward
    reduces it first (:func:`_unit_groups`) and its collectives."""
    if ddp:
        w = senders.world
        return [(1, False, ddp_collectives(senders, w * sum(n * u.numel for u, n in units),
                                           w * sum(n * u.exact_numel for u, n in units),
                                           nodes, grad_bytes, bucket_bytes))]
    counts, first = _unit_groups(units)
    return [(count, key == first, unit_collectives(senders, key, nodes, weight_bytes,
                                                   grad_bytes))
            for key, count in counts.items()]


def price_step(config: CompressionConfig | str, units: Units, layout: ClusterLayout,
               links: ClusterLinks, *, compute_s: float, engine: str | Engine = "fsdp2",
               grad_accum: int = 1,
               codec_rates: dict[str, float | tuple[float, float]] | None = None,
               codec_scale: float = 1.0, weight_bytes: int = 2, grad_bytes: int = 4,
               bucket_bytes: int = BUCKET_BYTES, activation_bytes: int = 0) -> StepCost:
    """One optimizer step of ``grad_accum`` micro-batches of ``units`` (values per DP rank,
    forward order; units or ``(unit, count)`` pairs) under ``config`` (a preset name or a
    :class:`CompressionConfig`; DDP presets: the all-reduce of every gradient) on ``layout``
    / ``links``, with
    ``compute_s`` seconds of compute for the whole step (module docstring).
    ``weight_bytes`` / ``grad_bytes``: bytes per value of the exact all-gathers and
    reductions (bf16 / fp16: 2, fp32: 4). ``codec_rates``: values/s per rate key
    (``cost/codec_rates.rate_key``) or scheme name, for compress and decompress alike or
    a measured (compress, decompress) pair (``hfcompress probe``'s); a scheme without
    one: the H200's measured rates times ``codec_scale`` (``cost/gpus.py``).
    ``bucket_bytes``: DDP's bucket size (the ``ddp`` engine, DDP presets).
    ``activation_bytes``: what a pipeline stage sends per micro-batch, direction and DP rank
    (``ModelShape.activation_bytes``; module docstring)."""
    spec = engine_spec(engine)
    _check_grad_accum(grad_accum)
    config = get_config(config)
    if spec.replicated:
        config = config.ddp_config()
    units = counted(units)
    if not spec.backward_gather:     # parameters gathered once per step (module docstring)
        units = [(dataclasses.replace(u, backward_gather=False), n) for u, n in units]
    senders = Senders.of(config, layout.dp, layout.dp_per_node)
    pricer = _Pricer(config, layout, links, codec_rates, codec_scale)
    rows: dict[str, dict] = {}
    first_hops: tuple[float, float] | None = None     # of the unit backward reduces first
    ddp = spec.replicated or senders.ddp
    for count, first, colls in _collectives(senders, units, layout.dp_nodes, weight_bytes,
                                            grad_bytes, ddp, bucket_bytes):
        for c in colls:
            p = pricer.collective(c)
            row = rows.setdefault(c.name, {"algorithm": p["algorithm"], "link": 0.0,
                                           "meter": 0.0, "intra": 0.0, "hop1": 0.0,
                                           "hop2": 0.0, "codec": 0.0, "part": c.part,
                                           "two_hop": c.two_hop, "calls": 0})
            for key in ("link", "meter", "intra", "hop1", "hop2", "codec"):
                row[key] += count * p[key]
            row["calls"] += count * c.calls
            if c.two_hop and (first or first_hops is None):
                first_hops = (p["hop1"], p["hop2"])
    out = []
    for name, r in rows.items():
        if r["two_hop"]:   # pipelined: the slower hop, plus the first unit's faster one
            wire = max(r["hop1"], r["hop2"]) + min(first_hops)
        else:
            wire = r["hop1"] + r["hop2"]
        times = spec.times_per_step(r["part"], grad_accum)
        out.append(CollectiveCost(name, r["part"], times, r["algorithm"], times * r["link"],
                                  times * r["meter"], times * r["intra"], times * wire,
                                  times * r["codec"],
                                  spec.overlaps(r["part"]), r["calls"]))
    out += _pipeline_sends(layout, links, activation_bytes, grad_accum)
    return _step(config, out, compute_s, units, layout, weight_bytes, pricer.estimated, spec,
                 grad_accum)


def _check_grad_accum(grad_accum: int) -> None:
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise ValueError(f"grad_accum={grad_accum!r} must be an int >= 1 (micro-batches per "
                         f"optimizer step)")


def _state_bytes(config: CompressionConfig, units: list[tuple[Unit, int]],
                 layout: ClusterLayout, dtype: torch.dtype) -> int:
    """The compressor state per GPU (``estimate_state_bytes``, a sum over the units: each
    distinct size estimated once, times its count)."""
    sizes: dict[int, int] = {}
    for u, n in units:
        sizes[u.numel] = sizes.get(u.numel, 0) + n
    return sum(n * total(estimate_state_bytes(config, [numel], layout.dp, layout.dp_per_node,
                                              dtype)) for numel, n in sizes.items())


def _pipeline_sends(layout: ClusterLayout, links: ClusterLinks, activation_bytes: int,
                    grad_accum: int) -> list[CollectiveCost]:
    """The stage-to-stage sends of a step (module docstring): each of a node's x DP ranks
    sends ``activation_bytes`` forward and as many backward per micro-batch, over the
    node's link, one latency each."""
    if layout.pp == 1 or not activation_bytes:
        return []
    link = 2 * layout.dp_per_node * activation_bytes * grad_accum
    seconds = link / links.inter_bytes_per_s + 2 * grad_accum * links.inter_latency_us * 1e-6
    return [CollectiveCost("pipeline_sends", "activations", grad_accum, "p2p", link, 0.0, 0.0,
                           seconds, 0.0, False, 2 * grad_accum)]    # not hfcompress's: unmetered


def _exposed(colls: list[CollectiveCost], compute_s: float, spec: Engine,
             grad_accum: int) -> float:
    """Communication not hidden behind compute: the overlap rule (module docstring)."""
    hidden = [c for c in colls if c.overlappable]
    rest = sum(c.wire_s for c in colls if not c.overlappable)
    cover = spec.cover * compute_s / grad_accum
    every = sum(c.wire_s / grad_accum for c in hidden if c.times_per_step == grad_accum)
    once = sum(c.wire_s for c in hidden if c.times_per_step != grad_accum)
    tail = max((c.wire_s / c.times_per_step / max(1, c.calls) for c in hidden
                if c.part != "weights"), default=0.0)
    return (grad_accum - 1) * max(0.0, every - cover) + max(tail, every + once - cover) + rest


def _step(config: CompressionConfig, colls: list[CollectiveCost], compute_s: float,
          units: list[tuple[Unit, int]], layout: ClusterLayout, weight_bytes: int,
          estimated_rates: dict[str, str], spec: Engine, grad_accum: int) -> StepCost:
    wire = sum(c.wire_s for c in colls)
    exposed = _exposed(colls, compute_s, spec, grad_accum)
    bubble = _bubble(compute_s, layout, grad_accum)
    codec = sum(c.codec_s for c in colls)
    dtype = torch.bfloat16 if weight_bytes == 2 else torch.float32
    state = total(all_reduce_state_bytes(config, layout.dp * sum(n * u.numel for u, n in units),
                                         layout.dp_per_node, layout.dp_nodes, dtype)) \
        if spec.replicated else _state_bytes(config, units, layout, dtype)
    return StepCost(config.name, colls, compute_s, wire, exposed, codec,
                    compute_s + bubble + exposed + codec, max(compute_s, wire) + bubble + codec,
                    state, estimated_rates=estimated_rates, bubble_s=bubble)


def _bubble(compute_s: float, layout: ClusterLayout, grad_accum: int) -> float:
    """The 1F1B bubble: (pp - 1) micro-batches' compute (module docstring)."""
    return compute_s * (layout.pp - 1) / grad_accum


def compute_from_baseline(step_s: float, units: Units, layout: ClusterLayout,
                          links: ClusterLinks, *, engine: str | Engine = "fsdp2",
                          grad_accum: int = 1, weight_bytes: int = 2,
                          grad_bytes: int = 4, bucket_bytes: int = BUCKET_BYTES,
                          activation_bytes: int = 0) -> float:
    """Compute seconds of an optimizer step whose exact baseline (``none``) measured
    ``step_s`` (all ``grad_accum`` micro-batches): the largest compute whose priced step is
    at most ``step_s`` (the step grows with compute, flat where communication dominates;
    bisection), >= 0. When even no compute prices above ``step_s`` the modelled links are
    slower than the measurement allows (``price_step`` will then predict more than
    ``step_s``: fit the bandwidth instead)."""
    spec = engine_spec(engine)
    none = price_step("none", units, layout, links, compute_s=0.0, engine=spec,
                      grad_accum=grad_accum, weight_bytes=weight_bytes, grad_bytes=grad_bytes,
                      bucket_bytes=bucket_bytes, activation_bytes=activation_bytes)

    def step(compute: float) -> float:
        return compute + _bubble(compute, layout, grad_accum) + \
            _exposed(none.collectives, compute, spec, grad_accum)
    low, high = 0.0, max(0.0, step_s)
    if step(low) >= step_s:
        return 0.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if step(mid) <= step_s else (low, mid)
    return low
