"""Quantization by random shift (QSDP 4.1, Definition 1), Triton version of ``random_shift.py``
(same functions, same numbers bit for bit given the same per-bucket noise).

Tiles, launches and the bf16 store: ``triton_tiles.py``. Divisions are IEEE (``div_rn``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .packing import unpack_codes
from .triton_tiles import (affine_rows, decode_rows, load_codes, load_values, nonfinite_rows,
                           quantize_buckets, row_min_max, scaled, store_codes, store_out,
                           store_rows, tile)


@triton.jit
def _quantize_kernel(x_ptr, u_ptr, code_ptr, base_ptr, step_ptr, n_buckets, bucket_size,
                     KMAX: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    x = load_values(x_ptr, offs, mask)
    lo, hi = row_min_max(x, mask)
    step = tl.math.div_rn(hi - lo, tl.full([GROUPS], KMAX - 1, tl.float32))
    bad = nonfinite_rows(x) | (step != step) | (step == float("inf"))
    u = tl.load(u_ptr + rows, mask=row_ok, other=0.5)
    step = tl.where(bad, float("nan"), step)
    base = tl.where(bad, float("nan"), lo + (u - 0.5) * step)
    k = tl.floor(scaled(x, base, step) + 0.5)
    k = tl.minimum(tl.maximum(k, 0.0), KMAX)
    store_codes(code_ptr, offs, mask, k)
    store_rows(base_ptr, rows, row_ok, base)
    store_rows(step_ptr, rows, row_ok, step)


@triton.jit
def _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG):
    """base + k * step of one peer's tile, clipped to +-BIG (NaN stays NaN)."""
    k = load_codes(code_ptr, offs, mask).to(tl.float32)
    y = affine_rows(k, base_ptr, step_ptr, rows, row_ok)
    return tl.where(y > BIG, BIG, tl.where(y < -BIG, -BIG, y))


@triton.jit
def _dequantize_rows_kernel(code_ptr, base_ptr, step_ptr, out_ptr, n_buckets, bucket_size,
                            n_peers, numel, code_stride, base_stride, step_stride, out_stride,
                            BIG, GROUPS: tl.constexpr, BLOCK: tl.constexpr,
                            OUT_BF16: tl.constexpr):
    """Row ``program_id(1)`` of byte codes, bases and steps (rows possibly strided: a
    gathered wire's fields, QSDP 5.1's weight gather) into out's row of as many, plus the
    ``n_peers - 1`` rows after it, in order (a peer sum: one peer = dequantize); the first
    ``numel`` values of each row are stored (``triton_tiles.decode_rows`` launches it)."""
    r = tl.program_id(1).to(tl.int64)
    code_ptr += r * code_stride
    base_ptr += r * base_stride
    step_ptr += r * step_stride
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    total = _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG)
    for _ in range(1, n_peers):
        code_ptr += code_stride
        base_ptr += base_stride
        step_ptr += step_stride
        total = total + _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG)
    store_out(out_ptr + r * out_stride, offs, total, mask & (offs < numel), OUT_BF16)


def quantize(x: torch.Tensor, bits: int, bucket_size: int,
             noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, noise (buckets,) -> (packed uint8 codes, float32 base, float32 step), per bucket."""
    return quantize_buckets(_quantize_kernel, x, noise, 2, bits, bucket_size,
                            KMAX=(1 << bits) - 1)


def dequantize(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
               bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``base.numel() * bucket_size`` values."""
    out = torch.empty(1, base.numel() * bucket_size, dtype=dtype, device=packed.device)
    return _decode_rows(packed.reshape(1, -1), base.reshape(1, -1), step.reshape(1, -1), bits,
                        bucket_size, out, False)[0]


def dequantize_sum(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                   bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), base and step (P, buckets) -> float32 (numel,)."""
    out = torch.empty(1, base.shape[1] * bucket_size, dtype=torch.float32, device=packed.device)
    return _decode_rows(packed, base, step, bits, bucket_size, out, True)[0]


def dequantize_rows(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                    bucket_size: int, out: torch.Tensor) -> torch.Tensor:
    """The twin's ``dequantize_rows`` in one kernel reading every row's fields in place
    (``[rows, ..]`` column views of a gathered wire) and writing its row of ``out`` (unit
    column stride, any row stride)."""
    return _decode_rows(packed, base, step, bits, bucket_size, out, False)


def _decode_rows(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                 bucket_size: int, out: torch.Tensor, peers: bool) -> torch.Tensor:
    """``triton_tiles.decode_rows`` of the rows kernel: byte codes read where they lie (8
    bits), packed ones unpacked first (one byte per value, rows back to back)."""
    if bits != 8:
        packed = unpack_codes(packed.reshape(-1), bits).view(base.shape[0], -1)
    return decode_rows(_dequantize_rows_kernel, packed, (base, step), bucket_size, out, peers,
                       BIG=torch.finfo(out.dtype).max)
