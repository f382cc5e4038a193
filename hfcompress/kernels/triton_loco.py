"""LoCo's error feedback in one kernel (LoCo Alg. 1 lines 4-8 and 12, Eqs. (2), (3), (5), (7)).

Per group of ``group_size`` gradient values: read ``g`` (any float dtype) and the stored 8-bit
error (codes and a float32 scale per group of 128), then

    e  = deq8(e_codes)                          # 0 before the first call / after a reset
    h  = g + e                                  # Eq. (2)
    q  = Q(h)  -> the inner's codes and scales  # Eq. (3): absmax group quantization
    d  = deq(q)
    e~ = lerp(e, h - d, beta)                   # Eq. (5), torch.lerp's single rounding (FMA)
    e' = Q8(nan_to_num(e~, 0, 0, 0))            # Eq. (7)

and write the payload and the new error. What ``compressors/loco.py`` computes with torch ops
(its torch twin: six to eight kernels and float32 transients of the whole tensor per call, per
destination row of a reduce-scatter), here one launch that reads ``g`` and ``e`` once and writes
the codes: bit-identical by construction. The steps are ``triton_group_quant``'s tile
(``_levels`` / ``_store_levels`` / ``_decode_tile``: the same IEEE divisions, ``floor``
rounding, hashed noise for stochastic rounding), the lerp is ``fma(w, end - e, e)`` for
``w < 0.5`` and ``fma(w - 1, end - e, end)`` otherwise (torch's ``lerp`` on CPU and CUDA), every
other step one rounding (``enable_fp_fusion=False``). The inner's group size must be the
error's (128): one tile serves both quantizations.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from .packing import packed_nbytes, payload_buffers, put_tail, row_wire, tail_nbytes
from .triton_group_quant import (NUM_WARPS, _block, _decode_tile, _levels, _per_thread,
                                 _store_levels, _tile, _tile_consts)
from .triton_noise import ONE_KEY, noise_operand, store_riders, tail_operand
from .triton_tiles import OLDER_TRITON, cdiv

#: the stored error: 8-bit codes, one float32 scale per group of 128 (LoCo 3.2)
ERROR_BITS, ERROR_GROUP = 8, 128
#: values per thread: 16, half the group quantizers' 32, keeps the five live tiles (g / h, e,
#: the levels, the new error) within 128 registers on sm_90 (tests/test_gpu_registers.py; 32:
#: up to 190). Triton < 3.9 (3.6: torch 2.10-2.12 and the GPU image) spreads a thread's two
#: 16-byte loads of a 16-bit gradient over two lanes and converts layouts through shared memory:
#: there 16-bit gradients take 8, one load (bf16 into int4: 155.4 -> 83.4 SASS per value on
#: sm_90; float32 keeps 16: 65.9, at 8 90.9). Triton 3.9: 16 for every dtype (53.2; at 8 69.0).
PER_THREAD = 16


@triton.jit
def _load_tile(x_ptr, pid, n_groups, numel, GS: tl.constexpr, BLOCK_G: tl.constexpr,
               L: tl.constexpr, LOG2V: tl.constexpr, VEC: tl.constexpr):
    """Program ``pid``'s ``(BLOCK_G, L, V)`` tile of ``g`` as float32 (``_per_thread``), the
    flat index of its first value, and which values are before ``numel`` (the padding of the
    last group reads nothing)."""
    base, off, mask = _tile(pid, n_groups, GS, BLOCK_G, L, (1 << LOG2V) // VEC, VEC)
    mask = mask & (off < tl.minimum(numel - base, BLOCK_G * GS).to(tl.int32))
    g = tl.load(x_ptr + base + off, mask=mask, other=0.0).to(tl.float32)
    return base, _per_thread(g), _per_thread(mask)


@triton.jit
def _feedback_tile(g, e, valid, pid, base, n_groups, coeff, noise_ptr, noise_row, packed_ptr,
                   scale_ptr, ecode_ptr, escale_ptr, GS: tl.constexpr, BLOCK_G: tl.constexpr,
                   L: tl.constexpr, LOG2V: tl.constexpr, BITS: tl.constexpr,
                   CPU: tl.constexpr, BPU: tl.constexpr, STOCHASTIC: tl.constexpr,
                   HASH: tl.constexpr, SMALL: tl.constexpr):
    """From ``g`` and the decoded error ``e`` of a tile: store the payload of ``h = g + e``
    and the new 8-bit error (module docstring); values not ``valid`` are the padding (0).
    ``coeff`` and ``SMALL``: the lerp's (:func:`lerp_coefficient`)."""
    h = tl.where(valid, g + e, 0.0)
    q, scale = _levels(h, pid, base, n_groups, noise_ptr, noise_row, GS, BLOCK_G, L, LOG2V,
                       BITS, STOCHASTIC, HASH)
    _store_levels(q, scale, pid, n_groups, packed_ptr, scale_ptr, GS, BLOCK_G, L, LOG2V, BITS,
                  CPU, BPU)
    end = h - q.to(tl.float32) * scale[:, None, None]
    avg = tl.fma(tl.full(end.shape, coeff, tl.float32), end - e, e if SMALL else end)
    avg = tl.where(valid & (tl.abs(avg) < float("inf")), avg, 0.0)   # NaN, +-Inf -> 0
    qe, escale = _levels(avg, pid, 0, n_groups, noise_ptr, noise_row, GS, BLOCK_G, L, LOG2V,
                         8, False, 0)
    _store_levels(qe, escale, pid, n_groups, ecode_ptr, escale_ptr, GS, BLOCK_G, L, LOG2V, 8,
                  4, 4)


@triton.jit
def _feedback_kernel(x_ptr, ecode_ptr, escale_ptr, noise_ptr, noise_row, packed_ptr, scale_ptr,
                     ecode_out_ptr, escale_out_ptr, n_groups, numel, coeff,
                     GS: tl.constexpr, BLOCK_G: tl.constexpr, L: tl.constexpr,
                     LOG2V: tl.constexpr, VEC: tl.constexpr, BITS: tl.constexpr,
                     CPU: tl.constexpr, BPU: tl.constexpr, STOCHASTIC: tl.constexpr,
                     HASH: tl.constexpr, HAS_ERROR: tl.constexpr, SMALL: tl.constexpr):
    """One tile of whole groups of one tensor: its payload and new error, fresh buffers."""
    pid = tl.program_id(0)
    base, g, valid = _load_tile(x_ptr, pid, n_groups, numel, GS, BLOCK_G, L, LOG2V, VEC)
    if HAS_ERROR:
        e = tl.where(valid, _decode_tile(ecode_ptr, escale_ptr, pid, n_groups, GS, BLOCK_G, L,
                                         1 << LOG2V, 8, 4, 4), 0.0)
    else:
        e = tl.zeros(g.shape, tl.float32)
    _feedback_tile(g, e, valid, pid, base, n_groups, coeff, noise_ptr, noise_row, packed_ptr,
                   scale_ptr, ecode_out_ptr, escale_out_ptr, GS, BLOCK_G, L, LOG2V, BITS, CPU,
                   BPU, STOCHASTIC, HASH, SMALL)


@triton.jit
def _feedback_rows_kernel(x_ptr, x_row, errors_ptr, noise_ptr, wire_ptr, row_words, code_words,
                          n_groups, numel, coeff, tail_ptr, tail_row, tail_n,
                          GS: tl.constexpr, BLOCK_G: tl.constexpr,
                          L: tl.constexpr, LOG2V: tl.constexpr, VEC: tl.constexpr,
                          BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr,
                          STOCHASTIC: tl.constexpr, HASH: tl.constexpr, SMALL: tl.constexpr,
                          TAIL: tl.constexpr):
    """Grid axis 1 is the row: row r of ``x`` (``x_row`` values apart) with its own stored
    error, read and rewritten in place where row r of the ``[rows, 3]`` int64 table
    ``errors_ptr`` points (codes as int32 words, scales; its third column 0 where the row has
    no error yet), its own key pair (row r of ``noise_ptr``, indices within the row), its
    payload written as row r of the int32 wire (``row_words`` words per row, the scales after
    ``code_words``), then row r of the riders (``TAIL``, ``triton_noise.store_riders``)."""
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    x_ptr += row * x_row
    wire_ptr += row * row_words
    if STOCHASTIC:
        noise_ptr += 2 * row
    ecode_ptr = tl.multiple_of(tl.load(errors_ptr + 3 * row).to(tl.pointer_type(tl.int32)), 16)
    escale_ptr = tl.multiple_of(tl.load(errors_ptr + 3 * row + 1).to(
        tl.pointer_type(tl.float32)), 16)
    has_error = tl.load(errors_ptr + 3 * row + 2) != 0
    base, g, valid = _load_tile(x_ptr, pid, n_groups, numel, GS, BLOCK_G, L, LOG2V, VEC)
    e = tl.where(valid & has_error, _decode_tile(ecode_ptr, escale_ptr, pid, n_groups, GS,
                                                 BLOCK_G, L, 1 << LOG2V, 8, 4, 4), 0.0)
    scale_ptr = (wire_ptr + code_words).to(tl.pointer_type(tl.float32), bitcast=True)
    _feedback_tile(g, e, valid, pid, base, n_groups, coeff, noise_ptr, 1, wire_ptr, scale_ptr,
                   ecode_ptr, escale_ptr, GS, BLOCK_G, L, LOG2V, BITS, CPU, BPU, STOCHASTIC,
                   HASH, SMALL)
    store_riders(scale_ptr, n_groups, tail_ptr, tail_row, tail_n, True, TAIL)


def _values_per_thread(bits: int, itemsize: int) -> int:
    """Values per thread for ``bits``-bit codes of a gradient of ``itemsize`` bytes
    (:data:`PER_THREAD`), at least one int32 word of codes (2-bit: 16); the error's tile the
    same."""
    return max(8 if OLDER_TRITON and itemsize == 2 else PER_THREAD, 32 // bits)


def _consts(bits: int, group_size: int, x: torch.Tensor) -> dict:
    """The tile of ``triton_group_quant`` at :func:`_values_per_thread` values per thread,
    which must also be the 8-bit error's (one tile serves both quantizations)."""
    n = _values_per_thread(bits, x.element_size())
    block, size = _block(x, n), x.element_size()
    k = _tile_consts(bits, group_size, block, size, n)
    if _tile_consts(ERROR_BITS, group_size, block, size, n)["LOG2V"] != k["LOG2V"]:
        raise ValueError(f"loco feedback kernel: {bits}-bit codes need another tile than the "
                         f"8-bit error")
    return k


def lerp_coefficient(beta: float) -> tuple[float, bool]:
    """``torch.lerp(e, end, beta)`` is ``fma(c, end - e, e)`` with ``c = beta`` where float32
    ``|beta| < 0.5`` (``SMALL``), else ``fma(c, end - e, end)`` with ``c = beta - 1``, in
    float32: ``(c, SMALL)``, ``c`` a Python float that float32 holds exactly (the difference
    of two float32 values in ``[0.5, 1]`` is exact, Sterbenz), so the kernel reads the same
    coefficient whether its float arguments arrive as float32 (a GPU launch) or float64 (the
    interpreter)."""
    w = struct.unpack("f", struct.pack("f", beta))[0]
    return (w, True) if abs(w) < 0.5 else (w - 1.0, False)


def feedback(x: torch.Tensor, error_codes: torch.Tensor | None,
             error_scales: torch.Tensor | None, beta: float, bits: int, group_size: int,
             noise: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (any shape, any float dtype; contiguous) and the stored error (uint8 codes of
    ``x.numel()`` padded to groups of 128, float32 scales; None: zero) -> (the payload's packed
    codes and float32 scales, the new error's codes and scales): ``loco.py``'s compress in one
    launch. ``noise``: the inner's keys (stochastic rounding)."""
    if group_size != ERROR_GROUP:
        raise ValueError(f"loco feedback kernel: group_size={group_size}, needs {ERROR_GROUP} "
                         f"(the error's groups)")
    x = x.reshape(-1)
    numel = x.numel()
    n_groups = -(-numel // group_size)
    padded = n_groups * group_size
    if error_codes is not None and (error_codes.numel() != padded or error_scales is None
                                    or error_scales.numel() != n_groups):
        raise ValueError(f"loco feedback kernel: a stored error of {error_codes.numel()} codes "
                         f"for {numel} values, expected {padded} codes and {n_groups} scales")
    k = _consts(bits, group_size, x)
    packed, scale = payload_buffers(packed_nbytes(padded, bits), n_groups, x.device)
    ecodes, escales = payload_buffers(packed_nbytes(padded, ERROR_BITS), n_groups, x.device)
    if n_groups:
        has_error = error_codes is not None
        u, hashed, row = noise_operand(noise, padded, x, group_size)
        coeff, small = lerp_coefficient(beta)
        _feedback_kernel[(cdiv(n_groups, k["BLOCK_G"]),)](
            x, error_codes.view(torch.int32) if has_error else ecodes,
            error_scales if has_error else escales, u, row,
            packed.view(torch.int32) if k["BPU"] == 4 else packed, scale,
            ecodes.view(torch.int32), escales, n_groups, numel, coeff, GS=group_size,
            BITS=bits, STOCHASTIC=noise is not None, HASH=hashed, HAS_ERROR=has_error,
            SMALL=small, **k, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return packed, scale, ecodes, escales


def feedback_rows(x: torch.Tensor, errors: torch.Tensor, noise: torch.Tensor | None, beta: float,
                  bits: int, group_size: int, tail: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`feedback` of every row of 2-D ``x`` (unit column stride, any row stride), row r
    with its own stored error, in one launch that writes the uint8 wire ``[rows, nbytes]``
    (row r the payload's ``flat()``, then row r of ``tail``: exact values riding along).
    ``errors``: int64 ``[rows, 3]`` on ``x``'s device, row r the addresses of row r's error
    codes (uint8, ``x.shape[1]`` padded to groups of 128, 16-byte aligned) and scales
    (float32, 16-byte aligned), and 1 where they hold an error (0: none yet, as zeros); the
    new errors are written there, in place. ``noise``: ``(rows, 2)`` int64 keys, row r its
    own call's (stochastic rounding)."""
    rows, numel = x.shape
    n_groups = -(-numel // group_size)
    code_bytes = packed_nbytes(n_groups * group_size, bits)
    k = _consts(bits, group_size, x)
    made = row_wire(rows, code_bytes, n_groups, x.device, tail_nbytes(tail))
    if group_size != ERROR_GROUP or k["BPU"] != 4 or made is None or x.stride(1) != 1:
        raise ValueError(f"loco feedback kernel: rows of {numel} values, {bits}-bit codes in "
                         f"groups of {group_size} are not whole int32 words of a wire")
    wire, words, _ = made
    if not (n_groups and rows):
        put_tail(wire, tail)
        return wire
    coeff, small = lerp_coefficient(beta)
    t, t_row, t_n, tail_block = tail_operand(tail, x)
    _feedback_rows_kernel[(cdiv(n_groups, k["BLOCK_G"]), rows)](
        x, x.stride(0) if rows > 1 else 0, errors, errors if noise is None else noise,
        words, words.shape[1], code_bytes // 4, n_groups, numel, coeff, t, t_row, t_n,
        GS=group_size, BITS=bits, STOCHASTIC=noise is not None, HASH=ONE_KEY, SMALL=small,
        TAIL=tail_block, **k, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return wire
