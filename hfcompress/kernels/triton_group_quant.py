"""Triton twin of ``group_quant.py``: symmetric absmax group quantization (SDP4Bit 2.2,
ZeRO++ 3.2), bit-exact with the torch twin.

Bit-exact by construction: IEEE division (``div_rn``) for ``absmax / qmax`` and
``1 / absmax``, ``floor(y + 0.5)`` / ``floor(y + noise)`` rounding (noise hashed in the
kernel when given as keys, ``triton_noise.group_noise_at``), peers added in order 0..P-1,
every launch compiled with ``enable_fp_fusion=False`` (no multiply-add contracted into an
FMA). Non-finite groups are detected explicitly (``x != x``, ``|x| == inf``), never
through ``tl.max``. bfloat16 output is rounded on the bits (round to nearest even, as torch),
since the interpreter's float32 -> bfloat16 cast truncates.

Quantizing programs own ``BLOCK_G`` whole groups as a ``(BLOCK_G, U_P2, CPU)`` tile: a
group's ``group_size / CPU`` packing units (``U_P2`` the next power of two, extra units
masked), each of ``CPU`` codes; a unit is the word ``c0 | c1 << bits | ...`` stored as
``BPU`` little-endian bytes (``packing.py``). Dequantizing programs own ``BLOCK`` consecutive
values and gather their bytes and scales, so any group size multiple of the unit works.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import group_quant as _twin
from .packing import _UNIT, packed_nbytes
from .triton_noise import group_noise_at, noise_operand
from .triton_tiles import per_program

#: values per program (a power of two; a quantizing tile holds whole groups): few large
#: programs under TRITON_INTERPRET (its cost is per program); on a GPU ``GPU_BLOCK_ELEMS`` over
#: ``NUM_WARPS`` warps, 8 values per thread (<= 128 registers and no spill on sm_90:
#: tests/test_gpu_registers.py)
BLOCK_ELEMS, GPU_BLOCK_ELEMS, NUM_WARPS = 4096, 2048, 8


@triton.jit
def _bf16_bits(x):
    """float32 -> bfloat16 bits as int16, round to nearest even (NaN -> 0x7FC0)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.int16)


@triton.jit
def _tile(pid, n_groups, GS: tl.constexpr, BLOCK_G: tl.constexpr, U_P2: tl.constexpr,
          CPU: tl.constexpr):
    """Group ids (BLOCK_G,), value indices (BLOCK_G, U_P2, CPU), unit mask (BLOCK_G, U_P2)
    and value mask of a quantizing tile."""
    g = pid.to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    u = tl.arange(0, U_P2)
    k = tl.arange(0, CPU)
    umask = (g[:, None] < n_groups) & (u[None, :] < GS // CPU)
    e = (g[:, None] * GS + u[None, :] * CPU)[:, :, None] + k[None, None, :]
    mask = umask[:, :, None] & (k[None, None, :] < CPU)  # (always true: broadcasts to 3-D)
    return g, u, e, umask, mask


@triton.jit
def _quantize_tile(y, e, mask, g, u, umask, noise_ptr, noise_row, packed_ptr, scale_ptr, n_groups,
                   GS: tl.constexpr, BITS: tl.constexpr, CPU: tl.constexpr,
                   BPU: tl.constexpr, STOCHASTIC: tl.constexpr, HASH: tl.constexpr):
    """Quantize a float32 tile (masked values 0) and store its scales and packed codes."""
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    nonfinite = (y != y) | (tl.abs(y) == float("inf"))
    bad = tl.max(tl.max(nonfinite.to(tl.int32), axis=2), axis=1) > 0
    absmax = tl.max(tl.max(tl.where(nonfinite, 0.0, tl.abs(y)), axis=2), axis=1)
    ok = (~bad) & (absmax > 0)
    scale = tl.where(bad, float("nan"),
                     tl.math.div_rn(absmax, tl.full(absmax.shape, QMAX, tl.float32)))
    one = tl.full(absmax.shape, 1.0, tl.float32)
    inv = tl.where(ok, tl.math.div_rn(one, tl.where(ok, absmax, 1.0)) * QMAX, 0.0)
    t = y * inv[:, None, None]
    if STOCHASTIC:
        q = tl.floor(t + group_noise_at(noise_ptr, e, mask, g[:, None, None],
                                        (g < n_groups)[:, None, None], GS, HASH, noise_row))
    else:
        q = tl.floor(t + 0.5)
    q = tl.where(q == q, tl.minimum(tl.maximum(q, -QMAX), QMAX), 0.0)
    codes = q.to(tl.int32) + (QMAX + 1)
    shift = BITS * tl.arange(0, CPU)
    word = tl.sum(codes << shift[None, None, :], axis=2)  # disjoint bits: sum == or
    tl.store(scale_ptr + g, scale, mask=g < n_groups)
    base = (g[:, None] * (GS // CPU) + u[None, :]) * BPU
    for m in tl.static_range(BPU):
        tl.store(packed_ptr + base + m, ((word >> (8 * m)) & 0xFF).to(tl.uint8), mask=umask)


@triton.jit
def _dequantize_at(packed_ptr, scale_ptr, e, mask, GS: tl.constexpr, BITS: tl.constexpr,
                   CPU: tl.constexpr, BPU: tl.constexpr):
    """float32 values at indices ``e`` of one peer's payload (masked values 0)."""
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    unit = e // CPU
    word = tl.zeros(e.shape, tl.int32)
    for m in tl.static_range(BPU):
        word = word | (tl.load(packed_ptr + unit * BPU + m, mask=mask, other=0).to(tl.int32)
                       << (8 * m))
    code = (word >> (BITS * (e % CPU))) & ((1 << BITS) - 1)
    return (code - (QMAX + 1)).to(tl.float32) * tl.load(scale_ptr + e // GS, mask=mask, other=0.0)


@triton.jit
def _quantize_kernel(x_ptr, noise_ptr, noise_row, packed_ptr, scale_ptr, n_groups,
                     GS: tl.constexpr, BLOCK_G: tl.constexpr, U_P2: tl.constexpr,
                     BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr,
                     STOCHASTIC: tl.constexpr, HASH: tl.constexpr):
    g, u, e, umask, mask = _tile(tl.program_id(0), n_groups, GS, BLOCK_G, U_P2, CPU)
    y = tl.load(x_ptr + e, mask=mask, other=0.0).to(tl.float32)
    _quantize_tile(y, e, mask, g, u, umask, noise_ptr, noise_row, packed_ptr, scale_ptr, n_groups,
                   GS, BITS, CPU, BPU, STOCHASTIC, HASH)


@triton.jit
def _dequantize_sum_kernel(packed_ptr, scale_ptr, out_ptr, numel, n_peers, peer_bytes,
                           peer_groups, GS: tl.constexpr, BITS: tl.constexpr,
                           CPU: tl.constexpr, BPU: tl.constexpr, BLOCK: tl.constexpr,
                           OUT_BF16: tl.constexpr):
    """Sum over peers 0..n_peers-1 (one peer: plain dequantize). ``OUT_BF16``: ``out_ptr``
    is an int16 view of a bfloat16 output."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = e < numel
    total = _dequantize_at(packed_ptr, scale_ptr, e, mask, GS, BITS, CPU, BPU)
    for _ in range(1, n_peers):
        packed_ptr += peer_bytes  # 64-bit pointer steps: no int32 offset overflow
        scale_ptr += peer_groups
        total = total + _dequantize_at(packed_ptr, scale_ptr, e, mask, GS, BITS, CPU, BPU)
    if OUT_BF16:
        tl.store(out_ptr + e, _bf16_bits(total), mask=mask)
    else:
        tl.store(out_ptr + e, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dequantize_sum_quantize_kernel(packed_ptr, scale_ptr, noise_ptr, noise_row,
                                    out_packed_ptr,
                                    out_scale_ptr, n_groups, n_peers, peer_bytes, peer_groups,
                                    GS: tl.constexpr, BITS: tl.constexpr, CPU: tl.constexpr,
                                    BPU: tl.constexpr, OGS: tl.constexpr,
                                    BLOCK_G: tl.constexpr, U_P2: tl.constexpr,
                                    OBITS: tl.constexpr, OCPU: tl.constexpr,
                                    OBPU: tl.constexpr, STOCHASTIC: tl.constexpr,
                                    HASH: tl.constexpr):
    """Tiles of ``BLOCK_G`` output groups: the peers' float32 sum, requantized in place."""
    g, u, e, umask, mask = _tile(tl.program_id(0), n_groups, OGS, BLOCK_G, U_P2, OCPU)
    y = _dequantize_at(packed_ptr, scale_ptr, e, mask, GS, BITS, CPU, BPU)
    for _ in range(1, n_peers):
        packed_ptr += peer_bytes
        scale_ptr += peer_groups
        y = y + _dequantize_at(packed_ptr, scale_ptr, e, mask, GS, BITS, CPU, BPU)
    _quantize_tile(y, e, mask, g, u, umask, noise_ptr, noise_row, out_packed_ptr, out_scale_ptr, n_groups,
                   OGS, OBITS, OCPU, OBPU, STOCHASTIC, HASH)


def _tile_consts(bits: int, group_size: int, block: int = BLOCK_ELEMS) -> dict:
    """A quantizing tile's constants: whole groups in about ``block`` values."""
    cpu, bpu = _UNIT[bits]
    u_p2 = triton.next_power_of_2(group_size // cpu)
    return dict(BLOCK_G=max(1, block // (u_p2 * cpu)), U_P2=u_p2, CPU=cpu, BPU=bpu)


def _block(t: torch.Tensor) -> int:
    return per_program(t, BLOCK_ELEMS, GPU_BLOCK_ELEMS)


def quantize(x: torch.Tensor, bits: int, group_size: int,
             noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D x -> (packed uint8 codes, float32 scales of shape (numel // group_size,))."""
    x = x.reshape(-1).contiguous()
    n_groups = x.numel() // group_size
    packed = torch.empty(packed_nbytes(x.numel(), bits), dtype=torch.uint8, device=x.device)
    scale = torch.empty(n_groups, dtype=torch.float32, device=x.device)
    if n_groups:
        k = _tile_consts(bits, group_size, _block(x))
        u, hashed, row = noise_operand(noise, x.numel(), x, group_size)
        _quantize_kernel[(triton.cdiv(n_groups, k["BLOCK_G"]),)](
            x, u, row, packed, scale, n_groups, GS=group_size, BITS=bits,
            STOCHASTIC=noise is not None, HASH=hashed, **k, num_warps=NUM_WARPS,
            enable_fp_fusion=False)
    return packed, scale


def _dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """``packed`` (P, nbytes), ``scale`` (P, groups) -> the sum over peers, as ``dtype``."""
    packed, scale = packed.contiguous(), scale.contiguous()
    n_peers, n_groups = scale.shape
    out = torch.empty(n_groups * group_size, dtype=dtype, device=packed.device)
    if out.numel() and n_peers:
        cpu, bpu = _UNIT[bits]
        bf16 = dtype == torch.bfloat16
        block = _block(out)
        _dequantize_sum_kernel[(triton.cdiv(out.numel(), block),)](
            packed, scale, out.view(torch.int16) if bf16 else out, out.numel(), n_peers,
            packed.shape[1], n_groups, GS=group_size, BITS=bits, CPU=cpu, BPU=bpu,
            BLOCK=block, OUT_BF16=bf16, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``scale.numel() * group_size`` values."""
    return _dequantize_sum(packed.reshape(1, -1), scale.reshape(1, -1), bits, group_size, dtype)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                   group_size: int) -> torch.Tensor:
    """Sum over peers: ``packed`` (P, nbytes), ``scale`` (P, groups) -> float32 (numel,),
    peers added in order 0..P-1."""
    return _dequantize_sum(packed, scale, bits, group_size, torch.float32)


def dequantize_sum_quantize(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                            group_size: int, out_bits: int, out_group_size: int,
                            noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of P peers' payloads requantized to ``out_bits`` in one pass (the hop between two
    all-to-alls); ``numel`` must be a multiple of ``out_group_size``."""
    packed, scale = packed.contiguous(), scale.contiguous()
    n_peers, n_in_groups = scale.shape
    numel = n_in_groups * group_size
    n_groups = numel // out_group_size
    out_packed = torch.empty(packed_nbytes(numel, out_bits), dtype=torch.uint8,
                             device=packed.device)
    out_scale = torch.empty(n_groups, dtype=torch.float32, device=packed.device)
    if n_groups and n_peers:
        cpu, bpu = _UNIT[bits]
        k = _tile_consts(out_bits, out_group_size, _block(packed))
        u, hashed, row = noise_operand(noise, numel, scale, out_group_size)
        _dequantize_sum_quantize_kernel[(triton.cdiv(n_groups, k["BLOCK_G"]),)](
            packed, scale, u, row, out_packed,
            out_scale, n_groups, n_peers, packed.shape[1], n_in_groups, GS=group_size,
            BITS=bits, CPU=cpu, BPU=bpu, OGS=out_group_size, BLOCK_G=k["BLOCK_G"],
            U_P2=k["U_P2"], OBITS=out_bits, OCPU=k["CPU"], OBPU=k["BPU"],
            STOCHASTIC=noise is not None, HASH=hashed, num_warps=NUM_WARPS,
            enable_fp_fusion=False)
    return out_packed, out_scale


def quantize_difference(x: torch.Tensor, ref: torch.Tensor, bits: int, group_size: int,
                        noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The twin's difference (torch ops), then :func:`quantize`."""
    return quantize(_twin.difference(x, ref, group_size), bits, group_size, noise)


def dequantize_add(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                   ref: torch.Tensor) -> torch.Tensor:
    """:func:`dequantize`, then the twin's ``add_to`` (torch ops)."""
    return _twin.add_to(ref, dequantize(packed, scale, bits, group_size))


def dequantize_add_rows(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                        ref: torch.Tensor) -> torch.Tensor:
    """:func:`dequantize` of every row, then the twin's ``add_rows`` (torch ops)."""
    rows, numel = ref.shape
    y = dequantize(packed, scale, bits, group_size).view(rows, -1)[:, :numel]
    return _twin.add_rows(ref, y)
