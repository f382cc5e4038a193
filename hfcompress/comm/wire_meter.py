"""The one communication meter: bytes on the wire per collective (intra- / inter-node), the
uncompressed baseline, and the time spent in the collectives, per step.

- Sent bytes (``record`` / ``record_sends``, by the collectives of ``hfcompress.comm``): each
  rank counts what it sends itself, as direct sends: for every peer of the group, the bytes
  of this rank's data destined to that peer (its own slot is not sent). A peer on another
  node (``Topology.node_of``) makes them inter-node bytes. Under a ring or tree algorithm
  the totals are the same; only which links carry them may differ.
- Uncompressed baseline (``record_uncompressed``, by the framework integration, once per
  FSDP / DDP collective call): what the exact collective would send for the buffer the
  framework hands over, counted the same way, so with compression off the two agree to the
  byte.
- Per node and per data-parallel group (:func:`node_traffic`, a collective report): every
  rank's counts summed over the ranks of each node (what all the DP groups of a node send
  together over its link) and of each DP group.
- Time (``with meter.timed(device):``, around the same calls): host wall-clock on CPU, CUDA
  events on the current stream on GPU (read, and so synchronized, only by ``take_seconds``).
"""

from __future__ import annotations

import copy
import functools
import time
from typing import Sequence

import torch
import torch.distributed as dist

from .topology import Topology, resolve_ranks_per_node


def peer_is_remote(group: dist.ProcessGroup | None, topology: Topology | None
                   ) -> tuple[bool, ...]:
    """For each rank of ``group``: is it on another node than this rank? Worked out once per
    (group, topology): every collective call asks (the cache holds both, so their ids stay
    theirs)."""
    group = group or dist.group.WORLD
    # without a topology, nodes of LOCAL_WORLD_SIZE ranks (or one node), as it reads now
    x = resolve_ranks_per_node(dist.get_world_size()) if topology is None else 0
    key = (id(group), id(topology), x)
    hit = _REMOTE.get(key)
    if hit is None:
        node_of = topology.node_of if topology is not None else (lambda r: r // x)
        me = node_of(dist.get_rank())
        remote = tuple(node_of(r) != me for r in dist.get_process_group_ranks(group))
        hit = _REMOTE[key] = (group, topology, remote)
    return hit[2]


_REMOTE: dict[tuple[int, int, int], tuple] = {}


def rank_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(dist.get_rank(group), dist.get_world_size(group))``, read once per group (each
    call walks torch's group maps; every collective asks). The cache holds the group, so its
    id stays its own."""
    group = group if group is not None else dist.group.WORLD
    hit = _RANK_SIZE.get(id(group))
    if hit is None or hit[0] is not group:
        hit = _RANK_SIZE[id(group)] = (group, dist.get_rank(group), dist.get_world_size(group))
    return hit[1], hit[2]


_RANK_SIZE: dict[int, tuple] = {}


@functools.lru_cache(maxsize=None)
def peer_counts(remote: tuple[bool, ...], me: int) -> tuple[int, int]:
    """(peers on this node, peers on other nodes) of a group, ``me`` excluded."""
    peers = [r for k, r in enumerate(remote) if k != me]
    return peers.count(False), peers.count(True)


def sends(per_peer: int, remote: tuple[bool, ...], me: int) -> tuple[int, int]:
    """(intra, inter) bytes of sending ``per_peer`` bytes to every other rank of a group."""
    intra, inter = peer_counts(remote, me)
    return intra * per_peer, inter * per_peer


def uncompressed_sends(per_peer: int, group: dist.ProcessGroup | None,
                       topology: Topology | None) -> tuple[int, int]:
    """:func:`sends` of ``per_peer`` bytes to every other rank of ``group``, worked out once
    per (group, topology, bytes) where a topology places the nodes (an FSDP unit's calls
    repeat it every step); without one, as :func:`peer_is_remote` reads it now."""
    key = (id(group), id(topology), per_peer)
    hit = _UNCOMPRESSED.get(key) if topology is not None else None
    if hit is None:
        group = group if group is not None else dist.group.WORLD
        hit = (group, topology, sends(per_peer, peer_is_remote(group, topology),
                                      rank_size(group)[0]))
        if topology is not None:
            if len(_UNCOMPRESSED) >= 4096:
                _UNCOMPRESSED.clear()
            _UNCOMPRESSED[key] = hit
    return hit[2]


_UNCOMPRESSED: dict[tuple[int, int, int], tuple] = {}


class Timer:
    """Seconds inside ``with timer(device):`` blocks (CUDA: events on the current stream,
    resolved when read). Pairs of events whose end the GPU has passed are folded into the
    count at each new block (``Event.query()``: no host sync), so a loop that never calls
    ``take`` keeps only the pairs still in flight, not one per collective forever."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __call__(self, device: torch.device) -> _Timed:
        return _Timed(self, device)

    def _fold(self, block: bool) -> None:
        """Add the finished pairs (all of them, waiting for each, with ``block``)."""
        pending = []
        for start, end in self._events:
            if block:
                end.synchronize()
            elif not end.query():
                pending.append((start, end))
                continue
            self.seconds += start.elapsed_time(end) / 1000.0
        self._events = pending

    def take(self) -> float:
        """Seconds since the last ``take``; restarts the count (synchronizes CUDA events)."""
        self._fold(block=True)
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class _Timed:
    """One ``with timer(device):`` block (a class, not a generator: entered twice per FSDP
    unit and step)."""

    __slots__ = ("timer", "device", "cuda", "start")

    def __init__(self, timer: Timer, device: torch.device) -> None:
        self.timer, self.device, self.cuda = timer, device, device.type == "cuda"

    def __enter__(self) -> None:
        if self.cuda:
            self.timer._fold(block=False)
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record(torch.cuda.current_stream(self.device))  # device's, not the current
        else:
            self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            self.timer._events.append((self.start, end))
        else:
            self.timer.seconds += time.perf_counter() - self.start


class WireMeter:
    """Per-step byte counts: ``record`` during a step, ``step()`` closes it, ``summary()``.

    A step dict holds ``intra_bytes``, ``inter_bytes`` (sent), ``uncompressed_intra_bytes``,
    ``uncompressed_inter_bytes`` (the exact collectives' baseline) and ``collectives``.
    ``history`` keeps the last ``keep`` closed steps (a long run does not grow memory);
    ``steps`` and the totals count every closed step. ``timed`` / ``take_seconds``: time in
    the collectives."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self.timer = Timer()
        self.reset()

    def reset(self) -> None:
        """Forget every step, including the current one."""
        self.history: list[dict] = []
        self.steps = 0
        self._closed = _empty_step()
        self._current = _empty_step()

    def record(self, collective: str, intra_bytes: int, inter_bytes: int) -> None:
        _add(self._current, collective, int(intra_bytes), int(inter_bytes), 1)

    def record_uncompressed(self, per_peer_bytes: int | Sequence[int],
                            group: dist.ProcessGroup, topology: Topology | None) -> None:
        """Count what an exact collective over ``group`` sends to each of its peers (an int:
        the same to every peer); this rank's own slot is not sent."""
        if isinstance(per_peer_bytes, int):    # the peers of each kind, counted once
            intra, inter = uncompressed_sends(per_peer_bytes, group, topology)
            self._current["uncompressed_intra_bytes"] += intra
            self._current["uncompressed_inter_bytes"] += inter
            return
        remote, me = peer_is_remote(group, topology), rank_size(group)[0]
        for k, (b, r) in enumerate(zip(per_peer_bytes, remote)):
            if k != me:
                self._current["uncompressed_inter_bytes" if r else
                              "uncompressed_intra_bytes"] += int(b)

    def timed(self, device: torch.device):
        """``with meter.timed(device):`` adds the block's time to the collectives' time."""
        return self.timer(device)

    def take_seconds(self) -> float:
        """Seconds in the collectives since the last call (synchronizes CUDA events)."""
        return self.timer.take()

    def record_sends(self, collective: str, per_peer_bytes: int | Sequence[int],
                     remote: tuple[bool, ...], me: int) -> None:
        """Record sending ``per_peer_bytes[k]`` to group rank k (skipping ``me``; an int:
        the same to every peer)."""
        if isinstance(per_peer_bytes, int):    # the peers of each kind, counted once
            self.record(collective, *sends(per_peer_bytes, remote, me))
            return
        intra = sum(b for k, (b, r) in enumerate(zip(per_peer_bytes, remote)) if k != me and not r)
        inter = sum(b for k, (b, r) in enumerate(zip(per_peer_bytes, remote)) if k != me and r)
        self.record(collective, intra, inter)

    def current(self) -> dict:
        return copy.deepcopy(self._current)

    def step(self) -> dict:
        """Close the current step (kept in ``history``) and return its counts."""
        done, self._current = self._current, _empty_step()
        self.history.append(done)
        del self.history[:-self.keep]
        self.steps += 1
        _merge(self._closed, done)
        return _copy_step(done)

    def discard(self) -> None:
        """Drop the current step's counts and the time since the last ``take_seconds``
        (e.g. evaluation traffic between training steps)."""
        self._current = _empty_step()
        self.timer.take()

    def summary(self) -> dict:
        """``{"steps", "current", "last_step", "total"}``; every step dict holds
        ``intra_bytes``, ``inter_bytes``, ``uncompressed_intra_bytes``,
        ``uncompressed_inter_bytes`` and ``collectives: {name: {intra_bytes, inter_bytes,
        calls}}``. ``total`` covers the closed steps and the current one."""
        total = copy.deepcopy(self._closed)
        _merge(total, self._current)
        return {"steps": self.steps, "current": self.current(),
                "last_step": copy.deepcopy(self.history[-1]) if self.history else None,
                "total": total}


#: the byte counts of a step that :func:`node_traffic` sums
COUNTS = ("intra_bytes", "inter_bytes", "uncompressed_intra_bytes", "uncompressed_inter_bytes")


def node_traffic(meter: WireMeter, topology: Topology | None) -> dict:
    """The meter's byte counts of every rank of the world, summed per node and per
    data-parallel group: what the ranks of a node (one or more DP groups beside tensor
    parallelism) send together over its link, and what each group sends.

    Collective over the world (one ``all_gather_object``): every rank calls it, outside the
    training step. Returns, on every rank, ``{"nodes": {node: entry}, "groups": {ranks:
    entry}}`` (a group keyed by its tuple of global ranks), each ``entry`` =
    ``{"ranks": [global ranks], "last_step": counts, "total": counts}`` with ``counts`` the
    :data:`COUNTS` summed over those ranks: ``last_step`` of each rank's last closed step
    (zeros before the first), ``total`` as in :meth:`WireMeter.summary` (closed steps and the
    current one). A rank's node is ``topology.node_of``, its group ``topology.ranks``
    (``topology`` None: the world is the group, nodes as in :func:`peer_is_remote`)."""
    world, me = dist.get_world_size(), dist.get_rank()
    if topology is not None:
        node, group = topology.node_of(me), tuple(topology.ranks)
    else:
        node, group = me // resolve_ranks_per_node(world), tuple(range(world))
    summary = meter.summary()
    last = summary["last_step"] or _empty_step()
    mine = (me, node, group, [last[k] for k in COUNTS], [summary["total"][k] for k in COUNTS])
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    report: dict = {"nodes": {}, "groups": {}}
    for rank, its_node, its_group, step, total in every:
        for entry in (_report_entry(report["nodes"], its_node),
                      _report_entry(report["groups"], its_group)):
            entry["ranks"].append(rank)
            for k, a, b in zip(COUNTS, step, total):
                entry["last_step"][k] += a
                entry["total"][k] += b
    return report


def _report_entry(where: dict, key) -> dict:
    if key not in where:
        where[key] = {"ranks": [], "last_step": dict.fromkeys(COUNTS, 0),
                      "total": dict.fromkeys(COUNTS, 0)}
    return where[key]


def _add(step: dict, collective: str, intra: int, inter: int, calls: int) -> None:
    entry = step["collectives"].get(collective)
    if entry is None:
        entry = step["collectives"][collective] = _empty_entry()
    entry["intra_bytes"] += intra
    entry["inter_bytes"] += inter
    entry["calls"] += calls
    step["intra_bytes"] += intra
    step["inter_bytes"] += inter


def _merge(into: dict, step: dict) -> None:
    for name, e in step["collectives"].items():
        _add(into, name, e["intra_bytes"], e["inter_bytes"], e["calls"])
    for key in _BASELINE:
        into[key] += step[key]


def _empty_entry() -> dict:
    return {"intra_bytes": 0, "inter_bytes": 0, "calls": 0}


_BASELINE = ("uncompressed_intra_bytes", "uncompressed_inter_bytes")


def _copy_step(step: dict) -> dict:
    """A copy of a step's counts (ints in two levels of dicts: cheaper than deepcopy)."""
    return {**step, "collectives": {k: dict(e) for k, e in step["collectives"].items()}}


def _empty_step() -> dict:
    return {"intra_bytes": 0, "inter_bytes": 0, **dict.fromkeys(_BASELINE, 0),
            "collectives": {}}
