"""One all-to-all hop on compressed payloads (ZeRO++ B.3.1): compress one part per peer,
``all_to_all_single`` the flat uint8 buffers, sum the received payloads.

The parts are the rows of one ``[peers, n]`` tensor: a stateless compressor compresses them
in one call (``Compressor.compress_rows``, the numbers of one call per row) and the receiver
sums the ``[peers, nbytes]`` received rows in one call (``reduce_rows``), so the torch ops /
kernel launches of a hop do not grow with the number of peers. A stateful compressor (LoCo
error feedback) keeps one stream per destination and compresses row by row.

``RawCodec`` stands in for "compression off": the values in their own dtype, exactly what
torch's collectives would send.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch
import torch.distributed as dist

from ..compressors.base import Compressor, Packed, into, stack_payloads
from ..kernels.packing import tail_bytes
from .streams import Streams
from .wire_meter import WireMeter, rank_size

# torch 2.13 renamed the flat collectives (the old names warn); torch < 2.13 has only those
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


class RawCodec(Compressor):
    """No compression: the payload is the tensor itself; ``reduce`` sums in float32.
    (Not registered: its wire size depends on the dtype, which ``payload_spec`` lacks.)"""

    name = "raw"

    def compress(self, x: torch.Tensor) -> Packed:
        return Packed({"values": x.contiguous().reshape(-1)}, x.shape, x.dtype)

    def decompress(self, packed: Packed) -> torch.Tensor:
        return packed.payload["values"].reshape(packed.shape)

    def unflatten(self, buf: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> Packed:
        return Packed({"values": buf.view(dtype)}, torch.Size(shape), dtype)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        total = packeds[0].payload["values"].float()
        for p in packeds[1:]:
            total = total + p.payload["values"].float()
        return total.reshape(packeds[0].shape)

    def compress_rows(self, x: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        if tail is None:
            return x.contiguous().view(torch.uint8)
        return torch.cat([tail_bytes(x), tail_bytes(tail)], dim=1)

    def reduce_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                    dtype: torch.dtype, out: torch.Tensor | None = None,
                    post: tuple[str, float] | None = None) -> torch.Tensor:
        """The float32 sum of the rows in order (as ``reduce``: one add per peer)."""
        values = wire.contiguous().view(dtype)
        total = values[0].float()
        for k in range(1, values.shape[0]):
            total = total + values[k].float()
        return into(total.reshape(shape), out, post)


def compress_rows(streams: Streams, rows: torch.Tensor, key: Callable[[int], Hashable],
                  rotated: bool = False, rider: torch.Tensor | None = None) -> torch.Tensor:
    """The uint8 ``[peers, nbytes]`` send buffer of a hop: row k of 2-D ``rows`` compressed for
    peer k, followed by row k of ``rider`` (exact values, ``riders.py``). Stateless: one
    ``compress_rows`` (``compress_rotated_rows`` if ``rotated``) call, which writes the
    rider too; stateful: row k through its own stream ``streams[key(k)]``, every row in one
    ``compress_streams`` call where the scheme has one (LoCo's kernel), else row by row (the
    rider in the same ``cat``)."""
    c = streams.compressor
    if not streams.stateful:
        return (c.compress_rotated_rows if rotated else c.compress_rows)(rows, rider)
    instances = [streams[key(k)] for k in range(rows.shape[0])]
    wire = None if rotated else c.compress_streams(instances, rows, rider)
    if wire is not None:
        return wire
    return stack_payloads([(s.compress_rotated if rotated else s.compress)(r)
                           for s, r in zip(instances, rows)], rider)


class Exchange:
    """An all-to-all of one payload row per group rank: ``send`` is uint8 ``[ranks, nbytes]``
    (row k goes to rank k); ``wait()`` returns the received ``[ranks, nbytes]`` (row k came
    from rank k)."""

    def __init__(self, send: torch.Tensor, group: dist.ProcessGroup, meter: WireMeter | None,
                 tag: str, remote: tuple[bool, ...], async_op: bool = False) -> None:
        self.count, self.nbytes = send.shape
        # kept alive until the exchange is done; rows split along dim 0 (no flat views)
        self.send = send if send.is_contiguous() else send.contiguous()
        self.recv = torch.empty_like(self.send)
        self.work = dist.all_to_all_single(self.recv, self.send, group=group, async_op=async_op)
        if meter is not None:
            meter.record_sends(tag, self.nbytes, remote, rank_size(group)[0])

    def received(self) -> torch.Tensor:
        """The received rows (valid once the exchange is done)."""
        return self.recv

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
        return self.received()

    def take(self) -> torch.Tensor:
        """``wait()``, then let go of the send buffer and the work: the caller holds the only
        reference to what was received (the buffers are freed as soon as it is done)."""
        received = self.wait()
        self.send = self.recv = self.work = None
        return received
