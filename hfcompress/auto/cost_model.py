"""The cost model of ``comm_compressor="auto"``: the communication time of one training step
under each :class:`~hfcompress.auto.candidates.Plan`, from the probed links and codec rates.

Per FSDP unit (one ``fully_shard``-ed module; ``numel`` values per rank, W ranks = Y nodes x
X ranks per node), what each collective sends and computes, following the collectives in
``hfcompress/comm`` (their docstrings cite the papers):

- weight all-gather, exact: ``all_gather`` over the world of ``numel`` values in the weights'
  dtype, in forward and (unless the unit stays gathered, e.g. the root) in backward;
- qWD (SDP4Bit Alg. 2, node-sharded references, ``comm/reference_gather.py``): forward, an
  inter-node ``all_gather`` of the 4-bit differences, one batched decode of the Y rows and an
  intra-node ``all_gather`` of the rebuilt Y slots in the weights' dtype; backward, only that
  intra-node gather (X = 1: nothing);
- gradient reduce-scatter, exact: torch's ``reduce_scatter`` over the world (its own
  algorithm: the probe timed it, e.g. gloo's sends twice the minimal volume);
- 2-hop (ZeRO++ B.3, SDP4Bit Alg. 3, ``comm/two_hop.py``): an intra-node ``all_to_all`` of
  all W rows (compressed: every value compressed and, as X payloads of Y rows, decompressed
  and summed), then an inter-node ``all_to_all`` of the Y partial sums;
- the exactly sent columns (norms, biases: ``exact_patterns``) as exact collectives.

DDP / HSDP: one all-reduce of the gradients per bucket (exact: torch's ``all_reduce``;
``global_qsgd_block``: the codes' SUM through the stock ``all_reduce``; ``global_qsgd_exp``:
an ``all_to_all`` of code chunks and an ``all_gather`` of the combined ones, Global-QSGD 4.3).

``exposed = wire x (1 - overlap) + codec``: ``overlap`` is the share of the wire time the
framework hides behind compute (0 here: on CPU / gloo these collectives run in the step's
critical path; the slow-link benchmark measures how close that is). Codec work is never
hidden (it runs on the same device). The step time is ``compute + exposed``, with
``compute`` measured from the running job (``AutoController``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..compressors import Compressor
from ..compressors.base import TreeCombined
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


def payload_bytes(compressor: Compressor | None, numel: int, raw_bytes: int) -> float:
    """Bytes ``compressor`` sends for ``numel`` values (None: the values as they are)."""
    if compressor is None:
        return float(numel * raw_bytes)
    return compressor.wire_bits(numel) / 8.0


def built(kind: str, option: str, world: int) -> Compressor | None:
    """A compressor of one option as it sends in steady state (its payload sizes, its codec
    cost: ``Compressor.steady``), built as the collectives build it (a globally scaled
    scheme sums over ``world`` peers); None = exact."""
    c = build_compressor(OPTIONS[kind][option][0], 0, num_peers=world)
    return None if c is None else c.steady()


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
    both = x > 1 and y > 1        # else the one non-trivial hop runs over the world group
    intra, inter = ("intra", "inter") if both else ("world", "world")
    qwd = built("weights", plan.weights, w)
    hop1 = built("grad_intra", plan.grad_intra, w) if x > 1 else None
    hop2 = built("grad_inter", plan.grad_inter, w) if y > 1 else None
    cost = Cost()
    for u in units:
        s, e = u.numel, u.exact_numel
        gathers = 2 if u.backward_gather else 1
        cost.add("weights", wire=links.seconds("all_gather", "world", gathers * e * wb, gathers))
        cost.add("grads", wire=links.seconds("reduce_scatter", "world", w * e * gb))
        if qwd is None:
            cost.add("weights", wire=links.seconds("all_gather", "world", gathers * s * wb,
                                                   gathers))
        else:   # references node-sharded when X > 1: Y rows per rank, else all W
            rows = y if x > 1 else w
            if y > 1:
                cost.add("weights", wire=links.seconds("all_gather", inter,
                                                       payload_bytes(qwd, s, wb)))
            key = f"weights:{plan.weights}"
            cost.add("weights", codec=measured[key] * s if key in measured
                     else codecs[plan.weights].seconds(s, rows * s))
            if x > 1:
                cost.add("weights", wire=links.seconds("all_gather", intra,
                                                       gathers * y * s * wb, gathers))
        if plan.grad_intra == "exact" and plan.grad_inter == "exact":
            cost.add("grads", wire=links.seconds("reduce_scatter", "world", w * s * gb))
            continue
        if x > 1:   # hop 1: every row, X payloads of Y rows each way
            cost.add("grads", wire=links.seconds("all_to_all", intra,
                                                 x * payload_bytes(hop1, y * s, gb)))
            if hop1 is not None and grads_key not in measured:
                cost.add("grads", codec=codecs[plan.grad_intra].seconds(w * s, w * s))
        if y > 1:   # hop 2: the Y partial sums
            cost.add("grads", wire=links.seconds("all_to_all", inter,
                                                 y * payload_bytes(hop2, s, gb)))
            if hop2 is not None and grads_key not in measured:
                cost.add("grads", codec=codecs[plan.grad_inter].seconds(y * s, y * s))
        if grads_key in measured:
            cost.add("grads", codec=measured[grads_key] * s)
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
    w = layout.world
    buckets = max(1, math.ceil(numel * 4 / bucket_bytes))
    c = built("all_reduce", plan.all_reduce, w)
    cost = Cost()
    if c is None:
        cost.add("all_reduce", wire=links.seconds("all_reduce", "world", numel * 4, buckets))
        return cost
    nbytes = payload_bytes(c, numel, 4)
    codec = codecs[plan.all_reduce].seconds(numel, numel)
    scales = links.seconds("all_reduce", "world", 4 * buckets, buckets)
    if isinstance(c, TreeCombined):    # all-to-all of code chunks, all-gather of the sums
        wire = (links.seconds("all_to_all", "world", nbytes, buckets)
                + links.seconds("all_gather", "world", nbytes / w, buckets))
    else:
        wire = links.seconds("all_reduce", "world", nbytes, buckets)
    cost.add("all_reduce", wire=wire + scales, codec=codec)
    return cost
