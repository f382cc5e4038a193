"""What one :class:`~hfcompress.comm.traffic.Phase` puts on a node's network link and on a
GPU's intra-node link, by the algorithm NCCL really runs, beside what the WireMeter counts.

The meter counts direct sends (``Phase.sent``: every byte addressed to a peer on another node
is an inter-node byte). NCCL does not send that way for every primitive. For one DP group
of W = x * y ranks (x per node, y nodes), per call:

- all-gather / reduce-scatter (``chunk`` = ``per_peer``: one rank's share), ring: every rank
  passes W - 1 chunks to its ring neighbour; a node's ranks are consecutive on the ring, so
  one edge per node leaves it: **(W - 1) chunk** per node link (the meter: x * x (y - 1)
  chunk: 7.6x more at 8 x 16). Over the ``inter`` group (one rank per node, x such groups
  per node): x (y - 1) chunk. ``intra``: none. Intra-node, the busiest GPU (its ring edge
  stays in the node) sends (W - 1) chunk, (x - 1) chunk on the ``intra`` ring;
- all-to-all: direct sends, the meter's count: x ranks x (y - 1) x remote peers x
  ``per_peer`` over the world, x (y - 1) ``per_peer`` over ``inter``;
- all-reduce of n bytes: ring (reduce-scatter + all-gather), 2 (W - 1) / W n per node link
  and per GPU; NCCL's tree moves about the same bytes in fewer latency steps (not modelled:
  ring is the bandwidth-bound choice for large buckets).

Latency steps: a ring's W - 1 (all-reduce: 2 (W - 1)); a direct all-to-all's sends go out
at once (one step). All groups of a node run the same collective at the same time: the
caller multiplies the link bytes by k (``ClusterLayout.groups_per_node``); a GPU's intra
link is its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm.traffic import Phase, group_size

RING, DIRECT = "ring", "direct"


@dataclass(frozen=True)
class PhaseBytes:
    """One call of one phase, for one DP group: ``link`` inter-node bytes a node sends,
    ``meter`` what the WireMeter records for the node's x ranks, ``intra`` the intra-node
    bytes of the busiest GPU; ``steps`` latency steps; ``crosses``: over the network."""

    algorithm: str
    link: float
    meter: float
    intra: float
    steps: int
    crosses: bool


def phase_bytes(phase: Phase, ranks_per_node: int, nodes: int) -> PhaseBytes:
    """Bytes of one call of ``phase`` on a layout of x = ``ranks_per_node``, y = ``nodes``
    (module docstring)."""
    x, y = ranks_per_node, nodes
    size = group_size(phase.group, x, y)
    meter = x * phase.sent(x, y)[1]
    crosses = phase.group != "intra" and y > 1
    if phase.primitive == "all_to_all":
        local = x - 1 if phase.group != "inter" else 0
        return PhaseBytes(DIRECT, meter, meter, local * phase.per_peer, 1 if size > 1 else 0,
                          crosses)
    if phase.primitive == "all_reduce":
        per_rank, steps = 2 * (size - 1) / size * phase.nbytes, 2 * (size - 1)
    else:   # all_gather, reduce_scatter
        per_rank, steps = (size - 1) * phase.per_peer, size - 1
    if phase.group == "world":
        link = per_rank if y > 1 else 0.0
        intra = per_rank if x > 1 else 0.0
    elif phase.group == "inter":
        link, intra = x * per_rank, 0.0
    else:
        link, intra = 0.0, per_rank
    return PhaseBytes(RING, link, meter, intra, steps, crosses)
