"""Quantization by random shift (QSDP 4.1, Definition 1), Triton version of ``random_shift.py``
(same functions, same numbers bit for bit given the same per-bucket noise).

Tiling, IEEE division, no FMA contraction and bf16 stores as in ``triton_qsgd.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .packing import pack_codes, unpack_codes
from .triton_qsgd import _nonfinite_rows, _store_out, _tile, out_view, tiles


@triton.jit
def _quantize_kernel(x_ptr, u_ptr, code_ptr, base_ptr, step_ptr, n_buckets, bucket_size,
                     KMAX: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    rows, row_ok, mask, offs = _tile(n_buckets, bucket_size, GROUPS, BLOCK)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    lo = tl.min(tl.where(mask, x, float("inf")), axis=1)
    hi = tl.max(tl.where(mask, x, -float("inf")), axis=1)
    step = tl.math.div_rn(hi - lo, tl.full([GROUPS], KMAX - 1, tl.float32))
    bad = _nonfinite_rows(x) | (step != step) | (step == float("inf"))
    u = tl.load(u_ptr + rows, mask=row_ok, other=0.5)
    step = tl.where(bad, float("nan"), step)
    base = tl.where(bad, float("nan"), lo + (u - 0.5) * step)
    pos = step > 0.0
    t = tl.math.div_rn(x - base[:, None], tl.where(pos, step, 1.0)[:, None])
    t = tl.where(pos[:, None], t, 0.0)
    k = tl.floor(t + 0.5)
    k = tl.minimum(tl.maximum(k, 0.0), KMAX)
    tl.store(code_ptr + offs, k.to(tl.uint8), mask=mask)
    tl.store(base_ptr + rows, base, mask=row_ok)
    tl.store(step_ptr + rows, step, mask=row_ok)


@triton.jit
def _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG):
    """base + k * step of one peer's tile, clipped to +-BIG (NaN stays NaN)."""
    base = tl.load(base_ptr + rows, mask=row_ok, other=0.0)
    step = tl.load(step_ptr + rows, mask=row_ok, other=0.0)
    k = tl.load(code_ptr + offs, mask=mask, other=0).to(tl.float32)
    y = base[:, None] + k * step[:, None]
    return tl.where(y > BIG, BIG, tl.where(y < -BIG, -BIG, y))


@triton.jit
def _dequantize_kernel(code_ptr, base_ptr, step_ptr, out_ptr, n_buckets, bucket_size, n_peers,
                       numel, BIG, GROUPS: tl.constexpr, BLOCK: tl.constexpr,
                       OUT_BF16: tl.constexpr):
    """out = sum over peers p (in order) of their decoded tiles; one peer = dequantize."""
    rows, row_ok, mask, offs = _tile(n_buckets, bucket_size, GROUPS, BLOCK)
    total = _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG)
    for _ in range(1, n_peers):
        code_ptr += numel
        base_ptr += n_buckets
        step_ptr += n_buckets
        total = total + _decode(code_ptr, base_ptr, step_ptr, rows, row_ok, mask, offs, BIG)
    _store_out(out_ptr, offs, total, mask, OUT_BF16)


def quantize(x: torch.Tensor, bits: int, bucket_size: int,
             noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, noise (buckets,) -> (packed uint8 codes, float32 base, float32 step), per bucket."""
    n = x.numel()
    nb = n // bucket_size
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    base = torch.empty(nb, dtype=torch.float32, device=x.device)
    step = torch.empty(nb, dtype=torch.float32, device=x.device)
    if nb:
        block, groups = tiles(bucket_size)
        _quantize_kernel[(triton.cdiv(nb, groups),)](
            x.contiguous(), noise.contiguous(), codes, base, step, nb, bucket_size,
            KMAX=(1 << bits) - 1, GROUPS=groups, BLOCK=block, enable_fp_fusion=False)
    return pack_codes(codes, bits), base, step


def _dequantize_peers(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                      bucket_size: int, dtype: torch.dtype) -> torch.Tensor:
    n_peers, nb = base.shape
    n = nb * bucket_size
    codes = unpack_codes(packed.reshape(-1), bits).contiguous()
    out = torch.empty(n, dtype=dtype, device=packed.device)
    if nb:
        block, groups = tiles(bucket_size)
        _dequantize_kernel[(triton.cdiv(nb, groups),)](
            codes, base.contiguous(), step.contiguous(), out_view(out), nb, bucket_size, n_peers,
            n, torch.finfo(dtype).max, GROUPS=groups, BLOCK=block,
            OUT_BF16=dtype == torch.bfloat16, enable_fp_fusion=False)
    return out


def dequantize(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
               bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``base.numel() * bucket_size`` values."""
    return _dequantize_peers(packed[None], base[None], step[None], bits, bucket_size, dtype)


def dequantize_sum(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                   bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), base and step (P, buckets) -> float32 (numel,)."""
    return _dequantize_peers(packed, base, step, bits, bucket_size, torch.float32)
