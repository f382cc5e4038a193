"""The compressor state's memory check: the estimate (``cost/state.py``) against the memory
free on CUDA, which every rank passes or refuses together, before any state is allocated."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ..config import CompressionConfig, get_config, list_presets
from ..cost.state import estimate_state_bytes, total

ADAM_STATE_PER_PARAM = 2 * 4    # exp_avg + exp_avg_sq, fp32, per sharded parameter value


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


#: the share of the memory available before training that hpZ's held weights may take under
#: ``auto`` (the rest: the optimizer state, not allocated yet, and the activations)
HPZ_SHARE = 0.5


def hpz_fits(held_bytes: int, device: torch.device,
             group: dist.ProcessGroup | None = None, available: int | None = None) -> bool:
    """Whether hpZ's weights (``hpz_switch.LayerResharding.held_bytes``) take at most
    ``HPZ_SHARE`` of the memory available on the fullest rank of ``group`` (the same answer
    on every rank). Checked on CUDA, or when ``available`` is given (a test); elsewhere (CPU)
    True, as :func:`check_fits`."""
    if device.type != "cuda" and available is None:
        return True
    have = available if available is not None else available_bytes(device)
    refuse, _, _ = _agree(held_bytes > HPZ_SHARE * have, held_bytes, have, device, group)
    return not refuse
