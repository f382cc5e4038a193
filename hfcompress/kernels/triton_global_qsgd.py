"""Global-QSGD quantizers and the exponent reduce (Alg. 2) in Triton.

Same functions, signatures and bits as the torch twin ``global_qsgd.py`` (see its docstring
for the math and the code layout). One program handles ``BLOCK`` output elements (bytes for
the exponential codes, two codes per byte at 4 bits); offsets are int64. Value i reads its
scale at ``i // per``: ``per`` is the scale's block size, or the value count when one scale
covers the tensor (``block_size=None``). Noise given as keys is hashed in the kernel
(``triton_noise.noise_at``, value i gets the noise of flat index i). Every launch is compiled
with ``enable_fp_fusion=False``: no multiply-add contracted into an FMA the twin does not do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .global_qsgd import linear_step, scale_inverse
from .triton_noise import noise_at, noise_operand
from .triton_tiles import per_program

#: output elements per program: few large programs under TRITON_INTERPRET (its cost is per
#: program); on a GPU ``GPU_BLOCK`` over ``NUM_WARPS`` warps, 4 per thread (<= 128 registers
#: and no spill on sm_90: tests/test_gpu_registers.py)
BLOCK, GPU_BLOCK, NUM_WARPS = 2048, 1024, 8


def _launch(kernel, n: int, t: torch.Tensor, *args, **consts) -> None:
    """Run ``kernel(*args, **consts, BLOCK)`` over ``n`` output elements on ``t``'s device."""
    block = per_program(t, BLOCK, GPU_BLOCK)
    kernel[(triton.cdiv(n, block),)](*args, **consts, BLOCK=block, num_warps=NUM_WARPS,
                                     enable_fp_fusion=False)


def _per(block_size: int | None, numel: int) -> int:
    """Values per scale: ``block_size``, or all of them (one scale)."""
    return max(numel, 1) if block_size is None else block_size


@triton.jit
def _cast_out(v, out_ptr):
    """float32 -> the output dtype, rounding to nearest even (done by hand for bf16: the
    interpreter truncates fp32 -> bf16 casts, GPUs round)."""
    ty = out_ptr.dtype.element_ty
    if ty == tl.bfloat16:
        b = v.to(tl.int32, bitcast=True)
        r = tl.where(v != v, 0x7FC00000, b + 0x7FFF + ((b >> 16) & 1))
        return (r >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return v.to(ty)


@triton.jit
def _unit(x, inv):
    """``min(|x| * inv, 1)`` in float32, NaN -> 0."""
    t = tl.abs(x.to(tl.float32)) * inv
    t = tl.where(t != t, 0.0, t)
    return tl.where(t > 1.0, 1.0, t)


# -- linear dithering -------------------------------------------------------------------
@triton.jit
def _linear_quantize_kernel(x_ptr, inv_ptr, noise_ptr, noise_row, out_ptr, n, per, levels,
                            HASH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = noise_at(noise_ptr, offs, mask, HASH, noise_row)
    y = x * tl.load(inv_ptr + offs // per, mask=mask, other=0.0)
    y = tl.where(y != y, 0.0, y)
    y = tl.minimum(tl.maximum(y, -1.0), 1.0) * levels
    fl = tl.floor(y)
    q = fl + (u < y - fl).to(tl.float32)
    tl.store(out_ptr + offs, q.to(tl.int32).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _linear_dequantize_kernel(codes_ptr, step_ptr, out_ptr, n, per, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    q = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.float32)
    step = tl.load(step_ptr + offs // per, mask=mask, other=0.0)
    tl.store(out_ptr + offs, _cast_out(q * step, out_ptr), mask=mask)


def linear_quantize(x: torch.Tensor, scale: torch.Tensor, levels: int, noise: torch.Tensor,
                    wire_dtype: torch.dtype, block_size: int | None = None) -> torch.Tensor:
    x = x.contiguous()
    n = x.numel()
    out = torch.empty(n, dtype=wire_dtype, device=x.device)
    if n:
        u, hashed, row = noise_operand(noise, n, x)
        _launch(_linear_quantize_kernel, n, x, x, scale_inverse(scale), u, row, out, n,
                _per(block_size, n), float(levels), HASH=hashed)
    return out


def linear_dequantize(codes: torch.Tensor, scale: torch.Tensor, levels: int,
                      dtype: torch.dtype = torch.float32,
                      block_size: int | None = None) -> torch.Tensor:
    codes = codes.contiguous()
    n = codes.numel()
    out = torch.empty(n, dtype=dtype, device=codes.device)
    if n:
        _launch(_linear_dequantize_kernel, n, codes, codes, linear_step(scale, levels), out, n,
                _per(block_size, n))
    return out


# -- exponential dithering --------------------------------------------------------------
@triton.jit
def _exp_code(x, u, inv, levels, headroom, sub_mult, BITS: tl.constexpr):
    """One value -> its int32 (sign, e) code."""
    t = _unit(x, inv)
    tb = t.to(tl.int32, bitcast=True)
    jl = 127 - (tb >> 23)
    frac = (tb & 0x7FFFFF).to(tl.float32) * (1.0 / 8388608.0)
    e_level = jl - (u < frac).to(tl.int32) + 1 + headroom
    e_sub = tl.where(u < t * sub_mult, levels + headroom, 0)
    e = tl.where(jl <= levels - 1, e_level, e_sub)
    neg = ((x < 0) & (e > 0)).to(tl.int32)
    return e | (neg << (BITS - 1))


@triton.jit
def _exp_quantize_kernel(x_ptr, inv_ptr, noise_ptr, noise_row, out_ptr, nbytes, per, levels, headroom,
                         sub_mult, HASH: tl.constexpr, BITS: tl.constexpr,
                         BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < nbytes
    if BITS == 8:
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = noise_at(noise_ptr, offs, mask, HASH, noise_row)
        inv = tl.load(inv_ptr + offs // per, mask=mask, other=0.0)
        code = _exp_code(x, u, inv, levels, headroom, sub_mult, BITS)
    else:
        x0 = tl.load(x_ptr + 2 * offs, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(x_ptr + 2 * offs + 1, mask=mask, other=0.0).to(tl.float32)
        u0 = noise_at(noise_ptr, 2 * offs, mask, HASH, noise_row)
        u1 = noise_at(noise_ptr, 2 * offs + 1, mask, HASH, noise_row)
        inv0 = tl.load(inv_ptr + (2 * offs) // per, mask=mask, other=0.0)
        inv1 = tl.load(inv_ptr + (2 * offs + 1) // per, mask=mask, other=0.0)
        code = _exp_code(x0, u0, inv0, levels, headroom, sub_mult, BITS) \
            | (_exp_code(x1, u1, inv1, levels, headroom, sub_mult, BITS) << 4)
    tl.store(out_ptr + offs, code.to(tl.uint8), mask=mask)


@triton.jit
def _exp_value(c, scale, headroom, BITS: tl.constexpr):
    e = c & ((1 << (BITS - 1)) - 1)
    pow2 = ((128 + headroom - e) << 23).to(tl.float32, bitcast=True)
    mag = tl.where(e > 0, pow2, 0.0) * scale
    return tl.where((c >> (BITS - 1)) == 1, -mag, mag)


@triton.jit
def _exp_dequantize_kernel(codes_ptr, scale_ptr, out_ptr, nbytes, per, headroom,
                           BITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < nbytes
    c = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    if BITS == 8:
        scale = tl.load(scale_ptr + offs // per, mask=mask, other=0.0)
        tl.store(out_ptr + offs, _cast_out(_exp_value(c, scale, headroom, BITS), out_ptr),
                 mask=mask)
    else:
        s0 = tl.load(scale_ptr + (2 * offs) // per, mask=mask, other=0.0)
        s1 = tl.load(scale_ptr + (2 * offs + 1) // per, mask=mask, other=0.0)
        tl.store(out_ptr + 2 * offs, _cast_out(_exp_value(c & 0xF, s0, headroom, BITS), out_ptr),
                 mask=mask)
        tl.store(out_ptr + 2 * offs + 1,
                 _cast_out(_exp_value(c >> 4, s1, headroom, BITS), out_ptr), mask=mask)


@triton.jit
def _exp_reduce(ca, cb, p, BITS: tl.constexpr):
    """Global-QSGD Alg. 2 on two int32 (sign, e) codes with noise p (see the twin)."""
    m: tl.constexpr = (1 << (BITS - 1)) - 1
    e1 = ca & m
    e2 = cb & m
    sign1 = 1 - 2 * (ca >> (BITS - 1))
    sign2 = 1 - 2 * (cb >> (BITS - 1))
    k = tl.minimum(127 - ((p.to(tl.int32, bitcast=True) >> 23) & 0xFF), m)
    gz1 = (e1 > 0).to(tl.int32)
    gz2 = (e2 > 0).to(tl.int32)
    sign12 = sign1 * sign2 * gz1 * gz2
    diff = tl.abs(e1 - e2) - (1 - sign12) // 2
    smaller = ((e1 <= e2).to(tl.int32) + (1 - gz2)) * gz1
    non_zero = 1 - ((e1 == e2) & (sign12 == -1)).to(tl.int32)
    sign_r = sign1 * smaller + sign2 * (1 - smaller)
    e_r = (e1 * smaller + e2 * (1 - smaller)) * non_zero \
        - sign12 * (k > diff).to(tl.int32) * non_zero
    return e_r | (((1 - sign_r) // 2) << (BITS - 1))


@triton.jit
def _exp_combine_kernel(a_ptr, b_ptr, noise_ptr, noise_row, out_ptr, nbytes, HASH: tl.constexpr,
                        BITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < nbytes
    ca = tl.load(a_ptr + offs, mask=mask, other=0).to(tl.int32)
    cb = tl.load(b_ptr + offs, mask=mask, other=0).to(tl.int32)
    if BITS == 8:
        p = noise_at(noise_ptr, offs, mask, HASH, noise_row)
        code = _exp_reduce(ca, cb, p, BITS)
    else:
        p0 = noise_at(noise_ptr, 2 * offs, mask, HASH, noise_row)
        p1 = noise_at(noise_ptr, 2 * offs + 1, mask, HASH, noise_row)
        code = _exp_reduce(ca & 0xF, cb & 0xF, p0, BITS) \
            | (_exp_reduce(ca >> 4, cb >> 4, p1, BITS) << 4)
    tl.store(out_ptr + offs, code.to(tl.uint8), mask=mask)


def exp_quantize(x: torch.Tensor, scale: torch.Tensor, levels: int, headroom: int, bits: int,
                 noise: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    nbytes = x.numel() * bits // 8
    out = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    if nbytes:
        u, hashed, row = noise_operand(noise, x.numel(), x)
        _launch(_exp_quantize_kernel, nbytes, x, x.contiguous(), scale_inverse(scale), u, row,
                out, nbytes, _per(block_size, x.numel()), levels, headroom,
                float(2.0 ** (levels - 1)), HASH=hashed, BITS=bits)
    return out


def exp_dequantize(codes: torch.Tensor, scale: torch.Tensor, headroom: int, bits: int,
                   dtype: torch.dtype = torch.float32,
                   block_size: int | None = None) -> torch.Tensor:
    codes = codes.contiguous()
    n = codes.numel() * 8 // bits
    out = torch.empty(n, dtype=dtype, device=codes.device)
    if codes.numel():
        _launch(_exp_dequantize_kernel, codes.numel(), codes, codes, scale.reshape(-1).float(),
                out, codes.numel(), _per(block_size, n), headroom, BITS=bits)
    return out


def exp_combine(a: torch.Tensor, b: torch.Tensor, bits: int, noise: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(a)
    if a.numel():
        u, hashed, row = noise_operand(noise, a.numel() * 8 // bits, a)
        _launch(_exp_combine_kernel, a.numel(), a, a.contiguous(), b.contiguous(), u, row, out,
                a.numel(), HASH=hashed, BITS=bits)
    return out
