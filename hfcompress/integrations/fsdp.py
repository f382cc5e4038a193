"""Compressed FSDP2 communication: a custom all-gather and reduce-scatter on every FSDPModule
(``set_custom_all_gather`` / ``set_custom_reduce_scatter``, PLATFORM.md "FSDP2 extension
points").

- Forward all-gather: the config's weight scheme (ZeRO++ qwZ, SDP4Bit qWD Alg. 2, QSDP W8).
  Backward all-gather: the same collective object (qWD: no optimizer step since the forward,
  known from the parameters' version counters, so every rank rebuilds the forward's weights
  from its node-sharded references: an intra-node gather, no differences), or, with
  hpZ (``reshard_after_forward=ranks_per_node``, ZeRO++ 3.3 / B.2), an exact gather of the
  node's secondary partition, which never leaves the node.
- Reduce-scatter: 1-hop all-to-all or the 2-hop intra-/inter-node all-to-all (ZeRO++ qgZ,
  SDP4Bit TLq / TLq-HS Alg. 3), with LoCo error feedback (LoCo Alg. 1) on the first hop.
- Parameters matched by ``exact_patterns`` / ``min_numel`` travel exactly (QSDP 5.1): their
  columns of the flat buffer go through an exact collective of their own (``exact_params``).
- One collective object, hence one stream of compressor state, per FSDP module and
  direction; each has its own seed per rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import warnings
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

from ..comm import (QuantizedAllGather, QuantizedReduceScatter, Topology, TwoHopReduceScatter,
                    WireMeter)
from ..comm.all_gather import VersionWatch
from ..comm.memory import check_fsdp_state_fits
from ..compressors import Compressor, get_compressor
from ..compressors.base import FLOAT_DTYPES
from ..compressors.loco import LoCo
from ..config import CompressionConfig, Scheme
from .consistency import differences
from .exact_params import GroupLayouts, SlotLayout
from .timeouts import comm_guard

ALL_GATHER, ALL_GATHER_BWD, REDUCE_SCATTER = "all_gather", "all_gather_bwd", "reduce_scatter"


# -- building the compressors ---------------------------------------------------------------
def stream_seed(base: int, *key: Any) -> int:
    """A seed for one (rank, module, direction) stream, derived from the base seed."""
    digest = hashlib.blake2b(repr((int(base), *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def build(scheme: Scheme | None, base_seed: int, *key: Any) -> Compressor | None:
    """A fresh compressor of ``scheme``; seeded per stream if the scheme takes a seed."""
    if scheme is None:
        return None
    c = scheme.build()
    if "seed" in inspect.signature(type(c).__init__).parameters:
        seed = stream_seed(scheme.params.get("seed", base_seed), *key)
        c = get_compressor(scheme.name, **{**scheme.params, "seed": seed})
    return c


def gradient_collective(config: CompressionConfig, topology: Topology, meter: WireMeter,
                        seed: int, rank: int, index: int):
    """The reduce-scatter of one module: 1-hop or 2-hop, LoCo on the first hop that runs."""
    intra = build(config.grad_intra, seed, rank, index, "grad_intra")
    inter = build(config.grad_inter, seed, rank, index, "grad_inter")
    if config.loco is not None:
        first_is_intra = config.two_hop and topology.ranks_per_node > 1
        inner = intra if first_is_intra else inter
        if inner is None:
            raise ValueError(f"config {config.name!r}: loco error feedback needs a gradient "
                             f"scheme on the {'intra' if first_is_intra else 'inter'}-node hop")
        wrapped = LoCo(inner=inner, **config.loco)
        intra, inter = (wrapped, inter) if first_is_intra else (intra, wrapped)
    if config.two_hop:
        return TwoHopReduceScatter(topology, intra, inter, meter=meter, tag=REDUCE_SCATTER)
    if inter is not None:
        return QuantizedReduceScatter(inter, topology, meter, REDUCE_SCATTER)
    return None


# -- the FSDP comm objects ------------------------------------------------------------------
class _Alloc:
    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class FSDPAllGather(_Alloc, AllGather):
    """All-gather of one FSDP module: compressed on the primary group, exact on hpZ's."""

    def __init__(self, name: str, param_group, layouts: GroupLayouts,
                 compressed: QuantizedAllGather | None, exact: QuantizedAllGather) -> None:
        self.name, self.param_group, self.layouts = name, param_group, layouts
        self.compressed, self.exact = compressed, exact
        self._warned = False
        # qWD: "no optimizer step since the forward all-gather", known on the host
        self.versions = VersionWatch(
            lambda: [p._sharded_param_data for p in param_group.fsdp_params])

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> None:
        pg = self.param_group
        backward = pg._training_state == TrainingState.PRE_BACKWARD
        unchanged = self.versions.unchanged() and backward   # ranks step together
        tag = ALL_GATHER_BWD if backward else ALL_GATHER
        self.exact.tag = tag
        with comm_guard(f"{'backward' if backward else 'forward'} all-gather", self.name,
                        group):
            layout = self.layouts.full
            if (self.compressed is None or pg.is_sharded_post_forward or layout.all_exact
                    or not self._compressible(input_tensor)):
                # hpZ's secondary partition already holds the compressed weights: exact
                self.exact(output_tensor, input_tensor, group)
                return None
            self.compressed.tag = tag
            if not layout.mixed:
                self.compressed(output_tensor, input_tensor, group, unchanged=unchanged)
                return None
            world = group.size()
            comp_in, exact_in = layout.split(input_tensor.reshape(1, -1))
            comp_out = torch.empty(world * comp_in.numel(), dtype=input_tensor.dtype,
                                   device=input_tensor.device)
            exact_out = torch.empty(world * exact_in.numel(), dtype=input_tensor.dtype,
                                    device=input_tensor.device)
            self.compressed(comp_out, comp_in.reshape(-1), group, unchanged=unchanged)
            self.exact(exact_out, exact_in.reshape(-1), group)
            layout.merge(output_tensor.view(world, -1), comp_out.view(world, -1),
                         exact_out.view(world, -1))
        return None

    def _compressible(self, input_tensor: torch.Tensor) -> bool:
        """A float buffer laid out as the param group says (not, e.g., the uint8 buffer of
        tensor-subclass all-gather extensions)."""
        ok = input_tensor.dtype in FLOAT_DTYPES and input_tensor.numel() == self.layouts.full.numel
        if not ok and not self._warned:
            self._warned = True
            warnings.warn(f"hfcompress: the all-gather buffer of FSDP module {self.name!r} "
                          f"({input_tensor.numel()} x {input_tensor.dtype}) does not match its "
                          f"parameters; it is gathered exactly", RuntimeWarning)
        return ok


class FSDPReduceScatter(_Alloc, ReduceScatter):
    """Reduce-scatter of one FSDP module's gradients; exact columns reduced exactly."""

    def __init__(self, name: str, layouts: GroupLayouts, compressed, exact: QuantizedReduceScatter
                 ) -> None:
        self.name, self.layouts = name, layouts
        self.compressed, self.exact = compressed, exact
        self._warned = False

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> None:
        with comm_guard("gradient reduce-scatter", self.name, group):
            layout = self._layout(output_tensor.numel())
            if self.compressed is None or layout is None or layout.all_exact:
                self.exact(output_tensor, input_tensor, op, group)
                return None
            if not layout.mixed:
                self.compressed(output_tensor, input_tensor, op, group)
                return None
            world = group.size()
            comp_in, exact_in = layout.split(input_tensor.view(world, -1))
            comp_out = torch.empty(comp_in.shape[1], dtype=output_tensor.dtype,
                                   device=output_tensor.device)
            exact_out = torch.empty(exact_in.shape[1], dtype=output_tensor.dtype,
                                    device=output_tensor.device)
            self.compressed(comp_out, comp_in.reshape(-1), op, group)
            self.exact(exact_out, exact_in.reshape(-1), op, group)
            layout.merge(output_tensor.view(1, -1), comp_out.view(1, -1), exact_out.view(1, -1))
        return None

    def _layout(self, numel: int) -> SlotLayout | None:
        layout = self.layouts.for_numel(numel)
        if layout is None and self.compressed is not None and not self._warned:
            self._warned = True
            warnings.warn(f"hfcompress: the gradient buffer of FSDP module {self.name!r} "
                          f"({numel} values per rank) matches no known parameter layout (some "
                          f"parameters got no gradient?); it is reduced exactly", RuntimeWarning)
        return layout


class ModuleComms:
    """The compressed all-gather and reduce-scatter of one FSDP module."""

    def __init__(self, name: str, module: FSDPModule, model: nn.Module,
                 config: CompressionConfig, topology: Topology, meter: WireMeter,
                 index: int) -> None:
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) != 1:
            raise ValueError(f"FSDP module {name!r} has {len(groups)} parameter groups; "
                             f"hfcompress supports one per module (no shard_placement_fn meshes)")
        self.name, self.module, self.param_group = name, module, groups[0]
        self.layouts = GroupLayouts(model, self.param_group, config.exact_patterns,
                                    config.min_numel)
        rank, seed = dist.get_rank(), config.seed
        weights = build(config.weights, seed, rank, index, "weights")
        self.all_gather = QuantizedAllGather(weights, topology, meter, ALL_GATHER) \
            if weights is not None else None
        self.reduce_scatter = gradient_collective(config, topology, meter, seed, rank, index)
        self.ag = FSDPAllGather(name, self.param_group, self.layouts, self.all_gather,
                                QuantizedAllGather(None, topology, meter, ALL_GATHER))
        self.rs = FSDPReduceScatter(name, self.layouts, self.reduce_scatter,
                                    QuantizedReduceScatter(None, topology, meter, REDUCE_SCATTER))
        self._saved = (self.param_group._all_gather_comm, self.param_group._reduce_scatter_comm)

    def collectives(self) -> dict[str, Any]:
        return {k: v for k, v in (("all_gather", self.all_gather),
                                  ("reduce_scatter", self.reduce_scatter)) if v is not None}

    def install(self) -> None:
        self.module.set_custom_all_gather(self.ag)
        self.module.set_custom_reduce_scatter(self.rs)

    def uninstall(self) -> None:
        self.module.set_custom_all_gather(self._saved[0])
        self.module.set_custom_reduce_scatter(self._saved[1])


# -- the handle -----------------------------------------------------------------------------
class FSDPCompression:
    """What ``hfcompress.apply`` returns for an FSDP2 model.

    ``meter`` (a ``WireMeter``) counts the bytes of every collective (``all_gather``,
    ``all_gather_bwd``, ``reduce_scatter``); call ``step()`` after each optimizer step;
    ``state_dict()`` / ``load_state_dict()`` hold every compressor's state (qWD references,
    LoCo errors, RNG streams); ``remove()`` restores FSDP's own collectives.
    """

    def __init__(self, model: nn.Module, config: CompressionConfig, topology: Topology,
                 meter: WireMeter, comms: dict[str, ModuleComms]) -> None:
        self.model, self.config, self.topology, self.meter = model, config, topology, meter
        self.comms = comms
        # compressor state per rank, estimated before any is allocated (raises on CUDA if
        # it cannot fit)
        self.state_estimate = check_fsdp_state_fits(config, comms.values(), topology.world_size,
                                                    topology.ranks_per_node)
        self.installed = False

    def install(self) -> "FSDPCompression":
        for c in self.comms.values():
            c.install()
        self.installed = True
        return self

    def remove(self) -> None:
        """Restore the collectives FSDP had before ``apply`` (compressor state is kept)."""
        for c in self.comms.values():
            c.uninstall()
        self.installed = False

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """FSDP's own exact collectives inside the block (e.g. to measure exact gradients)."""
        was = self.installed
        self.remove()
        try:
            yield
        finally:
            if was:
                self.install()

    def compressors(self) -> list[Compressor]:
        return [c for m in self.comms.values() for coll in m.collectives().values()
                for c in coll.compressors()]

    def step(self) -> dict:
        """End of an optimizer step: LoCo's reset counter (Alg. 1 lines 9-10) and the wire
        meter's step boundary. Returns the closed step's byte counts."""
        for c in self.compressors():
            if isinstance(c, LoCo):
                c.step()
        return self.meter.step()

    def state_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(),
                "modules": {name: {k: coll.state_dict() for k, coll in m.collectives().items()}
                            for name, m in self.comms.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        lines = differences([state["config"], self.config.to_dict()], ["saved", "this handle"])
        if lines:
            raise ValueError("hfcompress state was saved with another configuration:\n"
                             + "\n".join(lines))
        modules = state["modules"]
        if set(modules) != set(self.comms):
            raise ValueError(f"hfcompress state is for FSDP modules {sorted(modules)}, this "
                             f"model has {sorted(self.comms)}")
        for name, m in self.comms.items():
            colls = m.collectives()
            if set(modules[name]) != set(colls):
                raise ValueError(f"hfcompress state of module {name!r} holds "
                                 f"{sorted(modules[name])}, expected {sorted(colls)}")
            for k, coll in colls.items():
                coll.load_state_dict(modules[name][k])

    def __repr__(self) -> str:
        return (f"FSDPCompression({self.config.name!r}, {len(self.comms)} FSDP modules, "
                f"{self.topology!r}, installed={self.installed})")


# -- sharding -------------------------------------------------------------------------------
def decoder_layers(model: nn.Module, layer_cls: tuple[type, ...] | None = None) -> list[nn.Module]:
    """The modules to shard one by one: instances of ``layer_cls``, else of the classes in
    Hugging Face's ``model._no_split_modules`` (the decoder layers)."""
    if layer_cls is None:
        names = set(getattr(model, "_no_split_modules", None) or ())
        return [m for m in model.modules() if type(m).__name__ in names and m is not model]
    return [m for m in model.modules() if isinstance(m, layer_cls) and m is not model]


def hpz_reshard(ranks_per_node: int, world: int) -> bool | int:
    """``reshard_after_forward`` for hpZ: the node's ranks hold the secondary partition
    (one rank per node: keep the full weights; one node: the primary partition is the node)."""
    if ranks_per_node == 1:
        return False
    return True if ranks_per_node == world else ranks_per_node


def shard_model(model: nn.Module, ranks_per_node: int, hpz: bool,
                layer_cls: tuple[type, ...] | None = None, **fsdp_kwargs: Any) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root; hpZ via the layers'
    ``reshard_after_forward``."""
    layer_kwargs = dict(fsdp_kwargs)
    if hpz:
        if "reshard_after_forward" in fsdp_kwargs:
            raise ValueError("hpZ sets reshard_after_forward itself; do not pass it")
        layer_kwargs["reshard_after_forward"] = hpz_reshard(ranks_per_node,
                                                            dist.get_world_size())
    for layer in decoder_layers(model, layer_cls):
        fully_shard(layer, **layer_kwargs)
    fully_shard(model, **fsdp_kwargs)   # the root stays gathered for backward (FSDP default)
    return model


def fsdp_modules(model: nn.Module) -> list[tuple[str, FSDPModule]]:
    """Every FSDPModule with parameters, by name (the root is ``""``)."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, FSDPModule) and m._get_fsdp_state()._fsdp_param_groups]


def check_hpz(modules: list[tuple[str, FSDPModule]], ranks_per_node: int, world: int) -> None:
    """A config with hpZ needs every sharded layer to reshard to the node after forward."""
    want = hpz_reshard(ranks_per_node, world)
    for name, m in modules:
        if not name:
            continue  # the root's backward all-gather is FSDP's choice
        pg = m._get_fsdp_state()._fsdp_param_groups[0]
        info = pg.post_forward_mesh_info
        got = False if info is None else (True if info == pg.mesh_info
                                          else info.shard_mesh_size)
        if got != want and got is not False:  # False: no backward all-gather at all (e.g.
            raise ValueError(                 # Accelerate's final-norm + lm_head group)
                f"this configuration uses hpZ (backward all-gather inside the node), but FSDP "
                f"module {name!r} was sharded with reshard_after_forward={got!r}; shard with "
                f"fully_shard(..., reshard_after_forward={want!r}) or let apply(..., "
                f"shard=True) do it")


def check_group(modules: list[tuple[str, FSDPModule]]) -> dist.ProcessGroup:
    """The FSDP process group: every module must shard over the whole world."""
    world = list(range(dist.get_world_size()))
    group = None
    for name, m in modules:
        pg = m._get_fsdp_state()._fsdp_param_groups[0]
        g = pg.mesh_info.shard_process_group
        if dist.get_process_group_ranks(g) != world:
            raise ValueError(f"FSDP module {name!r} shards over ranks "
                             f"{dist.get_process_group_ranks(g)}; hfcompress supports FSDP over "
                             f"the whole world (ranks {world}) only")
        group = group or g
    return group
