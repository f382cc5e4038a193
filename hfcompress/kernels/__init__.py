"""Kernels: one Triton kernel per hot operation and a torch twin with the same numbers.

The functions here dispatch (``dispatch.pick``): Triton on CUDA tensors when Triton is
usable, otherwise the torch twin, run through ``torch.compile`` on CPU (``HFCOMPRESS_COMPILE=0``
keeps it eager); ``backend="torch" | "triton"`` forces one. A ``noise`` argument is the
float32 rounding noise, one value per rounded value, or the int64 keys of the counter hash
(``noise.py``), which Triton kernels expand in registers.
"""

from __future__ import annotations

import torch

from . import group_quant as _gq
from .dispatch import pick, triton_available, use_triton

__all__ = ["quantize_groups", "dequantize_groups", "dequantize_sum_groups",
           "dequantize_sum_quantize_groups", "triton_available", "use_triton"]


def quantize_groups(x: torch.Tensor, bits: int, group_size: int, noise: torch.Tensor | None = None,
                    backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """1-D x (numel % group_size == 0) -> (packed uint8 codes, float32 scales)."""
    impl = pick(x, backend, _gq, "triton_group_quant")
    return impl.quantize(x, bits, group_size, noise)


def dequantize_groups(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                      dtype: torch.dtype = torch.float32, backend: str = "auto") -> torch.Tensor:
    impl = pick(packed, backend, _gq, "triton_group_quant")
    return impl.dequantize(packed, scale, bits, group_size, dtype)


def dequantize_sum_groups(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                          backend: str = "auto") -> torch.Tensor:
    impl = pick(packed, backend, _gq, "triton_group_quant")
    return impl.dequantize_sum(packed, scale, bits, group_size)


def dequantize_sum_quantize_groups(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                                   group_size: int, out_bits: int, out_group_size: int,
                                   noise: torch.Tensor | None = None,
                                   backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    impl = pick(packed, backend, _gq, "triton_group_quant")
    return impl.dequantize_sum_quantize(packed, scale, bits, group_size, out_bits,
                                        out_group_size, noise)
