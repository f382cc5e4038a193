"""The collectives of one training step, as the backend runs them: ONE enumeration, priced by
``auto``'s cost model (on the probed links of the running job, ``auto/cost_model.py``) and by
the planner (on a cluster's node links, ``cost/step_model.py``).

Per FSDP unit (``cost/units.Unit``: ``numel`` compressible and ``exact_numel`` exactly
sent values per DP rank), each :class:`Collective` is one call's :class:`Phase` s, as the
collective class declares them in its ``traffic`` staticmethod (``comm/traffic.py``, checked
against the WireMeter by ``tests/test_traffic.py``), with the codec work of that call:

- ``weights_fwd``: the forward all-gather (``QuantizedAllGather.traffic``; qWD: node-sharded
  references, ``comm/reference_gather.py``, SDP4Bit Alg. 2); the codec: one compress of the
  shard, one decode of the rows a rank holds;
- ``weights_bwd``: the backward all-gather, unless the unit stays gathered (the root,
  ``Unit.backward_gather``): the weights are unchanged since the forward (qWD rebuilds them
  from its references: an intra-node gather, no decode); with hpZ (ZeRO++ 3.3) an exact
  gather of the node's secondary partition over the intra-node group, none at all with one
  rank per node (``cost/units.hpz_reshard``);
- ``grads``: the reduce-scatter: exact (torch's own, ring), 1-hop all-to-all
  (``QuantizedReduceScatter``) or 2-hop (``TwoHopReduceScatter``: ZeRO++ B.3, SDP4Bit Alg. 3);
  the codec: hop 1 compresses every row and decodes X payloads of Y rows, hop 2 the Y partial
  sums (LoCo error feedback, Alg. 1, on the hops ``CompressionConfig.with_loco`` wraps);
- the exactly sent columns (norms, biases, ``exact_patterns``): with nothing compressed every
  column travels in the one exact call; the compressed collectives carry them on their own
  wire rows (``comm/riders.py``); only qWD's backward gather (unchanged weights, no
  differences to ride) leaves them to ``exact_bwd``, an exact all-gather of their own.

DDP presets (``all_reduce`` set): ``all_reduce``, ``QuantizedAllReduce.traffic`` per fp32
bucket of ``bucket_bytes``; ``exact_all_reduce`` for the exact columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..comm.all_gather import QuantizedAllGather
from ..comm.all_reduce import QuantizedAllReduce, summing_peers
from ..comm.reduce_scatter import QuantizedReduceScatter
from ..comm.reference_gather import ShardedReferences
from ..comm.traffic import Phase, gather
from ..comm.two_hop import TwoHopReduceScatter
from ..compressors import Compressor
from ..compressors.base import ReferenceCoded
from ..compressors.registry import build_compressor
from ..config import DDP_ROLES, GRAD_ROLES, CompressionConfig
from .hops import gradient_hops
from .units import Unit, hpz_reshard

BUCKET_BYTES = 25 << 20    # DDP's default bucket_cap_mb


@dataclass(frozen=True)
class Work:
    """Codec work of one call: ``compressed`` values compressed, ``decompressed`` values
    decoded (and summed) with the scheme of ``role`` (``config.ROLES``)."""

    role: str
    compressed: float
    decompressed: float


@dataclass(frozen=True)
class Collective:
    """One call of one collective of one unit (``calls`` equal calls: DDP's buckets)."""

    name: str                    # weights_fwd | weights_bwd | grads | exact_* | all_reduce
    phases: tuple[Phase, ...]
    numel: int                   # values per rank it carries (a codec rate per value's base)
    codec: tuple[Work, ...] = ()
    calls: int = 1
    two_hop: bool = False        # phases are a 2-hop reduce-scatter's: intra = hop 1

    @property
    def part(self) -> str:
        """``weights`` (all-gathers), ``grads`` (reduce-scatters) or ``all_reduce``."""
        if self.name.endswith("all_reduce"):
            return "all_reduce"
        return "weights" if self.name.endswith(("_fwd", "_bwd")) else "grads"


@dataclass(frozen=True)
class Senders:
    """The compressors one configuration builds for a DP group of ``world`` ranks,
    ``ranks_per_node`` per node (built once; LoCo wrapped around its hop)."""

    config: CompressionConfig
    world: int
    ranks_per_node: int
    weights: Compressor | None
    grad_intra: Compressor | None
    grad_inter: Compressor | None
    all_reduce: Compressor | None

    @classmethod
    def of(cls, config: CompressionConfig, world: int, ranks_per_node: int) -> Senders:
        try:
            peers = summing_peers(ranks_per_node, world // ranks_per_node)
            built = {k: build_compressor(getattr(config, k), 0, num_peers=peers)
                     for k in ("weights", *DDP_ROLES)}
            if config.all_reduce is None:
                grads = gradient_hops(config, ranks_per_node, num_peers=world)
            else:    # DDP: the all-reduce carries the gradients, LoCo around it
                grads = dict.fromkeys(GRAD_ROLES)
                if config.loco is not None:
                    built["all_reduce"] = config.loco.wrap(built["all_reduce"])
        except ValueError as e:
            raise ValueError(f"preset {config.name!r} cannot run on a data-parallel group of "
                             f"{world} ranks: {e}") from e
        return cls(config, world, ranks_per_node, **built, **grads)

    @property
    def ddp(self) -> bool:
        """A DDP / HSDP preset: its gradients go through the all-reduce."""
        return self.config.all_reduce is not None

    @property
    def grads_compressed(self) -> bool:
        return self.config.two_hop or self.grad_inter is not None


def _call(name: str, phases: list[Phase], numel: int, codec: list[Work] | None = None,
          **kw) -> list[Collective]:
    """The collective, or nothing when it sends nothing on this layout."""
    return [Collective(name, tuple(phases), numel, tuple(codec or ()), **kw)] if phases else []


def unit_collectives(s: Senders, unit: Unit, nodes: int, weight_bytes: int = 2,
                     grad_bytes: int = 4, chunks: int = 1) -> list[Collective]:
    """The FSDP2 collectives of one unit per training step (module docstring), ``nodes``
    = Y nodes of the DP group, ``chunks``: the 2-hop reduce-scatter's pipeline stages."""
    x, y, w = s.ranks_per_node, nodes, s.world
    n, e, wb, gb = unit.numel, unit.exact_numel, weight_bytes, grad_bytes
    c = s.weights
    out: list[Collective] = []
    # -- weights
    if c is None:
        out += _call("weights_fwd", QuantizedAllGather.traffic(n + e, x, y, None, wb), n + e)
    else:
        # the compressed gather carries the exact columns (comm/riders.py)
        rows = ShardedReferences.rows(w, x) if isinstance(c, ReferenceCoded) else w
        out += _call("weights_fwd", QuantizedAllGather.traffic(n, x, y, c, wb, exact=e), n,
                     [Work("weights", n, rows * n)])
    reshard = hpz_reshard(x, w) if s.config.hpz else True
    if unit.backward_gather and reshard is not False:
        if reshard is not True:      # hpZ: the node's secondary partition, exact, in the node
            out += _call("weights_bwd", [gather("intra", y * (n + e) * wb)], n + e)
        elif c is None:
            out += _call("weights_bwd", QuantizedAllGather.traffic(n + e, x, y, None, wb, True),
                         n + e)
        elif isinstance(c, ReferenceCoded):   # unchanged weights: no differences to ride
            out += _call("weights_bwd", QuantizedAllGather.traffic(n, x, y, c, wb, True), n)
            out += _call("exact_bwd",
                         QuantizedAllGather.traffic(e, x, y, None, wb, True) if e else [], e)
        else:
            out += _call("weights_bwd", QuantizedAllGather.traffic(n, x, y, c, wb, True, e), n,
                         [Work("weights", n, w * n)])
    # -- gradients
    if not s.grads_compressed:
        out += _call("grads", QuantizedReduceScatter.traffic(n + e, x, y, None, gb), n + e)
        return out
    if s.config.runs_two_hop(x):
        work = []
        if x > 1 and s.grad_intra is not None:   # hop 1: every row; X payloads of Y rows
            work.append(Work("grad_intra", w * n, w * n))
        if y > 1 and s.grad_inter is not None:   # hop 2: the Y partial sums
            work.append(Work("grad_inter", y * n, y * n))
        out += _call("grads", TwoHopReduceScatter.traffic(
            n, x, y, s.grad_intra, s.grad_inter, gb, chunks, exact=e), n, work, two_hop=True)
    else:     # the exact columns ride the compressed all-to-all (comm/riders.py)
        out += _call("grads", QuantizedReduceScatter.traffic(n, x, y, s.grad_inter, gb,
                                                             exact=e), n,
                     [Work("grad_inter", w * n, w * n)] if w > 1 else [])
    return out


def ddp_collectives(s: Senders, numel: int, exact_numel: int, nodes: int,
                    grad_bytes: int = 4, bucket_bytes: int = BUCKET_BYTES) -> list[Collective]:
    """The all-reduce of ``numel`` gradients (``exact_numel`` of them exactly) per step, in
    fp32 buckets of ``bucket_bytes`` (DDP's ``bucket_cap_mb``)."""
    x, y = s.ranks_per_node, nodes
    out: list[Collective] = []
    for name, values, c in (("all_reduce", numel, s.all_reduce),
                            ("exact_all_reduce", exact_numel, None)):
        if values <= 0:
            continue
        buckets = max(1, math.ceil(values * 4 / bucket_bytes))
        work = [] if c is None else [Work("all_reduce", values, values)]
        out += _call(name, QuantizedAllReduce.traffic(-(-values // buckets), x, y, c, grad_bytes),
                     values, work, calls=buckets)
    return out
