"""Global-QSGD quantizers, the local scale and the exponent reduce (Alg. 2) in Triton.

Same functions, signatures and bits as the torch twin ``global_qsgd.py`` (see its docstring
for the math and the code layout). One program handles ``BLOCK`` output elements (bytes for
the exponential codes, two codes per byte at 4 bits); offsets are int64. The kernels read
the scale tensor itself: the inverse scale with its non-finite rule (``scale_inverse``) and
the linear step (``linear_step``) are computed in the kernel, once per program when one
scale covers the program (``SCALES`` 0: one scale for the tensor; 1: ``block_size`` a
multiple of the program's values, the scale index is the program's), else per value (value
i reads scale ``i // per``: 2, a 32-bit division past the program's first scale; 3, 64-bit).
``local_scale`` is one pass of max |x| over the float bits (no |x| tensor). Noise given as
keys is hashed in the kernel (``triton_noise.noise_at``, value i gets the noise of flat index
i; one key pair: ``_program_noise``). Every launch is compiled with
``enable_fp_fusion=False``: no multiply-add contracted into an FMA the twin does not do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_noise import MUL1, MUL2, ONE_KEY, _uniform, noise_at, noise_operand
from .triton_tiles import OLDER_TRITON, cdiv, per_program

#: output elements per program: few large programs under TRITON_INTERPRET (its cost is per
#: program); on a GPU over ``NUM_WARPS`` warps (<= 128 registers and no spill on sm_90:
#: tests/test_gpu_registers.py): the exponential kernels ``GPU_BLOCK`` (4 bytes per thread),
#: the linear ones ``GPU_LINEAR_BLOCK`` (32 values per thread; down to 4 for a block scale
#: per program) with one scalar scale per program (and one key pair for the quantize), else
#: ``GPU_LINEAR_SMALL`` (8 per thread)
BLOCK, NUM_WARPS = 2048, 8
GPU_BLOCK, GPU_LINEAR_BLOCK, GPU_LINEAR_SMALL = 1024, 8192, 2048
#: the widest tile of a linear quantize whose last program is ragged (masked): Triton < 3.9
#: gives the one-key quantize 145 registers there at 32 values per thread, 79 at 16 (43.9 SASS
#: per value either way, sm_90); whole programs, and Triton 3.9 (108), keep 32
GPU_LINEAR_RAGGED = GPU_LINEAR_BLOCK // 2 if OLDER_TRITON else GPU_LINEAR_BLOCK
#: ``local_scale``: values per program (powers of two): a block longer than ``GPU_TILE``
#: spans programs (32 values per thread on a GPU), shorter ones come ``GPU_BLOCKS_TILE`` values
#: of whole blocks per program (<= 128 registers unaligned: tests/test_gpu_registers.py)
TILE, GPU_TILE, GPU_BLOCKS_TILE = 4096, 8192, 2048
#: float32 +Inf as int32: the largest |x| bits that are not NaN
INF_BITS = tl.constexpr(0x7F800000)


def _launch(kernel, n: int, t: torch.Tensor, *args, **consts) -> None:
    """Run ``kernel(*args, **consts, BLOCK)`` over ``n`` output elements on ``t``'s device."""
    block = per_program(t, BLOCK, GPU_BLOCK)
    kernel[(cdiv(n, block),)](*args, **consts, BLOCK=block, num_warps=NUM_WARPS,
                              enable_fp_fusion=False)


def _scales(block_size: int | None, numel: int, values: int) -> tuple[int, int]:
    """(``SCALES``, ``per``) of a launch over ``numel`` values, ``values`` per program: one
    scale (0, 1); one per program (1, programs per scale); one per ``block_size`` values (2,
    or 3 for blocks too long for the 32-bit index within a program)."""
    if block_size is None or block_size >= numel:
        return 0, 1
    if block_size % values == 0:
        return 1, block_size // values
    return (2 if block_size + values < 1 << 31 else 3), block_size


def _linear_tiles(t: torch.Tensor, block_size: int | None, n: int, wide: bool,
                  ragged: int = GPU_LINEAR_BLOCK) -> tuple[int, int, int]:
    """(values per program, ``SCALES``, ``per``) of a linear kernel over ``n`` values on ``t``'s
    device: if ``wide``, the widest GPU tile (32 down to 4 values per thread) whose programs
    each have one scale, at most ``ragged`` values where ``n`` leaves a ragged last program;
    else, or if none does, ``GPU_LINEAR_SMALL``."""
    for gpu in (GPU_LINEAR_BLOCK >> k for k in range(4 if wide else 0)):
        block = per_program(t, BLOCK, gpu)
        mode, per = _scales(block_size, n, block)
        if mode < 2 and (gpu <= ragged or n % block == 0):
            return block, mode, per
    block = per_program(t, BLOCK, GPU_LINEAR_SMALL)
    return (block, *_scales(block_size, n, block))


@triton.jit
def _scale_of(scale_ptr, first, lanes, mask, per, SCALES: tl.constexpr):
    """The float32 scale of the values ``first + lanes`` (``first`` the program's first value,
    int64; ``lanes`` int32): one scalar (``SCALES`` 0, 1) or one per value (see ``_scales``)."""
    if SCALES == 0:
        s = tl.load(scale_ptr)
    elif SCALES == 1:
        s = tl.load(scale_ptr + tl.program_id(0) // per)
    else:
        if SCALES == 2:
            k = first // per + ((first % per).to(tl.int32) + lanes) // per
        else:
            k = (first + lanes) // per
        s = tl.load(scale_ptr + k, mask=mask, other=0.0)
    return s.to(tl.float32)


@triton.jit
def _inverse(s):
    """``scale_inverse``: ``1 / s`` (IEEE division), 0 unless ``0 < s < inf``."""
    ok = (s > 0.0) & (s < float("inf"))
    return tl.where(ok, tl.math.div_rn(1.0, tl.where(ok, s, 1.0)), 0.0)


@triton.jit
def _program_noise(keys_ptr, first, BLOCK: tl.constexpr):
    """``noise_at`` under one key pair of the flat indices ``first + arange(BLOCK)``, ``first``
    a multiple of ``BLOCK <= 2**16``: ``fmix(fmix(lo ^ k1) ^ (hi ^ k2))`` with the xorshifts
    that cancel or are the program's taken out. An index's low word ``lo`` is ``first ^ lane``
    and its bits from 16 up are the program's, so ``a ^ (a >> 16)`` (``a = lo ^ k1``) is
    ``d ^ lane``; and where the fmixes meet, ``g ^ (g >> 16) ^ c`` followed by its own
    ``^ (>> 16)`` is ``g ^ c ^ (c >> 16)``: the ``g >> 16`` terms cancel."""
    tl.static_assert(BLOCK <= 65536)
    a = first.to(tl.uint32) ^ tl.load(keys_ptr).to(tl.uint32)
    c = (first >> 32).to(tl.uint32) ^ tl.load(keys_ptr + 1).to(tl.uint32)
    h = (a ^ (a >> 16)) ^ tl.arange(0, BLOCK).to(tl.uint32)
    h = h * MUL1
    h = (h ^ (h >> 15)) * MUL2
    h = (h ^ (c ^ (c >> 16))) * MUL1
    h = (h ^ (h >> 15)) * MUL2
    return _uniform(h ^ (h >> 16))


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
    """``min(|x| * inv, 1)`` in float32, NaN -> 0 (an explicit select: triton 3.6's
    interpreter keeps a NaN through ``tl.maximum``, which PTX and 3.9's interpreter drop)."""
    t = tl.abs(x.to(tl.float32)) * inv
    return tl.minimum(tl.where(t > 0.0, t, 0.0), 1.0)


@triton.jit
def _multiplier(s, levels):
    """``linear_multiplier``: ``levels / s`` (IEEE division), 0 unless ``0 < s < inf``."""
    ok = (s > 0.0) & (s < float("inf"))
    return tl.where(ok, tl.math.div_rn(levels + tl.zeros_like(s), tl.where(ok, s, 1.0)), 0.0)


@triton.jit
def _dither(y, u, levels):
    """``floor(y + u)`` clamped to [-levels, levels], NaN ``y`` -> 0 (an explicit select first:
    no NaN reaches the min / max, whose NaN rule differs between PTX and the interpreters).
    Clamping the integer after the floor gives the numbers of clamping ``y`` before it."""
    q = tl.floor(tl.where(y == y, y, 0.0) + u)
    return tl.minimum(tl.maximum(q, -levels), levels)


# -- the local scale ----------------------------------------------------------------------
@triton.jit
def _abs_max_kernel(x_ptr, out_ptr, n, segs, blocks, width, per, n_segs, RAGGED: tl.constexpr,
                    ATOMIC: tl.constexpr, G: tl.constexpr, W: tl.constexpr):
    """Blocks of ``per`` values in rows of ``width`` (``blocks`` per row, the last one short
    when ``RAGGED``; else the blocks tile the flat ``n`` values), each in ``segs`` segments of
    ``W``: a (G, W) tile of segments -> per segment the largest |x| as float32 bits (int32;
    NaN bits above Inf's, clamped to Inf), stored per block, or ``atomic_max``-ed into the
    zeroed ``out`` when a block has several segments (then ``G`` is 1)."""
    r = tl.program_id(0) * G + tl.arange(0, G)
    b = r // segs if ATOMIC else r
    seg = (r % segs) * W if ATOMIC else 0
    if RAGGED:
        row = b // blocks
        start = row.to(tl.int64) * width + (b - row * blocks).to(tl.int64) * per
        end = tl.minimum(start + per, (row + 1).to(tl.int64) * width)
    else:
        start = b.to(tl.int64) * per
        end = tl.minimum(start + per, n)
    lim = tl.minimum(end - start - seg, W).to(tl.int32)
    cols = tl.arange(0, W)
    mask = (r < n_segs)[:, None] & (cols[None, :] < lim[:, None])
    x = tl.load(x_ptr + (start + seg)[:, None] + cols[None, :], mask=mask, other=0.0)
    m = tl.max(x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    m = tl.minimum(m, INF_BITS)
    if ATOMIC:
        tl.atomic_max(out_ptr + b, m, mask=r < n_segs, sem="relaxed")
    else:
        tl.store(out_ptr + b, m, mask=r < n_segs)


def local_scale(x: torch.Tensor, block_size: int | None = None, rows: int = 1) -> torch.Tensor:
    n = x.numel()
    width = n // rows if rows else 0
    per = max(width, 1) if block_size is None else block_size
    blocks = -(-width // per)
    if width == 0:
        return torch.zeros(rows * (block_size is None), dtype=torch.float32, device=x.device)
    w = min(triton.next_power_of_2(per), per_program(x, TILE, GPU_TILE))
    g = max(per_program(x, TILE, GPU_BLOCKS_TILE) // w, 1)
    segs = -(-per // w)
    n_segs = rows * blocks * segs
    out = (torch.zeros if segs > 1 else torch.empty)(rows * blocks, dtype=torch.float32,
                                                     device=x.device)
    _abs_max_kernel[(cdiv(n_segs, g),)](
        x.contiguous(), out.view(torch.int32), n, segs, blocks, width, per, n_segs,
        RAGGED=rows > 1 and width % per != 0, ATOMIC=segs > 1, G=g, W=w, num_warps=NUM_WARPS)
    return out


# -- linear dithering -------------------------------------------------------------------
@triton.jit
def _linear_quantize_kernel(x_ptr, scale_ptr, noise_ptr, noise_row, out_ptr, n, per, levels,
                            HASH: tl.constexpr, SCALES: tl.constexpr, EVEN: tl.constexpr,
                            BLOCK: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    offs = first + lanes
    mask = offs < n
    xmask = None if EVEN else mask  # EVEN: every program is whole (n % BLOCK == 0)
    x = tl.load(x_ptr + offs, mask=xmask).to(tl.float32)
    if HASH == 1:  # ONE_KEY
        u = _program_noise(noise_ptr, first, BLOCK)
    else:
        u = noise_at(noise_ptr, offs, mask, HASH, noise_row)
    m = _multiplier(_scale_of(scale_ptr, first, lanes, mask, per, SCALES), levels)
    q = _dither(x * m, u, levels)
    tl.store(out_ptr + offs, q.to(tl.int32).to(out_ptr.dtype.element_ty), mask=xmask)


@triton.jit
def _linear_dequantize_kernel(codes_ptr, scale_ptr, out_ptr, n, per, levels,
                              SCALES: tl.constexpr, BLOCK: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    offs = tl.max_contiguous(first + lanes, 4)  # codes and values in one register layout
    mask = offs < n
    q = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.float32)
    step = tl.math.div_rn(_scale_of(scale_ptr, first, lanes, mask, per, SCALES), levels)
    tl.store(out_ptr + offs, _cast_out(q * step, out_ptr), mask=mask)


def linear_quantize(x: torch.Tensor, scale: torch.Tensor, levels: int, noise: torch.Tensor,
                    wire_dtype: torch.dtype, block_size: int | None = None) -> torch.Tensor:
    x = x.contiguous()
    n = x.numel()
    out = torch.empty(n, dtype=wire_dtype, device=x.device)
    if n:
        u, hashed, row = noise_operand(noise, n, x)
        block, mode, per = _linear_tiles(x, block_size, n, hashed == ONE_KEY, GPU_LINEAR_RAGGED)
        _linear_quantize_kernel[(cdiv(n, block),)](
            x, scale.reshape(-1), u, row, out, n, per, float(levels), HASH=hashed, SCALES=mode,
            EVEN=n % block == 0, BLOCK=block, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def linear_dequantize(codes: torch.Tensor, scale: torch.Tensor, levels: int,
                      dtype: torch.dtype = torch.float32,
                      block_size: int | None = None) -> torch.Tensor:
    codes = codes.contiguous()
    n = codes.numel()
    out = torch.empty(n, dtype=dtype, device=codes.device)
    if n:
        block, mode, per = _linear_tiles(codes, block_size, n, True)
        _linear_dequantize_kernel[(cdiv(n, block),)](
            codes, scale.reshape(-1), out, n, per, float(levels), SCALES=mode, BLOCK=block,
            num_warps=NUM_WARPS, enable_fp_fusion=False)
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
def _exp_quantize_kernel(x_ptr, scale_ptr, noise_ptr, noise_row, out_ptr, nbytes, per, levels,
                         headroom, sub_mult, HASH: tl.constexpr, SCALES: tl.constexpr,
                         BITS: tl.constexpr, BLOCK: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    offs = first + lanes
    mask = offs < nbytes
    if BITS == 8:
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = noise_at(noise_ptr, offs, mask, HASH, noise_row)
        inv = _inverse(_scale_of(scale_ptr, first, lanes, mask, per, SCALES))
        code = _exp_code(x, u, inv, levels, headroom, sub_mult, BITS)
    else:
        x0 = tl.load(x_ptr + 2 * offs, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(x_ptr + 2 * offs + 1, mask=mask, other=0.0).to(tl.float32)
        u0 = noise_at(noise_ptr, 2 * offs, mask, HASH, noise_row)
        u1 = noise_at(noise_ptr, 2 * offs + 1, mask, HASH, noise_row)
        inv0 = _inverse(_scale_of(scale_ptr, 2 * first, 2 * lanes, mask, per, SCALES))
        inv1 = _inverse(_scale_of(scale_ptr, 2 * first, 2 * lanes + 1, mask, per, SCALES))
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
                           SCALES: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    offs = first + lanes
    mask = offs < nbytes
    c = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    if BITS == 8:
        scale = _scale_of(scale_ptr, first, lanes, mask, per, SCALES)
        tl.store(out_ptr + offs, _cast_out(_exp_value(c, scale, headroom, BITS), out_ptr),
                 mask=mask)
    else:
        s0 = _scale_of(scale_ptr, 2 * first, 2 * lanes, mask, per, SCALES)
        s1 = _scale_of(scale_ptr, 2 * first, 2 * lanes + 1, mask, per, SCALES)
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
        mode, per = _scales(block_size, x.numel(), per_program(x, BLOCK, GPU_BLOCK) * 8 // bits)
        _launch(_exp_quantize_kernel, nbytes, x, x.contiguous(), scale.reshape(-1), u, row,
                out, nbytes, per, levels, headroom, float(2.0 ** (levels - 1)), HASH=hashed,
                SCALES=mode, BITS=bits)
    return out


def exp_dequantize(codes: torch.Tensor, scale: torch.Tensor, headroom: int, bits: int,
                   dtype: torch.dtype = torch.float32,
                   block_size: int | None = None) -> torch.Tensor:
    codes = codes.contiguous()
    n = codes.numel() * 8 // bits
    out = torch.empty(n, dtype=dtype, device=codes.device)
    if codes.numel():
        mode, per = _scales(block_size, n, per_program(codes, BLOCK, GPU_BLOCK) * 8 // bits)
        _launch(_exp_dequantize_kernel, codes.numel(), codes, codes, scale.reshape(-1), out,
                codes.numel(), per, headroom, SCALES=mode, BITS=bits)
    return out


def exp_combine(a: torch.Tensor, b: torch.Tensor, bits: int, noise: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(a)
    if a.numel():
        u, hashed, row = noise_operand(noise, a.numel() * 8 // bits, a)
        _launch(_exp_combine_kernel, a.numel(), a, a.contiguous(), b.contiguous(), u, row, out,
                a.numel(), HASH=hashed, BITS=bits)
    return out
