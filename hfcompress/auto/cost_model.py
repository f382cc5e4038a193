"""The cost model of ``comm_compressor="auto"``: the communication time of one training step
under each :class:`~hfcompress.auto.candidates.Plan`, from the probed links and codec rates.

Per FSDP unit (one ``fully_shard``-ed module; ``numel`` values per rank, W ranks = Y nodes x
X ranks per node), the bytes each collective sends are what the collective declares for one
call (its ``traffic`` method, ``comm/traffic.py``, checked against the WireMeter by
``tests/test_traffic.py``), timed on the probed link of its primitive and group:

- weights: ``QuantizedAllGather.traffic`` in forward and (unless the unit stays gathered,
  e.g. the root) in backward, with the weights unchanged (qWD: node-sharded references,
  ``comm/reference_gather.py``); the codec: one batched decode of the rows a rank holds;
- gradients: ``QuantizedReduceScatter.traffic`` (exact: torch's ``reduce_scatter``, its own
  algorithm, timed by the probe) or ``TwoHopReduceScatter.traffic`` (ZeRO++ B.3, SDP4Bit
  Alg. 3); the codec: every value compressed and, as X payloads of Y rows, decompressed and
  summed in hop 1, the Y partial sums in hop 2;
- the exactly sent columns (norms, biases: ``exact_patterns``) as exact collectives.

DDP / HSDP: ``QuantizedAllReduce.traffic`` per bucket (exact: torch's ``all_reduce``;
``GloballyScaled``: the scales' MAX and the codes' SUM through the stock ``all_reduce``;
``TreeCombined``: an ``all_to_all`` of code chunks and an ``all_gather`` of the combined
ones, Global-QSGD 4.3).

``exposed = wire x (1 - overlap) + codec``: ``overlap`` is the share of the wire time the
framework hides behind compute (0 here: on CPU / gloo these collectives run in the step's
critical path; the slow-link benchmark measures how close that is). Codec work is never
hidden (it runs on the same device). The step time is ``compute + exposed``, with
``compute`` measured from the running job (``AutoController``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..comm.all_gather import QuantizedAllGather
from ..comm.all_reduce import QuantizedAllReduce
from ..comm.reduce_scatter import QuantizedReduceScatter
from ..comm.reference_gather import ShardedReferences
from ..comm.traffic import Phase, payload_bytes  # noqa: F401 (payload_bytes: tests)
from ..comm.two_hop import TwoHopReduceScatter
from ..compressors import Compressor
from ..compressors.base import ReferenceCoded
from ..compressors.registry import build_compressor
from ..integrations.fsdp import Unit  # noqa: F401 (the FSDP units integrations computes)
from .candidates import OPTIONS, Plan
from .probe import CodecRate, Links


@dataclass(frozen=True)
class Layout:
    world: int
    ranks_per_node: int
    weight_bytes: int = 2     # the all-gather dtype (bf16 under mixed precision)
    grad_bytes: int = 4       # the reduce-scatter dtype (fp32 reduction)

    @property
    def nodes(self) -> int:
        return self.world // self.ranks_per_node


@dataclass
class Cost:
    """Seconds per step: ``wire`` (on the links), ``codec`` (compress / decompress), per
    collective kind too (``parts``: ``{"weights": (wire, codec), ...}``)."""

    wire: float = 0.0
    codec: float = 0.0
    parts: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, wire: float = 0.0, codec: float = 0.0) -> None:
        self.wire += wire
        self.codec += codec
        part = self.parts.setdefault(kind, [0.0, 0.0])
        part[0] += wire
        part[1] += codec

    def exposed(self, overlap: float = 0.0) -> float:
        return self.wire * (1.0 - overlap) + self.codec


def scheme(kind: str, option: str, world: int) -> Compressor | None:
    """A compressor of one option built as the collectives build it (a globally scaled
    scheme sums over ``world`` peers); None = exact."""
    return build_compressor(OPTIONS[kind][option][0], 0, num_peers=world)


def built(kind: str, option: str, world: int) -> Compressor | None:
    """:func:`scheme` as it sends in steady state (its codec cost: ``Compressor.steady``)."""
    c = scheme(kind, option, world)
    return None if c is None else c.steady()


def wire_seconds(phases: list[Phase], layout: Layout, links: Links, calls: int = 1) -> float:
    """Seconds of ``calls`` calls of a collective declaring ``phases``, each phase on the
    probed link of its primitive and group (``intra`` / ``inter`` probed only when both
    hops exist: else the one non-trivial hop runs over the world group)."""
    both = layout.ranks_per_node > 1 and layout.nodes > 1
    return sum(links.seconds(p.primitive, p.group if both else "world", calls * p.nbytes,
                             calls) for p in phases)


def fsdp_needs(layout: Layout) -> list[tuple[str, str]]:
    """The ``(primitive, group)`` pairs an FSDP plan can use on this layout."""
    x, y = layout.ranks_per_node, layout.nodes
    need = [("all_gather", "world"), ("reduce_scatter", "world")]
    if x > 1 and y > 1:
        need += [("all_gather", "intra"), ("all_gather", "inter"),
                 ("all_to_all", "intra"), ("all_to_all", "inter")]
    else:
        need += [("all_to_all", "world")]
    return need


def ddp_needs(layout: Layout) -> list[tuple[str, str]]:
    return [("all_reduce", "world"), ("all_to_all", "world"), ("all_gather", "world")]


def fsdp_cost(plan: Plan, units: list[Unit], layout: Layout, links: Links,
              codecs: dict[str, CodecRate], measured: dict[str, float] | None = None) -> Cost:
    """Seconds per training step of the FSDP2 collectives under ``plan`` (module doc).
    ``measured``: codec seconds per value of a compressed collective as a whole
    (``weights:<option>``, ``grads:<intra>+<inter>``, from ``calibrate``), used instead of
    the kernels' rates."""
    measured = measured or {}
    grads_key = f"grads:{plan.grad_intra}+{plan.grad_inter}"
    w, x, y = layout.world, layout.ranks_per_node, layout.nodes
    wb, gb = layout.weight_bytes, layout.grad_bytes
    gather = scheme("weights", plan.weights, w)
    hop1 = scheme("grad_intra", plan.grad_intra, w)
    hop2 = scheme("grad_inter", plan.grad_inter, w)
    exact_grads = plan.grad_intra == "exact" and plan.grad_inter == "exact"
    cost = Cost()

    def add_codec(kind: str, key: str, numel: int, kernels: list[float]) -> None:
        """A collective's codec seconds: measured as a whole, else its kernels' (in turn)."""
        for seconds in [measured[key] * numel] if key in measured else kernels:
            cost.add(kind, codec=seconds)

    def gathers(u: Unit, numel: int, c: Compressor | None) -> float:
        forward = QuantizedAllGather.traffic(numel, x, y, c, wb)
        backward = QuantizedAllGather.traffic(numel, x, y, c, wb, unchanged=True)
        return wire_seconds(forward, layout, links) + \
            (wire_seconds(backward, layout, links) if u.backward_gather else 0.0)

    for u in units:
        s, e = u.numel, u.exact_numel
        cost.add("weights", wire=gathers(u, e, None) + gathers(u, s, gather))
        cost.add("grads", wire=wire_seconds(
            QuantizedReduceScatter.traffic(e, x, y, None, gb), layout, links))
        if gather is not None:   # one decode of the rows a rank holds
            rows = ShardedReferences.rows(w, x) if isinstance(gather, ReferenceCoded) else w
            add_codec("weights", f"weights:{plan.weights}", s,
                      [codecs[plan.weights].seconds(s, rows * s)])
        if exact_grads:
            cost.add("grads", wire=wire_seconds(
                QuantizedReduceScatter.traffic(s, x, y, None, gb), layout, links))
            continue
        cost.add("grads", wire=wire_seconds(
            TwoHopReduceScatter.traffic(s, x, y, hop1, hop2, gb), layout, links))
        kernels = []
        if x > 1 and hop1 is not None:   # hop 1: every row, X payloads of Y rows each way
            kernels.append(codecs[plan.grad_intra].seconds(w * s, w * s))
        if y > 1 and hop2 is not None:   # hop 2: the Y partial sums
            kernels.append(codecs[plan.grad_inter].seconds(y * s, y * s))
        add_codec("grads", grads_key, s, kernels)
    return cost


def calibrate(times: dict[str, float], numel: int, layout: Layout, links: Links,
              codecs: dict[str, CodecRate]) -> dict[str, float]:
    """Codec seconds per value of each compressed collective timed as a whole
    (``probe_collectives`` at ``numel`` values per rank): its time minus the wire time the
    links predict for it, at least what its kernels alone cost."""
    unit = [Unit("probe", numel, backward_gather=False)]
    out = {}
    for key, seconds in times.items():
        kind, option = key.split(":")
        plan = Plan(weights=option) if kind == "weights" else \
            Plan(grad_intra=option.split("+")[0], grad_inter=option.split("+")[1])
        part = "weights" if kind == "weights" else "grads"
        wire, kernels = fsdp_cost(plan, unit, layout, links, codecs).parts[part]
        out[key] = max(seconds - wire, kernels) / numel
    return out


def ddp_cost(plan: Plan, numel: int, layout: Layout, links: Links,
             codecs: dict[str, CodecRate], bucket_bytes: int = 25 << 20) -> Cost:
    """Seconds per training step of the DDP all-reduce of ``numel`` gradients (fp32 buckets
    of ``bucket_bytes``) under ``plan``."""
    buckets = max(1, math.ceil(numel * 4 / bucket_bytes))
    c = scheme("all_reduce", plan.all_reduce, layout.world)
    phases = QuantizedAllReduce.traffic(-(-numel // buckets), layout.ranks_per_node,
                                        layout.nodes, c, 4)
    cost = Cost()
    cost.add("all_reduce", wire=wire_seconds(phases, layout, links, buckets),
             codec=0.0 if c is None else codecs[plan.all_reduce].seconds(numel, numel))
    return cost
