"""The cost model of ``comm_compressor="auto"``: the communication time of one training step
under each :class:`~hfcompress.auto.candidates.Plan`, from the probed links and codec rates.

The collectives and their bytes are the planner's (``cost/collectives.py``: one enumeration
of a step's per-unit collectives, each one call's phases as the collective class declares
them in its ``traffic`` method, ``comm/traffic.py``, checked against the WireMeter by
``tests/test_traffic.py``; with their codec work). Only the pricing differs from the
planner's (``cost/step_model.py``, node links of a cluster): here every phase is timed on the
probed link of its primitive and group in the running job (``probe.py``: ``latency + send
buffer / bandwidth``, fitted with every rank of a node sending at once, so the ring / direct
algorithm and the node's shared link are in the measurement), and the codec at this
device's measured kernel rates, or at the compressed collective's measured cost per value
(``collective_codec_seconds``):

- weights: the forward all-gather (qWD: node-sharded references, ``comm/reference_gather.py``)
  and, unless the unit stays gathered, the backward one (the weights unchanged); the codec:
  one batched decode of the rows a rank holds;
- gradients: torch's exact ``reduce_scatter``, or the 2-hop all-to-all (ZeRO++ B.3, SDP4Bit
  Alg. 3); the codec: every value compressed and, as X payloads of Y rows, decompressed and
  summed in hop 1, the Y partial sums in hop 2;
- the exactly sent columns (norms, biases: ``exact_patterns``) as exact collectives.

DDP / HSDP: ``QuantizedAllReduce.traffic`` per bucket (exact: torch's ``all_reduce``;
``GloballyScaled``: the scales' MAX and the codes' SUM through the stock ``all_reduce``;
``TreeCombined``: an ``all_to_all`` of code chunks and an ``all_gather`` of the combined
ones, Global-QSGD 4.3).

FSDP2: ``exposed = wire x (1 - overlap) + codec``: ``overlap`` is the share of the wire time
the framework hides behind compute (0 here: on CPU / gloo these collectives, and the two
hops of a 2-hop reduce-scatter, run in the step's critical path one after the other; the
slow-link benchmark measures how close that is; the planner's FSDP2 prefetch and 2-hop
pipelining rules are for NCCL on GPUs). DDP: the planner's ``ddp`` engine
(``cost/step_model.py``): the buckets' all-reduces hide behind backward
(``BACKWARD_SHARE`` of the compute, ``cover``) but the last bucket (``Cost.tail``):
``exposed = max(tail, wire x (1 - overlap) - cover) + codec``; before the compute is
measured (the first choice) nothing is taken as hidden. Codec work is never hidden (it runs
on the same device). The step time is ``compute + exposed``, with ``compute`` measured from
the running job (``AutoController``, :func:`compute_from_step`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..comm.traffic import Phase, payload_bytes  # noqa: F401 (payload_bytes: tests)
from ..compressors import Compressor
from ..compressors.registry import build_compressor
from ..cost.collectives import (BUCKET_BYTES, Collective, Senders, ddp_collectives,
                                unit_collectives)
from ..cost.units import Unit
from .candidates import OPTIONS, Plan
from .probe import CodecSeconds, ProbedLinks


@dataclass(frozen=True)
class GroupLayout:
    """The running job's DP group: ``world`` ranks, ``ranks_per_node`` on each node, and the
    bytes per value of its exact collectives."""

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
    tail: float = 0.0          # the wire time of the longest single call (DDP: a bucket)

    def add(self, kind: str, wire: float = 0.0, codec: float = 0.0, calls: int = 1) -> None:
        self.wire += wire
        self.codec += codec
        self.tail = max(self.tail, wire / max(1, calls))
        part = self.parts.setdefault(kind, [0.0, 0.0])
        part[0] += wire
        part[1] += codec

    def exposed(self, overlap: float = 0.0, cover: float = 0.0) -> float:
        """Seconds not hidden (module docstring): ``cover`` seconds of compute hide all but
        the last call (DDP's backward; 0: nothing hidden but ``overlap``)."""
        wire = self.wire * (1.0 - overlap)
        if cover > 0:
            wire = max(self.tail, wire - cover)
        return wire + self.codec


def compute_from_step(step_s: float, row: dict, overlap: float, cover_share: float) -> float:
    """The compute of a measured step that ran the plan of ``row`` (a choice's table row:
    ``wire_s``, ``codec_s``, ``tail_s``): the one solution of ``step = compute +
    exposed(compute)``, whose exposed part shrinks as ``cover_share`` x compute hides more
    buckets (:meth:`Cost.exposed`); at least 0."""
    wire, codec = row["wire_s"] * (1.0 - overlap), row["codec_s"]
    if cover_share <= 0:
        return max(step_s - wire - codec, 0.0)
    partly = (step_s - wire - codec) / (1.0 - cover_share)     # buckets beyond the tail
    if wire - cover_share * partly >= row["tail_s"]:
        return max(partly, 0.0)
    return max(step_s - row["tail_s"] - codec, 0.0)            # all but the last hidden


def scheme(kind: str, option: str, world: int) -> Compressor | None:
    """A compressor of one option built as the collectives build it (a globally scaled
    scheme sums over ``world`` peers); None = exact."""
    return build_compressor(OPTIONS[kind][option][0], 0, num_peers=world)


def built(kind: str, option: str, world: int) -> Compressor | None:
    """:func:`scheme` as it sends in steady state (its codec cost: ``Compressor.steady``)."""
    c = scheme(kind, option, world)
    return None if c is None else c.steady()


def wire_seconds(phases: list[Phase], layout: GroupLayout, links: ProbedLinks,
                 calls: int = 1) -> float:
    """Seconds of ``calls`` calls of a collective declaring ``phases``, each phase on the
    probed link of its primitive and group (``intra`` / ``inter`` probed only when both
    hops exist: else the one non-trivial hop runs over the world group)."""
    both = layout.ranks_per_node > 1 and layout.nodes > 1
    return sum(links.seconds(p.primitive, p.group if both else "world", calls * p.nbytes,
                             calls) for p in phases)


def fsdp_needs(layout: GroupLayout) -> list[tuple[str, str]]:
    """The ``(primitive, group)`` pairs an FSDP plan can use on this layout."""
    x, y = layout.ranks_per_node, layout.nodes
    need = [("all_gather", "world"), ("reduce_scatter", "world")]
    if x > 1 and y > 1:
        need += [("all_gather", "intra"), ("all_gather", "inter"),
                 ("all_to_all", "intra"), ("all_to_all", "inter")]
    else:
        need += [("all_to_all", "world")]
    return need


def ddp_needs(layout: GroupLayout) -> list[tuple[str, str]]:
    return [("all_reduce", "world"), ("all_to_all", "world"), ("all_gather", "world")]


def _price(cost: Cost, plan: Plan, collectives: list[Collective], layout: GroupLayout,
           links: ProbedLinks, codecs: dict[str, CodecSeconds],
           measured: dict[str, float]) -> None:
    """Add each collective's wire and codec seconds to ``cost`` under its part. ``measured``:
    codec seconds per value of a compressed collective as a whole (``weights:<option>``,
    ``grads:<intra>+<inter>``), used instead of its kernels' rates."""
    keys = {"weights": f"weights:{plan.option('weights')}",
            "grads": f"grads:{plan.grad_intra}+{plan.grad_inter}"}
    for c in collectives:
        key = keys.get(c.part)
        if c.codec and key in measured:
            codec = measured[key] * c.numel
        else:
            codec = sum(codecs[plan.option(w.role)].seconds(w.compressed, w.decompressed)
                        for w in c.codec)
        cost.add(c.part, wire=wire_seconds(list(c.phases), layout, links, c.calls), codec=codec,
                 calls=c.calls)


def fsdp_cost(plan: Plan, units: list[Unit], layout: GroupLayout, links: ProbedLinks,
              codecs: dict[str, CodecSeconds],
              measured: dict[str, float] | None = None) -> Cost:
    """Seconds per training step of the FSDP2 collectives under ``plan`` (module doc):
    the collectives ``cost/collectives.unit_collectives`` enumerates, on the probed links."""
    senders = Senders.of(plan.config(), layout.world, layout.ranks_per_node)
    cost = Cost()
    for u in units:
        _price(cost, plan, unit_collectives(senders, u, layout.nodes, layout.weight_bytes,
                                            layout.grad_bytes), layout, links, codecs,
               measured or {})
    return cost


def collective_codec_seconds(times: dict[str, float], numel: int, layout: GroupLayout,
                             links: ProbedLinks,
                             codecs: dict[str, CodecSeconds]) -> dict[str, float]:
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


def ddp_cost(plan: Plan, numel: int, layout: GroupLayout, links: ProbedLinks,
             codecs: dict[str, CodecSeconds], bucket_bytes: int = BUCKET_BYTES) -> Cost:
    """Seconds per training step of the DDP all-reduce of ``numel`` gradients (fp32 buckets
    of ``bucket_bytes``) under ``plan``."""
    senders = Senders.of(plan.config(), layout.world, layout.ranks_per_node)
    cost = Cost()
    _price(cost, plan, ddp_collectives(senders, numel, 0, layout.nodes, 4, bucket_bytes),
           layout, links, codecs, {})
    return cost
