"""Triton twin of ``group_quant.py``: symmetric absmax group quantization (SDP4Bit 2.2,
ZeRO++ 3.2), bit-exact with the torch twin.

Bit-exact by construction: IEEE division (``div_rn``) for ``absmax / qmax`` and
``1 / absmax``, ``floor(y + 0.5)`` / ``floor(y + noise)`` rounding (noise hashed in the
kernel when given as keys, ``triton_noise.group_noise_at``), peers added in order 0..P-1,
every launch compiled with ``enable_fp_fusion=False`` (no multiply-add contracted into an
FMA). A group's absmax comes from NaN-propagating maxima and an int32 max of the float
bits, never from ``tl.max`` of floats (which may drop a NaN): Inf or NaN there makes the group
non-finite. bfloat16 output is rounded on the bits (round to nearest even, as torch), since
the interpreter's float32 -> bfloat16 cast truncates.

Quantizing programs own ``BLOCK_G`` whole groups (``_tile``): each thread holds consecutive
values of one group, loaded in 16-byte vectors, so a group's absmax is reduced inside the
thread and then across the few threads of one warp (two warps at group size 2048), and its
division pair runs once per group and thread. The codes go out in packing units of ``CPU``
codes, the word ``c0 | c1 << bits | ...``: one int32 store where a group is whole 32-bit
words, else ``BPU`` little-endian bytes (``packing.py``). qWD (SDP4Bit 3.1, Alg. 2) fuses its
float32 difference into the quantizing kernel and its update ``ref + decode`` into one
kernel on the same tile. Dequantizing programs own ``BLOCK`` consecutive
values and gather their bytes and scales, so any group size multiple of the unit works.
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Callable

import torch
import triton
import triton.language as tl

from . import group_quant as _twin
from . import triton_dequantize_sum as _dsum
from .launch_plans import LaunchPlans, planned_once, signature
from .packing import (_UNIT, flat_contiguous, packed_nbytes, payload_buffers,
                      tail_nbytes, take_tail, wire_fields, wire_words)
from .triton_noise import (ROW_MODES, copy_values, group_noise_at, noise_operand, row_launch,
                           row_program, store_riders, tail_operand, wire_pointers)
from .triton_tiles import cdiv, per_program, rows_of_groups, run_offset, spaced_runs

_ROW_GROUPS, _ROW_ONE = ROW_MODES

#: values per program (a power of two; a quantizing tile holds whole groups): few large
#: programs under TRITON_INTERPRET (its cost is per program); on a GPU ``NUM_WARPS`` warps,
#: each thread ``VALUES_PER_THREAD`` consecutive values of one group (``GPU_BLOCK_ELEMS`` per
#: program), ``SUM_VALUES_PER_THREAD`` in the 2-hop requantize, whose gathers from every peer
#: take more registers (<= 128 registers and no spill on sm_90: tests/test_gpu_registers.py)
BLOCK_ELEMS, NUM_WARPS, VALUES_PER_THREAD, SUM_VALUES_PER_THREAD = 4096, 8, 32, 8
GPU_BLOCK_ELEMS = NUM_WARPS * 32 * VALUES_PER_THREAD


@triton.jit
def _bf16_bits(x):
    """float32 -> bfloat16 bits as int16, round to nearest even (NaN -> 0x7FC0)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.int16)


@triton.jit
def _tile(pid, n_groups, GS: tl.constexpr, BLOCK_G: tl.constexpr, L: tl.constexpr,
          K: tl.constexpr, VEC: tl.constexpr):
    """A quantizing tile of ``BLOCK_G`` whole groups, each split among ``L`` threads owning
    ``K * VEC`` consecutive values (past ``GS`` masked). Loads see it as ``(K, BLOCK_G, L,
    VEC)``: a 16-byte vector of ``VEC`` values per thread and load, ``K`` loads per thread
    (:func:`_per_thread` turns it into ``(BLOCK_G, L, K * VEC)``). Returns the int64 flat
    index of its first value, the int32 offsets from it and their mask in the load view."""
    k = tl.arange(0, K)[:, None, None, None]
    r = tl.arange(0, BLOCK_G)[None, :, None, None]
    c = tl.arange(0, L)[None, None, :, None] * (K * VEC) + k * VEC \
        + tl.arange(0, VEC)[None, None, None, :]
    mask = pid * BLOCK_G + r < n_groups
    if GS != L * K * VEC:
        mask = mask & (c < GS)
    return pid.to(tl.int64) * (BLOCK_G * GS), r * GS + c, mask


@triton.jit
def _per_thread(t):
    """A ``(K, BLOCK_G, L, VEC)`` tile as ``(BLOCK_G, L, K * VEC)``, the values of a thread
    in order (no data moves: each thread's registers renamed)."""
    t = tl.permute(t, (1, 2, 0, 3))
    return tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2] * t.shape[3]))


@triton.jit
def _per_load(t, K: tl.constexpr, VEC: tl.constexpr):
    """Inverse of :func:`_per_thread`: a ``(BLOCK_G, L, K * VEC)`` tile in the load view."""
    return tl.permute(tl.reshape(t, (t.shape[0], t.shape[1], K, VEC)), (2, 0, 1, 3))


@triton.jit
def _absmax(y, LOG2V: tl.constexpr):
    """Per group of a ``(BLOCK_G, L, V)`` tile: the max of ``|y|``, NaN where one is NaN,
    else Inf where one is Inf (the twin's ``abs().amax()``). Inside a thread a tree of
    NaN-propagating maxima; across threads the max of the float bits as int32 (``|y| >= 0``:
    the same order, NaN above Inf), as ``tl.max`` of floats may drop a NaN."""
    m = tl.abs(y)
    for _ in tl.static_range(LOG2V):
        a, b = tl.split(tl.reshape(m, (m.shape[0], m.shape[1], m.shape[2] // 2, 2)))
        m = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    return tl.max(tl.max(m.to(tl.int32, bitcast=True), axis=2), axis=1).to(tl.float32,
                                                                        bitcast=True)


@triton.jit
def _levels(y, pid, base, n_groups, noise_ptr, noise_row, GS: tl.constexpr,
            BLOCK_G: tl.constexpr, L: tl.constexpr, LOG2V: tl.constexpr, BITS: tl.constexpr,
            STOCHASTIC: tl.constexpr, HASH: tl.constexpr):
    """The int32 levels ``q`` in ``[-QMAX, QMAX]`` (the codes less ``QMAX + 1``) and the
    per-group scales of the float32 ``(BLOCK_G, L, V)`` tile ``y`` (:func:`_per_thread`,
    masked values 0) of program ``pid`` over ``n_groups`` groups. The absmax is reduced
    inside a warp where a group fits in one, and the division pair is computed once per
    group and thread. ``base``: the noise index of the tile's first value
    (``group_noise_at``)."""
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    V: tl.constexpr = 1 << LOG2V
    absmax = _absmax(y, LOG2V)
    finite = absmax < float("inf")
    scale = tl.where(finite, tl.math.div_rn(absmax, tl.full(absmax.shape, QMAX, tl.float32)),
                     float("nan"))
    ok = finite & (absmax > 0)
    one = tl.full(absmax.shape, 1.0, tl.float32)
    inv = tl.where(ok, tl.math.div_rn(one, tl.where(ok, absmax, 1.0)) * QMAX, 0.0)
    r = tl.arange(0, BLOCK_G)[:, None, None]
    g = pid * BLOCK_G + r
    gmask = g < n_groups
    lane = tl.arange(0, L)[None, :, None]
    t = y * inv[:, None, None]
    if STOCHASTIC:
        c = lane * V + tl.arange(0, V)[None, None, :]
        vmask = gmask if GS == L * V else gmask & (c < GS)
        q = tl.floor(t + group_noise_at(noise_ptr, base + (r * GS + c), vmask, g, gmask, GS,
                                        HASH, noise_row))
    else:
        q = tl.floor(t + 0.5)
    # NaN (a non-finite group, 0 * inf where 1 / absmax overflows, NaN noise): level 0
    return tl.where(q == q, tl.minimum(tl.maximum(q, -QMAX), QMAX), 0.0).to(tl.int32), scale


@triton.jit
def _store_levels(q, scale, pid, n_groups, packed_ptr, scale_ptr, GS: tl.constexpr,
                  BLOCK_G: tl.constexpr, L: tl.constexpr, LOG2V: tl.constexpr,
                  BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr):
    """Store the levels and scales of :func:`_levels` as codes ``q + QMAX + 1``: units of
    ``CPU`` codes, one int32 word each where ``BPU == 4``, else ``BPU`` bytes."""
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    U: tl.constexpr = (1 << LOG2V) // CPU
    if CPU > 1:
        shift = BITS * tl.arange(0, CPU)
        q = tl.sum(tl.reshape(q, (BLOCK_G, L, U, CPU)) << shift, axis=3)
    # the unit of codes q + QMAX + 1: sum_k (q_k + QMAX + 1) << (BITS k) (mod 2**32, int32)
    LEVEL0: tl.constexpr = (QMAX + 1) * ((1 << (BITS * CPU)) - 1) // ((1 << BITS) - 1)
    word = q + (LEVEL0 - ((LEVEL0 >> 31) << 32))
    _store_tile(word, scale, pid, n_groups, packed_ptr, scale_ptr, GS, BLOCK_G, L, U, CPU, BPU)


@triton.jit
def _quantize_tile(y, pid, base, n_groups, noise_ptr, noise_row, packed_ptr, scale_ptr,
                   GS: tl.constexpr, BLOCK_G: tl.constexpr, L: tl.constexpr,
                   LOG2V: tl.constexpr, BITS: tl.constexpr, CPU: tl.constexpr,
                   BPU: tl.constexpr, STOCHASTIC: tl.constexpr, HASH: tl.constexpr):
    """Quantize the float32 ``(BLOCK_G, L, V)`` tile ``y`` (:func:`_levels`) and store its
    scales and packed codes (:func:`_store_levels`)."""
    q, scale = _levels(y, pid, base, n_groups, noise_ptr, noise_row, GS, BLOCK_G, L, LOG2V,
                       BITS, STOCHASTIC, HASH)
    _store_levels(q, scale, pid, n_groups, packed_ptr, scale_ptr, GS, BLOCK_G, L, LOG2V, BITS,
                  CPU, BPU)


@triton.jit
def _store_tile(word, scale, pid, n_groups, packed_ptr, scale_ptr, GS: tl.constexpr,
                BLOCK_G: tl.constexpr, L: tl.constexpr, U: tl.constexpr, CPU: tl.constexpr,
                BPU: tl.constexpr):
    """Store a quantized tile: each group's scale by its first thread, the ``(BLOCK_G, L,
    U)`` code units in 16-byte vectors of int32 words (``BPU == 4``) or ``BPU`` bytes each
    (:func:`_quantize_tile`'s layouts); the scales as ``scale_ptr``'s type (float32, or
    their bits in a wire's int32 words)."""
    r = tl.arange(0, BLOCK_G)[:, None, None]
    g = pid * BLOCK_G + r
    gmask = g < n_groups
    lane = tl.arange(0, L)[None, :, None]
    sidx = tl.max_contiguous(g, [1, 1, 1])
    tl.store(tl.broadcast_to(scale_ptr + sidx, (BLOCK_G, L, 1)),
             tl.broadcast_to(scale.to(scale_ptr.dtype.element_ty, bitcast=True)[:, None, None],
                             (BLOCK_G, L, 1)), mask=gmask & (lane == 0))
    first = pid.to(tl.int64) * (BLOCK_G * (GS // CPU))
    if BPU == 4:  # 16-byte stores of SV words, KS per thread (as the loads, see _tile)
        KS: tl.constexpr = (U + 3) // 4
        SV: tl.constexpr = U // KS
        u = (tl.arange(0, L)[None, None, :, None] * U + tl.arange(0, KS)[:, None, None, None] * SV
             + tl.arange(0, SV)[None, None, None, :])
        r4 = tl.arange(0, BLOCK_G)[None, :, None, None]
        tl.store(packed_ptr + first + (r4 * (GS // CPU) + u),
                 tl.permute(tl.reshape(word, (BLOCK_G, L, KS, SV)), (2, 0, 1, 3)),
                 mask=(pid * BLOCK_G + r4 < n_groups) & (u < GS // CPU))
    else:
        u = lane * U + tl.arange(0, U)[None, None, :]
        unit = first + (r * (GS // CPU) + u)
        umask = gmask & (u < GS // CPU)
        for m in tl.static_range(BPU):
            tl.store(packed_ptr + unit * BPU + m, ((word >> (8 * m)) & 0xFF).to(tl.uint8),
                     mask=umask)


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
def _quantize_kernel(x_ptr, ref_ptr, noise_ptr, noise_row, packed_ptr, scale_ptr, scale_off,
                     tail_ptr, tail_row, tail_n, n_groups, numel, gpr, row_words, x_row,
                     run_tiles, run_gap, GS: tl.constexpr, BLOCK_G: tl.constexpr,
                     L: tl.constexpr, LOG2V: tl.constexpr, VEC: tl.constexpr,
                     BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr,
                     STOCHASTIC: tl.constexpr, HASH: tl.constexpr, DIFF: tl.constexpr,
                     RAGGED: tl.constexpr, ROWS: tl.constexpr, XROWS: tl.constexpr,
                     TAIL: tl.constexpr, RUNS: tl.constexpr):
    """Quantize ``x``, or with ``DIFF`` qWD's float32 ``x - ref`` (SDP4Bit 3.1); ``RAGGED``:
    ``numel`` is not whole groups, the values past it are zeros. ``ROWS``: a 2-D grid, its
    axis 1 the rows of ``gpr`` groups, written as a wire of rows of ``row_words`` int32 words
    each, the codes then the scales (``scale_ptr``: row 0's first scale); ``XROWS``: read from
    rows ``x_row`` values apart (a strided view), else from a flat ``x``. A program's row is
    its pointers' offset: its tile is the flat kernel's, with no division by ``gpr``.
    ``RUNS``: ``x`` (a row of it) is runs of ``run_tiles`` tiles ``run_gap`` values apart
    (``triton_tiles.spaced_runs``). The scales go ``scale_off`` elements past ``scale_ptr``
    (a wire's words: their word), the riders after them (``store_riders``). A wire comes as
    its bytes, read as its words (``triton_noise.wire_pointers``)."""
    pid = tl.program_id(0)
    packed_ptr, scale_ptr = wire_pointers(packed_ptr, scale_ptr, scale_off, BPU == 4)
    n_tile, nbase = n_groups, 0
    if ROWS:
        n_tile = gpr
        x_ptr, packed_ptr, scale_ptr, noise_ptr, nbase = row_program(
            x_ptr, packed_ptr, scale_ptr, noise_ptr, gpr, row_words, x_row, GS, HASH, XROWS)
    store_riders(scale_ptr, n_tile, tail_ptr, tail_row, tail_n, ROWS, TAIL)
    base, off, mask = _tile(pid, n_tile, GS, BLOCK_G, L, (1 << LOG2V) // VEC, VEC)
    if RAGGED:
        mask = mask & (off < tl.minimum(numel - base, BLOCK_G * GS).to(tl.int32))
    xbase = base
    if RUNS:    # the gaps before this tile's run
        xbase = base + run_offset(pid, run_tiles, run_gap)
    y = tl.load(x_ptr + xbase + off, mask=mask, other=0.0).to(tl.float32)
    if DIFF:
        y = y - tl.load(ref_ptr + base + off, mask=mask, other=0.0).to(tl.float32)
    _quantize_tile(_per_thread(y), pid, nbase + base, n_tile, noise_ptr, noise_row, packed_ptr,
                   scale_ptr, GS, BLOCK_G, L, LOG2V, BITS, CPU, BPU, STOCHASTIC,
                   _ROW_ONE if ROWS and HASH == _ROW_GROUPS else HASH)


@triton.jit
def _decode_tile(packed_ptr, scale_ptr, pid, n_groups, GS: tl.constexpr, BLOCK_G: tl.constexpr,
                 L: tl.constexpr, V: tl.constexpr, BITS: tl.constexpr, CPU: tl.constexpr,
                 BPU: tl.constexpr):
    """float32 values of a ``(BLOCK_G, L, V)`` tile (:func:`_per_thread`) of one payload:
    each thread reads its ``V / CPU`` units (int32 words where ``BPU == 4``) and its scale
    (float32, or its bits in a wire's int32 words)."""
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    U: tl.constexpr = V // CPU
    r = tl.arange(0, BLOCK_G)[:, None, None]
    g = pid * BLOCK_G + r
    gmask = g < n_groups
    u = tl.arange(0, L)[None, :, None] * U + tl.arange(0, U)[None, None, :]
    unit = pid.to(tl.int64) * (BLOCK_G * (GS // CPU)) + (r * (GS // CPU) + u)
    umask = gmask & (u < GS // CPU)
    if BPU == 4:
        w = tl.load(packed_ptr + unit, mask=umask, other=0)
    else:
        w = tl.zeros((BLOCK_G, L, U), tl.int32)
        for m in tl.static_range(BPU):
            w = w | (tl.load(packed_ptr + unit * BPU + m, mask=umask, other=0).to(tl.int32)
                     << (8 * m))
    shift = BITS * tl.arange(0, CPU)
    code = tl.reshape((w[:, :, :, None] >> shift) & ((1 << BITS) - 1), (BLOCK_G, L, V))
    scale = tl.load(scale_ptr + g, mask=gmask, other=0).to(tl.float32, bitcast=True)
    return (code - (QMAX + 1)).to(tl.float32) * scale


@triton.jit
def _dequantize_add_kernel(packed_ptr, scale_ptr, scale_off, ref_ptr, out_ptr, also_ptr,
                           tail_ptr, tail_row, tail_off, tail_n, numel, gpr, row_words,
                           scale_row, also_row, run_tiles, run_gap, GS: tl.constexpr,
                           BLOCK_G: tl.constexpr, L: tl.constexpr, LOG2V: tl.constexpr,
                           VEC: tl.constexpr, BITS: tl.constexpr, CPU: tl.constexpr,
                           BPU: tl.constexpr, RAGGED: tl.constexpr, OUT_BF16: tl.constexpr,
                           ROWS: tl.constexpr, ALSO: tl.constexpr, TAIL: tl.constexpr,
                           RUNS: tl.constexpr):
    """qWD's update ``w~ + deq(C(w - w~))`` (SDP4Bit Alg. 2): ``ref`` plus the decoded
    values in float32, rounded to ``ref``'s dtype (``OUT_BF16``: ``out_ptr`` is an int16
    view of a bfloat16 output); the payload holds ``numel`` values and then padding, or
    (``ROWS``, ``BPU == 4``) is rows of ``gpr`` whole groups read in place, row r's words at
    ``r * row_words`` and its scales at ``r * scale_row`` (a wire's column views): a 2-D
    grid, axis 1 the rows, each program's pointers offset by its row. ``ALSO``: the result
    stored a second time at ``also_ptr`` (row r at ``r * also_row``: the all-gather's output
    beside the new w~; ``RUNS``: a row is runs of ``run_tiles`` tiles ``run_gap`` values
    apart, ``triton_tiles.spaced_runs``). The scales start ``scale_off`` elements past
    ``scale_ptr`` (a wire's words: their word); ``TAIL``: the row's ``tail_n`` riders, from
    its word ``tail_off`` on, copied to ``tail_ptr`` (row r at ``r * tail_row``: the
    all-gather's exact columns). A wire comes as its bytes, read as its words
    (``triton_noise.wire_pointers``)."""
    pid = tl.program_id(0)
    K: tl.constexpr = (1 << LOG2V) // VEC
    packed_ptr, scale_ptr = wire_pointers(packed_ptr, scale_ptr, scale_off, BPU == 4)
    n_groups = tl.cdiv(numel, GS)
    if ROWS:
        row = tl.program_id(1).to(tl.int64)
        packed_ptr += row * row_words
        scale_ptr += row * scale_row
        ref_ptr += row * gpr * GS
        out_ptr += row * gpr * GS
        also_ptr += row * also_row
        tail_ptr += row * tail_row
        n_groups = gpr
    if TAIL > 0:
        if pid == 0:
            words = packed_ptr + tail_off   # the row's riders, after its payload
            copy_values(tail_ptr, words.to(tl.pointer_type(tail_ptr.dtype.element_ty),
                                           bitcast=True), tail_n, TAIL)
    base, off, mask = _tile(pid, n_groups, GS, BLOCK_G, L, K, VEC)
    if RAGGED:
        mask = mask & (off < tl.minimum(numel - base, BLOCK_G * GS).to(tl.int32))
    y = _per_thread(tl.load(ref_ptr + base + off, mask=mask, other=0.0).to(tl.float32))
    y = _per_load(y + _decode_tile(packed_ptr, scale_ptr, pid, n_groups, GS, BLOCK_G, L,
                                   1 << LOG2V, BITS, CPU, BPU), K, VEC)
    y = _bf16_bits(y) if OUT_BF16 else y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + base + off, y, mask=mask)
    if ALSO:
        abase = base
        if RUNS:    # the gaps before this tile's run
            abase = base + run_offset(pid, run_tiles, run_gap)
        tl.store(also_ptr + abase + off, y, mask=mask)


@triton.jit
def _dequantize_rows_kernel(packed_ptr, scale_ptr, out_ptr, numel, gpr, row_words, scale_row,
                            out_row, tail_ptr, tail_row, tail_out_ptr, tail_out_row, tail_n,
                            GS: tl.constexpr, BLOCK_G: tl.constexpr, L: tl.constexpr,
                            LOG2V: tl.constexpr, VEC: tl.constexpr, BITS: tl.constexpr,
                            CPU: tl.constexpr, BPU: tl.constexpr, RAGGED: tl.constexpr,
                            OUT_BF16: tl.constexpr, TAIL: tl.constexpr):
    """Every slot of a gathered wire decoded where it lies (ZeRO++ 3.1's weight gather, QSDP
    5.1's): a 2-D grid, axis 1 the rows; row r's ``gpr`` groups of codes at word
    ``r * row_words``, its scales at ``r * scale_row``, its first ``numel`` values written to
    ``out`` at ``r * out_row`` (``RAGGED``: the row's last group is padding past ``numel``),
    rounded to ``out``'s dtype (``OUT_BF16``: an int16 view of a bfloat16 output);
    ``TAIL``: the row's ``tail_n`` riders (``tail_ptr``, rows ``tail_row`` apart) copied to
    ``tail_out_ptr`` (rows ``tail_out_row`` apart) by its first program."""
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    if TAIL > 0:
        if pid == 0:
            copy_values(tail_out_ptr + row * tail_out_row, tail_ptr + row * tail_row, tail_n,
                        TAIL)
    K: tl.constexpr = (1 << LOG2V) // VEC
    packed_ptr += row * row_words
    scale_ptr += row * scale_row
    out_ptr += row * out_row
    base, off, mask = _tile(pid, gpr, GS, BLOCK_G, L, K, VEC)
    if RAGGED:
        mask = mask & (off < tl.minimum(numel - base, BLOCK_G * GS).to(tl.int32))
    y = _per_load(_decode_tile(packed_ptr, scale_ptr, pid, gpr, GS, BLOCK_G, L, 1 << LOG2V,
                               BITS, CPU, BPU), K, VEC)
    if OUT_BF16:
        tl.store(out_ptr + base + off, _bf16_bits(y), mask=mask)
    else:
        tl.store(out_ptr + base + off, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dequantize_sum_quantize_kernel(packed_ptr, scale_ptr, noise_ptr, noise_row,
                                    out_packed_ptr, out_scale_ptr, n_groups, n_peers,
                                    peer_bytes, peer_groups, GS: tl.constexpr,
                                    BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr,
                                    OGS: tl.constexpr, BLOCK_G: tl.constexpr,
                                    L: tl.constexpr, LOG2V: tl.constexpr,
                                    VEC: tl.constexpr, OBITS: tl.constexpr,
                                    OCPU: tl.constexpr, OBPU: tl.constexpr,
                                    STOCHASTIC: tl.constexpr, HASH: tl.constexpr):
    """Tiles of ``BLOCK_G`` output groups: the peers' float32 sum, requantized in place."""
    pid = tl.program_id(0)
    base, off, mask = _tile(pid, n_groups, OGS, BLOCK_G, L, (1 << LOG2V) // VEC, VEC)
    e = base + off
    y = _dequantize_at(packed_ptr, scale_ptr, e, mask, GS, BITS, CPU, BPU)
    for _ in range(1, n_peers):
        packed_ptr += peer_bytes
        scale_ptr += peer_groups
        y = y + _dequantize_at(packed_ptr, scale_ptr, e, mask, GS, BITS, CPU, BPU)
    _quantize_tile(_per_thread(y), pid, base, n_groups, noise_ptr, noise_row, out_packed_ptr,
                   out_scale_ptr, OGS, BLOCK_G, L, LOG2V, OBITS, OCPU, OBPU, STOCHASTIC, HASH)


@functools.lru_cache(maxsize=256)
def _tile_consts(bits: int, group_size: int, block: int = BLOCK_ELEMS, itemsize: int = 4,
                 per_thread: int = VALUES_PER_THREAD) -> MappingProxyType:
    """A quantizing tile's constants (:func:`_tile`): whole groups in about ``block`` values,
    ``per_thread`` per thread in 16-byte loads of ``itemsize`` values, packed in int32 words
    (``BPU`` 4) where a group is whole words, else in ``packing.py``'s units. Cached per
    argument tuple (the launches' Python cost): read-only."""
    cpu, bpu = (32 // bits, 4) if (32 % bits == 0 and group_size * bits % 32 == 0) \
        else _UNIT[bits]
    gs_p2 = triton.next_power_of_2(group_size)
    v = min(max(per_thread, cpu), gs_p2)  # whole units per thread
    vec = min(16 // itemsize, v)
    return MappingProxyType(dict(BLOCK_G=max(1, block // gs_p2), L=gs_p2 // v,
                                 LOG2V=v.bit_length() - 1, VEC=vec, CPU=cpu, BPU=bpu))


def _block(t: torch.Tensor, per_thread: int = VALUES_PER_THREAD) -> int:
    return per_program(t, BLOCK_ELEMS, NUM_WARPS * 32 * per_thread)


def _packed(numel: int, bits: int, bpu: int, n_groups: int,
            device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed codes, the view a quantizing kernel writes them through (int32 words when
    ``bpu == 4``) and the float32 scales (:func:`payload_buffers`)."""
    packed, scale = payload_buffers(packed_nbytes(numel, bits), n_groups, device)
    return packed, packed.view(torch.int32) if bpu == 4 else packed, scale


def _quantize(x: torch.Tensor, ref: torch.Tensor | None, bits: int, group_size: int,
              noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize` of ``x`` (``ref`` None) or of ``x - ref`` zero-padded to whole groups."""
    x = flat_contiguous(x)
    numel = x.numel()
    n_groups = (numel if ref is None else numel + group_size - 1) // group_size
    k = _tile_consts(bits, group_size, _block(x), x.element_size())
    packed, words, scale = _packed(n_groups * group_size, bits, k["BPU"], n_groups, x.device)
    if n_groups:
        _launch_quantize(x, ref, noise, words, scale, 0, n_groups, 1, 0, group_size, bits, k)
    return packed, scale


def _launch_quantize(x: torch.Tensor, ref: torch.Tensor | None, noise: torch.Tensor | None,
                     words: torch.Tensor, scale: torch.Tensor, scale_off: int, n_groups: int,
                     gpr: int, row_words: int, group_size: int, bits: int, k: dict,
                     tail: torch.Tensor | None = None) -> None:
    """One ``_quantize_kernel`` launch over flat ``x``; ``row_words > 0``: the wire of rows
    of ``gpr`` groups, ``x`` flat or its rows (:func:`rows_of_groups`), a program per
    ``BLOCK_G`` groups of a row (:func:`row_launch`); the scales ``scale_off`` elements into
    ``scale`` (float32, or a wire's int32 words); ``tail``'s rows after each row's scales
    (a wire's)."""
    _quantize_launch(_quantize_plan(x, x.dim() == 2, ref is not None, noise, scale_off,
                                    n_groups, gpr, row_words, group_size, bits, k, tail),
                     x, ref, noise, words, scale, tail)


def _quantize_plan(x: torch.Tensor, xrows: bool, diff: bool, noise: torch.Tensor | None,
                   scale_off: int, n_groups: int, gpr: int, row_words: int, group_size: int,
                   bits: int, k: dict, tail: torch.Tensor | None,
                   runs: tuple[int, int] | None = None) -> tuple:
    """:func:`_launch_quantize`'s launch as :func:`_quantize_launch` takes it, no tensor
    held: ``(grid, float noise, the scalar arguments, the keywords)``; ``xrows``: ``x`` is
    read as its rows (``x.stride(0)`` apart), ``diff``: a reference is subtracted, ``runs``:
    ``(run_tiles, run_gap)``, ``x``'s values read as equally spaced runs."""
    numel = x.numel()
    _, hashed, row = noise_operand(noise, n_groups * group_size, x, group_size)
    _, t_row, t_n, tail_block = tail_operand(tail, x)
    grid, hashed = row_launch(numel, n_groups, gpr, row_words, group_size, k["BLOCK_G"],
                              hashed, row)
    kw = dict(GS=group_size, BITS=bits, STOCHASTIC=noise is not None, HASH=hashed, DIFF=diff,
              RAGGED=numel % group_size != 0, ROWS=row_words > 0,
              XROWS=row_words > 0 and xrows, TAIL=tail_block, RUNS=runs is not None, **k,
              num_warps=NUM_WARPS, enable_fp_fusion=False)
    return grid, noise is not None and noise.dtype != torch.int64, (
        row, scale_off, t_row, t_n, n_groups, numel, gpr, row_words,
        x.stride(0) if xrows else 0, *(runs or (1, 0))), kw


def _quantize_launch(plan: tuple, x: torch.Tensor, ref: torch.Tensor | None,
                     noise: torch.Tensor | None, words: torch.Tensor, scale: torch.Tensor,
                     tail: torch.Tensor | None) -> None:
    """The ``_quantize_kernel`` launch of :func:`_quantize_plan`'s ``plan`` on these
    tensors."""
    grid, noise_flat, scalars, kw = plan
    u = x if noise is None else flat_contiguous(noise) if noise_flat else noise.contiguous()
    t = x if tail is None else tail if tail.stride(-1) == 1 else tail.contiguous()
    r = x if ref is None else ref if ref.is_contiguous() else flat_contiguous(ref)
    _quantize_kernel[grid](x, r, u, scalars[0], words, scale, scalars[1], t, *scalars[2:], **kw)


def quantize_rows(x: torch.Tensor, rows: int, bits: int, group_size: int,
                  noise: torch.Tensor | None = None,
                  tail: torch.Tensor | None = None) -> torch.Tensor:
    """The twin's ``quantize_rows`` written in place: the kernel stores every row's codes and
    scales into the uint8 ``[rows, nbytes]`` wire (its rows' int32 words; ``tail``'s rows
    after them, copied by the kernel), no ``cat``; codes in bytes (6 bits), or rows not
    whole words, go through the twin's join."""
    return _rows(x, None, rows, bits, group_size, noise, tail)


def _rows(x: torch.Tensor, ref: torch.Tensor | None, rows: int, bits: int, group_size: int,
          noise: torch.Tensor | None, tail: torch.Tensor | None) -> torch.Tensor:
    """:func:`quantize_rows` of ``x`` (``ref`` None) or of ``x - ref`` (one row, zero-padded
    to whole groups); rows of whole groups are read in place (:func:`rows_of_groups`). The
    launch is planned once per signature (``launch_plans.py``)."""
    plan = _row_plans((signature(x), signature(ref), rows, bits, group_size, signature(noise),
                       signature(tail)), x, ref, rows, bits, group_size, noise, tail)
    return _rows_by_plan(plan, x, ref, rows, bits, group_size, noise, tail)


def _rows_by_plan(plan: tuple | None, x: torch.Tensor, ref: torch.Tensor | None, rows: int,
                  bits: int, group_size: int, noise: torch.Tensor | None,
                  tail: torch.Tensor | None) -> torch.Tensor:
    """:func:`_rows` with its :func:`_row_plan` (None: the twin's join)."""
    if plan is None:
        x = flat_contiguous(x)
        return _twin.join_rows(*_quantize(x, ref, bits, group_size, noise), rows, tail)
    copy, width, launch = plan
    if copy:
        x = flat_contiguous(x)
    wire = torch.empty(rows, width, dtype=torch.uint8, device=x.device)
    _quantize_launch(launch, x, ref, noise, wire, wire, tail)   # its words, in the kernel
    return wire


def _row_plan(x: torch.Tensor, ref: torch.Tensor | None, rows: int, bits: int, group_size: int,
              noise: torch.Tensor | None, tail: torch.Tensor | None) -> tuple | None:
    """:func:`_rows`' launch on operands of these signatures: ``(x copied flat first: read
    flat and not contiguous, the wire's width, :func:`_quantize_plan`)``; None where the
    twin's join makes the wire (codes in bytes, rows not whole words). One row: the flat
    kernel's layout, its binary (no ``ROWS``). A contiguous ``x`` is read flat as it is
    (the kernel takes its pointer: no view); runs of one length equally spaced in place
    (``triton_tiles.spaced_runs``)."""
    n_groups = (x.numel() if ref is None else x.numel() + group_size - 1) // group_size
    k = _tile_consts(bits, group_size, _block(x), x.element_size())
    runs = spaced_runs(x, rows, k["BLOCK_G"] * group_size)
    flat = runs is None and (ref is not None or rows_of_groups(x, rows, group_size) is None)
    gpr = n_groups // rows
    code_bytes = packed_nbytes(gpr * group_size, bits)
    width = code_bytes + 4 * gpr + tail_nbytes(tail)
    if not (k["BPU"] == 4 and n_groups) or width % 4:
        return None
    return flat and not x.is_contiguous(), width, _quantize_plan(
        x, not flat, ref is not None, noise, code_bytes // 4, n_groups, gpr,
        width // 4 if rows > 1 else 0, group_size, bits, k, tail, runs)


_row_plans = LaunchPlans(_row_plan)


def quantize(x: torch.Tensor, bits: int, group_size: int,
             noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D x -> (packed uint8 codes, float32 scales of shape (numel // group_size,))."""
    return _quantize(x, None, bits, group_size, noise)


def _dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                    dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``packed`` (P, nbytes), ``scale`` (P, groups) -> the sum over peers, as ``dtype``
    (``triton_dequantize_sum``: both read in place through their row strides; written into
    ``out`` if given)."""
    return _dsum.dequantize_sum(packed, scale, bits, group_size, dtype, out=out)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``scale.numel() * group_size`` values."""
    return _dequantize_sum(packed.reshape(1, -1), scale.reshape(1, -1), bits, group_size, dtype)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                   group_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over peers: ``packed`` (P, nbytes), ``scale`` (P, groups) -> float32 (numel,),
    peers added in order 0..P-1; ``out``: written there (float32, numel values)."""
    return _dequantize_sum(packed, scale, bits, group_size, torch.float32, out)


def dequantize_sum_wire(wire: torch.Tensor, code_bytes: int, n_groups: int, bits: int,
                        group_size: int, out: torch.Tensor | None = None,
                        post: tuple[str, float] | None = None,
                        riders: tuple | None = None) -> torch.Tensor:
    """:func:`dequantize_sum` of the payloads in the rows of the uint8 wire ``[P, width]``,
    their fields read in place (``triton_dequantize_sum.dequantize_sum_wire``); into
    ``out`` (any float dtype), ``post`` applied (``post_op.py``), ``riders`` summed, in the
    kernel."""
    return _dsum.dequantize_sum_wire(wire, code_bytes, n_groups, bits, group_size,
                                     torch.float32 if out is None else out.dtype, out=out,
                                     post=post, riders=riders)


def dequantize_sum_quantize(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                            group_size: int, out_bits: int, out_group_size: int,
                            noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of P peers' payloads requantized to ``out_bits`` in one pass (the hop between two
    all-to-alls); ``numel`` must be a multiple of ``out_group_size``."""
    packed, scale = packed.contiguous(), scale.contiguous()
    n_peers, n_in_groups = scale.shape
    numel = n_in_groups * group_size
    n_groups = numel // out_group_size
    k = _tile_consts(out_bits, out_group_size, _block(packed, SUM_VALUES_PER_THREAD),
                     per_thread=SUM_VALUES_PER_THREAD)
    out_packed, words, out_scale = _packed(numel, out_bits, k["BPU"], n_groups, packed.device)
    if n_groups and n_peers:
        cpu, bpu = _UNIT[bits]
        u, hashed, row = noise_operand(noise, numel, scale, out_group_size)
        _dequantize_sum_quantize_kernel[(cdiv(n_groups, k["BLOCK_G"]),)](
            packed, scale, u, row, words, out_scale, n_groups, n_peers, packed.shape[1],
            n_in_groups, GS=group_size, BITS=bits, CPU=cpu, BPU=bpu, OGS=out_group_size,
            BLOCK_G=k["BLOCK_G"], L=k["L"], LOG2V=k["LOG2V"], VEC=k["VEC"], OBITS=out_bits,
            OCPU=k["CPU"], OBPU=k["BPU"], STOCHASTIC=noise is not None, HASH=hashed,
            num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out_packed, out_scale


def quantize_difference(x: torch.Tensor, ref: torch.Tensor, bits: int, group_size: int,
                        noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """qWD's sender step (SDP4Bit 3.1): :func:`quantize` of the float32 ``x - ref`` (any
    float dtypes, same numel) zero-padded to whole groups, in one kernel."""
    return _quantize(x, ref, bits, group_size, noise)


def quantize_difference_row(x: torch.Tensor, ref: torch.Tensor, bits: int, group_size: int,
                            noise: torch.Tensor | None = None,
                            tail: torch.Tensor | None = None) -> torch.Tensor:
    """The twin's ``quantize_difference_row``: :func:`quantize_difference` written by the
    kernel into the uint8 ``[1, nbytes + E]`` wire row, ``tail`` (``[1, E]``) copied after
    the payload (no ``cat``)."""
    return _rows(x, ref, 1, bits, group_size, noise, tail)


def planned_quantize_difference_row(bits: int, group_size: int) -> Callable[..., torch.Tensor]:
    """:func:`quantize_difference_row` as ``(x, ref, noise, tail) -> wire`` for operands of
    one signature (``launch_plans.planned_once``: no plan lookup per call)."""
    return planned_once(
        lambda x, ref, noise, tail: _row_plan(x, ref, 1, bits, group_size, noise, tail),
        lambda plan, x, ref, noise, tail: _rows_by_plan(plan, x, ref, 1, bits, group_size,
                                                        noise, tail))


def dequantize_add(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                   ref: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
    """The twin's ``add_to(ref, dequantize(...))`` in one kernel: qWD's update (SDP4Bit
    Alg. 2); the payload may be padded past ``ref.numel()``. ``packed`` ``[rows, nbytes]``
    and ``scale`` ``[rows, groups]`` may be row-strided (a wire's column views, rows of
    whole groups): read in place where the codes are whole aligned int32 words, else
    copied flat first. ``also`` (``ref``'s dtype and number of values): written with the
    result too, by the kernel where its rows (``[rows, numel]`` of the payload's rows, unit
    column stride) can be, else copied."""
    flat = ref if ref.is_contiguous() else ref.contiguous()   # the kernel reads it flat
    numel = flat.numel()
    k = _tile_consts(bits, group_size, _block(flat), flat.element_size())
    rows = _row_strides(packed, scale) if k["BPU"] == 4 and numel else None
    if rows is not None and numel != packed.shape[0] * rows[0] * group_size:
        rows = None     # a payload padded past ``ref``: read flat
    if rows is None:
        packed, scale = packed.reshape(-1).contiguous(), scale.reshape(-1)
    if k["BPU"] == 4 and (packed.storage_offset() % 4 or packed.numel() % 4):
        k = {**k, "CPU": _UNIT[bits][0], "BPU": _UNIT[bits][1]}  # words: aligned, whole
    return _add(packed.view(torch.int32) if k["BPU"] == 4 else packed, scale, 0,
                None if rows is None else (packed.shape[0], *rows), flat, k, bits, group_size,
                also)


def dequantize_add_wire(wire: torch.Tensor, code_bytes: int, bits: int, group_size: int,
                        ref: torch.Tensor, also: torch.Tensor | None = None,
                        riders: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`dequantize_add_rows` of the payloads in the rows of the uint8 wire ``[rows,
    width]`` (row r: ``code_bytes`` of codes, then the float32 scales; more bytes may follow,
    e.g. riders) and ``ref``, their ``rows * numel`` flat references: the kernel reads both
    fields in place through the wire's int32 words, the scales at their word offset (no view
    per field), where the rows are whole groups of whole words and the wire 4-byte aligned;
    else through :func:`packing.wire_fields`. Flat, as ``ref``. ``riders`` (``[rows, E]``):
    each row's last bytes (exact values, ``comm/riders.py``) copied there, by the kernel
    where its columns have unit stride. The launch is planned once per signature
    (``launch_plans.py``)."""
    plan = _add_plans((signature(wire), wire.storage_offset() % 4, code_bytes, bits,
                       group_size, signature(ref), signature(also), signature(riders)),
                      wire, code_bytes, bits, group_size, ref, also, riders)
    return _add_by_plan(plan, wire, code_bytes, bits, group_size, ref, also, riders)


def planned_dequantize_add_wire(code_bytes: int, bits: int, group_size: int
                                ) -> Callable[..., torch.Tensor]:
    """:func:`dequantize_add_wire` as ``(wire, ref, also, riders) -> sum`` for operands of
    one signature (``launch_plans.planned_once``: no plan lookup per call)."""
    return planned_once(
        lambda wire, ref, also, riders: _add_plan(wire, code_bytes, bits, group_size, ref,
                                                  also, riders),
        lambda plan, wire, ref, also, riders: _add_by_plan(plan, wire, code_bytes, bits,
                                                           group_size, ref, also, riders))


def _add_by_plan(plan: tuple | None, wire: torch.Tensor, code_bytes: int, bits: int,
                 group_size: int, ref: torch.Tensor, also: torch.Tensor | None,
                 riders: torch.Tensor | None) -> torch.Tensor:
    """:func:`dequantize_add_wire` with its :func:`_add_plan` (None: :func:`_add_wire`)."""
    if plan is None:
        return _add_wire(wire, code_bytes, bits, group_size, ref, also, riders)
    flat = ref if ref.is_contiguous() else ref.contiguous()
    return _add_launch(plan, wire, wire, flat, also, riders)   # its words, in the kernel


def _add_wire(wire: torch.Tensor, code_bytes: int, bits: int, group_size: int,
              ref: torch.Tensor, also: torch.Tensor | None,
              riders: torch.Tensor | None) -> torch.Tensor:
    """:func:`dequantize_add_wire` deciding at the call (where no plan launches)."""
    rows = wire.shape[0]
    numel = ref.numel() // rows
    flat = ref if ref.is_contiguous() else ref.contiguous()
    k = _tile_consts(bits, group_size, _block(flat), flat.element_size())
    words = wire_words(wire) if code_bytes % 4 == 0 and numel % group_size == 0 and \
        k["BPU"] == 4 and (riders is None or riders.stride(-1) == 1) else None
    if words is None:
        if riders is not None:
            take_tail(wire, riders)
        return dequantize_add_rows(*wire_fields(wire, code_bytes, -(-numel // group_size)),
                                   bits, group_size, ref.view(rows, numel), also).reshape(-1)
    step, gpr = words.stride(0), numel // group_size
    return _add(words, words, code_bytes // 4, (rows, gpr, step, step) if rows > 1 else None,
                flat, k, bits, group_size, also,
                None if riders is None else (riders, code_bytes // 4 + gpr))


def _add_plan(wire: torch.Tensor, code_bytes: int, bits: int, group_size: int,
              ref: torch.Tensor, also: torch.Tensor | None,
              riders: torch.Tensor | None) -> tuple | None:
    """:func:`dequantize_add_wire`'s launch on operands of these signatures
    (:func:`_add_launch_plan`), the fields read through the wire's words; None where
    :func:`_add_wire` goes another way (fields not in words, nothing to add)."""
    rows = wire.shape[0]
    numel = ref.numel() // rows
    k = _tile_consts(bits, group_size, _block(ref), ref.element_size())
    words = wire_words(wire) if code_bytes % 4 == 0 and numel % group_size == 0 and \
        k["BPU"] == 4 and (riders is None or riders.stride(-1) == 1) else None
    if words is None or not ref.numel():
        return None
    step, gpr = words.stride(0), numel // group_size
    return _add_launch_plan(code_bytes // 4, (rows, gpr, step, step) if rows > 1 else None,
                            ref, k, bits, group_size, also,
                            None if riders is None else (riders, code_bytes // 4 + gpr))


_add_plans = LaunchPlans(_add_plan)


def _add(src: torch.Tensor, scale: torch.Tensor, scale_off: int,
         rows: tuple[int, int, int, int] | None, flat: torch.Tensor, k: dict, bits: int,
         group_size: int, also: torch.Tensor | None,
         riders: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """One ``_dequantize_add_kernel`` launch: the codes ``src`` (int32 words where
    ``k["BPU"] == 4``, else bytes), the scales ``scale_off`` elements into ``scale``, added to
    the contiguous ``flat`` reference; ``rows``: ``(rows, groups per row, words per codes
    row, scale elements per row)`` of a 2-D grid (a wire's rows read in place), else None
    (flat); ``also`` as :func:`dequantize_add`; ``riders``: ``(out [rows, E], word)``, each
    wire row's riders from that word on copied to its row of ``out``."""
    if not flat.numel():
        return torch.empty_like(flat)
    return _add_launch(_add_launch_plan(scale_off, rows, flat, k, bits, group_size, also, riders),
                       src, scale, flat, also, None if riders is None else riders[0])


def _add_launch_plan(scale_off: int, rows: tuple[int, int, int, int] | None,
                     flat: torch.Tensor, k: dict, bits: int, group_size: int,
                     also: torch.Tensor | None,
                     riders: tuple[torch.Tensor, int] | None) -> tuple:
    """:func:`_add`'s launch as :func:`_add_launch` takes it, no tensor held: ``(grid,
    ``also`` stored by the kernel, bfloat16 values, the scalar arguments, the keywords)``
    (``flat`` read for its dtype, size and device)."""
    numel = flat.numel()
    bf16 = flat.dtype == torch.bfloat16
    grid = (cdiv(cdiv(numel, group_size), k["BLOCK_G"]),) if rows is None else \
        (cdiv(rows[1], k["BLOCK_G"]), rows[0])
    second = _also_rows(also, flat, grid, k["BLOCK_G"] * group_size)
    _, t_row, t_n, tail_block = tail_operand(None if riders is None else riders[0], flat)
    runs = None if second is None else second[1]
    kw = dict(GS=group_size, BITS=bits, RAGGED=numel % group_size != 0, OUT_BF16=bf16,
              ROWS=rows is not None, ALSO=second is not None, TAIL=tail_block,
              RUNS=runs is not None, **k, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return grid, second is not None, bf16, (
        scale_off, t_row, 0 if riders is None else riders[1], t_n, numel,
        *((1, 0, 0) if rows is None else rows[1:]), 0 if second is None else second[0],
        *(runs or (1, 0))), kw


def _add_launch(plan: tuple, src: torch.Tensor, scale: torch.Tensor, flat: torch.Tensor,
                also: torch.Tensor | None, riders: torch.Tensor | None) -> torch.Tensor:
    """The ``_dequantize_add_kernel`` launch of :func:`_add_launch_plan`'s ``plan`` on these
    tensors: the sum, ``also`` written with it (by the kernel where the plan says so)."""
    grid, second, bf16, scalars, kw = plan
    out = torch.empty_like(flat)
    target = also if second else out
    t = flat if riders is None else riders if riders.stride(-1) == 1 else riders.contiguous()
    _dequantize_add_kernel[grid](
        src, scale, scalars[0], flat, out.view(torch.int16) if bf16 else out,
        target.view(torch.int16) if bf16 else target, t, *scalars[1:], **kw)
    if not second:
        _twin.also_into(out, also)
    return out


def _also_rows(also: torch.Tensor | None, ref: torch.Tensor,
               grid: tuple[int, ...], tile: int
               ) -> tuple[int, tuple[int, int] | None] | None:
    """``also`` as the kernel's second store: ``(row stride, runs)`` where it is ``ref``'s
    dtype and its rows are the launch's (one flat run, or the grid's rows of unit column
    stride; each row may be runs of one length equally spaced, ``runs`` their ``(run_tiles,
    run_gap)``: ``triton_tiles.spaced_runs`` for ``tile``-value programs); None where it is
    copied after."""
    if also is None or also.dtype != ref.dtype or also.numel() != ref.numel():
        return None
    rows = 1 if len(grid) == 1 else grid[1]
    runs = spaced_runs(also, rows, tile)
    if runs is not None:
        return also.stride(0) if rows > 1 else 0, runs
    if len(grid) == 1:
        return (0, None) if also.is_contiguous() else None
    if also.dim() != 2 or also.shape[0] != rows or also.stride(1) != 1:
        return None
    return also.stride(0), None


def _row_strides(packed: torch.Tensor, scale: torch.Tensor) -> tuple[int, int, int] | None:
    """``(groups per row, words per packed row, floats per scale row)`` where ``packed``
    (uint8 ``[rows > 1, nbytes]``) and ``scale`` (``[rows, groups]``) are strided rows a
    kernel reads in place as int32 words and float32 scales; None where they are flat, one
    row, or not word-aligned (then read flat after a copy)."""
    if packed.dim() != 2 or packed.shape[0] < 2 or packed.is_contiguous():
        return None
    if (packed.stride(1) != 1 or scale.stride(1) != 1 or packed.stride(0) % 4
            or packed.storage_offset() % 4 or packed.shape[1] % 4):
        return None
    return scale.shape[1], packed.stride(0) // 4, scale.stride(0)


def dequantize_rows(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                    out: torch.Tensor,
                    riders: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The twin's ``dequantize_rows`` in one kernel that reads every row's fields in place
    (``[rows, nbytes]`` / ``[rows, groups]`` column views of a gathered wire, any row
    strides) and writes each row's values into its row of ``out`` (``[rows, numel]``, unit
    column stride, any row stride: the compressed columns of an all-gather's output): no
    copy of the fields, no decoded buffer. Codes not in whole aligned int32 words: the
    flat decode, then a copy. ``riders`` as the twin's: copied by the same launch where the
    output's columns have unit stride and the values its dtype (``tail_operand``)."""
    rows, numel = out.shape
    gpr = scale.shape[1] if scale.dim() == 2 else 0
    k = _tile_consts(bits, group_size, _block(out), out.element_size())
    words = k["BPU"] == 4 and packed.stride(-1) == 1 and scale.stride(-1) == 1 and \
        packed.storage_offset() % 4 == 0 and packed.shape[1] % 4 == 0 and \
        (rows == 1 or packed.stride(0) % 4 == 0) and out.stride(-1) == 1
    kernel = words and gpr and rows and -(-numel // group_size) == gpr
    if riders is not None and not (kernel and riders[0].stride(-1) == 1 and
                                   riders[0].dtype == riders[1].dtype):
        riders[0].copy_(riders[1])
        riders = None
    if not kernel:
        if rows and numel:
            values = dequantize(packed.reshape(-1), scale.reshape(-1), bits, group_size,
                                out.dtype)
            out.copy_(values.view(rows, -1)[:, :numel])
        return out
    bf16 = out.dtype == torch.bfloat16
    t_out = out if riders is None else riders[0]
    t, t_row, t_n, tail_block = tail_operand(None if riders is None else riders[1], out)
    _dequantize_rows_kernel[(cdiv(gpr, k["BLOCK_G"]), rows)](
        packed.view(torch.int32), scale, out.view(torch.int16) if bf16 else out, numel, gpr,
        packed.stride(0) // 4 if rows > 1 else 0, scale.stride(0) if rows > 1 else 0,
        out.stride(0) if rows > 1 else 0, t, t_row, t_out,
        t_out.stride(0) if rows > 1 else 0, t_n, GS=group_size, BITS=bits,
        RAGGED=numel % group_size != 0, OUT_BF16=bf16, TAIL=tail_block, **k,
        num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def dequantize_add_rows(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                        ref: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
    """The twin's ``dequantize_add_rows``: rows of whole groups in one kernel
    (:func:`dequantize_add`, ``packed`` / ``scale`` flat or ``[rows, ..]`` row views of a
    wire, read in place; ``also``: written too); padded rows decoded, then the twin's
    ``add_rows``."""
    rows, numel = ref.shape
    if numel % group_size == 0:
        return dequantize_add(packed, scale, bits, group_size, ref, also)
    y = dequantize(packed, scale, bits, group_size).view(rows, -1)[:, :numel]
    return _twin.also_into(_twin.add_rows(ref, y), also)
