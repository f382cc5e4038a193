"""Blockwise Walsh-Hadamard smoothing fused with group quantization, torch twin of
``triton_hadamard.py`` (SDP4Bit 3.2.2 TLq-HS, 3.3, Alg. 3).

``rotate`` multiplies every block of ``hadamard_size`` consecutive values by
``H = Sylvester(n) / sqrt(n)`` (symmetric, orthogonal, so ``rotate(rotate(x)) == x`` up to
rounding). Both backends compute it the same way, bit for bit: ``log2(n)`` float32 add/sub
butterfly stages (pairs ``i, i + h`` for ``h = 1, 2, .., n/2`` -> ``a + b, a - b``), then one
multiply by :func:`inv_sqrt`. Values above ~3.4e38 / n overflow in the butterfly and come
back non-finite (never as finite garbage). ``hadamard_size=1`` is the identity (no stage,
multiply by 1.0), i.e. plain group quantization. Quantization is ``group_quant.py`` applied to
the rotated values (``hadamard_size`` divides ``group_size``, so a non-finite group stays a
NaN group after the inverse and never leaks into its neighbours).
"""

from __future__ import annotations

import math
import struct

import torch

from .random_shift import finite_range

from . import group_quant as _gq
from .packing import wire_fields
from .post_op import sum_riders, written

#: compiled on CPU; the fused-op composites below run as separate kernels there (``dispatch.
#: compiled``): Inductor fusing the rotation into the group reduction re-evaluates the
#: butterfly for every read (measured ~4x slower than storing the rotated values once)
COMPILE_ON_CPU = ("rotate",)


def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


#: ``1/sqrt(n)`` rounded to float32 for every power of two n (a table, so compiled code
#: reads a constant instead of breaking its graph)
_INV_SQRT = {1 << k: _f32(1.0 / math.sqrt(1 << k)) for k in range(31)}


def inv_sqrt(n: int) -> float:
    """``1/sqrt(n)`` rounded to float32 (the one constant both backends multiply by)."""
    return _INV_SQRT[n]


#: up to this size the butterfly runs on the block's columns (see :func:`_fwht_rows`)
COLUMN_MAX = 32


def _fwht_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """Normalized Walsh-Hadamard transform of every row of a float32 ``(rows, n)`` tensor.

    ``n <= COLUMN_MAX``: the butterfly on the n columns as n separate vectors, each scaled
    before they are stacked, so compiled code runs each stage once per row and writes the
    result in the same pass (scaling the stacked tensor took a second pass: ~1.4-2.6x slower
    on one CPU core); a broadcast over the whole tensor would be fused into one expression per
    output that recomputes the 2n-1 node tree (~4x slower). Larger n: one broadcast per stage,
    ``a + b * (+1, -1)``. Either way each stage computes ``(a + b, a - b)`` bit for bit
    (``b * -1`` is exact).
    """
    if n <= COLUMN_MAX:
        cols = [x[:, j] for j in range(n)]
        h = 1
        while h < n:
            for i in range(0, n, 2 * h):
                for j in range(i, i + h):
                    a, b = cols[j], cols[j + h]
                    cols[j], cols[j + h] = a + b, a + b * -1.0
            h *= 2
        scale = inv_sqrt(n)
        return torch.stack([c * scale for c in cols], dim=1)
    signs = torch.tensor([1.0, -1.0], dtype=x.dtype, device=x.device).view(1, 1, 2, 1)
    rows, h = x.shape[0], 1
    while h < n:
        y = x.reshape(rows, n // (2 * h), 2, h)
        x = (y[:, :, 0:1] + y[:, :, 1:2] * signs).reshape(rows, n)
        h *= 2
    return x * inv_sqrt(n)


def rotate(x: torch.Tensor, hadamard_size: int) -> torch.Tensor:
    """1-D x (numel % hadamard_size == 0) -> float32 ``x.view(-1, n) @ H``, flattened."""
    return _fwht_rows(x.reshape(-1, hadamard_size).float(), hadamard_size).reshape(-1)


def quantize(x: torch.Tensor, bits: int, group_size: int, hadamard_size: int,
             noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused rotate + group quantize: ``group_quant.quantize(rotate(x), ...)``; ``noise`` is
    indexed like the rotated values."""
    y = rotate(x, hadamard_size) if hadamard_size > 1 else x  # x * 1.0 == x: skip the pass
    return _gq.quantize(y, bits, group_size, noise)


def quantize_rows(x: torch.Tensor, rows: int, bits: int, group_size: int, hadamard_size: int,
                  noise: torch.Tensor | None = None,
                  tail: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`quantize` of ``rows`` equal rows of whole groups (flat ``x``, or its ``[rows,
    n]`` rows, any row stride) as the wire ``[rows, nbytes]``: row r its codes, then its
    scales, then row r of ``tail`` (``group_quant.join_rows``)."""
    return _gq.join_rows(*quantize(x.reshape(-1), bits, group_size, hadamard_size, noise),
                         rows, tail)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
               hadamard_size: int, dtype: torch.dtype = torch.float32,
               inverse: bool = True) -> torch.Tensor:
    """Dequantize, then (``inverse``) rotate back, in float32; cast to ``dtype`` last, finite
    values of a 16-bit ``dtype`` clipped to its largest (the rotated-back error can take a
    value near fp16's maximum past it: finite in, finite out; NaN stays NaN)."""
    y = _gq.dequantize(packed, scale, bits, group_size)
    y = rotate(y, hadamard_size) if inverse else y
    return (y if dtype == torch.float32 else finite_range(y, dtype)).to(dtype)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                   hadamard_size: int, inverse: bool = True,
                   out: torch.Tensor | None = None,
                   post: tuple[str, float] | None = None) -> torch.Tensor:
    """Sum of P peers in the rotated domain (``packed`` (P, nbytes), ``scale`` (P, groups)),
    then one inverse rotation (``sum_i H g_i = H sum_i g_i``, SDP4Bit 3.3). float32;
    ``out``: copied there (numel values, any float dtype; the Triton kernel writes it in
    place); ``post``: divided or multiplied after the rotation (``post_op.py``)."""
    y = _gq.dequantize_sum(packed, scale, bits, group_size)
    return written(rotate(y, hadamard_size) if inverse else y, out, post)


def dequantize_sum_wire(wire: torch.Tensor, code_bytes: int, n_groups: int, bits: int,
                        group_size: int, hadamard_size: int, inverse: bool = True,
                        out: torch.Tensor | None = None,
                        post: tuple[str, float] | None = None,
                        riders: tuple | None = None) -> torch.Tensor:
    """:func:`dequantize_sum` of the payloads in the rows of the uint8 wire ``[P, width]``
    (row p: ``code_bytes`` of codes, then ``n_groups`` float32 scales; more bytes may
    follow); ``out`` and ``post`` as there; ``riders`` as ``group_quant``'s."""
    if riders is not None:
        sum_riders(wire, riders)
    return dequantize_sum(*wire_fields(wire, code_bytes, n_groups), bits, group_size,
                          hadamard_size, inverse, out, post)
