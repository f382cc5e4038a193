"""Quantization by random shift (QSDP 4.1, Definition 1), Triton version of ``random_shift.py``
(same functions, same numbers bit for bit given the same per-bucket noise).

Tiles, launches and the bf16 store: ``triton_tiles.py``. Divisions are IEEE (``div_rn``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_tiles import (GPU_TILE, NUM_WARPS, TILE, out_view, affine_rows, cdiv,
                           dequantize_peers, load_codes, load_values, nonfinite_rows,
                           per_program, quantize_buckets, row_min_max, scaled, store_codes,
                           store_out, store_rows, tile, tile_shape)


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
def _dequantize_kernel(code_ptr, base_ptr, step_ptr, out_ptr, n_buckets, bucket_size, n_peers,
                       numel, BIG, GROUPS: tl.constexpr, BLOCK: tl.constexpr,
                       OUT_BF16: tl.constexpr):
    """out = sum over peers p (in order) of their decoded tiles; one peer = dequantize."""
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    total = _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG)
    for _ in range(1, n_peers):
        code_ptr += numel
        base_ptr += n_buckets
        step_ptr += n_buckets
        total = total + _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG)
    store_out(out_ptr, offs, total, mask, OUT_BF16)


@triton.jit
def _dequantize_rows_kernel(code_ptr, base_ptr, step_ptr, out_ptr, n_buckets, bucket_size,
                            numel, code_row, param_row, out_row, BIG, GROUPS: tl.constexpr,
                            BLOCK: tl.constexpr, OUT_BF16: tl.constexpr):
    """Every slot of a gathered wire decoded where it lies (QSDP 5.1's weight gather): a
    2-D grid, axis 1 the rows; row r's byte codes at ``r * code_row``, its bases and steps at
    ``r * param_row``, its first ``numel`` values written to ``out`` at ``r * out_row``."""
    r = tl.program_id(1).to(tl.int64)
    code_ptr += r * code_row
    base_ptr += r * param_row
    step_ptr += r * param_row
    out_ptr += r * out_row
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    y = _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG)
    store_out(out_ptr, offs, y, mask & (offs < numel), OUT_BF16)


def quantize(x: torch.Tensor, bits: int, bucket_size: int,
             noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, noise (buckets,) -> (packed uint8 codes, float32 base, float32 step), per bucket."""
    return quantize_buckets(_quantize_kernel, x, noise, 2, bits, bucket_size,
                            KMAX=(1 << bits) - 1)


def dequantize(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
               bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``base.numel() * bucket_size`` values."""
    return dequantize_peers(_dequantize_kernel, packed[None], (base[None], step[None]), bits,
                            bucket_size, dtype, BIG=torch.finfo(dtype).max)


def dequantize_sum(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                   bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), base and step (P, buckets) -> float32 (numel,)."""
    return dequantize_peers(_dequantize_kernel, packed, (base, step), bits, bucket_size,
                            torch.float32, BIG=torch.finfo(torch.float32).max)


def dequantize_rows(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                    bucket_size: int, out: torch.Tensor) -> torch.Tensor:
    """The twin's ``dequantize_rows`` in one kernel reading every row's fields in place
    (``[rows, ..]`` column views of a gathered wire) and writing its row of ``out`` (unit
    column stride, any row stride): 8-bit codes (one byte per value); other widths, or
    fields not read in place, decode flat, then a copy."""
    rows, numel = out.shape
    nb = base.shape[1] if base.dim() == 2 else 0
    if not (bits == 8 and nb and rows and -(-numel // bucket_size) == nb
            and all(t.dim() == 2 and t.stride(-1) == 1 for t in (packed, base, step, out))
            and base.stride(0) == step.stride(0)):
        if rows and numel:
            values = dequantize(packed.reshape(-1), base.reshape(-1), step.reshape(-1), bits,
                                bucket_size, out.dtype)
            out.copy_(values.view(rows, -1)[:, :numel])
        return out
    block, groups = tile_shape(bucket_size, per_program(out, TILE, GPU_TILE))
    _dequantize_rows_kernel[(cdiv(nb, groups), rows)](
        packed, base, step, out_view(out), nb, bucket_size, numel,
        packed.stride(0) if rows > 1 else 0, base.stride(0) if rows > 1 else 0,
        out.stride(0) if rows > 1 else 0, torch.finfo(out.dtype).max, GROUPS=groups,
        BLOCK=block, OUT_BF16=out.dtype == torch.bfloat16, num_warps=NUM_WARPS,
        enable_fp_fusion=False)
    return out
