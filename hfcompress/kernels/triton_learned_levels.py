"""Codebook quantization with learned levels (QSDP 5.2, Alg. 2), Triton version of
``learned_levels.py`` (same functions, same numbers bit for bit).

The nearest level is found by a ``bits``-step binary search over the sorted midpoints (the count
of midpoints strictly below v, as ``torch.bucketize``). Tiles, launches and the bf16 store:
``triton_tiles.py``. Divisions are IEEE (``div_rn``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .learned_levels import midpoints, pack_codes, unpack_codes
from .triton_tiles import (affine_rows, dequantize_peers, load_codes, load_values,
                           nonfinite_rows, quantize_buckets, row_min_max, scaled, store_codes,
                           store_out, store_rows, tile)


@triton.jit
def _quantize_kernel(x_ptr, mid_ptr, code_ptr, lo_ptr, rng_ptr, n_buckets, bucket_size,
                     BITS: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    x = load_values(x_ptr, offs, mask)
    lo, hi = row_min_max(x, mask)
    rng = hi - lo
    bad = nonfinite_rows(x) | (rng != rng) | (rng == float("inf"))
    lo = tl.where(bad, float("nan"), lo)
    rng = tl.where(bad, float("nan"), rng)
    v = scaled(x, lo, rng)
    code = tl.zeros([GROUPS, BLOCK], tl.int32)
    for i in tl.static_range(BITS):
        cand = code + (1 << (BITS - 1 - i))
        mid = tl.load(mid_ptr + cand - 1, mask=mask, other=0.0)
        code = tl.where(mid < v, cand, code)
    code = tl.where(bad[:, None], 0, code)
    store_codes(code_ptr, offs, mask, code)
    store_rows(lo_ptr, rows, row_ok, lo)
    store_rows(rng_ptr, rows, row_ok, rng)


@triton.jit
def _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, mask, offs):
    """lo + levels[code] * rng of one peer's tile."""
    code = load_codes(code_ptr, offs, mask).to(tl.int32)
    level = tl.load(lv_ptr + code, mask=mask, other=0.0)
    return affine_rows(level, lo_ptr, rng_ptr, rows, row_ok)


@triton.jit
def _dequantize_kernel(code_ptr, lo_ptr, rng_ptr, lv_ptr, out_ptr, n_buckets, bucket_size,
                       n_peers, numel, LEVELS: tl.constexpr, GROUPS: tl.constexpr,
                       BLOCK: tl.constexpr, OUT_BF16: tl.constexpr):
    """out = sum over peers p (in order) of their decoded tiles; one peer = dequantize."""
    rows, row_ok, mask, offs = tile(n_buckets, bucket_size, GROUPS, BLOCK)
    total = _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, mask, offs)
    for _ in range(1, n_peers):
        code_ptr += numel
        lo_ptr += n_buckets
        rng_ptr += n_buckets
        lv_ptr += LEVELS
        total = total + _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, mask, offs)
    store_out(out_ptr, offs, total, mask, OUT_BF16)


def quantize(x: torch.Tensor, levels: torch.Tensor, bits: int,
             bucket_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, sorted levels (2**bits,) -> (packed uint8 codes, float32 lo, float32 rng)."""
    return quantize_buckets(_quantize_kernel, x, midpoints(levels).to(x.device), 2, bits,
                            bucket_size, pack_codes, BITS=bits)


def dequantize(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
               bits: int, bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``lo.numel() * bucket_size`` values."""
    return dequantize_peers(_dequantize_kernel, packed[None],
                            (lo[None], rng[None], levels[None].float()), bits, bucket_size, dtype,
                            unpack_codes, LEVELS=1 << bits)


def dequantize_sum(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
                   bits: int, bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), lo and rng (P, buckets), levels (P, 2**bits) ->
    float32 (numel,)."""
    return dequantize_peers(_dequantize_kernel, packed, (lo, rng, levels.float()), bits,
                            bucket_size, torch.float32, unpack_codes, LEVELS=1 << bits)
