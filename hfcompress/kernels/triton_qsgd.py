"""QSGD bucketed stochastic quantization (QSDP 3.2), Triton version of ``qsgd.py`` (same
functions, same numbers bit for bit given the same noise).

Each program handles ``GROUPS`` buckets as a (GROUPS, BLOCK) tile, BLOCK the bucket size rounded
up to a power of two (masked). Divisions are IEEE (``div_rn``) and kernels launch with
``enable_fp_fusion=False`` so no multiply-add is contracted into an FMA the twin does not do.
The kernels read and write one uint8 code per value; ``packing.py`` packs them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .packing import pack_codes, unpack_codes

#: values per program (few large programs: cheap under TRITON_INTERPRET, fine on GPU)
TILE = 8192


def tiles(bucket_size: int) -> tuple[int, int]:
    """(BLOCK, GROUPS): the padded bucket width and buckets per program."""
    block = triton.next_power_of_2(bucket_size)
    return block, max(1, TILE // block)


@triton.jit
def _tile(n_buckets, bucket_size, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    cols = tl.arange(0, BLOCK)
    row_ok = rows < n_buckets
    mask = row_ok[:, None] & (cols < bucket_size)[None, :]
    offs = rows.to(tl.int64)[:, None] * bucket_size + cols[None, :]
    return rows, row_ok, mask, offs


@triton.jit
def _nonfinite_rows(x):
    """Per row: does it hold a NaN or an Inf (explicit; tl.max may drop NaN on GPU)."""
    return tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=1) > 0


@triton.jit
def _store_out(out_ptr, offs, y, mask, OUT_BF16: tl.constexpr):
    """Store float32 y in out's dtype; bf16 is rounded to nearest even by hand (bits into a
    uint16 view), as torch does and as the interpreter's own bf16 cast does not."""
    if OUT_BF16:
        b = y.to(tl.uint32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)
        tl.store(out_ptr + offs, r.to(tl.uint16), mask=mask)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def out_view(out: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel's ``_store_out`` writes to (bf16 as its uint16 bits)."""
    return out.view(torch.uint16) if out.dtype == torch.bfloat16 else out


@triton.jit
def _quantize_kernel(x_ptr, u_ptr, code_ptr, scale_ptr, n_buckets, bucket_size,
                     S: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    rows, row_ok, mask, offs = _tile(n_buckets, bucket_size, GROUPS, BLOCK)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    ax = tl.abs(x)
    bad = _nonfinite_rows(x)
    norm = tl.max(ax, axis=1)
    s = tl.full([GROUPS], S, tl.float32)
    scale = tl.where(bad, float("nan"), tl.math.div_rn(norm, s))
    inv = tl.where(bad | (norm == 0.0), 0.0, tl.math.div_rn(s, tl.where(norm == 0.0, 1.0, norm)))
    u = tl.load(u_ptr + offs, mask=mask, other=0.0)
    level = tl.floor(ax * inv[:, None] + u)
    level = tl.where(level != level, 0.0, level)
    level = tl.minimum(tl.maximum(level, 0.0), S)
    q = tl.where(x < 0.0, -level, level)
    tl.store(code_ptr + offs, (q + (S + 1)).to(tl.uint8), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=row_ok)


@triton.jit
def _dequantize_kernel(code_ptr, scale_ptr, out_ptr, n_buckets, bucket_size, n_peers, numel,
                       S: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr,
                       OUT_BF16: tl.constexpr):
    """out = sum over peers p (in order) of (code_p - (S+1)) * scale_p; one peer = dequantize."""
    rows, row_ok, mask, offs = _tile(n_buckets, bucket_size, GROUPS, BLOCK)
    scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    c = tl.load(code_ptr + offs, mask=mask, other=0).to(tl.float32)
    total = (c - (S + 1)) * scale[:, None]
    for _ in range(1, n_peers):
        scale_ptr += n_buckets
        code_ptr += numel
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
        c = tl.load(code_ptr + offs, mask=mask, other=0).to(tl.float32)
        total = total + (c - (S + 1)) * scale[:, None]
    _store_out(out_ptr, offs, total, mask, OUT_BF16)


def quantize(x: torch.Tensor, bits: int, bucket_size: int,
             noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D x -> (packed uint8 codes, float32 scales ``norm / s`` of shape (buckets,))."""
    n = x.numel()
    nb = n // bucket_size
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    scale = torch.empty(nb, dtype=torch.float32, device=x.device)
    if nb:
        block, groups = tiles(bucket_size)
        _quantize_kernel[(triton.cdiv(nb, groups),)](
            x.contiguous(), noise.contiguous(), codes, scale, nb, bucket_size,
            S=(1 << (bits - 1)) - 1, GROUPS=groups, BLOCK=block, enable_fp_fusion=False)
    return pack_codes(codes, bits), scale


def _dequantize_peers(packed: torch.Tensor, scale: torch.Tensor, bits: int, bucket_size: int,
                      dtype: torch.dtype) -> torch.Tensor:
    """packed (P, nbytes), scale (P, buckets) -> sum over peers, 1-D ``dtype``."""
    n_peers, nb = scale.shape
    n = nb * bucket_size
    codes = unpack_codes(packed.reshape(-1), bits).contiguous()
    out = torch.empty(n, dtype=dtype, device=packed.device)
    if nb:
        block, groups = tiles(bucket_size)
        _dequantize_kernel[(triton.cdiv(nb, groups),)](
            codes, scale.contiguous(), out_view(out), nb, bucket_size, n_peers, n,
            S=(1 << (bits - 1)) - 1, GROUPS=groups, BLOCK=block,
            OUT_BF16=dtype == torch.bfloat16, enable_fp_fusion=False)
    return out


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, bucket_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``scale.numel() * bucket_size`` values."""
    return _dequantize_peers(packed[None], scale[None], bits, bucket_size, dtype)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                   bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), scale (P, buckets) -> float32 (numel,)."""
    return _dequantize_peers(packed, scale, bits, bucket_size, torch.float32)
