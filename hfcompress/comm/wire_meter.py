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
    """Per-step byte counts: ``record`` during a step, ``step()`` closes it, ``summary()``."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every step, including the current one."""
        self.history: list[dict] = []
        self._current = _empty_step()

    def record(self, collective: str, intra_bytes: int, inter_bytes: int) -> None:
        entry = self._current["collectives"].setdefault(collective, _empty_entry())
        entry["intra_bytes"] += int(intra_bytes)
        entry["inter_bytes"] += int(inter_bytes)
        entry["calls"] += 1
        self._current["intra_bytes"] += int(intra_bytes)
        self._current["inter_bytes"] += int(inter_bytes)

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
        return copy.deepcopy(done)

    def summary(self) -> dict:
        """``{"steps", "current", "last_step", "total"}``; every step dict holds
        ``intra_bytes``, ``inter_bytes`` and ``collectives: {name: {intra_bytes, inter_bytes,
        calls}}``. ``total`` covers the closed steps and the current one."""
        total = _empty_step()
        for s in [*self.history, self._current]:
            total["intra_bytes"] += s["intra_bytes"]
            total["inter_bytes"] += s["inter_bytes"]
            for name, e in s["collectives"].items():
                t = total["collectives"].setdefault(name, _empty_entry())
                for k in t:
                    t[k] += e[k]
        return {"steps": len(self.history), "current": self.current(),
                "last_step": copy.deepcopy(self.history[-1]) if self.history else None,
                "total": total}


def _empty_entry() -> dict:
    return {"intra_bytes": 0, "inter_bytes": 0, "calls": 0}


def _empty_step() -> dict:
    return {"intra_bytes": 0, "inter_bytes": 0, "collectives": {}}
