"""One all-to-all hop on compressed payloads (ZeRO++ B.3.1): compress one part per peer,
``all_to_all_single`` the flat uint8 buffers, rebuild the received payloads.

``RawCodec`` stands in for "compression off": the values in their own dtype, exactly what
torch's collectives would send.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..compressors.base import Compressor, Packed
from .wire_meter import WireMeter

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


class Exchange:
    """An all-to-all of one payload per group rank; ``wait()`` returns the received ones."""

    def __init__(self, packeds: Sequence[Packed], unflatten: Callable[..., Packed],
                 group: dist.ProcessGroup, meter: WireMeter | None, tag: str,
                 remote: Sequence[bool], async_op: bool = False) -> None:
        bufs = [p.flat() for p in packeds]
        self.nbytes = bufs[0].numel()
        if any(b.numel() != self.nbytes for b in bufs):
            raise RuntimeError(f"payload sizes differ between parts: {[b.numel() for b in bufs]}")
        self.count = len(bufs)
        self.shape, self.dtype, self.unflatten = packeds[0].shape, packeds[0].dtype, unflatten
        self.send = torch.cat(bufs)  # kept alive until the asynchronous exchange is done
        self.recv = torch.empty_like(self.send)
        self.work = dist.all_to_all_single(self.recv, self.send, group=group, async_op=async_op)
        if meter is not None:
            meter.record_sends(tag, [self.nbytes] * len(bufs), remote, dist.get_rank(group))

    def wait(self) -> list[Packed]:
        if self.work is not None:
            self.work.wait()
        n = self.nbytes
        return [self.unflatten(self.recv[k * n:(k + 1) * n], self.shape, self.dtype)
                for k in range(self.count)]
