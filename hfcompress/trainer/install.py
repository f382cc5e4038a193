"""Install compressed communication on the model the Trainer prepared: ``hfcompress.apply``
on the ``fully_shard``-ed FSDP2 model (over the world, or over the data-parallel dims of
Accelerate's ``ParallelismConfig`` mesh: FSDP2 x TP, native HSDP) or on the DDP model (see
``integrations.ddp`` for what a preset all-reduces under DDP), plus the Trainer's checks and
messages around it."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..api import apply, check_integration  # noqa: F401 (the Trainer checks it early)
from ..comm.topology import NodeSplit, group_layout
from ..config import AutoSettings, CompressionConfig, describe
from ..cost.units import hpz_reshard
from ..integrations.fsdp import check_group, fsdp_modules
from ..integrations.handle import Compression
from .accelerate_cpu import sharded_by_transformers

logger = logging.getLogger(__name__)


Request = CompressionConfig | AutoSettings


def uses_loco(request: Request) -> bool:
    """Whether the optimizer must step LoCo's error feedback (``auto`` never chooses it)."""
    return isinstance(request, CompressionConfig) and request.loco is not None


def uses_hpz(request: Request) -> bool:
    """Whether layers must reshard to the node after forward (a preset's hpZ; ``auto``
    switches its own on the sharded layers: ``integrations/hpz_switch.py``)."""
    return isinstance(request, CompressionConfig) and request.hpz


def shard_ranks(trainer: Any, model: Any) -> list[int]:
    """Global ranks of the FSDP shard group this rank's layers shard (or will shard) over:
    the group of a model transformers sharded at load time, else the last FSDP dim of
    Accelerate's ``ParallelismConfig`` mesh, else the world."""
    if sharded_by_transformers(model):
        return dist.get_process_group_ranks(check_group(fsdp_modules(model)))
    mesh = getattr(trainer.accelerator, "torch_device_mesh", None)
    dims = getattr(trainer.accelerator.parallelism_config, "fsdp_dim_names", None)
    if mesh is None or not dims:
        return list(range(dist.get_world_size()))
    return [int(r) for r in mesh[dims[-1]].mesh.flatten().tolist()]


def hpz_choice(ranks: list[int], nodes: NodeSplit) -> tuple[bool | int, int]:
    """hpZ's ``reshard_after_forward`` for the shard group of global ``ranks`` and the
    group's x ranks per node: from the group's own layout (beside TP, x = X / tp), not the
    world's."""
    x = group_layout(ranks, nodes.ranks_per_node).ranks_per_node
    return hpz_reshard(x, len(ranks)), x


def reshard_loaded(model: Any, want: bool | int, x: int, name: str) -> None:
    """hpZ on a model transformers sharded at load time (its layers reshard fully after
    forward): keep the full weights (``want`` False: one shard-group rank per node) through
    FSDP2's public setter; a node partition (an int) it cannot set, so ValueError with the
    fix."""
    if want is not False:
        raise ValueError(
            f"comm_compressor {name!r} uses hpZ: the layers must reshard to the node's {x} "
            f"ranks after forward (reshard_after_forward={want}), but transformers sharded "
            f"the model at load time (DistributedConfig), fully after forward, and FSDP2 "
            f"can switch that only to True or False. Load the model without "
            f"distributed_config and let the Trainer shard it (fsdp=True, "
            f"fsdp_config={{'version': 2}}), or pick a preset without hpZ (e.g. 'sdp4bit')")
    for _, module in fsdp_modules(model):
        module.set_reshard_after_forward(False, recurse=False)


def one_node_fallback(config: Request, ranks_per_node: int, world: int) -> str | None:
    """What a multi-node preset does on a single node (FSDP2), or None if nothing changes."""
    if not isinstance(config, CompressionConfig):
        return None          # auto chooses for the layout it probed
    # a 2-hop reduce-scatter sending one scheme on both hops (ulq, loco) sends it on one node too
    two_hop = config.two_hop and config.grad_intra != config.grad_inter
    if ranks_per_node != world or world < 2 or not (two_hop or config.hpz):
        return None
    parts = []
    if two_hop:
        parts.append(f"its 2-hop gradient reduce-scatter ({describe(config.grad_intra)} inside "
                     f"a node, {describe(config.grad_inter)} across nodes) runs only the "
                     f"intra-node hop, so gradients are sent {describe(config.grad_intra)}")
    if config.hpz:
        parts.append(f"hpZ changes nothing (the backward all-gather already stays inside the "
                     f"node; it sends {describe(config.weights)} weights like the forward one)")
    hint = "Set ranks_per_node to emulate nodes"
    if two_hop:
        hint += ", or use 'ulq' / 'loco' for 4-bit gradients on one node"
    return (f"comm_compressor {config.name!r} is built for several nodes, but all {world} ranks "
            f"are on one node (ranks_per_node={ranks_per_node}): " + "; ".join(parts) +
            f". {hint}")


def install(model: Any, config: Request, nodes: NodeSplit) -> Compression:
    """``hfcompress.apply`` on the prepared DDP or FSDP2 model, given the Trainer's request and
    the node split it resolved once (a one-node warning first for a multi-node FSDP2
    preset)."""
    if isinstance(model, DistributedDataParallel):
        return apply(model, config, nodes)
    if not fsdp_modules(model):
        raise ValueError(f"hfcompress.Trainer: the prepared model is a {type(model).__name__}, "
                         f"neither FSDP2 nor DDP; nothing to install comm_compressor "
                         f"{config.name!r} on")
    world = dist.get_world_size()
    dp = dist.get_world_size(check_group(fsdp_modules(model)))   # the shard group's size
    fallback = one_node_fallback(config, nodes.ranks_per_node, world) if dp == world else None
    if fallback and dist.get_rank() == 0:
        warnings.warn(f"hfcompress: {fallback}", UserWarning, stacklevel=2)
    return apply(model, config, nodes)


KIND_NAMES = {"ddp": "DDP", "fsdp2": "FSDP2", "hsdp": "HSDP (FSDP2 shards, replicas all-reduced)"}


def summary(config: CompressionConfig, kind: str, world: int, ranks_per_node: int,
            dp_size: int | None = None) -> str:
    """The one line logged when the collectives are installed (``ranks_per_node``: of the
    data-parallel group, of ``dp_size`` ranks when that is smaller than the world: TP / HSDP
    beside it)."""
    c = config
    if kind == "ddp":
        what = f"all-reduce {describe(c.all_reduce_scheme)}"
        unused = [name for name, on in (("weight scheme", c.weights is not None),
                                        ("2-hop layout", c.two_hop), ("hpZ", c.hpz)) if on]
        if unused:
            what += f" (its {' and '.join(unused)}: FSDP2 only, not used under DDP)"
    else:
        grads = (f"2-hop {describe(c.grad_intra)} / {describe(c.grad_inter)}"
                 if c.two_hop else describe(c.grad_inter))
        what = f"weights {describe(c.weights)}, gradients {grads}" + (", hpZ" if c.hpz else "")
        if kind == "hsdp":     # the replica all-reduce is what crosses the nodes
            what = (f"replica all-reduce {describe(c.all_reduce_scheme)} across the "
                    f"replicas; inside each shard group {what}")
    loco = " with LoCo error feedback" if c.loco is not None else ""
    dp = dp_size or world
    nodes, per_node = dp // ranks_per_node, ranks_per_node
    where = f"{world} ranks" if dp == world else \
        f"the data-parallel groups of {dp} of the {world} ranks"
    return (f"hfcompress: {KIND_NAMES[kind]} comm_compressor {c.name!r} "
            f"on {where} ({nodes} node{'s' if nodes > 1 else ''} x {per_node} "
            f"rank{'s' if per_node > 1 else ''}): {what}{loco}")


def machine_line(preset: str, rank: int) -> str:
    """The one line local rank 0 of every other machine logs (``is_machine_lead``)."""
    return (f"hfcompress: comm_compressor {preset!r} installed on this machine (rank {rank} "
            f"and its local peers); the start-up summary is on global rank 0, and the comm/* "
            f"figures logged (on each machine, as transformers logs) are the whole job's")


def memory_line(report: dict[str, int]) -> str:
    """``memory_report()`` as one log line (MiB)."""
    mib = {k: v / 2 ** 20 for k, v in report.items()}
    return (f"hfcompress: compressor state on rank 0: {mib['total']:.2f} MiB (references "
            f"{mib['references']:.2f}, errors {mib['errors']:.2f}, buffers "
            f"{mib['buffers']:.2f}); parameters: local shard {mib['sharded_param_bytes']:.2f} "
            f"MiB of {mib['full_param_bytes']:.2f} MiB")
