"""Triton twin of ``hadamard.py`` (SDP4Bit 3.3: Hadamard fused with (de)quantization).

Bit-exact with the torch twin by construction: the same float32 butterfly (add/sub stages,
one multiply by ``inv_sqrt(n)``), IEEE division (``div_rn``), ``floor(y + 0.5)`` /
``floor(y + noise)`` rounding (noise hashed in the kernel when given as keys,
``triton_noise.group_noise_at``), peers added in order 0..P-1, and every launch compiled with
``enable_fp_fusion=False`` so no multiply-add is contracted into an FMA. Non-finite groups are
detected explicitly (``x != x``, ``|x| == inf``), not through ``tl.max``.

A program handles ``BLOCK_G`` whole groups as a ``(BLOCK_G, GS_P2)`` tile (``GS_P2`` the next
power of two >= group_size, the extra columns masked); an ``n``-block never straddles the mask
because ``n`` divides ``group_size``. Code packing follows ``packing.py``: a unit of ``CPU``
codes is the little-endian word ``c0 | c1 << bits | ...`` stored as ``BPU`` bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .hadamard import inv_sqrt
from .packing import packed_nbytes
from .triton_noise import group_noise_at, noise_operand
from .triton_tiles import per_program

#: values per program (a power of two; tiles of whole groups / whole n-blocks): few large
#: programs under TRITON_INTERPRET (its cost is per program); on a GPU ``GPU_BLOCK_ELEMS``
#: over ``NUM_WARPS`` warps, 8 values per thread (<= 128 registers and no spill on sm_90:
#: tests/test_gpu_registers.py)
BLOCK_ELEMS, GPU_BLOCK_ELEMS, NUM_WARPS = 4096, 2048, 8
#: codes per packing unit and bytes per unit, as in packing.py
_UNIT = {8: (1, 1), 4: (2, 1), 2: (4, 1), 6: (4, 3)}


@triton.jit
def _fwht(x, ROWS: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr, SCALE: tl.constexpr):
    """Normalized Walsh-Hadamard transform of every row of a float32 (ROWS, N) tile."""
    for s in tl.static_range(LOG2N):  # pairs (i, i + h), h = 1 << s
        y = tl.permute(tl.reshape(x, (ROWS, N >> (s + 1), 2, 1 << s)), (0, 1, 3, 2))
        a, b = tl.split(y)
        y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        x = tl.reshape(y, (ROWS, N))
    return x * SCALE


@triton.jit
def _rotate_tile(x, BLOCK_G: tl.constexpr, GS_P2: tl.constexpr, N: tl.constexpr,
                 LOG2N: tl.constexpr, SCALE: tl.constexpr):
    """Rotate every n-block of a (BLOCK_G, GS_P2) float32 tile."""
    y = _fwht(tl.reshape(x, (BLOCK_G * GS_P2 // N, N)), BLOCK_G * GS_P2 // N, N, LOG2N, SCALE)
    return tl.reshape(y, (BLOCK_G, GS_P2))


@triton.jit
def _tile(pid, n_groups, GS: tl.constexpr, BLOCK_G: tl.constexpr, GS_P2: tl.constexpr):
    """Group indices (BLOCK_G,), column indices (GS_P2,) and the value mask of a tile."""
    g = pid.to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    c = tl.arange(0, GS_P2)
    mask = (g[:, None] < n_groups) & (c[None, :] < GS)
    return g, c, mask


@triton.jit
def _load_codes(packed_ptr, g, c, mask, GS: tl.constexpr, BITS: tl.constexpr,
                CPU: tl.constexpr, BPU: tl.constexpr):
    """Unpacked codes of a tile as int32 (each code reads the bytes of its unit)."""
    unit = g[:, None] * (GS // CPU) + c[None, :] // CPU
    word = tl.zeros(mask.shape, tl.int32)
    for m in tl.static_range(BPU):
        byte = tl.load(packed_ptr + unit * BPU + m, mask=mask, other=0).to(tl.int32)
        word = word | (byte << (8 * m))
    return (word >> (BITS * (c[None, :] % CPU))) & ((1 << BITS) - 1)


@triton.jit
def _store_codes(packed_ptr, codes, g, BLOCK_G: tl.constexpr, GS: tl.constexpr,
                 GS_P2: tl.constexpr, n_groups, BITS: tl.constexpr, CPU: tl.constexpr,
                 BPU: tl.constexpr):
    """Pack int32 codes of a (BLOCK_G, GS_P2) tile into units of CPU codes / BPU bytes."""
    U: tl.constexpr = GS_P2 // CPU
    if CPU == 1:
        word = codes
    elif CPU == 2:
        c0, c1 = tl.split(tl.reshape(codes, (BLOCK_G, U, 2)))
        word = c0 | (c1 << BITS)
    else:
        even, odd = tl.split(tl.reshape(codes, (BLOCK_G, U, 2, 2)))
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
        word = c0 | (c1 << BITS) | (c2 << (2 * BITS)) | (c3 << (3 * BITS))
    u = tl.arange(0, U)
    umask = (g[:, None] < n_groups) & (u[None, :] < GS // CPU)
    base = (g[:, None] * (GS // CPU) + u[None, :]) * BPU
    for m in tl.static_range(BPU):
        tl.store(packed_ptr + base + m, ((word >> (8 * m)) & 0xFF).to(tl.uint8), mask=umask)


@triton.jit
def _bf16_bits(x):
    """float32 -> bfloat16 bits as int16, round to nearest even as torch does (NaN -> 0x7FC0).
    Done on the bits because the interpreter's float32 -> bfloat16 cast truncates."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.int16)


@triton.jit
def _rotate_kernel(x_ptr, out_ptr, n_rows, ROWS: tl.constexpr, N: tl.constexpr,
                   LOG2N: tl.constexpr, SCALE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs = r[:, None] * N + tl.arange(0, N)[None, :]
    mask = r[:, None] < n_rows
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, _fwht(x, ROWS, N, LOG2N, SCALE), mask=mask)


@triton.jit
def _quantize_kernel(x_ptr, noise_ptr, noise_row, packed_ptr, scale_ptr, n_groups,
                     GS: tl.constexpr, GS_P2: tl.constexpr, BLOCK_G: tl.constexpr,
                     N: tl.constexpr, LOG2N: tl.constexpr, SCALE: tl.constexpr,
                     BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr,
                     STOCHASTIC: tl.constexpr, HASH: tl.constexpr):
    g, c, mask = _tile(tl.program_id(0), n_groups, GS, BLOCK_G, GS_P2)
    offs = g[:, None] * GS + c[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = _rotate_tile(x, BLOCK_G, GS_P2, N, LOG2N, SCALE)
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    bad = tl.sum(((y != y) | (tl.abs(y) == float("inf"))).to(tl.int32), axis=1) > 0
    absmax = tl.max(tl.abs(y), axis=1)
    ok = (~bad) & (absmax > 0)
    # as group_quant.group_scales: absmax / qmax (IEEE division), (1 / absmax) * qmax
    qmax = tl.full(absmax.shape, QMAX, tl.float32)
    scale = tl.where(bad, float("nan"), tl.math.div_rn(absmax, qmax))
    one = tl.full(absmax.shape, 1.0, tl.float32)
    inv = tl.where(ok, tl.math.div_rn(one, tl.where(ok, absmax, 1.0)) * QMAX, 0.0)
    t = y * inv[:, None]
    if STOCHASTIC:
        q = tl.floor(t + group_noise_at(noise_ptr, offs, mask, g[:, None], (g < n_groups)[:, None],
                                        GS, HASH, noise_row))
    else:
        q = tl.floor(t + 0.5)
    q = tl.minimum(tl.maximum(tl.where(q != q, 0.0, q), -QMAX), QMAX)
    codes = q.to(tl.int32) + (QMAX + 1)
    tl.store(scale_ptr + g, scale, mask=g < n_groups)
    _store_codes(packed_ptr, codes, g, BLOCK_G, GS, GS_P2, n_groups, BITS, CPU, BPU)


@triton.jit
def _dequantize_kernel(packed_ptr, scale_ptr, out_ptr, n_peers, n_groups, peer_bytes,
                       GS: tl.constexpr, GS_P2: tl.constexpr, BLOCK_G: tl.constexpr,
                       N: tl.constexpr, LOG2N: tl.constexpr, SCALE: tl.constexpr,
                       BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr,
                       BIG, INVERSE: tl.constexpr, OUT_BF16: tl.constexpr,
                       CLIP: tl.constexpr):
    """Sum over peers 0..n_peers-1 (one peer: plain dequantize), then optional inverse.
    ``OUT_BF16``: ``out_ptr`` is an int16 view of a bfloat16 output; ``CLIP``: values past
    +-``BIG`` (a 16-bit output's largest) are clipped to it (NaN stays NaN)."""
    g, c, mask = _tile(tl.program_id(0), n_groups, GS, BLOCK_G, GS_P2)
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    gmask = g < n_groups
    q = (_load_codes(packed_ptr, g, c, mask, GS, BITS, CPU, BPU) - (QMAX + 1)).to(tl.float32)
    total = q * tl.load(scale_ptr + g, mask=gmask, other=0.0)[:, None]
    for _ in range(1, n_peers):
        packed_ptr += peer_bytes
        scale_ptr += n_groups
        q = (_load_codes(packed_ptr, g, c, mask, GS, BITS, CPU, BPU) - (QMAX + 1)).to(tl.float32)
        total = total + q * tl.load(scale_ptr + g, mask=gmask, other=0.0)[:, None]
    if INVERSE:
        total = _rotate_tile(total, BLOCK_G, GS_P2, N, LOG2N, SCALE)
    if CLIP:
        total = tl.where(total > BIG, BIG, tl.where(total < -BIG, -BIG, total))
    offs = g[:, None] * GS + c[None, :]
    if OUT_BF16:
        tl.store(out_ptr + offs, _bf16_bits(total), mask=mask)
    else:
        tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def _consts(bits: int, group_size: int, hadamard_size: int, block: int = BLOCK_ELEMS) -> dict:
    """A tile's constants: whole groups in about ``block`` values."""
    gs_p2 = triton.next_power_of_2(group_size)
    cpu, bpu = _UNIT[bits]
    return dict(GS=group_size, GS_P2=gs_p2, BLOCK_G=max(1, block // gs_p2),
                N=hadamard_size, LOG2N=hadamard_size.bit_length() - 1,
                SCALE=inv_sqrt(hadamard_size), BITS=bits, CPU=cpu, BPU=bpu)


def _block(t: torch.Tensor) -> int:
    return per_program(t, BLOCK_ELEMS, GPU_BLOCK_ELEMS)


def rotate(x: torch.Tensor, hadamard_size: int) -> torch.Tensor:
    """1-D x (numel % hadamard_size == 0) -> float32 ``x.view(-1, n) @ H``, flattened."""
    x = x.contiguous()
    out = torch.empty(x.numel(), dtype=torch.float32, device=x.device)
    n_rows = x.numel() // hadamard_size
    if n_rows:
        rows = max(1, _block(x) // hadamard_size)
        _rotate_kernel[(triton.cdiv(n_rows, rows),)](
            x, out, n_rows, ROWS=rows, N=hadamard_size, LOG2N=hadamard_size.bit_length() - 1,
            SCALE=inv_sqrt(hadamard_size), num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def quantize(x: torch.Tensor, bits: int, group_size: int, hadamard_size: int,
             noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused rotate + group quantize -> (packed uint8 codes, float32 scales)."""
    x = x.contiguous()
    n_groups = x.numel() // group_size
    packed = torch.empty(packed_nbytes(x.numel(), bits), dtype=torch.uint8, device=x.device)
    scale = torch.empty(n_groups, dtype=torch.float32, device=x.device)
    if n_groups:
        k = _consts(bits, group_size, hadamard_size, _block(x))
        u, hashed, row = noise_operand(noise, x.numel(), x, group_size)
        _quantize_kernel[(triton.cdiv(n_groups, k["BLOCK_G"]),)](
            x, u, row, packed, scale, n_groups, **k, STOCHASTIC=noise is not None, HASH=hashed,
            num_warps=NUM_WARPS, enable_fp_fusion=False)
    return packed, scale


def _dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                hadamard_size: int, dtype: torch.dtype, inverse: bool) -> torch.Tensor:
    packed, scale = packed.contiguous(), scale.contiguous()
    n_peers, n_groups = scale.shape
    out = torch.empty(n_groups * group_size, dtype=dtype, device=packed.device)
    if n_groups and n_peers:
        k = _consts(bits, group_size, hadamard_size, _block(packed))
        bf16 = dtype == torch.bfloat16
        _dequantize_kernel[(triton.cdiv(n_groups, k["BLOCK_G"]),)](
            packed, scale, out.view(torch.int16) if bf16 else out, n_peers, n_groups,
            packed.shape[-1], **k, BIG=torch.finfo(dtype).max, INVERSE=inverse,
            OUT_BF16=bf16, CLIP=dtype != torch.float32, num_warps=NUM_WARPS,
            enable_fp_fusion=False)
    return out


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
               hadamard_size: int, dtype: torch.dtype = torch.float32,
               inverse: bool = True) -> torch.Tensor:
    """Dequantize, then (``inverse``) rotate back, in float32; cast to ``dtype`` last."""
    return _dequantize(packed.reshape(1, -1), scale.reshape(1, -1), bits, group_size,
                       hadamard_size, dtype, inverse)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                   hadamard_size: int, inverse: bool = True) -> torch.Tensor:
    """Sum of P peers in the rotated domain, then one inverse rotation (SDP4Bit 3.3). float32."""
    return _dequantize(packed, scale, bits, group_size, hadamard_size, torch.float32, inverse)
