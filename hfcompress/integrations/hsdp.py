"""HSDP with a compressed replica all-reduce (Global-QSGD across nodes): FSDP2 shards over the ``"shard"`` dimension of a 2-D device mesh
``(replicate, shard)`` and each FSDP module's all-reduce hook (``set_all_reduce_hook``, run on
the reduce-scatter output) averages the gradient shard over the ``"replicate"`` group through
the configured scheme (``global_qsgd``, ``global_qsgd_exp``, int8 / int4 groups, LoCo)::

    mesh = init_device_mesh("cuda", (nodes, gpus_per_node), mesh_dim_names=("replicate", "shard"))
    handle = hfcompress.apply(model, "global_qsgd", shard=True, mesh=mesh)
    ...; optimizer.step(); handle.step()

(``fully_shard_hsdp`` / ``install_hsdp_hook`` are the building blocks ``apply`` uses; they
return the hook state.)

Native HSDP (``fully_shard(mesh=<2-D mesh>)``) all-reduces exactly *before* the hook, so the
model must be sharded over the 1-D ``mesh["shard"]`` instead (refused otherwise). Parameters
matched by the config's ``exact_patterns`` / ``min_numel`` are averaged exactly (QSDP 5.1).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from ..comm import Topology, WireMeter
from ..compressors import Compressor
from ..config import CompressionConfig
from . import _fsdp2
from .ddp import AllReduceState
from .exact_params import GroupLayouts, Segment, SlotLayout
from .fsdp import decoder_layers, fsdp_modules

MESH_DIMS = ("replicate", "shard")


class ReplicaHook:
    """``set_all_reduce_hook`` callable of one FSDP module: average its gradient shard over
    the replicas, in place."""

    def __init__(self, state: AllReduceState, name: str, layouts: GroupLayouts) -> None:
        self.state, self.name, self.layouts = state, name, layouts

    def __call__(self, reduce_output: torch.Tensor) -> None:
        """FSDP2 reads the output when the hook returns, so the chained stages are waited
        for: on NCCL (futures complete at launch, ``wait`` orders the caller's stream after
        them) the host does not block; on gloo it does."""
        n = reduce_output.numel()
        layout = self.layouts.for_numel(n) or SlotLayout([Segment(self.name, n, False)])
        self.state.reduce(self.name, reduce_output.view(-1), layout)


def is_hsdp_mesh(mesh: DeviceMesh | None) -> bool:
    return mesh is not None and tuple(mesh.mesh_dim_names or ()) == MESH_DIMS


def _check_mesh(mesh: DeviceMesh) -> None:
    if mesh.ndim != 2 or tuple(mesh.mesh_dim_names or ()) != MESH_DIMS:
        raise ValueError(f"HSDP needs a 2-D device mesh with mesh_dim_names={MESH_DIMS}, got "
                         f"{mesh.ndim}-D names {mesh.mesh_dim_names}: init_device_mesh(device, "
                         f"(replicas, shards), mesh_dim_names={MESH_DIMS})")


def install_hsdp_hook(model: nn.Module, mesh: DeviceMesh,
                      config: str | CompressionConfig | Compressor, *,
                      ranks_per_node: int | None = None, topology: Topology | None = None,
                      meter: WireMeter | None = None) -> AllReduceState:
    """Install the compressed replica all-reduce on every FSDP module of ``model`` (sharded
    with ``fully_shard(..., mesh=mesh["shard"])``); returns the state (``.meter``,
    ``.step()``, ``.state_dict()``). ``ranks_per_node`` (or ``topology``) splits the metered
    bytes into intra/inter-node."""
    _check_mesh(mesh)
    shard_ranks = dist.get_process_group_ranks(mesh.get_group("shard"))
    modules = fsdp_modules(model)
    if not modules:
        raise ValueError("the model has no FSDP2 modules: fully_shard it over mesh['shard'] "
                         "first, or use fully_shard_hsdp")
    groups = {}
    for name, module in modules:
        pgs = _fsdp2.param_groups(module)
        if len(pgs) != 1:
            raise ValueError(f"FSDP module {name!r} has {len(pgs)} parameter groups; the "
                             f"all-reduce hook supports one (no shard_placement_fn meshes)")
        pg = groups[name] = pgs[0]
        if _fsdp2.is_hsdp(pg):
            raise ValueError(f"FSDP module {name!r} is sharded over the 2-D mesh (native HSDP), "
                             f"which all-reduces exactly before any hook; shard it with "
                             f"fully_shard(..., mesh=mesh['shard'])")
        ranks = dist.get_process_group_ranks(_fsdp2.shard_group(pg))
        if ranks != shard_ranks:
            raise ValueError(f"FSDP module {name!r} shards over ranks {ranks}, but this rank's "
                             f"mesh['shard'] group is {shard_ranks}")
    if topology is None and ranks_per_node is not None:
        topology = Topology(ranks_per_node)
    state = AllReduceState(config, mesh.get_group("replicate"), topology, meter,
                           tag="replica_all_reduce")
    cfg = state.config
    for name, module in modules:
        layouts = GroupLayouts(model, groups[name], cfg.exact_patterns, cfg.min_numel)
        module.set_all_reduce_hook(ReplicaHook(state, name, layouts))
    return state


def fully_shard_hsdp(model: nn.Module, mesh: DeviceMesh,
                     config: str | CompressionConfig | Compressor, *,
                     layer_cls: tuple[type, ...] | None = None,
                     ranks_per_node: int | None = None, topology: Topology | None = None,
                     meter: WireMeter | None = None, **fsdp_kwargs: Any) -> AllReduceState:
    """``fully_shard`` every decoder layer (``layer_cls``, default Hugging Face's
    ``_no_split_modules``) and the root over ``mesh["shard"]``, then
    :func:`install_hsdp_hook`. Every replica must start from the same weights."""
    _check_mesh(mesh)
    for layer in decoder_layers(model, layer_cls):
        fully_shard(layer, mesh=mesh["shard"], **fsdp_kwargs)
    fully_shard(model, mesh=mesh["shard"], **fsdp_kwargs)
    return install_hsdp_hook(model, mesh, config, ranks_per_node=ranks_per_node,
                             topology=topology, meter=meter)
