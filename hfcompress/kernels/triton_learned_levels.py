"""Codebook quantization with learned levels (QSDP 5.2, Alg. 2), Triton version of
``learned_levels.py`` (same functions, same numbers bit for bit).

The nearest level is found by a ``bits``-step binary search over the sorted midpoints (the count
of midpoints strictly below v, as ``torch.bucketize``). Tiling, IEEE division, no FMA contraction
and bf16 stores as in ``triton_qsgd.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .learned_levels import midpoints, pack_codes, unpack_codes
from .triton_qsgd import _nonfinite_rows, _store_out, _tile, out_view, tiles


@triton.jit
def _quantize_kernel(x_ptr, mid_ptr, code_ptr, lo_ptr, rng_ptr, n_buckets, bucket_size,
                     BITS: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    rows, row_ok, mask, offs = _tile(n_buckets, bucket_size, GROUPS, BLOCK)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    lo = tl.min(tl.where(mask, x, float("inf")), axis=1)
    rng = tl.max(tl.where(mask, x, -float("inf")), axis=1) - lo
    bad = _nonfinite_rows(x) | (rng != rng) | (rng == float("inf"))
    lo = tl.where(bad, float("nan"), lo)
    rng = tl.where(bad, float("nan"), rng)
    pos = rng > 0.0
    v = tl.math.div_rn(x - lo[:, None], tl.where(pos, rng, 1.0)[:, None])
    v = tl.where(pos[:, None], v, 0.0)
    code = tl.zeros([GROUPS, BLOCK], tl.int32)
    for i in tl.static_range(BITS):
        cand = code + (1 << (BITS - 1 - i))
        mid = tl.load(mid_ptr + cand - 1, mask=mask, other=0.0)
        code = tl.where(mid < v, cand, code)
    code = tl.where(bad[:, None], 0, code)
    tl.store(code_ptr + offs, code.to(tl.uint8), mask=mask)
    tl.store(lo_ptr + rows, lo, mask=row_ok)
    tl.store(rng_ptr + rows, rng, mask=row_ok)


@triton.jit
def _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, mask, offs):
    """lo + levels[code] * rng of one peer's tile."""
    lo = tl.load(lo_ptr + rows, mask=row_ok, other=0.0)
    rng = tl.load(rng_ptr + rows, mask=row_ok, other=0.0)
    code = tl.load(code_ptr + offs, mask=mask, other=0).to(tl.int32)
    level = tl.load(lv_ptr + code, mask=mask, other=0.0)
    return lo[:, None] + level * rng[:, None]


@triton.jit
def _dequantize_kernel(code_ptr, lo_ptr, rng_ptr, lv_ptr, out_ptr, n_buckets, bucket_size,
                       n_peers, numel, LEVELS: tl.constexpr, GROUPS: tl.constexpr,
                       BLOCK: tl.constexpr, OUT_BF16: tl.constexpr):
    """out = sum over peers p (in order) of their decoded tiles; one peer = dequantize."""
    rows, row_ok, mask, offs = _tile(n_buckets, bucket_size, GROUPS, BLOCK)
    total = _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, mask, offs)
    for _ in range(1, n_peers):
        code_ptr += numel
        lo_ptr += n_buckets
        rng_ptr += n_buckets
        lv_ptr += LEVELS
        total = total + _decode(code_ptr, lo_ptr, rng_ptr, lv_ptr, rows, row_ok, mask, offs)
    _store_out(out_ptr, offs, total, mask, OUT_BF16)


def quantize(x: torch.Tensor, levels: torch.Tensor, bits: int,
             bucket_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, sorted levels (2**bits,) -> (packed uint8 codes, float32 lo, float32 rng)."""
    n = x.numel()
    nb = n // bucket_size
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    lo = torch.empty(nb, dtype=torch.float32, device=x.device)
    rng = torch.empty(nb, dtype=torch.float32, device=x.device)
    if nb:
        block, groups = tiles(bucket_size)
        _quantize_kernel[(triton.cdiv(nb, groups),)](
            x.contiguous(), midpoints(levels).to(x.device), codes, lo, rng, nb, bucket_size,
            BITS=bits, GROUPS=groups, BLOCK=block, enable_fp_fusion=False)
    return pack_codes(codes, bits), lo, rng


def _dequantize_peers(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor,
                      levels: torch.Tensor, bits: int, bucket_size: int,
                      dtype: torch.dtype) -> torch.Tensor:
    n_peers, nb = lo.shape
    n = nb * bucket_size
    codes = unpack_codes(packed.reshape(-1), bits).contiguous()
    out = torch.empty(n, dtype=dtype, device=packed.device)
    if nb:
        block, groups = tiles(bucket_size)
        _dequantize_kernel[(triton.cdiv(nb, groups),)](
            codes, lo.contiguous(), rng.contiguous(), levels.float().contiguous(), out_view(out),
            nb, bucket_size, n_peers, n, LEVELS=1 << bits, GROUPS=groups, BLOCK=block,
            OUT_BF16=dtype == torch.bfloat16, enable_fp_fusion=False)
    return out


def dequantize(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
               bits: int, bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``lo.numel() * bucket_size`` values."""
    return _dequantize_peers(packed[None], lo[None], rng[None], levels[None], bits, bucket_size,
                             dtype)


def dequantize_sum(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
                   bits: int, bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), lo and rng (P, buckets), levels (P, 2**bits) ->
    float32 (numel,)."""
    return _dequantize_peers(packed, lo, rng, levels, bits, bucket_size, torch.float32)
