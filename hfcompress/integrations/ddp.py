"""DDP comm hook for the all-reduce schemes (torch ``ddp_comm_hooks`` style: a state object and
a short hook): Global-QSGD linear / exponential dithering (Global-QSGD 8: "register our DDP
hook with one line"), int8 / int4 group quantization, LoCo error feedback (LoCo Alg. 1)::

    state = register_ddp_hook(ddp_model, "global_qsgd")
    for batch in data:
        loss_fn(ddp_model(batch)).backward()
        optimizer.step(); optimizer.zero_grad()
        state.step()                        # LoCo's per-step reset schedule; closes the meter step

Each bucket gets its own ``QuantizedAllReduce`` (LoCo keeps its error per bucket index; DDP
rebuilds its buckets once after the first iteration, which starts fresh streams for the
rebuilt buckets). Parameters matched by the config's ``exact_patterns`` / ``min_numel``
(QSDP 5.1: norms, biases, small tensors) are all-reduced exactly. The hook runs its
collectives synchronously and returns a completed Future of the averaged bucket.
"""

import inspect
from typing import Any, Hashable

import torch
import torch.distributed as dist
from torch import nn

from ..comm import QuantizedAllReduce, Topology, WireMeter
from ..comm.all_reduce import group_size_check
from ..compressors import Compressor, get_compressor
from ..compressors.loco import LoCo
from ..config import CompressionConfig, get_config
from .consistency import check_same_settings
from .exact_params import Segment, SlotLayout, is_exact
from .fsdp import stream_seed

AVG = dist.ReduceOp.AVG
GLOBAL_SCHEMES = ("global_qsgd", "global_qsgd_exp")


def all_reduce_compressor(config: CompressionConfig, group_size: int,
                          *key: Any) -> Compressor | None:
    """The all-reduce scheme of ``config`` (``all_reduce``, else the gradient scheme
    ``grad_inter``), LoCo-wrapped if ``config.loco``; None = exact. Global-QSGD gets
    ``num_peers = group_size`` unless given (then it must match); a seeded scheme gets a
    seed per ``key`` (include the rank: peers must not share rounding noise) from its own
    ``seed`` or ``config.seed``."""
    scheme = config.all_reduce or config.grad_inter
    if scheme is None:
        if config.loco is not None:
            raise ValueError(f"config {config.name!r}: loco error feedback needs a gradient "
                             f"scheme (all_reduce or grad_inter)")
        return None
    params = dict(scheme.params)
    if scheme.name in GLOBAL_SCHEMES:
        params.setdefault("num_peers", group_size)
    comp = get_compressor(scheme.name, **params)
    if "seed" in inspect.signature(type(comp).__init__).parameters:
        params["seed"] = stream_seed(params.get("seed", config.seed), *key)
        comp = get_compressor(scheme.name, **params)
    group_size_check(comp, group_size)
    return LoCo(inner=comp, **config.loco) if config.loco is not None else comp


class BucketAllReduce:
    """One stream's average over the group: exact columns by torch, the rest compressed."""

    def __init__(self, compressor: Compressor | None, layout: SlotLayout,
                 topology: Topology | None, meter: WireMeter, tag: str) -> None:
        self.layout = layout
        self.compressed = QuantizedAllReduce(compressor, topology, meter, tag)
        self.exact = QuantizedAllReduce(None, topology, meter, f"{tag}_exact")

    def __call__(self, flat: torch.Tensor, group: dist.ProcessGroup) -> None:
        layout = self.layout
        if self.compressed.compressor is None or layout.all_exact:
            self.exact(flat, AVG, group)
        elif not layout.mixed:
            self.compressed(flat, AVG, group)
        else:
            rows = flat.view(1, -1)
            comp, exact = layout.split(rows)
            self.compressed(comp, AVG, group)
            self.exact(exact, AVG, group)
            layout.merge(rows, comp, exact)


class AllReduceState:
    """Hook state: the config, the group, one :class:`BucketAllReduce` per stream key (DDP
    bucket index, FSDP module name), the wire meter."""

    def __init__(self, config: str | CompressionConfig | Compressor,
                 group: dist.ProcessGroup | None = None, topology: Topology | None = None,
                 meter: WireMeter | None = None, tag: str = "all_reduce") -> None:
        self.group = group or dist.group.WORLD
        self.size = dist.get_world_size(self.group)
        self.topology, self.meter, self.tag = topology, meter or WireMeter(), tag
        if isinstance(config, Compressor):
            group_size_check(config, self.size)
            self.config, self.prototype = CompressionConfig(exact_patterns=()), config
            settings = _without_seeds(config.config())
        else:
            self.config, self.prototype = get_config(config), None
            settings = self.config.to_dict()
        check_same_settings({"all_reduce": settings, "group_size": self.size}, self.group,
                            what="hfcompress all-reduce hook")
        self.streams: dict[Hashable, BucketAllReduce] = {}
        self.param_names: dict[int, str] = {}    # id(parameter) -> name, for DDP buckets
        self._compressor("check")    # a bad scheme fails here, not in the backward pass

    def layout(self, named: list[tuple[str, int]]) -> SlotLayout:
        """The exact / compressed columns of a flat buffer of these (name, numel) params."""
        c = self.config
        return SlotLayout([Segment(n, k, is_exact(n, k, c.exact_patterns, c.min_numel))
                           for n, k in named])

    def reduce(self, key: Hashable, flat: torch.Tensor, layout: SlotLayout) -> None:
        """Average ``flat`` over the group in place, as stream ``key`` (new if its layout
        changed, e.g. DDP's bucket rebuild)."""
        stream = self.streams.get(key)
        if stream is None or stream.layout.segments != layout.segments:
            stream = self.streams[key] = BucketAllReduce(self._compressor(key), layout,
                                                         self.topology, self.meter, self.tag)
        stream(flat, self.group)

    def _compressor(self, key: Hashable) -> Compressor | None:
        if self.prototype is not None:
            return self.prototype.fresh() if self.prototype.stateful else self.prototype
        return all_reduce_compressor(self.config, self.size, dist.get_rank(), key)

    def compressors(self) -> list[Compressor]:
        return [c for s in self.streams.values() for c in s.compressed.compressors()]

    def step(self) -> dict:
        """Once per optimizer step: LoCo's reset schedule (Alg. 1 lines 9-10) on every error
        stream; closes and returns the wire meter's step."""
        for c in self.compressors():
            if isinstance(c, LoCo):
                c.step()
        return self.meter.step()

    def state_dict(self) -> dict[str, Any]:
        return {"streams": {key: {"segments": s.layout.segments,
                                  "state": s.compressed.state_dict()}
                            for key, s in self.streams.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streams = {}
        for key, st in state["streams"].items():
            layout = SlotLayout(st["segments"])
            self.streams[key] = BucketAllReduce(self._compressor(key), layout, self.topology,
                                                self.meter, self.tag)
            self.streams[key].compressed.load_state_dict(st["state"])


def _without_seeds(config: dict[str, Any]) -> dict[str, Any]:
    """A compressor's config without its seeds (they differ per rank by design)."""
    return {k: _without_seeds(v) if isinstance(v, dict) else v
            for k, v in config.items() if k != "seed"}


def all_reduce_hook(state: AllReduceState,
                    bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's gradients averaged through ``state``'s scheme. (No
    ``from __future__ import annotations`` in this module: DDP checks these annotations.)"""
    buf = bucket.buffer()
    names = state.param_names
    state.reduce(bucket.index(), buf,
                 state.layout([(names.get(id(p), "?"), p.numel()) for p in bucket.parameters()]))
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def register_ddp_hook(ddp_model: nn.parallel.DistributedDataParallel,
                      config: str | CompressionConfig | Compressor, *,
                      ranks_per_node: int | None = None, topology: Topology | None = None,
                      meter: WireMeter | None = None) -> AllReduceState:
    """Register the compressed all-reduce on ``ddp_model``; returns the hook state
    (``.meter``, ``.step()``, ``.state_dict()``). ``config``: a preset name
    (``"global_qsgd"``, ``"global_qsgd_exp"``, ``"loco"``, ``"none"``), a ``CompressionConfig``
    (e.g. ``CompressionConfig(all_reduce=Scheme("int", {"bits": 8, "rounding":
    "stochastic"}))`` for the int8 group all-reduce), or a compressor instance (used as is for
    every parameter; give each rank its own seed). ``ranks_per_node`` (or ``topology``)
    splits the metered bytes into intra- and inter-node."""
    if topology is None and ranks_per_node is not None:
        topology = Topology(ranks_per_node)
    state = AllReduceState(config, ddp_model.process_group, topology, meter)
    state.param_names = {id(p): n for n, p in ddp_model.module.named_parameters()}
    ddp_model.register_comm_hook(state, all_reduce_hook)
    return state
