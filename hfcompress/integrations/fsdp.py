"""Compressed FSDP2 communication: a custom all-gather and reduce-scatter on every FSDPModule
(``set_custom_all_gather`` / ``set_custom_reduce_scatter``; the private FSDP2 internals they
need are in ``_fsdp2``).

- Forward all-gather: the config's weight scheme (ZeRO++ qwZ, SDP4Bit qWD Alg. 2, QSDP W8).
  Backward all-gather: the same collective object (qWD: no optimizer step since the forward,
  known from the parameters' version counters, so every rank rebuilds the forward's weights
  from its node-sharded references: an intra-node gather, no differences), or, with
  hpZ (``reshard_after_forward=ranks_per_node``, ZeRO++ 3.3 / B.2), an exact gather of the
  node's secondary partition, which never leaves the node.
- Reduce-scatter: 1-hop all-to-all or the 2-hop intra-/inter-node all-to-all (ZeRO++ qgZ,
  SDP4Bit TLq / TLq-HS Alg. 3), with LoCo error feedback (LoCo Alg. 1) on each hop.
- Parameters matched by ``exact_patterns`` / ``min_numel`` travel exactly (QSDP 5.1): their
  columns of the flat buffer go through an exact collective of their own (``exact_params``).
- One collective object, hence one stream of compressor state, per FSDP module and
  direction; each has its own seed per rank.
- Every call is metered: the sent bytes by the collectives, the uncompressed baseline (the
  buffer FSDP hands over) and the time here.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from ..comm import (QuantizedAllGather, QuantizedReduceScatter, Topology, TwoHopReduceScatter,
                    WireMeter)
from ..comm.all_gather import VersionWatch
from ..comm.frozen import FrozenParams
from ..comm.one_rank import skips
from ..comm.reduce_scatter import check_scatter_op, post_of
from ..comm.futures import FutureWork, finish_all, inline, side_stream_call
from ..compressors.base import FLOAT_DTYPES
from ..compressors.registry import build_compressor
from ..compressors.runs import put, view
from ..config import CompressionConfig, upgrade_dict
from ..cost.hops import gradient_hops
from ..cost.units import Unit, hpz_reshard
from ..kernels.launch_plans import LaunchPlans, signature
from . import _fsdp2
from .consistency import differences
from .exact_params import GroupLayouts, SlotLayout
from .memory import check_fits
from .timeouts import comm_guard, communication_error

ALL_GATHER, ALL_GATHER_BWD, REDUCE_SCATTER = "all_gather", "all_gather_bwd", "reduce_scatter"


# -- building the compressors ---------------------------------------------------------------
def gradient_collective(config: CompressionConfig, topology: Topology, meter: WireMeter,
                        seed: int, rank: int, index: int):
    """The reduce-scatter of one module: 1-hop or 2-hop, with the compressors of
    ``cost/hops.gradient_hops``."""
    hops = gradient_hops(config, topology.ranks_per_node, seed, (rank, index))
    intra, inter = hops["grad_intra"], hops["grad_inter"]
    if config.runs_two_hop(topology.ranks_per_node):
        return TwoHopReduceScatter(topology, intra, inter, meter=meter, tag=REDUCE_SCATTER)
    if inter is not None:
        return QuantizedReduceScatter(inter, topology, meter, REDUCE_SCATTER)
    return None


# -- the FSDP comm objects ------------------------------------------------------------------
class _Alloc:
    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class FSDPAllGather(_Alloc, _fsdp2.AllGather):
    """All-gather of one FSDP module: compressed on the primary group, exact on hpZ's."""

    def __init__(self, name: str, param_group, layouts: GroupLayouts,
                 compressed: QuantizedAllGather | None, exact: QuantizedAllGather) -> None:
        self.name, self.param_group, self.layouts = name, param_group, layouts
        self.compressed, self.exact = compressed, exact
        self.frozen = frozen_columns(layouts, compressed)
        self._warned = False
        self._plans = LaunchPlans(self._plan)    # buffers' signatures -> :meth:`_plan`
        # qWD: "no optimizer step since the forward all-gather", known on the host
        self.versions = VersionWatch()

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> dist.Work | None:
        """FSDP2's all-gather call. ``async_op=True`` (``unshard(async_op=True)``, explicit
        prefetching) returns a ``dist.Work``; FSDP2 ``wait()``s it in
        ``foreach_all_gather_copy_out`` before reading ``output_tensor``, and it completes
        when the exchange and the decode into ``output_tensor`` are done.

        Streams (torch 2.13 ``_fsdp_param_group.py`` / ``_fsdp_collectives.py``): FSDP2 calls
        this under ``device_handle.stream(all_gather_stream)``: its all-gather stream for
        implicit prefetching (sync), the *compute* stream when ``async_op=True``
        (``get_all_gather_streams``). On CUDA without ``async_op`` every kernel here
        (compress, NCCL, decode) is enqueued on the all-gather stream in order and FSDP2
        records its own event after this call, which covers the decode too. With
        ``async_op`` they go to a private side stream that waits on the compute stream
        (``comm/futures.side_stream_call``: the compute stream is never made to wait for
        NCCL), and the returned Work's ``wait()`` (called by FSDP2 before the copy-out)
        makes the compute stream wait for an event recorded there after the decode. Nothing
        waits on the host. On CPU the exchange runs asynchronously on gloo and the decode is
        chained to it (overlap with the caller's compute)."""
        meter = self.exact.meter
        meter.record_uncompressed(input_tensor.numel() * input_tensor.element_size(), group,
                                  self.exact.topology)
        backward = _fsdp2.in_backward(self.param_group)
        what = f"{'backward' if backward else 'forward'} all-gather"

        device = input_tensor.device
        on_side = inline(device)

        def gather(async_: bool):
            with meter.timed(device):    # on the stream the stages run on
                return self._gather(output_tensor, input_tensor, group, backward, async_)

        with comm_guard(what, self.name, group):
            if async_op and on_side:    # CUDA: the side stream
                fut = side_stream_call(lambda: gather(False), output_tensor,
                                       keep=[input_tensor])
            else:
                fut = gather(async_op)
        if not async_op:
            return None
        return FutureWork(fut, lambda err: communication_error(what, self.name, group, err),
                          device if on_side else None)

    def _gather(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                group: dist.ProcessGroup, backward: bool, async_op: bool):
        pg = self.param_group
        tag = ALL_GATHER_BWD if backward else ALL_GATHER
        self.exact.tag = tag
        if self.compressed is None:    # no weight scheme: nothing to watch
            return self.exact(output_tensor, input_tensor, group, async_op=async_op)
        # read once: the version watch's and frozen.py's
        states = VersionWatch.read(_fsdp2.sharded_params(pg))
        unchanged = self.versions.unchanged(states) and backward   # ranks step together
        layout = self.layouts.full
        if (_fsdp2.is_sharded_post_forward(pg) or layout.all_exact
                or not self._compressible(input_tensor)):
            # hpZ's secondary partition already holds the compressed weights: exact
            return self.exact(output_tensor, input_tensor, group, async_op=async_op)
        self.compressed.tag = tag
        columns = self.frozen.current(states) if self.frozen is not None else None
        if columns is not None:   # qWD with frozen parameters (comm/frozen.py)
            return columns(self.exact, output_tensor, input_tensor, group, unchanged, async_op)
        if not layout.mixed:
            return self.compressed(output_tensor, input_tensor, group, unchanged=unchanged,
                                   async_op=async_op)
        return self._gather_mixed(output_tensor, input_tensor, group, unchanged, async_op)

    def _gather_mixed(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                      group: dist.ProcessGroup, unchanged: bool, async_op: bool):
        """Compressed and exact columns. The exact ones ride the compressed gather
        (``comm/riders.py``) unless qWD sends no differences (unchanged weights: two
        collectives, torch's all-gather into a buffer). Each column set decodes into its
        columns of the output where they are one run (a row-strided view; qWD's slots always
        go straight there), else into a buffer put there after."""
        refs = self.compressed.references
        plan = None if refs is None or unchanged or async_op or refs.qwd.reference is None \
            else self._plans((signature(output_tensor), signature(input_tensor), group,
                              signature(refs.qwd.reference), skips(1)),
                             output_tensor, input_tensor, group)
        if plan is not None:
            return plan(output_tensor, input_tensor)
        layout, world = self.layouts.full, group.size()
        qwd = refs is not None and refs.sends_differences(unchanged)
        # qWD reads its columns where they lie (equally spaced runs too: a root unit's)
        comp_in, exact_in = layout.split_slot(input_tensor, spaced=qwd)
        rows, puts = output_tensor.view(world, -1), []

        def into_columns(runs, out: torch.Tensor | None, cols: torch.Tensor,
                         contiguous: bool = False) -> torch.Tensor:
            if out is None or (contiguous and not out.is_contiguous()):
                out = torch.empty(world, cols.shape[-1], dtype=input_tensor.dtype,
                                  device=input_tensor.device)
                puts.append((runs, out))
            return out
        if refs is None or qwd:     # qWD puts its slots into their columns itself
            comp_out = rows if qwd else into_columns(
                layout.compressed_runs, view(rows, layout.compressed_runs), comp_in)
            exact_out = into_columns(layout.exact_runs, view(rows, layout.exact_runs), exact_in)
            futures = [self.compressed(comp_out, comp_in, group, unchanged=unchanged,
                                       async_op=async_op, exact=(exact_in, exact_out),
                                       columns=layout.compressed_runs if qwd else None)]
        else:
            comp_view, exact_view = layout.views(rows)
            comp_out = into_columns(layout.compressed_runs, comp_view, comp_in)
            exact_out = into_columns(layout.exact_runs, exact_view, exact_in, contiguous=True)
            futures = [self.compressed(comp_out, comp_in, group,
                                       unchanged=unchanged, async_op=async_op),
                       self.exact(exact_out, exact_in.reshape(-1), group, async_op=async_op)]

        if not puts and len(futures) == 1:     # nothing to put after it: its own future
            return futures[0]

        def merge() -> None:
            for runs, buf in puts:
                put(rows, runs, buf)
        return finish_all(futures, merge, async_op, input_tensor.device)

    def _plan(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup):
        """A mixed qWD call that sends differences, not ``async_op``, with buffers of these
        signatures (the reference's too): ``(output, input) -> None``, the slot's two
        column sets and the output's exact columns as views, the compressed gather's own
        plan of them (``QuantizedAllGather.planned``, the exact columns riding) bound:
        :meth:`_gather_mixed`'s calls, nothing decided; None where the exact columns are not
        one run or the gather plans nothing (a unit's host time)."""
        layout, world = self.layouts.full, group.size()
        comp_in, exact_in = layout.split_slot(input, spaced=True)
        rows = output.view(world, -1)
        exact_out = view(rows, layout.exact_runs)
        if exact_out is None:
            return None
        run = self.compressed.planned(rows, comp_in, group, (exact_in, exact_out),
                                      layout.compressed_runs)
        if run is None:
            return None

        def gather(output: torch.Tensor, input: torch.Tensor) -> None:
            comp_in, exact_in = layout.split_slot(input, spaced=True)
            rows = output.view(world, -1)
            run(rows, comp_in, (exact_in, view(rows, layout.exact_runs)))
        return gather

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


def frozen_columns(layouts: GroupLayouts,
                   compressed: QuantizedAllGather | None) -> FrozenParams | None:
    """qWD: the differences of the parameters frozen at an all-gather are not sent while
    they stay frozen and unwritten (``comm/frozen.py``); None without qWD."""
    if compressed is None or compressed.references is None or layouts.full.all_exact:
        return None
    return FrozenParams([(s.numel, s.exact) for s in layouts.segments], compressed)


class FSDPReduceScatter(_Alloc, _fsdp2.ReduceScatter):
    """Reduce-scatter of one FSDP module's gradients; exact columns reduced exactly."""

    def __init__(self, name: str, layouts: GroupLayouts, compressed, exact: QuantizedReduceScatter
                 ) -> None:
        self.name, self.layouts = name, layouts
        self.compressed, self.exact = compressed, exact
        self._warned = False
        self._plans = LaunchPlans(self._plan)    # buffers' signatures -> :meth:`_plan`

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> None:
        """FSDP2's reduce-scatter call (torch 2.13 ``foreach_reduce``): made under
        ``device_handle.stream(reduce_scatter_stream)``, which waited for the gradients'
        copy-in, never with ``async_op``, and its return value is ignored: FSDP2 records
        an event on that stream right after this call, which the optimizer step and the
        next reduce-scatter's buffer reuse wait for. On CUDA every kernel here is enqueued
        on that stream, so the reduce-scatter overlaps the rest of backward on the compute
        stream; nothing here reads a device value on the host (no sync). ``op`` is SUM,
        AVG or ``PREMUL_SUM(1 / f)`` for ``set_gradient_divide_factor(f)``."""
        meter = self.exact.meter
        meter.record_uncompressed(output_tensor.numel() * input_tensor.element_size(), group,
                                  self.exact.topology)
        with meter.timed(input_tensor.device):
            self._reduce(output_tensor, input_tensor, group, op)

    def _reduce(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                group: dist.ProcessGroup, op: Any) -> None:
        with comm_guard("gradient reduce-scatter", self.name, group):
            layout = self._layout(output_tensor.numel())
            if self.compressed is None or layout is None or layout.all_exact:
                self.exact(output_tensor, input_tensor, op, group)
                return None
            if not layout.mixed:
                self.compressed(output_tensor, input_tensor, op, group)
                return None
            plan = self._planned(output_tensor, input_tensor, op, group, layout)
            if plan is not None:
                plan(output_tensor, input_tensor)
                return None
            world = group.size()
            # spaced runs of compressed columns (a root unit's) read where they lie if it can
            comp_in, exact_in = layout.split(input_tensor.view(world, -1),
                                             spaced=self.compressed.spaced_input)
            # each column set reduced straight into the output where it is one run (a slice;
            # the compressed ones also as spaced runs where it reads them so)
            flat = output_tensor if output_tensor.dim() == 1 else output_tensor.view(-1)
            outs = []
            views = layout.views(flat)
            if views[0] is None and self.compressed.spaced_input:
                views = (view(flat, layout.compressed_runs, spaced=True), views[1])
            for runs, cols, out in zip((layout.compressed_runs, layout.exact_runs),
                                       (comp_in, exact_in), views):
                outs.append((runs, out, out if out is not None else torch.empty(
                    cols.numel() // world, dtype=output_tensor.dtype,
                    device=output_tensor.device)))
            # the exact columns ride the compressed exchange (comm/riders.py)
            self.compressed(outs[0][2], comp_in, op, group, exact=(exact_in, outs[1][2]))
            for runs, out, buf in outs:
                if out is None:
                    put(flat, runs, buf)
        return None

    def _planned(self, output: torch.Tensor, input: torch.Tensor, op: Any,
                 group: dist.ProcessGroup, layout: SlotLayout):
        """The plan of a mixed call (:meth:`_plan`) with buffers of these signatures, or None
        (the call decides: a layout of the trainable parameters only, a collective that
        plans nothing)."""
        if layout is not self.layouts.full or not getattr(self.compressed, "plannable", False):
            return None
        check_scatter_op(op)
        return self._plans((signature(output), signature(input), group,
                            post_of(op, group.size()), skips(1)), output, input, op, group)

    def _plan(self, output: torch.Tensor, input: torch.Tensor, op: Any,
              group: dist.ProcessGroup):
        """``(output, input) -> None``: both column sets as views (each one run), the
        compressed collective's own plan of them (``TwoHopReduceScatter.planned``, the exact
        columns riding) bound: the general path's calls, nothing decided; None where a set
        is not one run or the collective plans nothing (a unit's host time)."""
        layout, world = self.layouts.full, group.size()
        outs = layout.views(output if output.dim() == 1 else output.view(-1))
        if any(o is None for o in outs):
            return None
        comp_in, exact_in = layout.split(input.view(world, -1))
        run = self.compressed.planned(outs[0], comp_in, op, group, (exact_in, outs[1]))
        if run is None:
            return None

        def reduce(output: torch.Tensor, input: torch.Tensor) -> None:
            comp_out, exact_out = layout.views(output if output.dim() == 1 else output.view(-1))
            comp_in, exact_in = layout.split(input.view(world, -1))
            run(comp_out, comp_in, (exact_in, exact_out))
        return reduce

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
        groups = _fsdp2.param_groups(module)
        if len(groups) != 1:
            raise ValueError(f"FSDP module {name!r} has {len(groups)} parameter groups; "
                             f"hfcompress supports one per module (no shard_placement_fn meshes)")
        self.name, self.module, self.param_group = name, module, groups[0]
        self.layouts = GroupLayouts(model, self.param_group, config.exact_patterns,
                                    config.min_numel)
        rank, seed = dist.get_rank(), config.seed
        weights = build_compressor(config.weights, seed, rank, index, "weights")
        self.all_gather = QuantizedAllGather(weights, topology, meter, ALL_GATHER) \
            if weights is not None else None
        self.reduce_scatter = gradient_collective(config, topology, meter, seed, rank, index)
        self.ag = FSDPAllGather(name, self.param_group, self.layouts, self.all_gather,
                                QuantizedAllGather(None, topology, meter, ALL_GATHER))
        self.rs = FSDPReduceScatter(name, self.layouts, self.reduce_scatter,
                                    QuantizedReduceScatter(None, topology, meter, REDUCE_SCATTER))
        self._saved = _fsdp2.current_comms(self.param_group)

    def collectives(self) -> dict[str, Any]:
        return {k: v for k, v in (("all_gather", self.all_gather),
                                  ("reduce_scatter", self.reduce_scatter)) if v is not None}

    def install(self) -> None:
        self.module.set_custom_all_gather(self.ag)
        self.module.set_custom_reduce_scatter(self.rs)

    def uninstall(self) -> None:
        self.module.set_custom_all_gather(self._saved[0])
        self.module.set_custom_reduce_scatter(self._saved[1])


def fsdp_units(model: nn.Module, modules: list[tuple[str, FSDPModule]], patterns,
               min_numel: int) -> tuple[list[Unit], torch.dtype, torch.dtype, torch.device]:
    """The FSDP units of ``model`` (``exact_patterns`` / ``min_numel`` split as the
    collectives split them), with the all-gather / reduce dtypes and the device (what
    ``comm_compressor="auto"`` prices)."""
    units, wdt, gdt, device = [], torch.bfloat16, torch.float32, torch.device("cpu")
    for name, module in modules:
        for pg in _fsdp2.param_groups(module):
            full = GroupLayouts(model, pg, patterns, min_numel).full
            # no backward all-gather: the root, and layers that keep their weights after
            # forward (reshard_after_forward=False; hpZ with one rank per node)
            units.append(Unit(name, full.numel - full.exact_numel, full.exact_numel,
                              backward_gather=module is not model
                              and _fsdp2.post_forward_shard_size(pg) is not False))
            wdt, device = _fsdp2.all_gather_dtype_device(pg)
            gdt = _fsdp2.reduce_dtype(pg)
    return units, wdt, gdt, device


def fsdp_shards(comms: Iterable[ModuleComms]
                ) -> tuple[list[int], list[int], torch.dtype, torch.device]:
    """Compressed values per rank of each FSDP unit, those of them that get gradients now,
    their all-gather dtype and device."""
    numels, grads, dtype, device = [], [], torch.float32, torch.device("cpu")
    for m in comms:
        full, trainable = m.layouts.full, m.layouts.trainable
        numels.append(full.numel - full.exact_numel)
        grads.append(trainable.numel - trainable.exact_numel)
        dtype, device = _fsdp2.all_gather_dtype_device(m.param_group)
    return numels, grads, dtype, device


# -- what the handle installs -----------------------------------------------------------------
class FSDPInstall:
    """The collectives of every FSDP module of a model (what ``Compression`` installs for
    FSDP2): state as ``{"config", "modules": {name: {direction: state}}}``."""

    def __init__(self, config: CompressionConfig, comms: dict[str, ModuleComms],
                 topology: Topology) -> None:
        self.config, self.comms = config, comms
        # compressor state per rank, estimated before any is allocated (raises on CUDA if
        # it cannot fit)
        numels, grads, dtype, device = fsdp_shards(comms.values())
        self.state_estimate = check_fits(
            config, numels, topology.world_size, topology.ranks_per_node, dtype, device,
            param_numel=sum(m.layouts.full.numel for m in comms.values()),
            group=topology.group, grad_numels=grads)

    def install(self) -> None:
        for c in self.comms.values():
            c.install()

    def uninstall(self) -> None:
        for c in self.comms.values():
            c.uninstall()

    def collectives(self) -> list[Any]:
        return [coll for m in self.comms.values() for coll in m.collectives().values()]

    def state_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(),
                "modules": {name: {k: coll.state_dict() for k, coll in m.collectives().items()}
                            for name, m in self.comms.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        lines = differences([upgrade_dict(state["config"]), self.config.to_dict()],
                            ["saved", "this handle"])
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
            if m.ag.frozen is not None:    # the loaded references go with today's weights
                m.ag.frozen.rebase()

    def describe(self) -> str:
        return f"{len(self.comms)} FSDP modules"


# -- sharding -------------------------------------------------------------------------------
def decoder_layers(model: nn.Module, layer_cls: tuple[type, ...] | None = None) -> list[nn.Module]:
    """The modules to shard one by one: instances of ``layer_cls``, else of the classes in
    Hugging Face's ``model._no_split_modules`` (the decoder layers)."""
    if layer_cls is None:
        names = set(getattr(model, "_no_split_modules", None) or ())
        return [m for m in model.modules() if type(m).__name__ in names and m is not model]
    return [m for m in model.modules() if isinstance(m, layer_cls) and m is not model]


def shard_model(model: nn.Module, ranks_per_node: int, hpz: bool,
                layer_cls: tuple[type, ...] | None = None, **fsdp_kwargs: Any) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root; hpZ via the layers'
    ``reshard_after_forward``."""
    layer_kwargs = dict(fsdp_kwargs)
    if hpz:
        if "reshard_after_forward" in fsdp_kwargs:
            raise ValueError("hpZ sets reshard_after_forward itself; do not pass it")
        mesh = fsdp_kwargs.get("mesh")     # a sub-mesh: its shard dim's (the last) size
        world = mesh.size(mesh.ndim - 1) if mesh is not None else dist.get_world_size()
        layer_kwargs["reshard_after_forward"] = hpz_reshard(ranks_per_node, world)
    for layer in decoder_layers(model, layer_cls):
        fully_shard(layer, **layer_kwargs)
    fully_shard(model, **fsdp_kwargs)   # the root stays gathered for backward (FSDP default)
    return model


def fsdp_modules(model: nn.Module) -> list[tuple[str, FSDPModule]]:
    """Every FSDP unit with parameters, by name (the root is ``""``): one entry per
    ``fully_shard`` call. Modules sharded by one call (``fully_shard([norm, lm_head])``,
    Accelerate's tail unit) share its param group and collectives: one entry, the first
    module, named by all of them (``"model.norm+lm_head"``)."""
    units: dict[int, tuple[list[str], FSDPModule]] = {}
    for n, m in model.named_modules():
        groups = _fsdp2.param_groups(m) if isinstance(m, FSDPModule) else []
        if groups:
            units.setdefault(id(groups[0]), ([], m))[0].append(n)
    return [("+".join(names), m) for names, m in units.values()]


def check_hpz(modules: list[tuple[str, FSDPModule]], ranks_per_node: int, world: int) -> None:
    """A config with hpZ needs every sharded layer to reshard to the node after forward."""
    want = hpz_reshard(ranks_per_node, world)
    for name, m in modules:
        if not name:
            continue  # the root's backward all-gather is FSDP's choice
        got = _fsdp2.post_forward_shard_size(_fsdp2.param_groups(m)[0])
        if got != want and got is not False:  # False: no backward all-gather at all (e.g.
            raise ValueError(                 # Accelerate's final-norm + lm_head group)
                f"this configuration uses hpZ (backward all-gather inside the node), but FSDP "
                f"module {name!r} was sharded with reshard_after_forward={got!r}; shard with "
                f"fully_shard(..., reshard_after_forward={want!r}) or let apply(..., "
                f"shard=True) do it")


def check_group(modules: list[tuple[str, FSDPModule]]) -> dist.ProcessGroup:
    """The FSDP shard group: every module must shard over one group, the world or the
    data-parallel dim of a larger mesh (FSDP2 x TP: ``fully_shard(..., mesh=mesh["dp"])``,
    TP inside a node; only the data-parallel collectives are compressed). Native HSDP (a 2-D
    FSDP mesh) shards over its shard dim: see :func:`replicate_group`."""
    return _one_group(modules, _fsdp2.shard_group, "shards",
                      "every FSDP module of a model sharded over one data-parallel group")


def _one_group(modules: list[tuple[str, FSDPModule]], group_of, verb: str,
               need: str) -> dist.ProcessGroup:
    """The process group ``group_of`` gives for the param group of every module: one, or a
    ValueError naming the first module that differs and what hfcompress ``need`` s."""
    group, ranks = None, None
    for name, m in modules:
        g = group_of(_fsdp2.param_groups(m)[0])
        r = dist.get_process_group_ranks(g)
        if ranks is None:
            group, ranks = g, r
        elif r != ranks:
            raise ValueError(f"FSDP module {name!r} {verb} over ranks {r}, but "
                             f"{modules[0][0]!r} over {ranks}; hfcompress needs {need}")
    return group


def replicate_group(modules: list[tuple[str, FSDPModule]]) -> dist.ProcessGroup | None:
    """Native HSDP (``fully_shard(mesh=mesh["dp_replicate", "dp_shard"])``, what Accelerate's
    ``ParallelismConfig(dp_replicate_size=...)`` builds): the replicas' group, the same for
    every module; None without HSDP. ValueError for a model mixing both."""
    hsdp = {name: _fsdp2.is_hsdp(_fsdp2.param_groups(m)[0]) for name, m in modules}
    if not any(hsdp.values()):
        return None
    if not all(hsdp.values()):
        two_d = sorted(n for n, h in hsdp.items() if h)
        one_d = sorted(n for n, h in hsdp.items() if not h)
        raise ValueError(f"FSDP modules {two_d} are sharded over a 2-D mesh (native HSDP), "
                         f"{one_d} over a 1-D one; hfcompress needs one data-parallel layout "
                         f"per model")
    for name, m in modules:
        if _fsdp2.gradient_divide_factor(_fsdp2.param_groups(m)[0]) is not None:
            raise ValueError(f"FSDP module {name!r} (native HSDP) has a gradient divide factor "
                             f"(set_gradient_divide_factor); hfcompress averages over the "
                             f"replicas itself and supports FSDP2's default mean only: unset it")
    return _one_group(modules, _fsdp2.replicate_group, "replicates", "one HSDP mesh per model")


def mesh_group(mesh: Any) -> dist.ProcessGroup:
    """The group ``fully_shard(..., mesh=mesh)`` will shard over (None: the world; a 2-D
    mesh, native HSDP: its shard dim, the last)."""
    if mesh is None:
        return dist.group.WORLD
    if mesh.ndim > 2:
        raise ValueError(f"apply(..., shard=True) got a {mesh.ndim}-D mesh "
                         f"{mesh.mesh_dim_names} for fully_shard; FSDP2 takes a 1-D mesh "
                         f"(FSDP) or a 2-D one (HSDP: replicate, shard)")
    return mesh.get_group(mesh.ndim - 1)
