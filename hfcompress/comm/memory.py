"""Compressor state per rank: the estimate before it is allocated, and the check on CUDA.

State a rank keeps between steps (``state_bytes()`` of the collectives measures it):

- ``references``: qWD's w~ (SDP4Bit Alg. 2) for the slots this rank holds, in the weights'
  dtype: ``Y = world / ranks_per_node`` slots of each unit's shard with node-sharded
  references (``reference_gather.py``), all ``world`` slots with one rank per node;
- ``errors``: LoCo's 8-bit error (LoCo 3.2) of everything this rank sends on the first
  gradient hop, i.e. its whole local (unsharded) gradient: one uint8 code per value, padded
  to groups of 128 per part, plus a float32 scale per group (int8 codes only with a fixed
  ``error_scale``);
- ``buffers``: nothing persistent (payload and gather buffers live for one call).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..config import CompressionConfig, get_config

#: presets that keep no per-rank state proportional to the model (no qWD, no LoCo)
LEAN_PRESETS = ("zeropp", "tlq_hs")
ERROR_GROUP = 128


def _loco_bytes(parts: int, width: int, error_scale: Any) -> int:
    if error_scale != "group":
        return parts * width
    padded = -(-width // ERROR_GROUP) * ERROR_GROUP
    return parts * (padded + 4 * (padded // ERROR_GROUP))


def estimate_state_bytes(config: CompressionConfig | str, shard_numels: Sequence[int],
                         world: int, ranks_per_node: int, dtype: torch.dtype,
                         shard_references: bool = True) -> dict[str, int]:
    """Compressor state per rank, by kind, for FSDP units whose compressed shards hold
    ``shard_numels[i]`` values per rank (the all-gather input), gathered in ``dtype``."""
    config = get_config(config)
    x, item = ranks_per_node, dtype.itemsize
    y = world // x
    refs = errors = 0
    qwd = config.weights is not None and config.weights.name == "qwd"
    for s in shard_numels:
        if qwd:
            rows = y if shard_references and x > 1 else world
            refs += rows * s * item
        if config.loco is not None and world > 1:
            parts, width = (x, y * s) if config.two_hop and x > 1 else (world, s)
            errors += _loco_bytes(parts, width, config.loco.error_scale)
    return {"references": refs, "errors": errors, "buffers": 0}


def total(state: dict[str, int]) -> int:
    return sum(state.values())


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def check_fits(config: CompressionConfig | str, shard_numels: Sequence[int], world: int,
               ranks_per_node: int, dtype: torch.dtype, device: torch.device) -> dict[str, int]:
    """The estimate; on CUDA, a ValueError naming lighter presets when it exceeds the free
    device memory (before anything is allocated)."""
    config = get_config(config)
    need = estimate_state_bytes(config, shard_numels, world, ranks_per_node, dtype)
    if device.type != "cuda" or total(need) == 0:
        return need
    free, _ = torch.cuda.mem_get_info(device)
    if total(need) > free:
        fits = [p for p in LEAN_PRESETS if total(estimate_state_bytes(
            p, shard_numels, world, ranks_per_node, dtype)) <= free]
        raise ValueError(
            f"hfcompress: preset {config.name!r} keeps {gib(total(need))} of compressor state "
            f"per GPU ({gib(need['references'])} qWD references, {gib(need['errors'])} LoCo "
            f"errors; {world} ranks, {ranks_per_node} per node) but only {gib(free)} is free on "
            f"{device}. Presets without per-rank state that fit: "
            f"{', '.join(map(repr, fits)) or 'none'}; or more ranks per node (qWD references "
            f"are 1/ranks_per_node of the model) or more GPUs")
    return need
