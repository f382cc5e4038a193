"""Bucket tiles shared by the Triton kernels of QSDP's bucketed quantizers (QSDP 5.1):
``triton_qsgd``, ``triton_random_shift`` and ``triton_learned_levels``.

Each program handles ``GROUPS`` buckets as a (GROUPS, BLOCK) tile, BLOCK the bucket size
rounded up to a power of two (masked). Kernels read and write one uint8 code per value (the
host packs and unpacks them) and launch with ``enable_fp_fusion=False``, so no multiply-add is
contracted into an FMA the torch twins do not do. Imported only by Triton modules.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from .packing import pack_codes, unpack_codes

#: values per program: few large programs under TRITON_INTERPRET (its cost is per program);
#: on a GPU ``GPU_TILE`` over ``NUM_WARPS`` warps, 8 values per thread (<= 128 registers and
#: no spill on sm_90: tests/test_gpu_registers.py)
TILE, GPU_TILE, NUM_WARPS = 8192, 2048, 8


def per_program(t: torch.Tensor, interpreted: int, gpu: int) -> int:
    """Values per program of a kernel on ``t``'s device: ``gpu`` on a GPU, else
    ``interpreted`` (TRITON_INTERPRET runs CPU tensors)."""
    return gpu if t.is_cuda else interpreted


def tile_shape(bucket_size: int, tile: int = TILE) -> tuple[int, int]:
    """(BLOCK, GROUPS): the padded bucket width and buckets per program of ``tile`` values."""
    block = triton.next_power_of_2(bucket_size)
    return block, max(1, tile // block)


@triton.jit
def tile(n_buckets, bucket_size, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's bucket ids, their mask, the value mask and the value offsets."""
    rows = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    cols = tl.arange(0, BLOCK)
    row_ok = rows < n_buckets
    mask = row_ok[:, None] & (cols < bucket_size)[None, :]
    offs = rows.to(tl.int64)[:, None] * bucket_size + cols[None, :]
    return rows, row_ok, mask, offs


@triton.jit
def load_values(x_ptr, offs, mask):
    """The tile's input values as float32 (0 where masked)."""
    return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def row_min_max(x, mask):
    """Per row: the min and max of the unmasked values (QSDP 5.1 min-max buckets)."""
    lo = tl.min(tl.where(mask, x, float("inf")), axis=1)
    hi = tl.max(tl.where(mask, x, -float("inf")), axis=1)
    return lo, hi


@triton.jit
def scaled(x, base, step):
    """Per row ``(x - base) / step`` (IEEE division), 0 in rows whose step is not > 0."""
    pos = step > 0.0
    t = tl.math.div_rn(x - base[:, None], tl.where(pos, step, 1.0)[:, None])
    return tl.where(pos[:, None], t, 0.0)


@triton.jit
def nonfinite_rows(x):
    """Per row: does it hold a NaN or an Inf (explicit; tl.max may drop NaN on GPU)."""
    return tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=1) > 0


@triton.jit
def load_rows(ptr, rows, row_ok):
    """One float32 per bucket of the tile (0 past the last bucket)."""
    return tl.load(ptr + rows, mask=row_ok, other=0.0)


@triton.jit
def store_rows(ptr, rows, row_ok, v):
    """Store one float32 per bucket of the tile."""
    tl.store(ptr + rows, v, mask=row_ok)


@triton.jit
def affine_rows(v, base_ptr, step_ptr, rows, row_ok):
    """``base + v * step`` with one (base, step) per bucket: the min-max buckets' decode."""
    base = load_rows(base_ptr, rows, row_ok)
    step = load_rows(step_ptr, rows, row_ok)
    return base[:, None] + v * step[:, None]


@triton.jit
def load_codes(code_ptr, offs, mask):
    """The tile's codes, one per value as stored (0 where masked)."""
    return tl.load(code_ptr + offs, mask=mask, other=0)


@triton.jit
def store_codes(code_ptr, offs, mask, code):
    """Store the tile's codes as uint8, one per value."""
    tl.store(code_ptr + offs, code.to(tl.uint8), mask=mask)


@triton.jit
def store_out(out_ptr, offs, y, mask, OUT_BF16: tl.constexpr):
    """Store float32 y in out's dtype; bf16 is rounded to nearest even by hand (bits into a
    uint16 view, see :func:`_out_view`), as torch does and as the interpreter's own bf16 cast
    does not."""
    if OUT_BF16:
        b = y.to(tl.uint32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)
        tl.store(out_ptr + offs, r.to(tl.uint16), mask=mask)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _out_view(out: torch.Tensor) -> torch.Tensor:
    """The tensor :func:`store_out` writes to (bf16 as its uint16 bits)."""
    return out.view(torch.uint16) if out.dtype == torch.bfloat16 else out


def quantize_buckets(kernel, x: torch.Tensor, aux: torch.Tensor, n_params: int, bits: int,
                     bucket_size: int, pack: Callable = pack_codes,
                     **consts) -> tuple[torch.Tensor, ...]:
    """Run ``kernel(x, aux, codes, *params, n_buckets, bucket_size, **consts, GROUPS, BLOCK)``
    on 1-D x: -> (packed uint8 codes, then ``n_params`` float32 tensors of one value per
    bucket)."""
    n = x.numel()
    nb = n // bucket_size
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    params = [torch.empty(nb, dtype=torch.float32, device=x.device) for _ in range(n_params)]
    if nb:
        block, groups = tile_shape(bucket_size, per_program(x, TILE, GPU_TILE))
        kernel[(triton.cdiv(nb, groups),)](
            x.contiguous(), aux.contiguous(), codes, *params, nb, bucket_size, **consts,
            GROUPS=groups, BLOCK=block, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return (pack(codes, bits), *params)


def dequantize_peers(kernel, packed: torch.Tensor, operands: tuple[torch.Tensor, ...],
                     bits: int, bucket_size: int, dtype: torch.dtype,
                     unpack: Callable = unpack_codes, **consts) -> torch.Tensor:
    """Run ``kernel(codes, *operands, out, n_buckets, bucket_size, n_peers, numel, **consts,
    GROUPS, BLOCK, OUT_BF16)``: packed (P, nbytes) and operands whose first is (P, buckets)
    -> the 1-D ``dtype`` sum over the P peers."""
    n_peers, nb = operands[0].shape
    n = nb * bucket_size
    codes = unpack(packed.reshape(-1), bits).contiguous()
    out = torch.empty(n, dtype=dtype, device=packed.device)
    if nb:
        block, groups = tile_shape(bucket_size, per_program(codes, TILE, GPU_TILE))
        kernel[(triton.cdiv(nb, groups),)](
            codes, *(t.contiguous() for t in operands), _out_view(out), nb, bucket_size,
            n_peers, n, **consts, GROUPS=groups, BLOCK=block,
            OUT_BF16=dtype == torch.bfloat16, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out
