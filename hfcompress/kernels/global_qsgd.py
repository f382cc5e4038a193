"""Global-QSGD quantizers and the exponent reduce, torch twin of ``triton_global_qsgd.py``.

Every peer quantizes with the same global scale (Global-QSGD Alg. 1), given as a float32
tensor: one element for the whole tensor (``block_size=None``, the paper), or one per block
of ``block_size`` consecutive values (value i uses ``scale[i // block_size]``);
``t = min(|x| / scale, 1)``. The noise is float32 U[0, 1), one draw per code (given as
values or as the hash keys, ``noise.py``). All integer
and float steps below are the ones the Triton kernels run, so both give the same bits for
the same noise.

Linear dithering (Global-QSGD 4.2, L_s): ``q = floor(y + u)`` clamped to
``[-levels, levels]``, with ``y = t * sign(x) * levels`` computed as ``x * (levels / scale)``
(one multiply per value; NaN -> 0), a signed integer in ``[-levels, levels]``; decoded
``q * (scale / levels)``. ``q`` is ``floor(y) + 1`` with probability ``y - floor(y)``
(unbiased) up to the float32 rounding of ``y + u``: at most half an ulp of ``|y| <= 127``,
i.e. 2**-18 of a level (the QSGD kernels round the same way). Clamping the integer (after the
floor) gives the numbers of clamping ``y`` before it, and keeps ``y = levels`` from rounding
up past it.

Exponential dithering (Global-QSGD 4.2-4.3, E_s with C_nat rounding): levels ``2**-j``,
``j = 0 .. levels-1``, and 0. ``t`` rounds to one of its two neighbouring levels, unbiased
(below the last level: to 0 or ``2**-(levels-1)``). The wire code is ``(sign, e)``
(Global-QSGD eq. 3): ``e = 0`` is zero, else the value is ``sign * scale * 2**(1 + headroom - e)``,
so a peer's codes use ``e = j + 1 + headroom`` and ``headroom`` doublings of the sum fit
before ``e`` reaches 1. Code layout (``bits`` = 8 or 4): the sign bit (1 = negative) is the
top bit, ``e`` the low ``bits - 1`` bits; 4-bit codes go two per byte, the first in the low
nibble. The quantizer writes zeros with sign bit 0 (Alg. 2 may leave either sign on a zero).

The local scale (:func:`local_scale`, each peer's before the MAX all-reduce) is the largest
``|x|`` per block, +Inf where the block holds an Inf or a NaN.

Non-finite scale (any peer held Inf/NaN in that block): ``inv = 0`` so every code of the
block is 0, and decoding multiplies by the scale, so every value of the block decodes to NaN
or Inf (never finite garbage).
"""

from __future__ import annotations

import torch

from .noise import noise_values

#: run through torch.compile on CPU by ``dispatch.pick`` (same numbers, several times faster)
COMPILE_ON_CPU = ("linear_quantize", "linear_dequantize", "exp_quantize", "exp_dequantize",
                  "exp_combine")
#: float32 holds every integer up to 2**24 exactly: the largest linear level count.
MAX_LINEAR_LEVELS = 1 << 24


def local_scale(x: torch.Tensor, block_size: int | None = None, rows: int = 1) -> torch.Tensor:
    """float32 ``max |x|`` of each block of ``block_size`` consecutive values of each of
    ``rows`` equal rows of ``x`` (the last block of a row may be short; ``None``: the whole
    row), +Inf where a block holds Inf or NaN; ``rows * blocks`` values, row-major."""
    width = x.numel() // rows if rows else 0
    per = max(width, 1) if block_size is None else block_size
    blocks = -(-width // per) if block_size is not None else 1
    a = x.detach().reshape(rows, width).abs()
    a = torch.nn.functional.pad(a, (0, blocks * per - width))
    m = a.reshape(rows * blocks, per).amax(1).float()
    return torch.where(torch.isfinite(m), m, torch.full_like(m, float("inf")))


def scale_inverse(scale: torch.Tensor) -> torch.Tensor:
    """``1 / scale``, or 0 where the scale is 0 or not finite (float32, one per scale)."""
    s = scale.reshape(-1).float()
    ok = torch.isfinite(s) & (s > 0)
    return torch.where(ok, 1.0 / torch.where(ok, s, torch.ones_like(s)), torch.zeros_like(s))


def linear_multiplier(scale: torch.Tensor, levels: int) -> torch.Tensor:
    """``levels / scale`` (IEEE quotient), or 0 where the scale is 0 or not finite: what
    takes x to the level axis (float32, one per scale)."""
    s = scale.reshape(-1).float()
    ok = torch.isfinite(s) & (s > 0)
    return torch.where(ok, torch.full_like(s, levels) / torch.where(ok, s, torch.ones_like(s)),
                       torch.zeros_like(s))


def linear_step(scale: torch.Tensor, levels: int) -> torch.Tensor:
    """The value of one linear level: ``scale / levels`` (float32, one per scale). Divided by
    a tensor: CUDA divides by a Python number as a multiply by its float32 reciprocal, off
    by an ulp from the IEEE quotient the CPU computes (seen on an H200)."""
    s = scale.reshape(-1).float()
    return s / torch.full_like(s, levels)


def per_value(v: torch.Tensor, numel: int, block_size: int | None) -> torch.Tensor:
    """``v[i // block_size]`` for each of ``numel`` values; ``v`` itself (one element,
    broadcast) when ``block_size`` is None."""
    if block_size is None:
        return v
    return v.repeat_interleave(block_size)[:numel]


def _unit(x: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """``min(|x| * inv, 1)`` in float32, NaN -> 0 (a new tensor)."""
    return (x.float().abs() * inv).nan_to_num_(nan=0.0, posinf=1.0).clamp_max_(1.0)


# -- linear dithering -------------------------------------------------------------------
def linear_quantize(x: torch.Tensor, scale: torch.Tensor, levels: int, noise: torch.Tensor,
                    wire_dtype: torch.dtype, block_size: int | None = None) -> torch.Tensor:
    """1-D x -> signed integer codes in ``[-levels, levels]``, ``wire_dtype`` (Global-QSGD 4.2)."""
    m = per_value(linear_multiplier(scale, levels), x.numel(), block_size)
    y = (x.float() * m).nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf"))
    q = y.add_(noise_values(noise, y)).floor_()
    return q.clamp_(-float(levels), float(levels)).to(wire_dtype)


def linear_dequantize(codes: torch.Tensor, scale: torch.Tensor, levels: int,
                      dtype: torch.dtype = torch.float32,
                      block_size: int | None = None) -> torch.Tensor:
    """Integer codes (any integer dtype, e.g. a sum of peers) -> ``codes * scale / levels``."""
    step = per_value(linear_step(scale, levels), codes.numel(), block_size)
    return (codes.float() * step).to(dtype)


# -- exponential dithering --------------------------------------------------------------
def _split(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Packed uint8 bytes -> one int32 code per value."""
    c = codes.reshape(-1, 1).to(torch.int32)
    if bits == 8:
        return c.reshape(-1)
    return torch.cat([c & 0xF, c >> 4], dim=1).reshape(-1)


def _join(code: torch.Tensor, bits: int) -> torch.Tensor:
    """One int32 code per value -> packed uint8 bytes."""
    if bits == 4:
        c = code.reshape(-1, 2)
        code = c[:, 0] | (c[:, 1] << 4)
    return code.to(torch.uint8)


def exp_quantize(x: torch.Tensor, scale: torch.Tensor, levels: int, headroom: int, bits: int,
                 noise: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    """1-D x (numel a multiple of 8 // bits) -> packed (sign, e) codes (Global-QSGD 4.2)."""
    t = _unit(x, per_value(scale_inverse(scale), x.numel(), block_size))
    u = noise_values(noise, t)
    tb = t.view(torch.int32)
    jl = 127 - (tb >> 23)                                # t in [2**-jl, 2**(1-jl)), t >= 0
    frac = (tb & 0x7FFFFF).float().mul_(1.0 / 8388608.0)  # (t - 2**-jl) / 2**-jl, exact
    e_level = (jl + (1 + headroom)).sub_((u < frac).int())
    e_sub = (u < t.mul_(float(2.0 ** (levels - 1)))).int().mul_(levels + headroom)
    e = torch.where(jl <= levels - 1, e_level, e_sub)
    neg = (x.float() < 0).logical_and_(e > 0).int()
    return _join(e | (neg << (bits - 1)), bits)


def exp_value(code: torch.Tensor, scale: torch.Tensor, headroom: int, bits: int) -> torch.Tensor:
    """int32 (sign, e) codes -> ``sign * scale * 2**(1 + headroom - e)``; 0 if ``e = 0`` (eq. 3)."""
    e = code & ((1 << (bits - 1)) - 1)
    pow2 = ((128 + headroom - e) << 23).view(torch.float32)   # 2**(1 + headroom - e)
    mag = torch.where(e > 0, pow2, torch.zeros_like(pow2)) * scale.reshape(1).float()
    return torch.where((code >> (bits - 1)) == 1, -mag, mag)


def exp_dequantize(codes: torch.Tensor, scale: torch.Tensor, headroom: int, bits: int,
                   dtype: torch.dtype = torch.float32,
                   block_size: int | None = None) -> torch.Tensor:
    """Packed codes -> values (:func:`exp_value`): a lookup table of the 256 byte values at
    scale 1 (``+-2**k`` or ``+-0``), times the scale (the same float32 product)."""
    one = torch.ones(1, dtype=torch.float32, device=codes.device)
    table = exp_value(_split(torch.arange(256, dtype=torch.uint8, device=codes.device), bits),
                      one, headroom, bits).reshape(256, 8 // bits)
    unit = table[codes.reshape(-1).int()].reshape(-1)
    return (unit * per_value(scale.reshape(-1).float(), unit.numel(), block_size)).to(dtype)


def exp_combine(a: torch.Tensor, b: torch.Tensor, bits: int, noise: torch.Tensor) -> torch.Tensor:
    """The exponent reduce (Global-QSGD Alg. 2): C_nat(x_a + x_b) of two packed code tensors.

    ``k = -floor(log2(2**-m + [p - 2**-m]_+))`` is read from the bits of the noise ``p``,
    with ``m = 2**(bits-1) - 1`` (the largest exponent the field holds, so
    ``P(k > diff) = 2**-diff`` for every difference that can occur; the paper's m = s + 1
    covers only differences up to s). With noise on torch.rand's 2**-24 grid this is exact
    for diff <= 24 and off by < 2**-24 of the larger operand beyond. A same-sign pair with
    ``e = 1`` would round up to ``e = 0`` (zero): the compressor's headroom prevents it.
    """
    m = (1 << (bits - 1)) - 1
    ca, cb = _split(a, bits), _split(b, bits)
    e1, e2 = ca & m, cb & m
    sign1, sign2 = 1 - 2 * (ca >> (bits - 1)), 1 - 2 * (cb >> (bits - 1))
    pb = noise_values(noise, ca).float().view(torch.int32)
    k = torch.clamp(127 - ((pb >> 23) & 0xFF), max=m)
    gz1, gz2 = (e1 > 0).to(torch.int32), (e2 > 0).to(torch.int32)
    sign12 = sign1 * sign2 * gz1 * gz2
    diff = (e1 - e2).abs() - (1 - sign12) // 2
    smaller = ((e1 <= e2).to(torch.int32) + (1 - gz2)) * gz1
    non_zero = 1 - ((e1 == e2) & (sign12 == -1)).to(torch.int32)
    sign_r = sign1 * smaller + sign2 * (1 - smaller)
    e_r = (e1 * smaller + e2 * (1 - smaller)) * non_zero \
        - sign12 * (k > diff).to(torch.int32) * non_zero
    return _join(e_r | (((1 - sign_r) // 2) << (bits - 1)), bits)
