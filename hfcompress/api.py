"""``hfcompress.apply``: one call turns on compressed communication for a data-parallel model
(FSDP2, DDP or HSDP) and returns the one handle type, :class:`Compression`."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from .auto.choose import choose_ddp, choose_fsdp, replica_config
from .auto.controller import AutoController
from .comm import Topology, WireMeter
from .comm.topology import NodeSplit, node_split
from .config import AutoSettings, CompressionConfig, describe, request_dict, resolve
from .integrations import _fsdp2
from .integrations.compile_notice import compile_notice
from .integrations.consistency import check_same_settings
from .integrations.ddp import ddp_scheme, register_ddp_hook
from .integrations.ddp import AllReduceState
from .integrations.fsdp import (FSDPInstall, ModuleComms, check_group, check_hpz, fsdp_modules,
                                mesh_group, replicate_group, shard_model)
from .integrations.handle import Compression
from .integrations.hpz_switch import LayerResharding
from .integrations.hsdp import NativeHSDP, fully_shard_hsdp, install_hsdp_hook, is_hsdp_mesh
from .integrations.timeouts import mesh_groups, user_timeout


Request = CompressionConfig | AutoSettings


def apply(model: nn.Module, compressor: str | CompressionConfig | AutoSettings = "sdp4bit",
          ranks_per_node: int | NodeSplit | None = None, shard: bool = False, *,
          meter: WireMeter | None = None, layer_cls: tuple[type, ...] | None = None,
          **fsdp_kwargs: Any) -> Compression:
    """Install compressed communication on ``model``; which kind it was given decides how:

    - a ``DistributedDataParallel`` model: the compressed all-reduce comm hook (the preset's
      ``all_reduce`` scheme, else its gradient scheme ``grad_inter``);
    - ``mesh=`` a 2-D device mesh named ``("replicate", "shard")``: HSDP, FSDP2 over
      ``mesh["shard"]`` and the compressed all-reduce over the replicas;
    - otherwise FSDP2: compressed all-gather / reduce-scatter on every FSDP2 module (a 1-D
      ``mesh`` goes to ``fully_shard`` with the other ``fsdp_kwargs``). FSDP2 over one
      data-parallel dim of a larger mesh (``mesh["dp"]`` of ``(dp, tp)``, TP inside a node)
      compresses that group's collectives only, laid out on the nodes by global rank
      (``comm.Topology(group=)``); TP's collectives stay torch's. Native HSDP (a 2-D FSDP
      mesh, e.g. ``mesh["dp_replicate", "dp_shard"]``, also beside TP): the shard group's
      collectives as FSDP2's, and FSDP2's replica all-reduce replaced by the compressed one
      (``integrations.hsdp.NativeHSDP``).

    - ``compressor``: a preset name (``hfcompress.config.list_presets()``), a
      ``CompressionConfig``, or ``"auto"`` / ``AutoSettings``: probe the links and this
      device, then choose each collective's scheme among the loss-keeping ones
      (``hfcompress/auto``; FSDP2, also over a sub-mesh: every DP group probed at once, one
      plan for all; native HSDP: the replica all-reduce chosen too; and DDP; the choice is
      ``handle.auto``). Resolved once,
      here (``config.resolve``); the engine paths get a fixed configuration and, for
      ``"auto"``, the controller that chose it.
    - ``ranks_per_node``: ranks per node (default ``LOCAL_WORLD_SIZE``, else one node); an
      explicit value emulates nodes on one machine. Resolved once, here
      (``comm.topology.node_split``; the Trainer passes the ``NodeSplit`` it resolved), and
      read from that everywhere below.
    - ``shard=False``: ``model`` is already ``fully_shard``-ed (over ``mesh["shard"]`` for
      HSDP). ``shard=True``: apply ``fully_shard`` to every decoder layer (``layer_cls``,
      default Hugging Face's ``_no_split_modules``) and the root, with ``fsdp_kwargs`` (e.g.
      ``mp_policy``) and, when the config uses hpZ, ``reshard_after_forward=ranks_per_node``.

    Every rank must call it with the same settings (checked: a mismatch raises ValueError
    naming the differing keys and ranks). Returns the handle: ``.meter``, ``.step()`` after
    each optimizer step, ``.state_dict()`` / ``.load_state_dict()``, ``.memory_report()``,
    ``.remove()``.
    """
    check_not_deepspeed(model)
    if not dist.is_initialized():
        raise RuntimeError("hfcompress.apply needs torch.distributed to be initialized "
                           "(torchrun / accelerate launch, or dist.init_process_group)")
    ddp = isinstance(model, DistributedDataParallel)
    hsdp = not ddp and is_hsdp_mesh(fsdp_kwargs.get("mesh"))
    request, nodes = _resolved(compressor, ranks_per_node, raise_now=ddp or hsdp)
    device = next(iter(model.parameters()), torch.empty(0)).device
    compile_notice(device, request, fsdp=not ddp)
    if ddp:
        return _apply_ddp(model, request, nodes, shard, fsdp_kwargs, meter)
    _fsdp2.require()       # FSDP2 from here on: its internals must be where we expect them
    if hsdp:
        mesh = fsdp_kwargs.pop("mesh")
        return _apply_hsdp(model, request, nodes, shard, mesh, meter, layer_cls, fsdp_kwargs)
    return _apply_fsdp(model, request, nodes, shard, meter, layer_cls, fsdp_kwargs)


#: what hfcompress says to a DeepSpeed user (``apply`` on an engine, the Trainer under DeepSpeed)
DEEPSPEED_REFUSED = (
    "hfcompress compresses FSDP2, DDP and HSDP communication; DeepSpeed runs its own "
    "collectives, which hfcompress does not replace (DeepSpeed's own ZeRO++ quantizes them: "
    "zero_quantized_weights / zero_quantized_gradients / zero_hpz_partition_size in its "
    "config). Train with FSDP2 instead (Accelerate: fsdp_version: 2), or drop "
    "comm_compressor. `hfcompress plan --engine zero3` still prices what compression would "
    "save under ZeRO-3.")


def check_not_deepspeed(model: Any) -> None:
    """ValueError for a DeepSpeed engine (checked by class name: deepspeed need not be
    installed)."""
    if any(cls.__name__ == "DeepSpeedEngine" for cls in type(model).__mro__):
        raise ValueError(f"hfcompress.apply got a DeepSpeed engine: {DEEPSPEED_REFUSED}")


def check_integration(config: Request, fsdp: bool) -> None:
    """ValueError if ``config`` compresses nothing that FSDP2 (or DDP / HSDP's all-reduce)
    sends (``auto`` chooses for the engine it finds). The Trainer calls it when it is
    created, ``apply`` when it installs."""
    if not isinstance(config, CompressionConfig):
        return
    if not fsdp:
        ddp_scheme(config)
    elif config.all_reduce is not None and not config.compresses_fsdp:
        raise ValueError(f"comm_compressor {config.name!r} compresses only DDP's all-reduce "
                         f"({describe(config.all_reduce)}: only the DDP / HSDP all-reduce uses it); "
                         f"FSDP2's all-gather and reduce-scatter have nothing to compress. "
                         f"Train with DDP (no fsdp), or pick an FSDP preset such as 'sdp4bit'")


def _resolved(compressor: str | CompressionConfig | AutoSettings,
              ranks_per_node: int | NodeSplit | None, raise_now: bool
              ) -> tuple[Request | ValueError, NodeSplit | None]:
    """The request and the node split, each resolved once; an invalid one raises
    (``raise_now``) or comes back as the ValueError (FSDP2: every rank learns of it in the
    settings check)."""
    try:
        return resolve(compressor), node_split(dist.get_world_size(), ranks_per_node)
    except ValueError as err:
        if raise_now:
            raise
        return err, None


def _fixed(request: Request, probe: Callable[..., Any],
           rebuild: Callable[[CompressionConfig], Any] | None = None
           ) -> tuple[CompressionConfig, AutoController | None]:
    """The configuration to install and, for ``"auto"``, the controller that chose it
    (``probe(compute_s=None)`` probes and chooses; ``rebuild``: re-probes may switch)."""
    if isinstance(request, CompressionConfig):
        return request, None
    auto = AutoController(probe(), request, reprobe=probe if rebuild else None,
                          rebuild=rebuild)
    return auto.config, auto


def _apply_ddp(model: DistributedDataParallel, request: Request,
               nodes: NodeSplit, shard: bool, fsdp_kwargs: dict[str, Any],
               meter: WireMeter | None) -> Compression:
    if shard or fsdp_kwargs:
        raise ValueError(f"apply() got a DistributedDataParallel model: it is replicated, not "
                         f"sharded; drop shard=True and fully_shard arguments "
                         f"{sorted(fsdp_kwargs)}")
    check_integration(request, fsdp=False)
    group = model.process_group
    # the DDP group and the node groups built from it time out as the world does
    topology = Topology(nodes, user_timeout(group), group=group)
    config, auto = _fixed(request, lambda compute_s=None: choose_ddp(
        model.module, topology, dist.get_world_size(group), request, compute_s),
        lambda cfg: state.adopt(cfg))      # auto's switch: the registered hook, new config
    state = register_ddp_hook(model, config, topology=topology, meter=meter)
    return Compression("ddp", model.module, config, topology, state.meter, state,
                       auto).install()


def _apply_hsdp(model: nn.Module, request: Request,
                nodes: NodeSplit, shard: bool, mesh: DeviceMesh,
                meter: WireMeter | None, layer_cls: tuple[type, ...] | None,
                fsdp_kwargs: dict[str, Any]) -> Compression:
    if not isinstance(request, CompressionConfig):
        raise ValueError("comm_compressor='auto' does not shard through a ('replicate', "
                         "'shard') mesh given to apply; shard natively instead: "
                         "fully_shard(..., mesh=mesh) with that 2-D mesh on every layer and "
                         "the root, then hfcompress.apply(model, 'auto') (it chooses the "
                         "replica all-reduce too), or pick a preset (e.g. 'global_qsgd_exp')")
    config = request
    check_integration(config, fsdp=False)
    if mesh.mesh.numel() != dist.get_world_size():
        raise ValueError(f"HSDP over a sub-mesh ({mesh.mesh.numel()} of "
                         f"{dist.get_world_size()} ranks: HSDP x TP / CP / pipeline stages) "
                         f"through a ('replicate', 'shard') mesh is not supported; shard "
                         f"natively instead (native HSDP, also beside TP): fully_shard(..., "
                         f"mesh=mesh['dp_replicate', 'dp_shard']) on every layer and the root, "
                         f"then hfcompress.apply(model, preset)")
    # the mesh's groups (created without a timeout) and the node groups: the world's
    topology = Topology(nodes, user_timeout(dist.group.WORLD, *mesh_groups(mesh)))
    if shard:
        state = fully_shard_hsdp(model, mesh, config, layer_cls=layer_cls, topology=topology,
                                 meter=meter, **fsdp_kwargs)
    elif fsdp_kwargs or layer_cls is not None:
        raise ValueError("layer_cls and fully_shard keyword arguments need shard=True")
    else:
        state = install_hsdp_hook(model, mesh, config, topology=topology, meter=meter)
    return Compression("hsdp", model, config, topology, state.meter, state).install()


def _same_fsdp_settings(model: nn.Module, request: Request | ValueError,
                        nodes: NodeSplit | None, shard: bool) -> list:
    """Every rank's settings checked against the others' (a rank's own error raised on every
    rank); the model's FSDP modules, as ``shard`` expects them."""
    try:
        if isinstance(request, ValueError):
            raise request
        check_integration(request, fsdp=True)
        existing = fsdp_modules(model)
        settings: dict | BaseException = {
            "config": request_dict(request), "world_size": dist.get_world_size(),
            "ranks_per_node": nodes.ranks_per_node,
            "shard": shard, "fsdp_modules": [n for n, _ in existing],
            "parameters": sum(p.numel() for p in model.parameters())}
    except ValueError as err:  # every rank learns about it, instead of waiting for this one
        settings = err
    try:
        check_same_settings(settings)
    except ValueError as err:
        if isinstance(settings, BaseException):
            raise settings from None      # this rank's own error
        if "  fsdp_modules:" in str(err) or "  parameters:" in str(err):
            raise ValueError(f"{err}\nThe ranks hold different models. If they are pipeline "
                             f"stages: pipeline parallelism is not supported yet (hfcompress "
                             f"compresses FSDP2 over the world or over one data-parallel dim of "
                             f"a (dp, tp) mesh, every rank holding the same model)") from None
        raise
    if shard and existing:
        raise ValueError("apply(..., shard=True) got a model that is already fully_shard-ed; "
                         "pass shard=False")
    if not shard and not existing:
        raise ValueError("the model has no FSDP2 modules: call fully_shard on it first, or "
                         "pass shard=True")
    return existing


def _apply_fsdp(model: nn.Module, request: Request | ValueError,
                nodes: NodeSplit | None, shard: bool, meter: WireMeter | None,
                layer_cls: tuple[type, ...] | None, fsdp_kwargs: dict[str, Any]) -> Compression:
    existing = _same_fsdp_settings(model, request, nodes, shard)
    hpz = isinstance(request, CompressionConfig) and request.hpz
    if not shard and (fsdp_kwargs or layer_cls is not None):
        raise ValueError("layer_cls and fully_shard keyword arguments need shard=True")
    # the data-parallel group: the world, or one dim of a larger mesh (FSDP2 x TP)
    given_mesh = fsdp_kwargs.get("mesh")
    group = mesh_group(given_mesh) if shard else check_group(existing)
    # every rank's group is laid out on the nodes (its x ranks per node, y nodes); the groups
    # given (a mesh's dims are created without a timeout) and the node groups built from
    # them time out as the world does
    timeout = user_timeout(group, *mesh_groups(given_mesh if isinstance(given_mesh, DeviceMesh)
                                               else None))
    topology = Topology(nodes, timeout, group=group)
    if shard:
        shard_model(model, topology.ranks_per_node, hpz, layer_cls, **fsdp_kwargs)
    modules = fsdp_modules(model)
    sharded_over = dist.get_process_group_ranks(check_group(modules))
    if sharded_over != list(topology.ranks):
        raise ValueError(f"the FSDP modules shard over ranks {sharded_over}, expected "
                         f"{list(topology.ranks)} (the mesh given to apply)")
    if hpz:
        check_hpz(modules, topology.ranks_per_node, topology.world_size)
    meter = meter if meter is not None else WireMeter()
    replicas = replicate_group(modules)     # native HSDP: the replicas' group
    replica_topology = None if replicas is None else \
        Topology(nodes, user_timeout(replicas), group=replicas)

    # auto: the layers' hpZ, switched with the plan (a preset's is set at fully_shard)
    resharding = LayerResharding(model, modules, topology) \
        if isinstance(request, AutoSettings) else None

    def build(cfg: CompressionConfig) -> FSDPInstall | NativeHSDP:
        if resharding is not None:
            resharding.set(cfg.hpz)
        comms = {name: ModuleComms(name, m, model, cfg, topology, meter, i)
                 for i, (name, m) in enumerate(modules)}
        fsdp = FSDPInstall(cfg, comms, topology)
        if replicas is None:
            return fsdp
        # auto: the plan's all_reduce option alone, as priced (a preset: its own scheme)
        replica = replica_config(cfg) if isinstance(request, AutoSettings) else cfg
        return NativeHSDP(fsdp, AllReduceState(replica, replicas, replica_topology, meter,
                                               tag="replica_all_reduce"))

    config, auto = _fixed(request, lambda compute_s=None: choose_fsdp(
        model, modules, topology, request, compute_s=compute_s, replicas=replica_topology,
        resharding=resharding), build)
    return Compression("fsdp2", model, config, topology, meter, build(config), auto).install()
