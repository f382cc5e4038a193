"""Quantized all-gather (ZeRO++ qwZ; SDP4Bit qWD, Alg. 2; QSDP weights).

``output`` is flat ``world * S`` values, rank-major (or, compressed, a ``[world, S]`` view
whose rows may be strided: the compressed columns of FSDP2's buffer, decoded in place);
``input`` holds this rank's S values (it may be a view of its slot in ``output``, as in
FSDP2). Each rank compresses its input,
the flat uint8 payloads are all-gathered, and every slot, this rank's included, is
decompressed from the gathered bytes, so all ranks hold bit-identical outputs: one
``decompress_slots`` call over the ``[world, n]`` bytes (stateless schemes; a bucketed one
decodes every slot in one kernel), or slot by slot for a stateful scheme's per-slot streams.
With ``compressor=None`` this is torch's ``all_gather_single`` (``all_gather_into_tensor``).

qWD (SDP4Bit Alg. 2), the stateful scheme, goes through ``ShardedReferences``
(``reference_gather.py``): each rank keeps the references of 1/ranks_per_node of the slots,
the 4-bit differences cross nodes once, the rebuilt slots are gathered inside the node.
``unchanged=True`` (a host-side fact: no optimizer step since the last all-gather, e.g.
FSDP's backward all-gather; every rank must pass the same value) rebuilds from the
references without sending differences. Stateless schemes ignore it.

``async_op=True`` returns a future that completes when the exchange and the decode into
``output`` are done (``futures.py``: on CPU the decode is chained to gloo's asynchronous
all-gather; on CUDA every stage is enqueued on a private side stream that waits on the
caller's stream, and the future, completed there with ``output``, makes its waiter's
stream wait).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..compressors.base import Compressor, ReferenceCoded
from ..compressors.runs import Runs
from ..kernels.packing import flat_contiguous, split_tail
from .hop import all_gather_single
from .futures import finish, inline, overlaps, side_stream_call
from .reference_gather import ShardedReferences
from .riders import rider_nbytes
from .streams import StreamOwner, Streams, stateless_only
from .topology import Topology
from .traffic import Phase, gather, payload_bytes
from .wire_meter import WireMeter, peer_is_remote, rank_size


class QuantizedAllGather(StreamOwner):
    """All-gather through ``compressor`` (None: exact); qWD keeps node-sharded references
    (``shard_references=False``: every rank keeps all of them, SDP4Bit's layout)."""

    def __init__(self, compressor: Compressor | None = None, topology: Topology | None = None,
                 meter: WireMeter | None = None, tag: str = "all_gather",
                 shard_references: bool = True) -> None:
        self.compressor = compressor
        self.references = ShardedReferences(compressor, topology, shard_references) \
            if isinstance(compressor, ReferenceCoded) else None
        self.streams = {"slots": Streams(compressor)} \
            if compressor is not None and self.references is None else {}
        self.topology, self.meter, self.tag = topology, meter, tag

    def __call__(self, output: torch.Tensor, input: torch.Tensor,
                 group: dist.ProcessGroup | None = None, unchanged: bool = False,
                 async_op: bool = False, exact: tuple[torch.Tensor, torch.Tensor] | None = None,
                 columns: Runs | None = None) -> torch.futures.Future | None:
        """``exact``: ``(values [E], out [world, E])``, columns gathered exactly in the same
        collective(s) (``riders.py``); qWD only: ``columns``, ``output`` is ``[world, S]``
        rows and the slots go to these column runs (``ShardedReferences``)."""
        if group is None:
            group = self.topology.group if self.topology else dist.group.WORLD
        (me, world), s = rank_size(group), input.numel()
        if (exact is not None and self.compressor is None) or \
                (columns is not None and self.references is None):
            raise ValueError("all_gather: exact columns ride a compressor's gather; columns "
                             "are qWD's (a ReferenceCoded scheme)")
        if columns is None and output.numel() != world * s:
            raise ValueError(f"all_gather: output has {output.numel()} values, expected "
                             f"world size {world} x input {s} = {world * s}")
        if async_op and inline(input.device):   # CUDA: the side stream (futures.py)
            return side_stream_call(lambda: self(output, input, group, unchanged,
                                                 exact=exact, columns=columns), output,
                                    keep=[input])
        launch = overlaps(input.device, async_op)
        if self.compressor is None:
            self._record(s * input.element_size(), group, me)
            work = all_gather_single(output.view(-1), flat_contiguous(input),
                                     group=group, async_op=launch)
            return finish(work, None, async_op, input.device)
        if s == 0:
            return finish(None, None, async_op, input.device)
        # may be row-strided (FSDP's compressed columns)
        out = output if output.dim() == 2 and output.shape[0] == world and \
            (columns is not None or output.shape[1] == s) else \
            output.view(world, s if columns is None else -1)
        if self.references is not None:    # its slot read as it lies (e.g. spaced runs)
            return self.references(out, input, group, unchanged, self.meter, self.tag,
                                   async_op, exact=exact, columns=columns)
        flat = input if input.dim() == 1 else input.reshape(-1)
        slots = self.streams["slots"]
        riding = None if exact is None else exact[0].reshape(1, -1)
        # the payload, then the riding exact values, in one row (the kernel writes it)
        row = slots[me].compress_rows(flat.reshape(1, -1), riding)
        n = row.shape[1] - rider_nbytes(riding)
        gathered = torch.empty(world, row.shape[1], dtype=torch.uint8, device=row.device)
        self._record(row.shape[1], group, me)
        work = all_gather_single(gathered.view(-1), row.view(-1), group=group, async_op=launch)

        def decode() -> None:
            wire, values = split_tail(gathered, n, None if exact is None else exact[0].dtype)
            if not slots.stateful:   # one decode of every slot (same numbers), the riders too
                copies = values is not None and slots.compressor.copies_riders
                slots.compressor.decompress_slots(
                    wire, s, out, **({"riders": (exact[1], values)} if copies else {}))
                values = None if copies else values
            else:
                for r in range(world):   # a stream per slot
                    slots[r].decompress_slots(wire[r:r + 1], s, out[r:r + 1])
            if values is not None:
                exact[1].copy_(values)
        return finish(work, decode, async_op, input.device)

    def planned(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
                exact: tuple[torch.Tensor, torch.Tensor] | None = None,
                columns: Runs | None = None):
        """The plan of a qWD call that sends differences (not ``unchanged``: the caller's)
        and is not ``async_op``, with operands of these signatures, ``output`` its ``[world,
        S]`` rows: ``(output, input, exact) -> None`` (``ShardedReferences.planned``; the
        meter and tag read at each call), or None (the call decides)."""
        world = rank_size(group)[1]
        if self.references is None or not input.numel() or output.dim() != 2 \
                or output.shape[0] != world \
                or (columns is None and output.shape[1] != input.numel()):
            return None
        run = self.references.planned(output, input, group, False, exact, columns)
        if run is None:
            return None
        return lambda output, input, exact: run(output, input, self.meter, self.tag, exact)

    @staticmethod
    def traffic(numel: int, ranks_per_node: int, nodes: int, compressor: Compressor | None,
                itemsize: int, unchanged: bool = False, exact: int = 0) -> list[Phase]:
        """One call over the world of ``numel`` values of ``itemsize`` bytes per rank
        (``traffic.py``); qWD: :meth:`ShardedReferences.traffic` (``exact`` values riding)."""
        if isinstance(compressor, ReferenceCoded):
            return ShardedReferences.traffic(numel, ranks_per_node, nodes, compressor,
                                             itemsize, unchanged, exact)
        extra = exact * itemsize if compressor is not None else 0
        return [gather("world", payload_bytes(compressor, numel, itemsize) + extra)]

    # -- state ----------------------------------------------------------------------------
    def compressors(self) -> list[Compressor]:
        if self.references is not None:
            return [self.references.qwd]
        return super().compressors()

    def state_bytes(self) -> dict[str, int]:
        """Bytes of compressor state this rank keeps between calls, by kind."""
        if self.references is not None:
            return self.references.state_bytes()
        return super().state_bytes()

    def state_dict(self) -> dict[str, Any]:
        if self.references is not None:
            return {"references": self.references.state_dict()}
        return super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.references is not None:
            if "references" not in state:
                raise ValueError("qwd all-gather state without node-sharded references (saved "
                                 "by an older hfcompress?); start the references afresh")
            self.references.load_state_dict(state["references"])
            return
        super().load_state_dict(state)

    def _record(self, per_peer: int, group: dist.ProcessGroup, me: int) -> None:
        if self.meter is not None:
            self.meter.record_sends(self.tag, per_peer, peer_is_remote(group, self.topology), me)


def all_gather(output: torch.Tensor, input: torch.Tensor, compressor: Compressor | None = None,
               group: dist.ProcessGroup | None = None, topology: Topology | None = None,
               meter: WireMeter | None = None, tag: str = "all_gather") -> None:
    """One quantized all-gather with a stateless compressor (see ``QuantizedAllGather``)."""
    stateless_only([compressor], "QuantizedAllGather")
    QuantizedAllGather(compressor, topology, meter, tag)(output, input, group)


class VersionWatch:
    """"Unchanged since the last call", known on the host: the tensors' storage pointers and
    autograd version counters, which in-place updates through the tensor or a view of it
    bump (``copy_``, ``load_state_dict``, a plain optimizer step; not a ``foreach`` /
    ``fused`` step of DTensor parameters, nor ``.data``). No device sync, no copy: use it
    where nothing else changes the tensors between two calls (FSDP's forward and backward
    all-gather of one step)."""

    def __init__(self) -> None:
        self._last: tuple | None = None

    @staticmethod
    def read(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, int, bool], ...]:
        """Each tensor's ``(data_ptr, version counter, requires_grad)``, read once per call
        for :meth:`unchanged` and ``frozen.FrozenParams.current``. Read with tensor
        subclasses' ``__torch_function__`` off: the same values (a DTensor's own, as its
        handler returns them), without a handler call per attribute (FSDP2's parameters
        are DTensors: 3x less host time)."""
        with torch._C.DisableTorchFunctionSubclass():
            return tuple([(t.data_ptr(), t._version, t.requires_grad) for t in tensors])

    def unchanged(self, states: tuple[tuple[int, int, bool], ...]) -> bool:
        """Whether the tensors whose :meth:`read` is ``states`` (the same ones, in order, at
        every call) are as at the last call."""
        same, self._last = states == self._last, states
        return same
