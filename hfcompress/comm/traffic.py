"""What one call of a collective puts on the wire, declared by the collective itself.

Each collective class has a ``traffic(...)`` staticmethod: the :class:`Phase` s of one call
(steady state: a stateful scheme's later calls) on a layout of X ranks per node and Y nodes.
A phase is one primitive over one group (``world``, ``intra``: the X ranks of a node,
``inter``: the Y ranks of one local index), with this rank's send buffer (what
``auto/probe.py`` fits its links on) and the bytes sent to each peer of the group, counted
as :class:`~.wire_meter.WireMeter` counts them (direct sends; a peer on another node makes
inter-node bytes). ``tests/test_traffic.py`` checks every declaration against the meter on
real gloo processes; ``auto/cost_model.py`` times the phases on the probed links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..compressors.base import Compressor


@dataclass(frozen=True)
class Phase:
    primitive: str      # all_gather | all_to_all | reduce_scatter | all_reduce
    group: str          # world | intra | inter
    nbytes: float       # this rank's send buffer
    per_peer: float     # bytes the meter counts for each peer of the group

    def sent(self, ranks_per_node: int, nodes: int) -> tuple[float, float]:
        """(intra, inter) bytes this phase sends per rank."""
        local, remote = peers(self.group, ranks_per_node, nodes)
        return self.per_peer * local, self.per_peer * remote


def peers(group: str, ranks_per_node: int, nodes: int) -> tuple[int, int]:
    """(same-node, other-node) peers of a rank in ``group``."""
    x, y = ranks_per_node, nodes
    return {"world": (x - 1, (y - 1) * x), "intra": (x - 1, 0), "inter": (0, y - 1)}[group]


def group_size(group: str, ranks_per_node: int, nodes: int) -> int:
    return {"world": ranks_per_node * nodes, "intra": ranks_per_node, "inter": nodes}[group]


def sent(phases: Sequence[Phase], ranks_per_node: int, nodes: int) -> tuple[float, float]:
    """(intra, inter) bytes per rank of one call: what the meter records for it."""
    pairs = [p.sent(ranks_per_node, nodes) for p in phases]
    return sum(a for a, _ in pairs), sum(b for _, b in pairs)


def payload_bytes(compressor: Compressor | None, numel: int, itemsize: int) -> float:
    """Bytes ``compressor`` sends for ``numel`` values (None: the values, ``itemsize`` each)."""
    if compressor is None:
        return float(numel * itemsize)
    return compressor.wire_bits(numel) / 8.0


def gather(group: str, nbytes: float) -> Phase:
    """An all-gather of ``nbytes`` per rank: all of it to every peer."""
    return Phase("all_gather", group, nbytes, nbytes)


def exchange(group: str, ranks: int, per_row: float) -> Phase:
    """An all-to-all of one ``per_row``-byte row per group rank."""
    return Phase("all_to_all", group, ranks * per_row, per_row)


def stock_all_reduce(group: str, ranks: int, nbytes: float) -> Phase:
    """Torch's all-reduce of ``nbytes``, counted as reduce-scatter + all-gather of near-equal
    chunks: ``2 nbytes / ranks`` to each peer (exact per rank when the chunks are equal,
    the mean over the ranks otherwise)."""
    return Phase("all_reduce", group, nbytes, 2 * nbytes / ranks)
