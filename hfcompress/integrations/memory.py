"""Compressor state per rank: the estimate before it is allocated, and the check on CUDA.

State a rank keeps between steps, as each scheme declares it (``Compressor.state_bytes_for``;
``state_bytes()`` of the collectives measures it afterwards):

- ``references``: a reference-coded weight scheme's copy of the weights (qWD's w~, SDP4Bit
  Alg. 2) for the slots this rank holds, in the weights' dtype: ``Y = world /
  ranks_per_node`` slots of each unit's shard with node-sharded references
  (``comm/reference_gather.py``), all ``world`` slots with one rank per node;
- ``errors``: an error-feedback scheme's stored error (LoCo 3.2) of everything this rank
  sends on a gradient hop: X parts of ``Y * s`` values on the 2-hop intra-node hop and Y
  parts of ``s`` on its inter-node hop (the node's partial sums), else ``world`` parts of
  ``s``;
- ``buffers``: nothing persistent (payload and gather buffers live for one call).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ..comm.reference_gather import ShardedReferences
from ..compressors import Compressor
from ..compressors.registry import build_compressor
from ..config import CompressionConfig, get_config, list_presets

KINDS = ("references", "errors", "buffers")
ADAM_STATE_PER_PARAM = 2 * 4    # exp_avg + exp_avg_sq, fp32, per sharded parameter value


def _add(into: dict[str, int], state: dict[str, int], times: int = 1) -> None:
    for kind, n in state.items():
        into[kind] = into.get(kind, 0) + times * int(n)


def _gradient_hops(config: CompressionConfig, world: int, ranks_per_node: int
                   ) -> list[tuple[Compressor | None, int, int]]:
    """(compressor as the reduce-scatter builds it, parts, values per part / shard value)."""
    x, y = ranks_per_node, world // ranks_per_node
    hops = config.with_loco({k: build_compressor(getattr(config, k))
                             for k in ("grad_intra", "grad_inter")}, x)
    intra, inter = hops["grad_intra"], hops["grad_inter"]
    if config.two_hop and x > 1:
        return [(intra, x, y), (inter, y if y > 1 else 0, 1)]
    return [(inter, world, 1)]


def estimate_state_bytes(config: CompressionConfig | str, shard_numels: Sequence[int],
                         world: int, ranks_per_node: int, dtype: torch.dtype,
                         shard_references: bool = True,
                         grad_numels: Sequence[int] | None = None) -> dict[str, int]:
    """Compressor state per rank, by kind, for FSDP units whose compressed shards hold
    ``shard_numels[i]`` values per rank (the all-gather input), gathered in ``dtype``, of
    which ``grad_numels[i]`` get gradients (default: all; frozen ones send none, so they
    keep no error-feedback state)."""
    config = get_config(config)
    out = dict.fromkeys(KINDS, 0)
    weights = build_compressor(config.weights)
    hops = _gradient_hops(config, world, ranks_per_node) if world > 1 else []
    rows = ShardedReferences.rows(world, ranks_per_node, shard_references)
    for s, g in zip(shard_numels, shard_numels if grad_numels is None else grad_numels):
        if weights is not None:
            _add(out, weights.state_bytes_for(rows * s, dtype))
        for comp, parts, width in hops:
            if comp is not None and parts:
                _add(out, comp.state_bytes_for(width * g, dtype), parts)
    return out


def total(state: dict[str, int]) -> int:
    return sum(state.values())


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def available_bytes(device: torch.device) -> int:
    """Free device memory plus the blocks PyTorch's allocator holds cached but unused (they
    are reused before the device is asked for more)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def _agree(refuse: bool, need: int, available: int, device: torch.device,
           group: dist.ProcessGroup | None) -> tuple[bool, int, int]:
    """Every rank's verdict at once (an all-reduce MAX): whether any rank refuses, the
    largest need and the smallest available memory, so every rank raises the same error."""
    if not dist.is_initialized():
        return refuse, need, available
    nccl = "nccl" in str(dist.get_backend(group))
    t = torch.tensor([float(refuse), float(need), -float(available)], dtype=torch.float64,
                     device=device if nccl and device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t[0].item()), int(t[1].item()), int(-t[2].item())


def check_fits(config: CompressionConfig | str, shard_numels: Sequence[int], world: int,
               ranks_per_node: int, dtype: torch.dtype, device: torch.device, *,
               param_numel: int = 0, available: int | None = None,
               group: dist.ProcessGroup | None = None,
               grad_numels: Sequence[int] | None = None) -> dict[str, int]:
    """The estimate; on CUDA (or when ``available`` bytes are given, e.g. by a test) every
    rank of ``group`` raises the same ValueError when the compressor state, plus headroom
    for the optimizer state, exceeds the memory available on any rank.

    This runs before training: the optimizer's state is not allocated yet, so it is counted
    as Adam's (``ADAM_STATE_PER_PARAM``: 2 x the fp32 parameter shard of ``param_numel``
    values). Available = free device memory + the allocator's cached, unused blocks."""
    config = get_config(config)
    need = estimate_state_bytes(config, shard_numels, world, ranks_per_node, dtype,
                                grad_numels=grad_numels)
    if (device.type != "cuda" and available is None) or total(need) == 0:
        return need
    headroom = ADAM_STATE_PER_PARAM * param_numel
    have = available if available is not None else available_bytes(device)
    mine = total(need) + headroom
    refuse, worst, least = _agree(mine > have, mine, have, device, group)
    if refuse:
        lean = [p for p in list_presets() if get_config(p).compresses_fsdp and not total(
            estimate_state_bytes(p, shard_numels, world, ranks_per_node, dtype,
                                 grad_numels=grad_numels))]
        raise ValueError(
            f"hfcompress: preset {config.name!r} keeps {gib(total(need))} of compressor state "
            f"per GPU ({gib(need['references'])} weight references, {gib(need['errors'])} "
            f"error-feedback buffers; {world} ranks, {ranks_per_node} per node), but only "
            f"{gib(least)} is free on {device.type} (free + cached by the allocator, on the "
            f"fullest rank) for it and {gib(headroom)} of optimizer state, which is not "
            f"allocated yet at this point (Adam: 2 x the fp32 parameter shard): a rank needs "
            f"up to {gib(worst)}. Presets without per-rank state: "
            f"{', '.join(map(repr, lean)) or 'none'}; or more ranks per node (references "
            f"are 1/ranks_per_node of the model) or more GPUs")
    return need
