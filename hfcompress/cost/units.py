"""FSDP units as the collectives see them, and hpZ's resharding: the facts the runtime
(``integrations/fsdp.py``) and the cost model share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """One FSDP unit as its collectives see it: values per rank (compressible ``numel``,
    exactly sent ``exact_numel``) and whether backward gathers it again (not the root, nor
    a unit sharded with ``reshard_after_forward=False``)."""

    name: str
    numel: int
    exact_numel: int = 0
    backward_gather: bool = True


def hpz_reshard(ranks_per_node: int, world: int) -> bool | int:
    """``reshard_after_forward`` for hpZ: the node's ranks hold the secondary partition
    (one rank per node: keep the full weights; one node: the primary partition is the node).
    ``ranks_per_node`` and ``world``: of the FSDP group (a DP group beside TP: its x and
    size)."""
    if ranks_per_node == 1:
        return False
    return True if ranks_per_node == world else ranks_per_node
