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
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Sequence

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
    allowed) or it came from ``LOCAL_WORLD_SIZE`` or the whole world; ``source`` names
    which (:data:`SOURCES`; not compared)."""

    ranks_per_node: int
    explicit: bool
    source: str = field(default="ranks_per_node", compare=False)


#: where X came from: the user's value, torchrun's variable, or neither (the whole world)
SOURCES = ("ranks_per_node", "LOCAL_WORLD_SIZE", "world")
#: what SLURM says of the tasks per host (``srun`` sets no LOCAL_WORLD_SIZE)
SLURM_TASK_VARS = ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def node_split(world_size: int, ranks_per_node: int | NodeSplit | None = None) -> NodeSplit:
    """The node split of a world of ``world_size`` ranks from the value the user gave
    (None: ``LOCAL_WORLD_SIZE``, else one node); ValueError when X does not divide it. The
    one place that reads ``LOCAL_WORLD_SIZE``: pass the user's value on as given (None
    stays None), so a split taken from the environment never turns explicit. A
    ``NodeSplit`` (resolved once by ``apply`` / the Trainer) is checked and returned as is."""
    if isinstance(ranks_per_node, NodeSplit):
        _check_divides(world_size, ranks_per_node.ranks_per_node, ranks_per_node.source)
        return ranks_per_node
    source = "ranks_per_node"
    if ranks_per_node is None:
        env = os.environ.get("LOCAL_WORLD_SIZE")
        if env is None:
            return NodeSplit(world_size, explicit=False, source="world")
        source = "LOCAL_WORLD_SIZE"
        try:
            ranks_per_node = int(env)
        except ValueError:
            raise ValueError(f"LOCAL_WORLD_SIZE={env!r} is not an integer") from None
    _check_divides(world_size, ranks_per_node, source)
    return NodeSplit(ranks_per_node, explicit=source == "ranks_per_node", source=source)


def _check_divides(world_size: int, x: Any, source: str) -> None:
    """ValueError unless ``x`` (from ``source``) is a positive int dividing the world."""
    if isinstance(x, bool) or not isinstance(x, int) or x <= 0 or world_size % x:
        raise ValueError(
            f"world size {world_size} cannot be split into nodes of {source}={x!r} "
            f"ranks; ranks_per_node must divide the world size: one of "
            f"{', '.join(map(str, divisors(world_size)))}")


def resolve_ranks_per_node(world_size: int, ranks_per_node: int | None = None) -> int:
    """X alone (:func:`node_split`)."""
    return node_split(world_size, ranks_per_node).ranks_per_node


def hostname() -> str:
    """This process's host name (``HFCOMPRESS_HOSTNAME`` if set)."""
    return os.environ.get(HOSTNAME_ENV) or socket.gethostname()


def check_node_layout(hosts: list[str], ranks_per_node: int, explicit: bool,
                      source: str | None = None) -> None:
    """Check that nodes of ``ranks_per_node`` consecutive ranks match the ranks' ``hosts``;
    ``source``: where that number came from (:data:`SOURCES`; default: ``ranks_per_node``
    when ``explicit``, else ``LOCAL_WORLD_SIZE``), named in what it says.

    A node whose ranks run on several hosts (a cyclic placement, or a number larger than
    the ranks per host) raises ValueError: its "intra-node" hop would cross machines
    uncompressed or lightly compressed. A host holding several nodes is allowed when all
    ranks share one host and ``ranks_per_node`` is given (``explicit``: emulated nodes, one
    log line), else warned about (traffic inside the host is treated as inter-node)."""
    source = source or ("ranks_per_node" if explicit else "LOCAL_WORLD_SIZE")
    per_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        per_host.setdefault(h, []).append(r)
    _check_nodes_within_hosts(hosts, ranks_per_node, source, per_host)
    shared = {h: r for h, r in per_host.items() if len(r) > ranks_per_node}
    if not shared:
        return
    if explicit and len(per_host) == 1:
        logger.info("hfcompress: emulating %d nodes of %d ranks on 1 host(s) (ranks_per_node="
                    "%d given explicitly)", len(hosts) // ranks_per_node, ranks_per_node,
                    ranks_per_node)
        return
    h, ranks = next(iter(shared.items()))
    hosts_seen = "" if len(per_host) == 1 else f", though the job runs on {len(per_host)} hosts"
    unset = ", or leave it unset under torchrun" if explicit else ""
    warnings.warn(f"hfcompress: {source}={ranks_per_node} splits host {h!r} ({len(ranks)} "
                  f"ranks) into {len(ranks) // ranks_per_node} nodes{hosts_seen}, so traffic "
                  f"inside the host is compressed as inter-node traffic. Pass ranks_per_node="
                  f"{len(ranks)} for the real layout{unset}; ranks_per_node={ranks_per_node} "
                  f"emulates nodes on purpose on one host (if these are different machines "
                  f"with one host name, set {HOSTNAME_ENV})", UserWarning, stacklevel=3)


def _check_nodes_within_hosts(hosts: list[str], x: int, source: str,
                              per_host: dict[str, list[int]]) -> None:
    """ValueError when a node of ``x`` consecutive ranks spans several hosts, naming where
    ``x`` came from and the value to set instead."""
    nodes = [hosts[n * x:(n + 1) * x] for n in range(len(hosts) // x)]
    split = [(n, sorted(set(h))) for n, h in enumerate(nodes) if len(set(h)) > 1]
    if not split:
        return
    n, names = split[0]
    cyclic = len(per_host) > 1 and all(
        hosts[r] == hosts[r % len(per_host)] for r in range(len(hosts)))
    origin = f"{source}={x}" if source != "world" else \
        f"(neither ranks_per_node nor LOCAL_WORLD_SIZE is set, so all {len(hosts)} ranks " \
        f"are one node)"
    raise ValueError(
        f"hfcompress: node layout {origin} puts ranks {n * x}..{n * x + x - 1} in node {n}, "
        f"but they run on hosts {names} ({len(split)} of {len(nodes)} nodes span several "
        f"hosts; ranks per host: { {h: len(r) for h, r in per_host.items()} }). "
        + ("The ranks are placed round-robin over the hosts: launch them node-major (rank "
           "= node_rank * nproc_per_node + local_rank, as torchrun does) "
           if cyclic else "Number the ranks node-major (as torchrun does) ")
        + f"and {_what_to_set(per_host)}.")


def _what_to_set(per_host: dict[str, list[int]]) -> str:
    """The fix: ranks_per_node (or LOCAL_WORLD_SIZE) = the ranks per host, the number
    itself when every host runs as many, and what SLURM's variables say of it."""
    counts = {len(r) for r in per_host.values()}
    value = f"={counts.pop()}" if len(counts) == 1 else ""
    slurm = [f"{k}={os.environ[k]}" for k in SLURM_TASK_VARS if k in os.environ]
    return (f"set ranks_per_node{value} (or LOCAL_WORLD_SIZE{value}): the ranks per host"
            + (f" ({', '.join(slurm)})" if slurm else ""))


@dataclass(frozen=True)
class GroupLayout:
    """Where the ranks of one data-parallel group sit: ``ranks`` (global ranks, in group-rank
    order), ``ranks_per_node`` = x of them on each of the ``nodes`` (global node indices) the
    group spans, group rank ``i`` on ``nodes[i // x]`` with local index ``i % x``. The world
    group has x = X (the world's ranks per node); a DP group beside tensor / context
    parallelism inside a node has x = X / (tp * cp) (x = 1: no intra-node hop)."""

    ranks: tuple[int, ...]
    ranks_per_node: int
    nodes: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def intra(self) -> list[list[int]]:
        """Global ranks of each node's part of the group (the intra-node groups)."""
        x = self.ranks_per_node
        return [list(self.ranks[n * x:(n + 1) * x]) for n in range(self.num_nodes)]

    def inter(self) -> list[list[int]]:
        """Global ranks of each local index across the nodes (the inter-node groups)."""
        x = self.ranks_per_node
        return [list(self.ranks[l::x]) for l in range(x)]


def group_layout(ranks: Sequence[int], world_ranks_per_node: int) -> GroupLayout:
    """The node layout of a group of global ``ranks`` (group-rank order) in a world of
    ``world_ranks_per_node`` ranks per node (node = global rank // X): a pure function.
    ValueError when the group's ranks are not node-major or a node holds more of them than
    another (the 2-hop reduce-scatter and node-sharded references need x ranks on each of
    y nodes)."""
    ranks = tuple(int(r) for r in ranks)
    big_x = world_ranks_per_node
    if not ranks or len(set(ranks)) != len(ranks):
        raise ValueError(f"hfcompress: process group ranks {list(ranks)} must be distinct and "
                         f"non-empty")
    node = [r // big_x for r in ranks]
    if any(b < a for a, b in zip(ranks, ranks[1:])):   # new_group / DeviceMesh sort them
        raise ValueError(f"hfcompress: the data-parallel group's ranks {list(ranks)} are not in "
                         f"increasing global order (its intra-/inter-node groups number them "
                         f"so); build the group with dist.new_group or init_device_mesh")
    counts: dict[int, int] = {}
    for n in node:
        counts[n] = counts.get(n, 0) + 1
    if len(set(counts.values())) > 1:
        raise ValueError(
            f"hfcompress: the data-parallel group {list(ranks)} has a different number of "
            f"ranks on each node ({ {f'node {n}': c for n, c in counts.items()} }, nodes of "
            f"{big_x} ranks), so it has no intra-/inter-node layout. Put the tensor / context "
            f"parallel dims innermost in the device mesh (dims (dp_replicate, dp_shard, cp, "
            f"tp), tp * cp dividing the ranks per node) and set ranks_per_node (or "
            f"LOCAL_WORLD_SIZE) to the ranks per node")
    return GroupLayout(ranks, len(ranks) // len(counts), tuple(sorted(counts)))


def subgroups_to_build(groups: Sequence[Sequence[int]],
                       world_ranks_per_node: int) -> list[tuple[int, ...]]:
    """The intra- and inter-node groups to create for the data-parallel ``groups`` (every
    rank's, as gathered), in the one order every rank creates them (``new_group`` is
    collective over the world): each distinct group in sorted order, its intra-node groups,
    then its inter-node groups. A subgroup of one rank carries nothing and is left out (x = 1:
    no intra-node groups; one node: no inter-node groups), and one listed already is not
    repeated. A pure function: every group's layout is checked first (:func:`group_layout`
    raises the same ValueError on every rank, before any group is created)."""
    layouts = [group_layout(g, world_ranks_per_node) for g in sorted({tuple(g) for g in groups})]
    out: dict[tuple[int, ...], None] = {}      # ordered, without repeats
    for lay in layouts:
        out.update((r, None) for r in map(tuple, lay.intra() + lay.inter()) if len(r) > 1)
    return list(out)


class Topology:
    """The node layout of a data-parallel group (default: the world) and its process groups.

    Every rank constructs it once, with the same ``ranks_per_node`` as the user gave it (None:
    ``LOCAL_WORLD_SIZE``) or as resolved once (a ``NodeSplit``; :func:`node_split`): the
    world's X ranks per node. ``group``: the
    data-parallel group the collectives run on (FSDP2's shard group over a sub-mesh, e.g. the
    ``dp`` dim of a ``(dp, tp)`` mesh; None: the world). A member's node comes from its
    *global* rank (``global // X``, :meth:`node_of`); the group's own layout
    (:func:`group_layout`) gives ``ranks_per_node`` = x of its ranks per node (x = 1 beside
    TP filling the node) on ``num_nodes`` = y nodes, ``world_size`` = x * y and this rank's
    ``rank`` / ``node`` / ``local_rank`` in the group. ``intra_group`` (this rank's x ranks
    of its node) and ``inter_group`` (the group's ranks of its local index, one per node) are
    None when they would hold this rank alone (x = 1: no intra-node hop; one node: no
    inter-node hop; the DP group itself when that is one rank). Every rank gathers every
    rank's group and creates the subgroups of more than one rank of *all* of them, in one
    order (:func:`subgroups_to_build`), as globally synchronized ``new_group`` requires.
    ``timeout``: the groups' timeout (give the training group's, so a dead peer surfaces as
    an error in the same time; None: torch's default). The ranks'
    host names are gathered once, here, and checked against the world's layout
    (:func:`check_node_layout`).
    """

    def __init__(self, ranks_per_node: int | NodeSplit | None = None,
                 timeout: timedelta | None = None,
                 group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Topology needs torch.distributed to be initialized")
        self.global_world_size = dist.get_world_size()
        split = node_split(self.global_world_size, ranks_per_node)
        self.world_ranks_per_node = split.ranks_per_node
        hosts: list = [None] * self.global_world_size
        dist.all_gather_object(hosts, hostname())
        check_node_layout(hosts, split.ranks_per_node, split.explicit, split.source)
        group = group if group is not None else dist.group.WORLD
        mine = tuple(dist.get_process_group_ranks(group))
        every: list = [None] * self.global_world_size
        dist.all_gather_object(every, mine)
        # every group's layout is checked on every rank (all raise the same error) first
        built = {r: dist.new_group(list(r), timeout=timeout)     # the same order on every rank
                 for r in subgroups_to_build(every, split.ranks_per_node)}
        self.layout = group_layout(mine, split.ranks_per_node)
        self.group = group
        self.ranks = mine
        x = self.ranks_per_node = self.layout.ranks_per_node
        self.num_nodes = self.layout.num_nodes
        self.world_size = len(mine)
        self.rank = dist.get_rank(group)
        self.node, self.local_rank = divmod(self.rank, x)
        self.groups_per_node = split.ranks_per_node // x   # DP groups sharing a node's link
        self.timeout = timeout
        self.intra_group = self._subgroup(self.layout.intra()[self.node], built)
        self.inter_group = self._subgroup(self.layout.inter()[self.local_rank], built)

    def _subgroup(self, ranks: list[int], built: dict) -> dist.ProcessGroup | None:
        """The process group of ``ranks`` (this rank's intra- or inter-node group): built,
        or the DP group itself when it is that one rank, else None (this rank alone)."""
        ranks = tuple(ranks)
        return built.get(ranks, self.group if ranks == self.ranks else None)

    def node_of(self, global_rank: int) -> int:
        """The node of a *global* rank."""
        return global_rank // self.world_ranks_per_node

    def __repr__(self) -> str:
        sub = "" if self.world_size == self.global_world_size else \
            f", group={list(self.ranks)} of {self.global_world_size}"
        return (f"Topology(world_size={self.world_size}, ranks_per_node={self.ranks_per_node}, "
                f"num_nodes={self.num_nodes}, rank={self.rank}{sub})")
