"""Node layout and the intra-/inter-node process groups (ZeRO++ B.3, SDP4Bit Alg. 3).

X ranks per node, Y nodes, ``global rank = node * X + local`` (how torchrun numbers ranks).
X comes from an explicit ``ranks_per_node`` (one machine emulating nodes), else from
``LOCAL_WORLD_SIZE``, else the whole world is one node.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resolve_ranks_per_node(world_size: int, ranks_per_node: int | None = None) -> int:
    """X for a world of ``world_size`` ranks; ValueError when X does not divide it."""
    source = "ranks_per_node"
    if ranks_per_node is None:
        env = os.environ.get("LOCAL_WORLD_SIZE")
        if env is None:
            return world_size
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
    return ranks_per_node


class Topology:
    """The node layout of the default (world) group and its process groups.

    Every rank constructs it once, with the same ``ranks_per_node``: it calls ``new_group``
    for every intra-node group (ranks ``n*X .. n*X+X-1``) and every inter-node group
    (ranks with the same local rank), in the same order on all ranks. ``timeout``: the
    groups' timeout (give the training group's, so a dead peer surfaces as an error in the
    same time; None: torch's default).
    """

    def __init__(self, ranks_per_node: int | None = None,
                 timeout: timedelta | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Topology needs torch.distributed to be initialized")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        x = self.ranks_per_node = resolve_ranks_per_node(self.world_size, ranks_per_node)
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
