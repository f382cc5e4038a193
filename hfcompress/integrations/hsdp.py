"""HSDP with a compressed replica all-reduce (Global-QSGD across nodes): FSDP2 shards over the ``"shard"`` dimension of a 2-D device mesh
``(replicate, shard)`` and each FSDP module's all-reduce hook (``set_all_reduce_hook``, run on
the reduce-scatter output) averages the gradient shard over the ``"replicate"`` group through
the configured scheme (``global_qsgd``, ``global_qsgd_exp``, int8 / int4 groups, LoCo)::

    mesh = init_device_mesh("cuda", (nodes, gpus_per_node), mesh_dim_names=("replicate", "shard"))
    handle = hfcompress.apply(model, "global_qsgd", shard=True, mesh=mesh)
    ...; optimizer.step(); handle.step()

(``fully_shard_hsdp`` / ``install_hsdp_hook`` are the building blocks ``apply`` uses; they
return the hook state.)

Native HSDP (``fully_shard(mesh=mesh["dp_replicate", "dp_shard"])``, what Accelerate's
``ParallelismConfig(dp_replicate_size=..., dp_shard_size=...)`` builds) all-reduces exactly
*before* the hook; ``apply`` compresses it as :class:`NativeHSDP`: FSDP2's own replica
all-reduce switched off (``_fsdp2.shard_only``), the shard group's all-gather / reduce-scatter
compressed as for FSDP2 and this hook on the replicas. Parameters matched by the config's
``exact_patterns`` / ``min_numel`` are averaged exactly (QSDP 5.1).
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
from .timeouts import comm_guard

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
        with comm_guard("replica all-reduce", self.name, self.state.group):
            self.state.reduce(self.name, reduce_output.view(-1), layout)


class NativeHSDP:
    """What ``apply`` installs on a model sharded over a 2-D FSDP mesh (native HSDP): the
    shard group's compressed collectives (an ``FSDPInstall``) and the replica all-reduce
    (``replica``, an ``AllReduceState`` over the replicate group) as each module's all-reduce
    hook, with FSDP2's exact replica all-reduce off while installed (its mesh info back on
    ``uninstall``). The hook runs on the reduce-scatter output, the mean over the shard group,
    and averages it over the replicas: the mean over every data-parallel rank, as FSDP2's.
    DTensor placements and state dicts stay those of native HSDP."""

    def __init__(self, fsdp: Any, replica: AllReduceState) -> None:
        self.fsdp, self.replica = fsdp, replica
        self.config, self.comms = fsdp.config, fsdp.comms
        self.state_estimate = fsdp.state_estimate
        self.hooks = {name: ReplicaHook(replica, name, c.layouts) for name, c in self.comms.items()}
        self._native: dict[str, Any] = {}      # module name -> FSDP2's own mesh info

    def install(self) -> None:
        self.fsdp.install()
        self.replica.install()
        for name, c in self.comms.items():
            if name not in self._native:
                self._native[name] = _fsdp2.shard_only(c.param_group)
            c.module.set_all_reduce_hook(self.hooks[name])

    def uninstall(self) -> None:
        self.fsdp.uninstall()
        self.replica.uninstall()
        for name, info in self._native.items():
            _fsdp2.restore_mesh_info(self.comms[name].param_group, info)
            self.comms[name].module.set_all_reduce_hook(None)
        self._native = {}

    def collectives(self) -> list[Any]:
        return self.fsdp.collectives() + self.replica.collectives()

    def state_dict(self) -> dict[str, Any]:
        return {**self.fsdp.state_dict(), "replica": self.replica.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        replica = state.pop("replica", None)
        if replica is None:
            raise ValueError("hfcompress state holds no replica all-reduce: it was saved "
                             "without HSDP (a 1-D FSDP mesh)")
        self.fsdp.load_state_dict(state)
        self.replica.load_state_dict(replica)

    def describe(self) -> str:
        return f"{self.fsdp.describe()} (native HSDP: replica all-reduce over {self.replica.size})"


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
