"""``hfcompress.apply``: one call turns on compressed communication for a data-parallel model
(FSDP2, DDP or HSDP) and returns the one handle type, :class:`Compression`."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from .auto.choose import choose_ddp, choose_fsdp
from .auto.controller import AutoController
from .comm import Topology, WireMeter
from .comm.topology import resolve_ranks_per_node
from .config import CompressionConfig, get_config
from .integrations import _fsdp2
from .integrations.consistency import check_same_settings
from .integrations.ddp import ddp_scheme, register_ddp_hook
from .integrations.fsdp import (FSDPInstall, ModuleComms, check_group, check_hpz, fsdp_modules,
                                shard_model)
from .integrations.handle import Compression
from .integrations.hsdp import fully_shard_hsdp, install_hsdp_hook, is_hsdp_mesh
from .integrations.timeouts import group_timeout


def apply(model: nn.Module, compressor: str | CompressionConfig = "sdp4bit",
          ranks_per_node: int | None = None, shard: bool = False, *,
          meter: WireMeter | None = None, layer_cls: tuple[type, ...] | None = None,
          **fsdp_kwargs: Any) -> Compression:
    """Install compressed communication on ``model``; which kind it was given decides how:

    - a ``DistributedDataParallel`` model: the compressed all-reduce comm hook (the preset's
      ``all_reduce`` scheme, else its gradient scheme ``grad_inter``);
    - ``mesh=`` a 2-D device mesh named ``("replicate", "shard")``: HSDP, FSDP2 over
      ``mesh["shard"]`` and the compressed all-reduce over the replicas;
    - otherwise FSDP2: compressed all-gather / reduce-scatter on every FSDP2 module (a 1-D
      ``mesh`` goes to ``fully_shard`` with the other ``fsdp_kwargs``).

    - ``compressor``: a preset name (``hfcompress.config.list_presets()``), a
      ``CompressionConfig``, or ``"auto"`` / ``AutoSettings``: probe the links and this
      device, then choose each collective's scheme among the loss-keeping ones
      (``hfcompress/auto``; FSDP2 and DDP; the choice is ``handle.auto``).
    - ``ranks_per_node``: ranks per node (default ``LOCAL_WORLD_SIZE``, else one node); an
      explicit value emulates nodes on one machine.
    - ``shard=False``: ``model`` is already ``fully_shard``-ed (over ``mesh["shard"]`` for
      HSDP). ``shard=True``: apply ``fully_shard`` to every decoder layer (``layer_cls``,
      default Hugging Face's ``_no_split_modules``) and the root, with ``fsdp_kwargs`` (e.g.
      ``mp_policy``) and, when the config uses hpZ, ``reshard_after_forward=ranks_per_node``.

    Every rank must call it with the same settings (checked: a mismatch raises ValueError
    naming the differing keys and ranks). Returns the handle: ``.meter``, ``.step()`` after
    each optimizer step, ``.state_dict()`` / ``.load_state_dict()``, ``.memory_report()``,
    ``.remove()``.
    """
    if not dist.is_initialized():
        raise RuntimeError("hfcompress.apply needs torch.distributed to be initialized "
                           "(torchrun / accelerate launch, or dist.init_process_group)")
    if isinstance(model, DistributedDataParallel):
        return _apply_ddp(model, compressor, ranks_per_node, shard, fsdp_kwargs, meter)
    _fsdp2.require()       # FSDP2 from here on: its internals must be where we expect them
    if is_hsdp_mesh(fsdp_kwargs.get("mesh")):
        mesh = fsdp_kwargs.pop("mesh")
        return _apply_hsdp(model, compressor, ranks_per_node, shard, mesh, meter, layer_cls,
                           fsdp_kwargs)
    return _apply_fsdp(model, compressor, ranks_per_node, shard, meter, layer_cls, fsdp_kwargs)


def _apply_ddp(model: DistributedDataParallel, compressor: str | CompressionConfig,
               ranks_per_node: int | None, shard: bool, fsdp_kwargs: dict[str, Any],
               meter: WireMeter | None) -> Compression:
    if shard or fsdp_kwargs:
        raise ValueError(f"apply() got a DistributedDataParallel model: it is replicated, not "
                         f"sharded; drop shard=True and fully_shard arguments "
                         f"{sorted(fsdp_kwargs)}")
    config = get_config(compressor)
    ddp_scheme(config)
    group = model.process_group
    topology = Topology(ranks_per_node, group_timeout(group))
    auto = None
    if config.auto is not None:
        if config.auto.reprobe_every:
            raise ValueError("comm_compressor='auto' re-probes (reprobe_every) under FSDP2 "
                             "only; under DDP it chooses once: set reprobe_every=0")
        choice = choose_ddp(model.module, topology, dist.get_world_size(group), config.auto)
        auto = AutoController(choice, config)
        config = auto.config
    state = register_ddp_hook(model, config, topology=topology, meter=meter)
    return Compression("ddp", model.module, config, topology, state.meter, state,
                       auto).install()


def _apply_hsdp(model: nn.Module, compressor: str | CompressionConfig,
                ranks_per_node: int | None, shard: bool, mesh: DeviceMesh,
                meter: WireMeter | None, layer_cls: tuple[type, ...] | None,
                fsdp_kwargs: dict[str, Any]) -> Compression:
    config = get_config(compressor)
    if config.auto is not None:
        raise ValueError("comm_compressor='auto' supports FSDP2 and DDP; for HSDP pick a "
                         "preset (e.g. 'global_qsgd_exp' for the replica all-reduce)")
    ddp_scheme(config)
    topology = Topology(ranks_per_node, group_timeout(dist.group.WORLD))
    if shard:
        state = fully_shard_hsdp(model, mesh, config, layer_cls=layer_cls, topology=topology,
                                 meter=meter, **fsdp_kwargs)
    elif fsdp_kwargs or layer_cls is not None:
        raise ValueError("layer_cls and fully_shard keyword arguments need shard=True")
    else:
        state = install_hsdp_hook(model, mesh, config, topology=topology, meter=meter)
    return Compression("hsdp", model, config, topology, state.meter, state).install()


def _apply_fsdp(model: nn.Module, compressor: str | CompressionConfig,
                ranks_per_node: int | None, shard: bool, meter: WireMeter | None,
                layer_cls: tuple[type, ...] | None, fsdp_kwargs: dict[str, Any]) -> Compression:
    try:
        config = get_config(compressor)
        if config.all_reduce is not None and not config.compresses_fsdp:
            raise ValueError(f"config {config.name!r} compresses only the DDP / HSDP "
                             f"all-reduce; FSDP's all-gather and reduce-scatter have nothing "
                             f"to compress. Use the DDP comm hook, or an FSDP preset such as "
                             f"'sdp4bit'")
        world = dist.get_world_size()
        x = resolve_ranks_per_node(world, ranks_per_node)
        existing = fsdp_modules(model)
        settings: dict | BaseException = {
            "config": config.to_dict(), "world_size": world, "ranks_per_node": x,
            "shard": shard, "fsdp_modules": [n for n, _ in existing],
            "parameters": sum(p.numel() for p in model.parameters())}
    except ValueError as err:  # every rank learns about it, instead of waiting for this one
        settings = err
    try:
        check_same_settings(settings)
    except ValueError:
        if isinstance(settings, BaseException):
            raise settings from None      # this rank's own error
        raise
    if shard and existing:
        raise ValueError("apply(..., shard=True) got a model that is already fully_shard-ed; "
                         "pass shard=False")
    if not shard and not existing:
        raise ValueError("the model has no FSDP2 modules: call fully_shard on it first, or "
                         "pass shard=True")
    if shard:
        shard_model(model, x, config.hpz, layer_cls, **fsdp_kwargs)
    elif fsdp_kwargs or layer_cls is not None:
        raise ValueError("layer_cls and fully_shard keyword arguments need shard=True")
    modules = fsdp_modules(model)
    group = check_group(modules)
    if config.hpz:
        check_hpz(modules, x, world)
    topology = Topology(ranks_per_node, group_timeout(group))
    meter = meter if meter is not None else WireMeter()

    def build(cfg: CompressionConfig) -> FSDPInstall:
        comms = {name: ModuleComms(name, m, model, cfg, topology, meter, i)
                 for i, (name, m) in enumerate(modules)}
        return FSDPInstall(cfg, comms, topology)

    auto = None
    if config.auto is not None:
        requested = config

        def probe(compute_s: float | None = None):
            return choose_fsdp(model, modules, topology, requested.auto,
                               requested.exact_patterns, requested.min_numel, compute_s)

        auto = AutoController(probe(), requested, reprobe=probe, rebuild=build)
        config = auto.config
    return Compression("fsdp2", model, config, topology, meter, build(config), auto).install()
