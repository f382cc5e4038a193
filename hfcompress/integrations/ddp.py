"""DDP comm hook for the all-reduce schemes (torch ``ddp_comm_hooks`` style: a state object and
a short hook): Global-QSGD linear / exponential dithering (Global-QSGD 8: "register our DDP
hook with one line"), int8 / int4 group quantization, LoCo error feedback (LoCo Alg. 1)::

    handle = hfcompress.apply(ddp_model, "global_qsgd")   # or register_ddp_hook (the state)
    for batch in data:
        loss_fn(ddp_model(batch)).backward()
        optimizer.step(); optimizer.zero_grad()
        handle.step()                      # LoCo's per-step reset schedule; closes the meter step

DDP has no weight all-gather: a preset's all-reduce is its ``all_reduce`` scheme, else its
gradient scheme ``grad_inter`` (e.g. ``sdp4bit`` all-reduces with the 4-bit Hadamard
scheme); weight schemes, hpZ and the 2-hop layout need FSDP2. With a topology of X > 1 ranks
on each of Y > 1 nodes the compressed all-reduce is hierarchical (exact inside the node,
compressed across the nodes on 1/X of the bucket: ``comm/all_reduce.py``).

Each bucket gets its own ``QuantizedAllReduce`` (LoCo keeps its error per bucket index; DDP
rebuilds its buckets once after the first iteration, which starts fresh streams for the
rebuilt buckets; a stream restored from a checkpoint holds the rebuilt order, which the
first iteration's buckets are permuted into). Parameters matched by the config's
``exact_patterns`` / ``min_numel`` (QSDP 5.1: norms, biases, small tensors) are all-reduced
exactly. The hook returns a chained Future of the averaged bucket, like torch's own hooks
(``all_reduce(..., async_op=True).get_future().then(...)``): every stage of a scheme (the
scales' MAX, the codes' SUM or all-to-all / all-gather) launches when the previous one
completes, so backward goes on while buckets are reduced.
"""

import warnings
from typing import Any, Hashable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.futures import Future

from ..comm import QuantizedAllReduce, Topology, WireMeter
from ..comm.all_reduce import group_size_check, node_layout, stock_all_reduce_bytes, summing_peers
from ..comm.exit_drain import add_callback
from ..comm.futures import chain, completed, devices_of, inline, side_stream_call
from ..compressors import Compressor
from ..compressors.registry import build_compressor
from ..config import CompressionConfig, Scheme, get_config, is_exact
from .consistency import check_same_settings
from .exact_params import Segment, SlotLayout
from .handle import step_error_feedback
from .timeouts import group_timeout

AVG = dist.ReduceOp.AVG


def ddp_scheme(config: CompressionConfig) -> Optional[Scheme]:
    """The scheme DDP's all-reduce uses for ``config`` (``CompressionConfig.ddp_config``);
    ValueError if the preset compresses nothing DDP sends."""
    return config.ddp_config().all_reduce


def all_reduce_compressor(config: CompressionConfig, group_size: int,
                          *key: Any) -> Optional[Compressor]:
    """The all-reduce scheme of ``config`` (``all_reduce``, else the gradient scheme
    ``grad_inter``), LoCo-wrapped if ``config.loco``; None = exact. A globally scaled scheme
    gets ``num_peers = group_size`` (the payloads it sums: ``comm.all_reduce.summing_peers``)
    unless given (then it must match); a seeded scheme gets a
    seed per ``key`` (include the rank: peers must not share rounding noise) from its own
    ``seed`` or ``config.seed``."""
    scheme = config.all_reduce_scheme
    if scheme is None:
        if config.loco is not None:
            raise ValueError(f"config {config.name!r}: loco error feedback needs a gradient "
                             f"scheme (all_reduce or grad_inter)")
        return None
    comp = build_compressor(scheme, config.seed, *key, num_peers=group_size)
    group_size_check(comp, group_size)
    return config.loco.wrap(comp) if config.loco is not None else comp


class BucketAllReduce:
    """One stream's average over the group: exact columns by torch, the rest compressed."""

    def __init__(self, compressor: Compressor | None, layout: SlotLayout,
                 topology: Topology | None, meter: WireMeter, tag: str) -> None:
        self.layout = layout
        self.compressed = QuantizedAllReduce(compressor, topology, meter, tag)
        self.exact = QuantizedAllReduce(None, topology, meter, f"{tag}_exact")

    def launch(self, flat: torch.Tensor, group: dist.ProcessGroup) -> Future:
        """Start averaging ``flat`` in place; a future of ``flat``."""
        layout, dev = self.layout, devices_of(flat)
        if self.compressed.compressor is None or layout.all_exact:
            return self.exact.launch(flat, AVG, group)
        if not layout.mixed:
            return self.compressed.launch(flat, AVG, group)
        rows = flat.view(1, -1)
        comp, exact = layout.split(rows)
        both = chain(self.compressed.launch(comp, AVG, group),
                     lambda _: self.exact.launch(exact, AVG, group), dev)

        def merge(_: Any) -> torch.Tensor:
            layout.merge(rows, comp, exact)
            return flat
        return chain(both, merge, dev)


class AllReduceState:
    """Hook state: the config, the group, one :class:`BucketAllReduce` per stream key (DDP
    bucket index, FSDP module name), the wire meter (sent bytes, the stock all-reduce's
    bytes as the uncompressed baseline, time). ``enabled=False`` (``uninstall``): exact
    all-reduces, unmetered."""

    def __init__(self, config: str | CompressionConfig | Compressor,
                 group: dist.ProcessGroup | None = None, topology: Topology | None = None,
                 meter: WireMeter | None = None, tag: str = "all_reduce") -> None:
        self.group = group or dist.group.WORLD
        self.size = dist.get_world_size(self.group)
        self.peers = summing_peers(*node_layout(topology, self.size))  # hierarchical: nodes
        self.topology, self.meter, self.tag = topology, meter or WireMeter(), tag
        if isinstance(config, Compressor):
            group_size_check(config, self.peers, nodes=self.peers != self.size)
            self.config, self.prototype = CompressionConfig(exact_patterns=()), config
            settings = _without_seeds(config.config())
        else:
            self.config, self.prototype = get_config(config), None
            settings = self.config.to_dict()
        check_same_settings({"all_reduce": settings, "group_size": self.size}, self.group,
                            what="hfcompress all-reduce hook")
        self.streams: dict[Hashable, BucketAllReduce] = {}
        self.param_names: dict[int, str] = {}    # id(parameter) -> name, for DDP buckets
        self.enabled = True
        self._used: set = set()      # stream keys reduced by this process
        self._tail: Future = completed(None)   # the last stream launched (reduce_async)
        self._compressor("check")    # a bad scheme fails here, not in the backward pass

    def install(self) -> None:
        self.enabled = True

    def adopt(self, config: CompressionConfig) -> "AllReduceState":
        """Another config's all-reduce from the next bucket on, every stream fresh (``auto``
        switching plans at a step boundary: DDP keeps the hook it registered)."""
        self.config, self.prototype = get_config(config), None
        self.streams, self._used = {}, set()
        self._compressor("check")
        return self

    def uninstall(self) -> None:
        self.enabled = False

    def describe(self) -> str:
        return f"{len(self.streams)} all-reduce streams"

    def collectives(self) -> list[QuantizedAllReduce]:
        return [s.compressed for s in self.streams.values()]

    def layout(self, named: list[tuple[str, int]]) -> SlotLayout:
        """The exact / compressed columns of a flat buffer of these (name, numel) params."""
        c = self.config
        return SlotLayout([Segment(n, k, is_exact(n, k, c.exact_patterns, c.min_numel))
                           for n, k in named])

    def reduce(self, key: Hashable, flat: torch.Tensor, layout: SlotLayout) -> None:
        """Average ``flat`` over the group in place, as stream ``key``; waits for
        :meth:`reduce_async`."""
        self.reduce_async(key, flat, layout).wait()

    def reduce_async(self, key: Hashable, flat: torch.Tensor, layout: SlotLayout) -> Future:
        """Start averaging ``flat`` over the group in place, as stream ``key`` (new if its
        layout changed, e.g. DDP's bucket rebuild); a future of ``flat``. Streams run one
        after another, in call order: every rank launches the same collectives in the same
        order (gloo pairs them by launch order, NCCL needs it too). CPU: the stages are
        chained futures, nothing waits. CUDA (``comm/futures.py``, the stream contract):
        every stage is enqueued at once on the hook's side stream, which first waits on the
        caller's stream (the gradients are written); the future is completed there with
        ``flat``, so DDP's wait orders its stream after the decode and the average."""
        if inline(flat.device):   # CUDA: every stage enqueued now, on the side stream
            return side_stream_call(lambda: self._start(key, flat, layout).wait(), flat)
        previous = add_callback(self._tail, lambda _: None)  # its error is its own stream's
        self._tail = chain(previous, lambda _: self._start(key, flat, layout))
        return self._tail

    def _start(self, key: Hashable, flat: torch.Tensor, layout: SlotLayout) -> Future:
        dev = devices_of(flat)
        if not self.enabled:
            if self.size == 1:     # nothing to average (and no one-rank AVG: all_reduce.py)
                return completed(flat, dev)
            return chain(dist.all_reduce(flat, op=AVG, group=self.group,
                                         async_op=True).get_future(), lambda _: flat, dev)
        self.meter.record_uncompressed(stock_all_reduce_bytes(
            flat.numel(), flat.element_size(), self.size, dist.get_rank(self.group)),
            self.group, self.topology)
        timer = self.meter.timed(flat.device)      # from this stream's start to its end
        timer.__enter__()
        order = self._restored_order(key, layout)
        if order is not None:     # a restored stream: its values in the saved order
            order = order.to(flat.device)
            part = flat[order]
            fut = self._stream(key, self.streams[key].layout).launch(part, self.group)

            def put_back(_: Any) -> torch.Tensor:
                flat[order] = part
                return flat
            fut = chain(fut, put_back, dev)
        else:
            fut = self._stream(key, layout).launch(flat, self.group)

        def stop_timer(_: Any) -> torch.Tensor:
            timer.__exit__(None, None, None)
            return flat
        return chain(fut, stop_timer, dev)

    def _stream(self, key: Hashable, layout: SlotLayout) -> BucketAllReduce:
        stream = self.streams.get(key)
        if stream is None or stream.layout.segments != layout.segments:
            stream = self.streams[key] = BucketAllReduce(self._compressor(key), layout,
                                                         self.topology, self.meter, self.tag)
        return stream

    def _restored_order(self, key: Hashable, layout: SlotLayout) -> Optional[torch.Tensor]:
        """Indices putting this bucket's values in the order of a stream restored from a
        checkpoint, when DDP's first iteration orders the same parameters differently (DDP
        rebuilds its buckets after the first iteration: the checkpoint holds the rebuilt
        order). None: use the bucket as it is (a stream whose parameters differ restarts)."""
        stream = self.streams.get(key)
        first_use = key not in self._used
        self._used.add(key)
        if stream is None or not first_use:
            return None
        saved = [(seg.name, seg.numel) for seg in stream.layout.segments]
        named = [(seg.name, seg.numel) for seg in layout.segments]
        if saved == named:
            return None
        if sorted(saved) != sorted(named) or len(set(saved)) != len(saved):
            warnings.warn(f"hfcompress: bucket {key} holds other parameters than the bucket "
                          f"restored from the checkpoint; its compressor state (LoCo errors, "
                          f"RNG) restarts", UserWarning, stacklevel=2)
            return None
        start, offset = {}, 0
        for entry in named:
            start[entry], offset = offset, offset + entry[1]
        return torch.cat([torch.arange(start[e], start[e] + e[1]) for e in saved])

    def _compressor(self, key: Hashable) -> Compressor | None:
        if self.prototype is not None:
            return self.prototype.fresh() if self.prototype.stateful else self.prototype
        return all_reduce_compressor(self.config, self.peers, dist.get_rank(), key)

    def compressors(self) -> list[Compressor]:
        return [c for s in self.streams.values() for c in s.compressed.compressors()]

    def step(self) -> dict:
        """Once per optimizer step: LoCo's reset schedule (Alg. 1 lines 9-10) on every error
        stream; closes and returns the wire meter's step."""
        step_error_feedback(self.compressors())
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
    return state.reduce_async(bucket.index(), buf, state.layout(
        [(names.get(id(p), "?"), p.numel()) for p in bucket.parameters()]))


def own_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The group the hook's collectives run on. gloo completes a future on its worker thread,
    which then launches the next stage while DDP may launch its own collective on the main
    thread (the used-parameter map with ``find_unused_parameters=True``): gloo pairs
    collectives by launch order per group, so the hook gets a group of its own (same ranks
    and timeout). NCCL completes futures at launch: every stage launches on the caller's
    thread, in order, on DDP's group."""
    if dist.get_backend(group) != "gloo":
        return group
    return dist.new_group(dist.get_process_group_ranks(group), timeout=group_timeout(group),
                          use_local_synchronization=True)


def register_ddp_hook(ddp_model: nn.parallel.DistributedDataParallel,
                      config: "str | CompressionConfig | Compressor", *,
                      ranks_per_node: Optional[int] = None, topology: Optional[Topology] = None,
                      meter: Optional[WireMeter] = None) -> AllReduceState:
    """Register the compressed all-reduce on ``ddp_model``; returns the hook state
    (``.meter``, ``.step()``, ``.state_dict()``), which ``hfcompress.apply(ddp_model, ...)``
    wraps in its handle (prefer that: it also checks the preset fits DDP and reports
    memory). ``config``: a preset name
    (``"global_qsgd"``, ``"global_qsgd_exp"``, ``"loco"``, ``"none"``), a ``CompressionConfig``
    (e.g. ``CompressionConfig(all_reduce=Scheme("int", {"bits": 8, "rounding":
    "stochastic"}))`` for the int8 group all-reduce), or a compressor instance (used as is for
    every parameter; give each rank its own seed). ``ranks_per_node`` (or ``topology``)
    splits the metered bytes into intra- and inter-node."""
    if topology is None and ranks_per_node is not None:
        topology = Topology(ranks_per_node)
    state = AllReduceState(config, own_group(ddp_model.process_group), topology, meter)
    state.param_names = {id(p): n for n, p in ddp_model.module.named_parameters()}
    ddp_model.register_comm_hook(state, all_reduce_hook)
    return state
