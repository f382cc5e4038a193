"""Node layout and the intra-/inter-node process groups (ZeRO++ B.3, SDP4Bit Alg. 3).

X ranks per node, Y nodes, ``global rank = node * X + local`` (how torchrun numbers ranks).
X comes from an explicit ``ranks_per_node`` (one machine emulating nodes), else from
``LOCAL_WORLD_SIZE``, else the whole world is one node: :func:`node_split` resolves it and
records which. :class:`Topology` checks that layout against the ranks' host names once, when
it is built (:func:`check_node_layout`).
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

logger = logging.getLogger(__name__)

#: Overrides ``socket.gethostname()`` for the node-layout check (a test seam: lets one machine
#: play several hosts; read only by :func:`hostname`).
HOSTNAME_ENV = "HFCOMPRESS_HOSTNAME"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class NodeSplit:
    """X ranks per node, and whether the user gave it (``explicit``: emulated nodes are
    allowed) or it came from ``LOCAL_WORLD_SIZE`` or the whole world."""

    ranks_per_node: int
    explicit: bool


def node_split(world_size: int, ranks_per_node: int | None = None) -> NodeSplit:
    """The node split of a world of ``world_size`` ranks from the value the user gave
    (None: ``LOCAL_WORLD_SIZE``, else one node); ValueError when X does not divide it. The
    one place that reads ``LOCAL_WORLD_SIZE``: pass the user's value on as given (None
    stays None), so a split taken from the environment never turns explicit."""
    source = "ranks_per_node"
    if ranks_per_node is None:
        env = os.environ.get("LOCAL_WORLD_SIZE")
        if env is None:
            return NodeSplit(world_size, explicit=False)
        source = "LOCAL_WORLD_SIZE"
        try:
            ranks_per_node = int(env)
        except ValueError:
            raise ValueError(f"LOCAL_WORLD_SIZE={env!r} is not an integer") from None
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) \
            or ranks_per_node <= 0 or world_size % ranks_per_node:
        raise ValueError(
            f"world size {world_size} cannot be split into nodes of {source}={ranks_per_node!r} "
            f"ranks; ranks_per_node must divide the world size: one of "
            f"{', '.join(map(str, divisors(world_size)))}")
    return NodeSplit(ranks_per_node, explicit=source == "ranks_per_node")


def resolve_ranks_per_node(world_size: int, ranks_per_node: int | None = None) -> int:
    """X alone (:func:`node_split`)."""
    return node_split(world_size, ranks_per_node).ranks_per_node


def hostname() -> str:
    """This process's host name (``HFCOMPRESS_HOSTNAME`` if set)."""
    return os.environ.get(HOSTNAME_ENV) or socket.gethostname()


def check_node_layout(hosts: list[str], ranks_per_node: int, explicit: bool) -> None:
    """Check that nodes of ``ranks_per_node`` consecutive ranks match the ranks' ``hosts``.

    A node whose ranks run on several hosts (a cyclic placement, or a ``ranks_per_node`` /
    ``LOCAL_WORLD_SIZE`` larger than the ranks per host) raises ValueError: its "intra-node"
    hop would cross machines uncompressed or lightly compressed. A host holding several
    nodes is allowed when ``ranks_per_node`` is given (``explicit``: emulated nodes, one log
    line), else warned about (traffic inside the host is treated as inter-node)."""
    x, world = ranks_per_node, len(hosts)
    source = "ranks_per_node" if explicit else "LOCAL_WORLD_SIZE"
    nodes = [hosts[n * x:(n + 1) * x] for n in range(world // x)]
    split = [(n, sorted(set(h))) for n, h in enumerate(nodes) if len(set(h)) > 1]
    per_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        per_host.setdefault(h, []).append(r)
    if split:
        n, names = split[0]
        cyclic = len(per_host) > 1 and all(
            hosts[r] == hosts[r % len(per_host)] for r in range(world))
        raise ValueError(
            f"hfcompress: node layout {source}={x} puts ranks {n * x}..{n * x + x - 1} in node "
            f"{n}, but they run on hosts {names} ({len(split)} of {len(nodes)} nodes span "
            f"several hosts; ranks per host: "
            f"{ {h: len(r) for h, r in per_host.items()} }). "
            + ("The ranks are placed round-robin over the hosts: launch them node-major (rank "
               "= node_rank * nproc_per_node + local_rank, as torchrun does) "
               if cyclic else "Number the ranks node-major (as torchrun does) ")
            + f"and set ranks_per_node (or LOCAL_WORLD_SIZE) to the ranks per host.")
    shared = {h: r for h, r in per_host.items() if len(r) > x}
    if not shared:
        return
    if explicit:
        logger.info("hfcompress: emulating %d nodes of %d ranks on %d host(s) (ranks_per_node="
                    "%d given explicitly)", world // x, x, len(per_host), x)
    else:
        h, ranks = next(iter(shared.items()))
        warnings.warn(f"hfcompress: LOCAL_WORLD_SIZE={x} splits host {h!r} ({len(ranks)} ranks) "
                      f"into {len(ranks) // x} nodes, so traffic inside the host is compressed "
                      f"as inter-node traffic. Pass ranks_per_node={len(ranks)} for the real "
                      f"layout, or ranks_per_node={x} to emulate nodes on purpose (if these "
                      f"are different machines with one host name, set {HOSTNAME_ENV})",
                      UserWarning, stacklevel=3)


class Topology:
    """The node layout of the default (world) group and its process groups.

    Every rank constructs it once, with the same ``ranks_per_node`` as the user gave it (None:
    ``LOCAL_WORLD_SIZE``; :func:`node_split`): it calls ``new_group`` for every intra-node
    group (ranks ``n*X .. n*X+X-1``) and every inter-node group (ranks with the same local
    rank), in the same order on all ranks. ``timeout``: the
    groups' timeout (give the training group's, so a dead peer surfaces as an error in the
    same time; None: torch's default). The ranks' host names are gathered once, here, and
    checked against the layout (:func:`check_node_layout`).
    """

    def __init__(self, ranks_per_node: int | None = None,
                 timeout: timedelta | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Topology needs torch.distributed to be initialized")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        split = node_split(self.world_size, ranks_per_node)
        x = self.ranks_per_node = split.ranks_per_node
        hosts: list = [None] * self.world_size
        dist.all_gather_object(hosts, hostname())
        check_node_layout(hosts, x, split.explicit)
        y = self.num_nodes = self.world_size // x
        self.node, self.local_rank = divmod(self.rank, x)
        self.group = dist.group.WORLD
        self.timeout = timeout
        intra = [dist.new_group([n * x + l for l in range(x)], timeout=timeout)
                 for n in range(y)]
        inter = [dist.new_group([n * x + l for n in range(y)], timeout=timeout)
                 for l in range(x)]
        self.intra_group = intra[self.node]
        self.inter_group = inter[self.local_rank]

    def node_of(self, global_rank: int) -> int:
        return global_rank // self.ranks_per_node

    def __repr__(self) -> str:
        return (f"Topology(world_size={self.world_size}, ranks_per_node={self.ranks_per_node}, "
                f"num_nodes={self.num_nodes}, rank={self.rank})")
