"""Bytes on the wire per collective, split into intra-node and inter-node, per step.

Each rank counts what it sends itself, as direct sends: for every peer of the group, the
bytes of this rank's data destined to that peer (its own slot is not sent). A peer on
another node (``Topology.node_of``) makes them inter-node bytes. Under a ring or tree
algorithm the totals are the same; only which links carry them may differ.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch.distributed as dist

from .topology import Topology, resolve_ranks_per_node


def peer_is_remote(group: dist.ProcessGroup | None, topology: Topology | None) -> list[bool]:
    """For each rank of ``group``: is it on another node than this rank?"""
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    x = topology.ranks_per_node if topology is not None else \
        resolve_ranks_per_node(dist.get_world_size())
    me = dist.get_rank() // x
    return [r // x != me for r in ranks]


class WireMeter:
    """Per-step byte counts: ``record`` during a step, ``step()`` closes it, ``summary()``.

    ``history`` keeps the last ``keep`` closed steps (a long run does not grow memory);
    ``steps`` and the totals count every closed step."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self.reset()

    def reset(self) -> None:
        """Forget every step, including the current one."""
        self.history: list[dict] = []
        self.steps = 0
        self._closed = _empty_step()
        self._current = _empty_step()

    def record(self, collective: str, intra_bytes: int, inter_bytes: int) -> None:
        _add(self._current, collective, int(intra_bytes), int(inter_bytes), 1)

    def record_sends(self, collective: str, per_peer_bytes: Sequence[int],
                     remote: Sequence[bool], me: int) -> None:
        """Record sending ``per_peer_bytes[k]`` to group rank k (skipping ``me``)."""
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
        return copy.deepcopy(done)

    def discard(self) -> None:
        """Drop the current step's counts (e.g. evaluation traffic between training steps)."""
        self._current = _empty_step()

    def summary(self) -> dict:
        """``{"steps", "current", "last_step", "total"}``; every step dict holds
        ``intra_bytes``, ``inter_bytes`` and ``collectives: {name: {intra_bytes, inter_bytes,
        calls}}``. ``total`` covers the closed steps and the current one."""
        total = copy.deepcopy(self._closed)
        _merge(total, self._current)
        return {"steps": self.steps, "current": self.current(),
                "last_step": copy.deepcopy(self.history[-1]) if self.history else None,
                "total": total}


def _add(step: dict, collective: str, intra: int, inter: int, calls: int) -> None:
    entry = step["collectives"].setdefault(collective, _empty_entry())
    entry["intra_bytes"] += intra
    entry["inter_bytes"] += inter
    entry["calls"] += calls
    step["intra_bytes"] += intra
    step["inter_bytes"] += inter


def _merge(into: dict, step: dict) -> None:
    for name, e in step["collectives"].items():
        _add(into, name, e["intra_bytes"], e["inter_bytes"], e["calls"])


def _empty_entry() -> dict:
    return {"intra_bytes": 0, "inter_bytes": 0, "calls": 0}


def _empty_step() -> dict:
    return {"intra_bytes": 0, "inter_bytes": 0, "collectives": {}}
