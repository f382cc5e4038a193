"""Codebook quantization with learned levels (QSDP 5.2, Alg. 2), Triton version of
``learned_levels.py`` (same functions, same numbers bit for bit).

The nearest level is found by a ``bits``-step binary search over the sorted midpoints (the count
of midpoints strictly below v, as ``torch.bucketize``). The quantize kernel writes the codes
densely packed and the decode kernel reads them so (``store_packed`` / ``load_packed``): no
host-side packing. One decode kernel serves ``dequantize`` (one row), ``dequantize_sum`` (the
peers' rows summed) and ``dequantize_rows`` (rows decoded side by side into a caller's
output), on rows that may be a wire's strided columns. Tiles, launches and the bf16 store:
``triton_tiles.py``. Divisions are IEEE (``div_rn``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .learned_levels import midpoints
from . import triton_tiles as _tiles
from .triton_tiles import (decode_rows, load_packed, load_rows, load_values, quantize_buckets,
                           store_out, store_packed, store_rows, unit_codes, unit_tile)

#: values per program on a GPU: 16 per thread (fewer index computations per value than the
#: shared tile's 8; <= 128 registers, no spill: tests/test_gpu_registers.py)
GPU_TILE = 2 * _tiles.GPU_TILE


@triton.jit
def _quantize_kernel(x_ptr, mid_ptr, code_ptr, lo_ptr, rng_ptr, n_buckets, bucket_size, numel,
                     BITS: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr,
                     CPU: tl.constexpr):
    """The last bucket, if partial, padded with x's last value (``numel - 1``)."""
    rows, row_ok, umask, mask, offs = unit_tile(n_buckets, bucket_size, GROUPS, BLOCK, CPU)
    x = load_values(x_ptr, offs, mask & (offs < numel))
    x = tl.where(offs < numel, x, tl.load(x_ptr + numel - 1).to(tl.float32))
    lo = tl.min(tl.min(tl.where(mask, x, float("inf")), axis=2), axis=1)
    hi = tl.max(tl.max(tl.where(mask, x, -float("inf")), axis=2), axis=1)
    rng = hi - lo
    nonfinite = ((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32)
    bad = (tl.max(tl.max(nonfinite, axis=2), axis=1) > 0) | (rng != rng) | (rng == float("inf"))
    lo = tl.where(bad, float("nan"), lo)
    rng = tl.where(bad, float("nan"), rng)
    pos = rng > 0.0
    v = tl.math.div_rn(x - lo[:, None, None], tl.where(pos, rng, 1.0)[:, None, None])
    v = tl.where(pos[:, None, None], v, 0.0)
    code = tl.zeros([GROUPS, BLOCK // CPU, CPU], tl.int32)
    for i in tl.static_range(BITS):
        cand = code + (1 << (BITS - 1 - i))
        mid = tl.load(mid_ptr + cand - 1, mask=mask, other=0.0)
        code = tl.where(mid < v, cand, code)
    code = tl.where(bad[:, None, None], 0, code)
    store_packed(code_ptr, code, rows, umask, bucket_size, BITS)
    store_rows(lo_ptr, rows, row_ok, lo)
    store_rows(rng_ptr, rows, row_ok, rng)


@triton.jit
def _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, umask, mask, bucket_size,
            BITS: tl.constexpr, U: tl.constexpr, CPU: tl.constexpr):
    """lo + levels[code] * rng of one row's tile."""
    code = load_packed(code_ptr, rows, umask, bucket_size, BITS, U, CPU)
    level = tl.load(lv_ptr + code, mask=mask, other=0.0)
    lo = load_rows(lo_ptr, rows, row_ok)
    rng = load_rows(rng_ptr, rows, row_ok)
    return lo[:, None, None] + level * rng[:, None, None]


@triton.jit
def _dequantize_kernel(code_ptr, lo_ptr, rng_ptr, lv_ptr, out_ptr, n_buckets, bucket_size,
                       n_peers, numel, code_stride, lo_stride, rng_stride, lv_stride,
                       out_stride, BITS: tl.constexpr, GROUPS: tl.constexpr,
                       BLOCK: tl.constexpr, CPU: tl.constexpr, OUT_BF16: tl.constexpr):
    """Row ``program_id(1)`` (its own codes, lo, rng and levels) into out's row of as many,
    plus the ``n_peers - 1`` rows after it, in order (a peer sum); the first ``numel`` values
    of each row are stored."""
    r = tl.program_id(1).to(tl.int64)
    code_ptr += r * code_stride
    lo_ptr += r * lo_stride
    rng_ptr += r * rng_stride
    lv_ptr += r * lv_stride
    rows, row_ok, umask, mask, offs = unit_tile(n_buckets, bucket_size, GROUPS, BLOCK, CPU)
    U: tl.constexpr = BLOCK // CPU
    total = _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, umask, mask, bucket_size,
                    BITS, U, CPU)
    for _ in range(1, n_peers):
        code_ptr += code_stride
        lo_ptr += lo_stride
        rng_ptr += rng_stride
        lv_ptr += lv_stride
        total = total + _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, umask, mask,
                                bucket_size, BITS, U, CPU)
    store_out(out_ptr + r * out_stride, offs, total, mask & (offs < numel), OUT_BF16)


def quantize(x: torch.Tensor, levels: torch.Tensor, bits: int, bucket_size: int,
             mids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, sorted levels (2**bits,) -> (packed uint8 codes, float32 lo, float32 rng);
    a partial last bucket is padded with x's last value. ``mids``: ``midpoints(levels)`` if
    the caller has them (no op to find them)."""
    mids = midpoints(levels).to(x.device) if mids is None else mids
    return quantize_buckets(_quantize_kernel, x, mids, 2, bits, bucket_size, None,
                            GPU_TILE, numel=x.numel(), BITS=bits, CPU=unit_codes(bits))


def _decode_rows(packed, lo, rng, levels, bits, bucket_size, out, peers) -> torch.Tensor:
    return decode_rows(_dequantize_kernel, packed, (lo, rng, levels.float()), bucket_size, out,
                       peers, GPU_TILE, BITS=bits, CPU=unit_codes(bits))


def dequantize(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
               bits: int, bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``lo.numel() * bucket_size`` values."""
    out = torch.empty(1, lo.numel() * bucket_size, dtype=dtype, device=packed.device)
    return _decode_rows(packed.reshape(1, -1), lo.reshape(1, -1), rng.reshape(1, -1),
                        levels.reshape(1, -1), bits, bucket_size, out, False)[0]


def dequantize_sum(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
                   bits: int, bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), lo and rng (P, buckets), levels (P, 2**bits) ->
    float32 (numel,). Rows may be strided (a wire's columns)."""
    out = torch.empty(1, lo.shape[1] * bucket_size, dtype=torch.float32, device=packed.device)
    return _decode_rows(packed, lo, rng, levels, bits, bucket_size, out, True)[0]


def dequantize_rows(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor,
                    levels: torch.Tensor, bits: int, bucket_size: int,
                    out: torch.Tensor) -> None:
    """Row r of packed (R, nbytes), lo and rng (R, buckets), levels (R, 2**bits) decoded into
    ``out[r]`` (out (R, numel), its dtype; the first numel values of the row). Rows may be
    strided (a wire's columns)."""
    _decode_rows(packed, lo, rng, levels, bits, bucket_size, out, False)
