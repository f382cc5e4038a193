"""Quantized all-gather (ZeRO++ qwZ; SDP4Bit qWD, Alg. 2; QSDP weights).

``output`` is flat ``world * S`` values, rank-major; ``input`` holds this rank's S values
(it may be a view of its slot in ``output``, as in FSDP2). Each rank compresses its input,
the flat uint8 payloads are all-gathered, and every slot, this rank's included, is
decompressed from the gathered bytes, so all ranks hold bit-identical outputs.
With ``compressor=None`` this is torch's ``all_gather_single`` (``all_gather_into_tensor``).

Stateful schemes (qWD) keep one instance per slot (``Streams``): on every rank, slot r's
instance sees the same ``decompress`` calls on the same bytes, and rank r also calls
``compress`` on it before. The scheme must therefore update its state in ``decompress``
(e.g. ``reference += dequantized difference``), never only in ``compress``.

``maybe_unchanged=True`` (FSDP's backward all-gather, no optimizer step since the forward)
lets a scheme with ``unchanged`` / ``reference`` (qWD) skip the exchange: one
``all_reduce(MAX)`` of a "my slot changed" flag, and if no rank's slot changed every rank
writes the slots' references, which is what the zero differences would have rebuilt
(SDP4Bit Alg. 2: "all-gather with no optimizer step in between sends zero differences").
Every rank must pass the same ``maybe_unchanged``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..compressors.base import Compressor
from .hop import all_gather_single
from .streams import StreamOwner, Streams, stateless_only
from .topology import Topology
from .wire_meter import WireMeter, peer_is_remote


class QuantizedAllGather(StreamOwner):
    """All-gather through ``compressor`` (None: exact); holds per-slot state if needed."""

    def __init__(self, compressor: Compressor | None = None, topology: Topology | None = None,
                 meter: WireMeter | None = None, tag: str = "all_gather") -> None:
        self.compressor = compressor
        self.streams = {"slots": Streams(compressor)} if compressor is not None else {}
        self.topology, self.meter, self.tag = topology, meter, tag

    def __call__(self, output: torch.Tensor, input: torch.Tensor,
                 group: dist.ProcessGroup | None = None, maybe_unchanged: bool = False) -> None:
        if group is None:
            group = self.topology.group if self.topology else dist.group.WORLD
        world, me, s = dist.get_world_size(group), dist.get_rank(group), input.numel()
        if output.numel() != world * s:
            raise ValueError(f"all_gather: output has {output.numel()} values, expected "
                             f"world size {world} x input {s} = {world * s}")
        if self.compressor is None:
            self._record([s * input.element_size()] * world, group, me)
            all_gather_single(output.view(-1), input.reshape(-1).contiguous(), group=group)
            return
        if s == 0:
            return
        slots = self.streams["slots"]
        slots.check_layout((world, s))
        flat = input.reshape(-1)
        out = output.view(-1)
        if maybe_unchanged and self._nobody_changed(slots[me], flat, group, me):
            for r in range(world):
                out[r * s:(r + 1) * s].copy_(slots[r].reference.reshape(-1))
            return
        buf = slots[me].compress(flat).flat()
        n = buf.numel()
        gathered = torch.empty(world * n, dtype=torch.uint8, device=buf.device)
        self._record([n] * world, group, me)
        all_gather_single(gathered, buf, group=group)
        for r in range(world):
            c = slots[r]
            packed = c.unflatten(gathered[r * n:(r + 1) * n], flat.shape, flat.dtype)
            out[r * s:(r + 1) * s].copy_(c.decompress(packed))

    def _nobody_changed(self, mine: Compressor, flat: torch.Tensor,
                        group: dist.ProcessGroup, me: int) -> bool:
        """No rank's slot changed since its last compress (one int32 MAX all-reduce)."""
        if not hasattr(mine, "unchanged"):
            return False
        changed = torch.tensor([0 if mine.unchanged(flat) else 1], dtype=torch.int32,
                               device=flat.device)
        self._record([changed.numel() * changed.element_size()] * dist.get_world_size(group),
                     group, me)
        dist.all_reduce(changed, op=dist.ReduceOp.MAX, group=group)
        return int(changed.item()) == 0

    def _record(self, per_peer: list[int], group: dist.ProcessGroup, me: int) -> None:
        if self.meter is not None:
            self.meter.record_sends(self.tag, per_peer, peer_is_remote(group, self.topology), me)


def all_gather(output: torch.Tensor, input: torch.Tensor, compressor: Compressor | None = None,
               group: dist.ProcessGroup | None = None, topology: Topology | None = None,
               meter: WireMeter | None = None, tag: str = "all_gather") -> None:
    """One quantized all-gather with a stateless compressor (see ``QuantizedAllGather``)."""
    stateless_only([compressor], "QuantizedAllGather")
    QuantizedAllGather(compressor, topology, meter, tag)(output, input, group)
