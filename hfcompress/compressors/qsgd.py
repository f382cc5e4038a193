"""QSGD stochastic quantization, QSDP's gradient quantizer (QSDP 3.2, 5.1, D.3).

``qsgd``: per bucket of ``bucket_size`` values (default 1024, QSDP 5.1; a multiple of 32) the
max norm ``max |x|`` (QSDP 3.2 scales values "to the range [-1, 1]"; QSGD's l2 norm is not
used), and each ``|x| / norm`` stochastically rounded onto ``s = 2**(bits-1) - 1`` uniform
levels, sign kept (bits 2/4/6/8, default 8: QSDP's G8). Unbiased, per-value variance at most
``(norm/s)**2 / 4`` and ``(norm/s) |x|``. Wire: packed codes and one float32 scale per bucket;
the zero padding of the last bucket is counted. Kernels: ``kernels/qsgd.py`` and
``kernels/triton_qsgd.py``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..kernels import dispatch
from ..kernels import qsgd as _twin
from ..kernels.packing import SUPPORTED_BITS, packed_nbytes
from .base import Compressor, Packed, check_choice, check_float_input, check_group_size
from .group_quant import pad_to
from .registry import register_compressor
from .rng import SeededRNG

BUCKET_MULTIPLE = 32


@register_compressor("qsgd")
class QSGD(Compressor):
    """QSGD with max-norm buckets and stochastic rounding (QSDP's gradient quantizer)."""

    unbiased = True

    def __init__(self, bits: int = 8, bucket_size: int = 1024, seed: int = 0,
                 backend: str = "auto") -> None:
        check_choice(self.name, "bits", bits, SUPPORTED_BITS)
        check_group_size(self.name, bucket_size, BUCKET_MULTIPLE, "bucket_size")
        check_choice(self.name, "backend", backend, dispatch.BACKENDS)
        super().__init__(bits=bits, bucket_size=bucket_size, seed=seed, backend=backend)
        self.bits, self.bucket_size, self.backend = bits, bucket_size, backend
        self.rng = SeededRNG(seed)

    def _impl(self, t: torch.Tensor):
        return dispatch.pick(t, self.backend, _twin, "triton_qsgd")

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        n = -(-numel // self.bucket_size) * self.bucket_size
        return {"codes": (torch.uint8, packed_nbytes(n, self.bits)),
                "scales": (torch.float32, n // self.bucket_size)}

    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        flat = pad_to(x.detach(), self.bucket_size)
        noise = self.rng.uniform_like(flat)
        codes, scales = self._impl(flat).quantize(flat, self.bits, self.bucket_size, noise)
        return Packed({"codes": codes, "scales": scales}, x.shape, x.dtype)

    def decompress(self, packed: Packed) -> torch.Tensor:
        codes, scales = packed.payload["codes"], packed.payload["scales"]
        out = self._impl(codes).dequantize(codes, scales, self.bits, self.bucket_size, packed.dtype)
        return out[:packed.numel].reshape(packed.shape)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        if not packeds:
            raise ValueError("reduce() needs at least one payload")
        codes = torch.stack([p.payload["codes"] for p in packeds])
        scales = torch.stack([p.payload["scales"] for p in packeds])
        total = self._impl(codes).dequantize_sum(codes, scales, self.bits, self.bucket_size)
        return total[:packeds[0].numel].reshape(packeds[0].shape)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.load_state_dict(state["rng"])
