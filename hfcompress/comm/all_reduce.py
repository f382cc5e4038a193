"""Quantized all-reduce: Global-QSGD (Alg. 1, 4.2, 4.3) and group-quantized / LoCo schemes.

``QuantizedAllReduce(compressor)(tensor, op)`` reduces ``tensor`` in place over a group;
every rank ends with bit-identical values (all decode the same bytes). By the compressor's
declared capability (``compressors/base.py``):

- ``None``: torch's ``all_reduce`` (exact).
- :class:`GloballyScaled` (``global_qsgd``, linear dithering, 4.2): one ``all_reduce(MAX)`` of the local scales (one
  float, or one per block with ``block_size``), then a stock ``all_reduce(SUM)`` of the
  integer codes: an exact sum that cannot overflow because the level count leaves room for
  ``num_peers`` = group size (checked).
- :class:`TreeCombined` (``global_qsgd_exp``, exponential dithering, 4.3): the ``C_nat`` exponent reduce (Alg. 2),
  which no stock all-reduce runs. After the MAX of the scales: an all-to-all of code chunks
  (rank k gets chunk k from everyone), a pairwise ``combine`` tree of depth ceil(log2 n) on
  rank k, then an all-gather of the combined chunks; the chunks are quantized, combined (per
  tree level) and decoded in one call each (``*_rows`` methods, same numbers). Only codes
  travel (the scale is known).
  With ``block_size`` the blocks are counted within each chunk (none straddles two owners).
- any other compressor (``int`` 8/4 bit groups, ``loco`` wrapping one): compress chunks (one
  ``compress_rows`` call when stateless) -> all-to-all -> fp32 sum on the chunk's owner (one
  ``reduce_rows``) -> compress -> all-gather -> one ``decompress_slots`` (LoCo 3.2, A.1).
  A stateful compressor keeps one stream per chunk sent and one for the gathered chunk, so
  LoCo error feedback applies to the local gradient before it is sent, and to the owner's
  reduced chunk.

Hierarchical (a topology of X > 1 ranks on each of Y > 1 nodes; QSDP 5.1's "hierarchical
versions of the algorithms", SDP4Bit 3.2 / ZeRO++ B.3's node-local first hop): an exact
reduce-scatter inside the node (an all-to-all of X chunks of the tensor, each summed in
float32 by its owner: same bytes as torch's, and gloo's has no future), the compressed
all-reduce above of this rank's chunk across the Y nodes (its inter-node group:
``num_peers`` = Y for Global-QSGD), an exact all-gather inside the node. Each node link
carries the compressed tensor once, not X times. At X = 1 or Y = 1 the flat path above runs
unchanged (on one node it compresses between the node's GPUs, as Global-QSGD's PCIe
experiments do).

Wire meter (what each rank sends, direct sends): a stock all-reduce, the codes' SUM and the
scales' MAX alike (one float32, or one per block), counts as reduce-scatter + all-gather of
near-equal chunks: 2 (n - 1) times its bytes over the group of n ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from ..compressors.base import Compressor, ErrorFeedback, GloballyScaled, Packed, TreeCombined
from .futures import chain, completed, devices_of
from .hop import Exchange, all_gather_single, compress_rows
from .one_rank import skips
from .reduce_scatter import check_op
from .streams import StreamOwner, Streams, stateless_only
from .topology import Topology
from .traffic import Phase, exchange, gather, payload_bytes, stock_all_reduce
from .wire_meter import WireMeter, peer_is_remote

_STOCK_SUM_BITS = (8, 32)   # gloo and NCCL have no int16 SUM


def group_size_check(compressor: Compressor, peers: int, nodes: bool = False) -> None:
    """Global-QSGD payloads sum in the compressed domain: ``num_peers`` must be the number of
    payloads summed, ``peers`` (fewer overflows the wire integer, more wastes levels): the
    group's ranks, or its nodes when the all-reduce is hierarchical (``nodes``)."""
    if isinstance(compressor, GloballyScaled) and compressor.num_peers != peers:
        what = f"{peers} nodes (hierarchical: one payload per node)" if nodes \
            else f"{peers} ranks"
        raise ValueError(f"{compressor.name}: num_peers={compressor.num_peers} but the all-reduce "
                         f"group has {what}; build it with num_peers={peers} (the level "
                         f"count must leave room for the sum of {peers} peers, Global-QSGD 4.2)")


class QuantizedAllReduce(StreamOwner):
    """In-place all-reduce of one tensor stream through ``compressor`` (None: exact)."""

    def __init__(self, compressor: Compressor | None = None, topology: Topology | None = None,
                 meter: WireMeter | None = None, tag: str = "all_reduce") -> None:
        if isinstance(compressor, ErrorFeedback) and isinstance(compressor.inner, GloballyScaled):
            raise ValueError("loco around global_qsgd is not supported: LoCo compresses with the "
                             "inner's own scales, Global-QSGD needs the all-reduced one")
        if isinstance(compressor, GloballyScaled) and not isinstance(compressor, TreeCombined) \
                and compressor.bits not in _STOCK_SUM_BITS:
            raise ValueError(f"global_qsgd: bits={compressor.bits} has no stock all_reduce(SUM) "
                             f"in gloo or NCCL; use bits 8 or 32")
        self.compressor = compressor
        self.streams = {"all_reduce": Streams(compressor)} if compressor is not None else {}
        self.topology, self.meter, self.tag = topology, meter, tag

    def __call__(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                 group: dist.ProcessGroup | None = None) -> torch.Tensor:
        """Reduce ``tensor`` (any shape, fp32/bf16/fp16) in place; returns it (waits for
        :meth:`launch`'s future)."""
        return self.launch(tensor, op, group).wait()

    def launch(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM,
               group: dist.ProcessGroup | None = None) -> Future:
        """Start reducing ``tensor`` in place; a future of ``tensor``, complete when every
        stage is. CPU: each stage is an asynchronous collective whose completion runs the
        next (:func:`~.futures.chain`), nothing here waits; CUDA: every stage is enqueued
        now on the current stream, in order, and the future holds ``tensor`` with an event
        recorded after the last stage (``futures.py``). Same numbers as ``__call__``."""
        if group is None:
            group = self.topology.group if self.topology else dist.group.WORLD
        world, me = dist.get_world_size(group), dist.get_rank(group)
        dev = devices_of(tensor)
        flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().reshape(-1)
        if self.compressor is not None:
            check_op(op)
        if flat.numel() == 0 or (world == 1 and (self.compressor is None or skips(world))):
            # nothing to reduce (and NCCL 2.27's one-rank AVG drops trailing values,
            # NVIDIA/nccl#1950: never ask for it); one_rank.py runs the compressed stages
            return completed(tensor, dev)
        if self.compressor is None:
            self._record(stock_all_reduce_bytes(flat.numel(), flat.element_size(), world, me),
                         group, me)
            fut = dist.all_reduce(flat, op=op, group=group, async_op=True).get_future()
        elif hierarchical(*node_layout(self.topology, world)):
            fut = self._hierarchical(flat, op, dev)
        else:
            group_size_check(self.compressor, world)
            self.streams["all_reduce"].check_layout((world, flat.numel()))

            def average(t: torch.Tensor) -> torch.Tensor:
                return flat.copy_(t / world if op == dist.ReduceOp.AVG else t)
            fut = chain(self._compressed(flat, group, world, me, dev), average, dev)

        def write_back(_: Any) -> torch.Tensor:
            if flat.data_ptr() != tensor.data_ptr():
                tensor.copy_(flat.view(tensor.shape))
            return tensor
        return chain(fut, write_back, dev)

    @staticmethod
    def traffic(numel: int, ranks_per_node: int, nodes: int, compressor: Compressor | None,
                itemsize: int) -> list[Phase]:
        """One call over the world of ``numel`` values of ``itemsize`` bytes (``traffic.py``):
        by the compressor's capability, as :meth:`launch` runs it."""
        c, x, y = compressor, ranks_per_node, nodes
        if c is None:
            return [stock_all_reduce("world", x * y, numel * itemsize)]
        if x * y == 1 or numel == 0:
            return []
        if not hierarchical(x, y):
            return _compressed_phases("world", x * y, numel, c, itemsize)
        width = -(-numel // x)
        part = width * itemsize
        return [exchange("intra", x, part)] \
            + _compressed_phases("inter", y, width, c, itemsize) + [gather("intra", part)]

    def _compressed(self, flat, group, world, me, dev) -> Future:
        """A future of the float32 sum of ``flat`` over ``group``, by the compressor's
        capability (module docstring)."""
        if isinstance(self.compressor, TreeCombined):
            return self._exponential(flat, group, world, me, dev)
        if isinstance(self.compressor, GloballyScaled):
            return self._linear(flat, group, world, me, dev)
        return self._chunked(flat, self.streams["all_reduce"], group, world, me, dev)

    def _hierarchical(self, flat: torch.Tensor, op: Any, dev) -> Future:
        """Exact sum in the node (an all-to-all of the X chunks, summed in float32), the
        compressed sum of this rank's chunk across the nodes, exact all-gather in the node
        (module docstring); a future of ``flat`` holding the result (divided by the world
        size for AVG in float32, then cast)."""
        topo = self.topology
        x, y = topo.ranks_per_node, topo.num_nodes
        group_size_check(self.compressor, y, nodes=True)
        rows = _rows(flat, x)
        width, itemsize = rows.shape[1], flat.element_size()
        self.streams["all_reduce"].check_layout(("nodes", y, width))
        self._record([2 * width * itemsize * (k != topo.local_rank) for k in range(x)],
                     topo.intra_group, topo.local_rank)   # the all-to-all and all-gather
        recv = torch.empty_like(rows)
        fut = dist.all_to_all_single(recv, rows, group=topo.intra_group,
                                     async_op=True).get_future()

        def across(_: Any) -> Future:
            part = recv.float().sum(0)
            return self._compressed(part, topo.inter_group, y, topo.node, dev)

        def gather(total: torch.Tensor) -> Future:
            mine = (total / (x * y) if op == dist.ReduceOp.AVG else total).to(flat.dtype)
            recv[0] = mine      # kept alive until the all-gather is done
            return all_gather_single(rows.reshape(-1), recv[0], group=topo.intra_group,
                                     async_op=True).get_future()

        def unpad(_: Any) -> torch.Tensor:
            if rows.data_ptr() != flat.data_ptr():
                flat.copy_(rows.reshape(-1)[:flat.numel()])
            return flat
        return chain(chain(chain(fut, across, dev), gather, dev), unpad, dev)

    # -- Global-QSGD ----------------------------------------------------------------------
    def _global_scale(self, scale: torch.Tensor, group: dist.ProcessGroup, world: int,
                      me: int) -> tuple[torch.Tensor, list[int], Future]:
        """Alg. 1 line 1: the MAX over the group of the local ℓ∞ norms ``scale`` (per block
        with ``block_size``; +Inf where one is not finite), reduced in place once the returned
        future completes; and the bytes it sends to each peer."""
        fut = dist.all_reduce(scale, op=dist.ReduceOp.MAX, group=group,
                              async_op=True).get_future()
        return scale, stock_all_reduce_bytes(scale.numel(), scale.element_size(), world, me), fut

    def _linear(self, flat, group, world, me, dev) -> Future:
        """Linear dithering: exact integer sum by a stock all_reduce(SUM) (4.2)."""
        c = self.compressor
        scale, sent, fut = self._global_scale(c.local_scale(flat), group, world, me)
        codes: list[torch.Tensor] = []

        def sum_codes(_: Any) -> Future:
            codes.append(c.compress(flat, scale=scale).payload["codes"])
            self._record([a + b for a, b in zip(sent, stock_all_reduce_bytes(
                codes[0].numel(), codes[0].element_size(), world, me))], group, me)
            return dist.all_reduce(codes[0], op=dist.ReduceOp.SUM, group=group,
                                   async_op=True).get_future()

        def decode(_: Any) -> torch.Tensor:
            return c.decompress(Packed({"scale": scale, "codes": codes[0]}, flat.shape,
                                       torch.float32))
        return chain(chain(fut, sum_codes, dev), decode, dev)

    def _exponential(self, flat, group, world, me, dev) -> Future:
        """Exponential dithering: all-to-all of code chunks, C_nat tree on the owner (Alg. 2),
        all-gather of the combined chunks (4.3)."""
        c = self.compressor
        rows = _rows(flat, world)
        width = rows.shape[1]
        # one scale for the tensor, shared by every chunk; or the blocks of each chunk
        local = c.local_scale(flat) if c.block_size is None else c.local_scale_rows(rows)
        scale, sent, fut = self._global_scale(local, group, world, me)
        bufs: dict[str, torch.Tensor] = {}

        def exchange(_: Any) -> Future:
            send = bufs["send"] = c.quantize_rows(rows, scale)
            n = send.shape[1]
            recv = bufs["recv"] = torch.empty_like(send)
            self._record([b + 2 * n * (k != me) for k, b in enumerate(sent)], group, me)
            return dist.all_to_all_single(recv.view(-1), send.view(-1), group=group,
                                          async_op=True).get_future()

        def combine_and_gather(_: Any) -> Future:
            combined = c.combine_rows(bufs["recv"])
            gathered = bufs["gathered"] = torch.empty_like(bufs["recv"])
            return all_gather_single(gathered.view(-1), combined.contiguous(), group=group,
                                     async_op=True).get_future()

        def decode(_: Any) -> torch.Tensor:
            return c.dequantize_rows(bufs["gathered"], scale, width).reshape(-1)[:flat.numel()]
        return chain(chain(chain(fut, exchange, dev), combine_and_gather, dev), decode, dev)

    # -- any other compressor -------------------------------------------------------------
    def _chunked(self, flat, streams: Streams, group, world, me, dev) -> Future:
        """compress -> all-to-all -> fp32 sum on the owner -> compress -> all-gather."""
        rows = _rows(flat, world)
        width = rows.shape[1]
        send = compress_rows(streams, rows, lambda k: ("send", k))
        recv = streams["recv"]
        ex = Exchange(send, group, None, self.tag, [False] * world, async_op=True)
        bufs: dict[str, torch.Tensor] = {}

        def reduce_and_gather(_: Any) -> Future:
            m = ex.nbytes
            part = recv.reduce_rows(ex.received(), (width,), rows.dtype).reshape(-1).float()
            buf = streams["gather"].compress(part).flat()
            n = buf.numel()
            self._record([(m + n) * (k != me) for k in range(world)], group, me)
            gathered = bufs["gathered"] = torch.empty(world * n, dtype=torch.uint8,
                                                      device=buf.device)
            bufs["buf"] = buf      # kept alive until the all-gather is done
            return all_gather_single(gathered, buf, group=group, async_op=True).get_future()

        def decode(_: Any) -> torch.Tensor:
            gathered = bufs["gathered"]
            out = torch.empty(world, width, dtype=torch.float32, device=gathered.device)
            recv.decompress_slots(gathered.view(world, -1), width, out)
            return out.reshape(-1)[:flat.numel()]
        return chain(chain(ex.work.get_future(), reduce_and_gather, dev), decode, dev)

    def _record(self, per_peer: list[int], group: dist.ProcessGroup, me: int) -> None:
        if self.meter is not None:
            self.meter.record_sends(self.tag, per_peer, peer_is_remote(group, self.topology), me)


def node_layout(topology: Topology | None, world: int) -> tuple[int, int]:
    """(X ranks per node, Y nodes) of an all-reduce over ``world`` ranks: the topology's
    when its group is that size, else one node."""
    if topology is not None and topology.world_size == world:
        return topology.ranks_per_node, topology.num_nodes
    return world, 1


def hierarchical(ranks_per_node: int, nodes: int) -> bool:
    """A compressed all-reduce runs hierarchically on X > 1 ranks of each of Y > 1 nodes
    (module docstring)."""
    return ranks_per_node > 1 and nodes > 1


def summing_peers(ranks_per_node: int, nodes: int) -> int:
    """How many payloads a compressed all-reduce sums (Global-QSGD's ``num_peers``): the
    nodes when it runs hierarchically, else the ranks."""
    return nodes if hierarchical(ranks_per_node, nodes) else ranks_per_node * nodes


def _rows(flat: torch.Tensor, world: int) -> torch.Tensor:
    """``flat`` zero-padded to ``world`` equal chunks, as ``[world, ceil(numel / world)]``."""
    width = -(-flat.numel() // world)
    pad = world * width - flat.numel()
    return torch.nn.functional.pad(flat, (0, pad)).view(world, width) if pad \
        else flat.view(world, width)


def _compressed_phases(group: str, w: int, numel: int, c: Compressor,
                       itemsize: int) -> list[Phase]:
    """The phases of the compressed sum of ``numel`` values over ``w`` ranks of ``group``."""
    width = -(-numel // w)
    if isinstance(c, GloballyScaled):
        tree = isinstance(c, TreeCombined)
        scales = w * c.num_scales(width) if tree and c.block_size is not None \
            else c.num_scales(numel)
        codes = _codes_bytes(c, width if tree else numel)
        return [stock_all_reduce(group, w, 4 * scales)] + (
            [exchange(group, w, codes), gather(group, codes)] if tree
            else [stock_all_reduce(group, w, codes)])
    return [exchange(group, w, payload_bytes(c, width, itemsize)),
            gather(group, payload_bytes(c, width, 4))]


def _codes_bytes(c: GloballyScaled, numel: int) -> int:
    """Bytes of the integer codes of ``numel`` values (the payload without its scales)."""
    dtype, count = c.payload_spec(numel)["codes"]
    return dtype.itemsize * count


def stock_all_reduce_bytes(numel: int, itemsize: int, world: int, me: int) -> list[int]:
    """Bytes sent to each peer by an all-reduce as reduce-scatter + all-gather of near-equal
    chunks: chunk k to peer k, then this rank's reduced chunk to every peer."""
    edges = [numel * k // world for k in range(world + 1)]
    size = [(edges[k + 1] - edges[k]) * itemsize for k in range(world)]
    return [(size[k] + size[me]) * (k != me) for k in range(world)]


def all_reduce(tensor: torch.Tensor, compressor: Compressor | None = None,
               op: Any = dist.ReduceOp.SUM, group: dist.ProcessGroup | None = None,
               topology: Topology | None = None, meter: WireMeter | None = None,
               tag: str = "all_reduce") -> torch.Tensor:
    """One in-place quantized all-reduce with a stateless compressor (``QuantizedAllReduce``)."""
    stateless_only([compressor], "QuantizedAllReduce")
    return QuantizedAllReduce(compressor, topology, meter, tag)(tensor, op, group)
