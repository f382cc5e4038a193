"""``hfcompress.apply``: one call turns on compressed communication for a sharded model."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from .comm import WireMeter
from .comm.topology import resolve_ranks_per_node
from .config import CompressionConfig, get_config
from .integrations.consistency import check_same_settings
from .integrations.fsdp import (FSDPCompression, ModuleComms, check_group, check_hpz,
                                fsdp_modules, shard_model)
from .integrations.timeouts import TimedTopology, group_timeout


def apply(model: nn.Module, compressor: str | CompressionConfig = "sdp4bit",
          ranks_per_node: int | None = None, shard: bool = False, *,
          meter: WireMeter | None = None, layer_cls: tuple[type, ...] | None = None,
          **fsdp_kwargs: Any) -> FSDPCompression:
    """Install compressed all-gather / reduce-scatter on every FSDP2 module of ``model``.

    - ``compressor``: a preset name (``hfcompress.config.list_presets()``) or a
      ``CompressionConfig``.
    - ``ranks_per_node``: ranks per node (default ``LOCAL_WORLD_SIZE``, else one node); an
      explicit value emulates nodes on one machine.
    - ``shard=False``: ``model`` is already ``fully_shard``-ed. ``shard=True``: apply
      ``fully_shard`` to every decoder layer (``layer_cls``, default Hugging Face's
      ``_no_split_modules``) and the root, with ``fsdp_kwargs`` (e.g. ``mp_policy``) and,
      when the config uses hpZ, ``reshard_after_forward=ranks_per_node``.

    Every rank must call it with the same settings (checked: a mismatch raises ValueError
    naming the differing keys and ranks). Returns the handle: ``.meter``, ``.step()`` after
    each optimizer step, ``.state_dict()`` / ``.load_state_dict()``, ``.remove()``.
    """
    if not dist.is_initialized():
        raise RuntimeError("hfcompress.apply needs torch.distributed to be initialized "
                           "(torchrun / accelerate launch, or dist.init_process_group)")
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
    topology = TimedTopology(x, group_timeout(group))
    meter = meter if meter is not None else WireMeter()
    comms = {name: ModuleComms(name, m, model, config, topology, meter, i)
             for i, (name, m) in enumerate(modules)}
    return FSDPCompression(model, config, topology, meter, comms).install()
