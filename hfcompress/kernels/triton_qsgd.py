"""QSGD bucketed stochastic quantization (QSDP 3.2), Triton version of ``qsgd.py`` (same
functions, same numbers bit for bit given the same noise; noise given as keys is hashed in
the kernel, ``triton_noise.group_noise_at``).

Tiles, launches and the bf16 store: ``triton_tiles.py``. Divisions are IEEE (``div_rn``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_tiles import (dequantize_peers, load_codes, load_rows, load_values,
                           nonfinite_rows, quantize_buckets, store_codes, store_out, store_rows,
                           tile)
from .triton_noise import group_noise_at, noise_operand


@triton.jit
def _quantize_kernel(x_ptr, u_ptr, code_ptr, scale_ptr, n_buckets, bucket_size, noise_row,
                     S: tl.constexpr, HASH: tl.constexpr, GROUPS: tl.constexpr,
                     BLOCK: tl.constexpr):
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    x = load_values(x_ptr, offs, mask)
    ax = tl.abs(x)
    bad = nonfinite_rows(x)
    norm = tl.max(ax, axis=1)
    s = tl.full([GROUPS], S, tl.float32)
    scale = tl.where(bad, float("nan"), tl.math.div_rn(norm, s))
    inv = tl.where(bad | (norm == 0.0), 0.0, tl.math.div_rn(s, tl.where(norm == 0.0, 1.0, norm)))
    u = group_noise_at(u_ptr, offs, mask, rows[:, None], row_ok[:, None],
                       bucket_size, HASH, noise_row)
    level = tl.floor(ax * inv[:, None] + u)
    level = tl.where(level != level, 0.0, level)
    level = tl.minimum(tl.maximum(level, 0.0), S)
    q = tl.where(x < 0.0, -level, level)
    store_codes(code_ptr, offs, mask, q + (S + 1))
    store_rows(scale_ptr, rows, row_ok, scale)


@triton.jit
def _decode(code_ptr, scale_ptr, rows, row_ok, mask, offs, S: tl.constexpr):
    """(code - (S+1)) * scale of one peer's tile."""
    c = load_codes(code_ptr, offs, mask).to(tl.float32)
    return (c - (S + 1)) * load_rows(scale_ptr, rows, row_ok)[:, None]


@triton.jit
def _dequantize_kernel(code_ptr, scale_ptr, out_ptr, n_buckets, bucket_size, n_peers, numel,
                       S: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr,
                       OUT_BF16: tl.constexpr):
    """out = sum over peers p (in order) of their decoded tiles; one peer = dequantize."""
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    total = _decode(code_ptr, scale_ptr, rows, row_ok, mask, offs, S)
    for _ in range(1, n_peers):
        code_ptr += numel
        scale_ptr += n_buckets
        total = total + _decode(code_ptr, scale_ptr, rows, row_ok, mask, offs, S)
    store_out(out_ptr, offs, total, mask, OUT_BF16)


def quantize(x: torch.Tensor, bits: int, bucket_size: int,
             noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D x -> (packed uint8 codes, float32 scales ``norm / s`` of shape (buckets,))."""
    u, hashed, row = noise_operand(noise, x.numel(), x, bucket_size)
    return quantize_buckets(_quantize_kernel, x, u, 1, bits, bucket_size, noise_row=row,
                            S=(1 << (bits - 1)) - 1, HASH=hashed)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, bucket_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``scale.numel() * bucket_size`` values."""
    return dequantize_peers(_dequantize_kernel, packed[None], (scale[None],), bits, bucket_size,
                            dtype, S=(1 << (bits - 1)) - 1)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                   bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), scale (P, buckets) -> float32 (numel,)."""
    return dequantize_peers(_dequantize_kernel, packed, (scale,), bits, bucket_size,
                            torch.float32, S=(1 << (bits - 1)) - 1)
