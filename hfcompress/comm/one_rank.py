"""A test switch: run the compressed collectives' stages over a group of one rank.

Over one rank the compressed all-reduce (DDP hook, HSDP replica hook), reduce-scatter and
2-hop reduce-scatter have nothing to send and return before any stage. A one-GPU check then
cannot see whether their compress / exchange / decode stages are ordered after the caller's
stream. Inside :func:`compress_one_rank` they run every stage as with more ranks; their
exchanges are one-rank MAX / SUM / all-to-all / all-gather collectives (never AVG: NCCL's
one-rank AVG drops trailing values, NVIDIA/nccl#1950). Exact collectives keep their early
return. For checks only: in training it spends time and adds codec error to a one-rank run.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

_ON = False


@contextlib.contextmanager
def compress_one_rank() -> Iterator[None]:
    """Within the block, compressed collectives over one rank run all their stages."""
    global _ON
    saved, _ON = _ON, True
    try:
        yield
    finally:
        _ON = saved


def skips(world: int) -> bool:
    """A compressed collective over ``world`` ranks returns before any stage."""
    return world == 1 and not _ON
