"""Triton twin of ``hadamard.py`` (SDP4Bit 3.3: Hadamard fused with (de)quantization).

Bit-exact with the torch twin by construction: the same float32 butterfly (add/sub stages,
one multiply by ``inv_sqrt(n)``), IEEE division (``div_rn``), ``floor(y + 0.5)`` /
``floor(y + noise)`` rounding (noise hashed in the kernel when given as keys,
``triton_noise.group_noise_at``), peers added in order 0..P-1, and every launch compiled with
``enable_fp_fusion=False`` so no multiply-add is contracted into an FMA. Non-finite groups are
found in the group max of ``|y|`` taken with a NaN-propagating maximum (``tl.max`` may drop
NaN on a GPU).

A quantizing program handles ``BLOCK_G`` whole groups; a thread owns a run of ``RUN``
consecutive values of one group (up to ``RUN_MAX``) in registers, the lanes and warps own the
runs, so the butterfly of an ``n``-block inside a run is register arithmetic and a group's max
a few warp shuffles. A group's runs are padded to a power of two (``RPG``, the extra runs
masked); an ``n``-block never straddles the mask because ``n`` divides ``group_size``. Code
packing follows ``packing.py``: a unit of ``CPU`` codes is the little-endian word
``c0 | c1 << bits | ...`` stored as ``BPU`` bytes; where a run holds whole 32-bit words of
``32 / bits`` codes (bits 2, 4, 8) those are stored as int32 words instead.
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Callable

import torch
import triton
import triton.language as tl

from . import triton_dequantize_sum as _dsum
from .group_quant import join_rows
from .hadamard import inv_sqrt
from .launch_plans import LaunchPlans, planned_once, signature
from .packing import flat_contiguous, packed_nbytes, payload_buffers, tail_nbytes
from .triton_butterfly import fwht, fwht_runs
from .triton_noise import (ROW_MODES, group_noise_at, noise_operand, row_launch, row_program,
                           store_riders, tail_operand, wire_pointers)
from .triton_tiles import cdiv, per_program, rows_of_groups, run_offset, spaced_runs

_ROW_GROUPS, _ROW_ONE = ROW_MODES

#: values per program (a power of two; tiles of whole groups / whole n-blocks): few large
#: programs under TRITON_INTERPRET (its cost is per program); on a GPU ``GPU_BLOCK_ELEMS``
#: over ``NUM_WARPS`` warps, 8 values per thread (<= 128 registers and no spill on sm_90:
#: tests/test_gpu_registers.py)
BLOCK_ELEMS, GPU_BLOCK_ELEMS, NUM_WARPS = 4096, 2048, 8
#: the quantize kernel: a thread's run of values is at most ``RUN_MAX`` (a 32-block), so a GPU
#: tile of ``GPU_BLOCK_ELEMS`` values fills ``QUANT_WARPS`` warps (a run per thread or more);
#: a tile of one larger group takes up to ``NUM_WARPS``
RUN_MAX = 32
QUANT_WARPS = GPU_BLOCK_ELEMS // (32 * RUN_MAX)
#: codes per packing unit and bytes per unit, as in packing.py
_UNIT = {8: (1, 1), 4: (2, 1), 2: (4, 1), 6: (4, 3)}


@triton.jit
def _store_codes(packed_ptr, codes, first, b, gmask, BLOCK_G: tl.constexpr, RPG: tl.constexpr,
                 GS: tl.constexpr, RUN: tl.constexpr, BITS: tl.constexpr, CPU: tl.constexpr,
                 BPU: tl.constexpr, WORDS: tl.constexpr):
    """Pack the int32 codes of a (RUN // K, BLOCK_G, RPG, K) tile of runs, each group's from
    its unit ``first``: int32 words of ``32 // BITS`` codes (``WORDS``), else units of CPU
    codes as BPU bytes. A thread stores
    its run's units as vectors of up to 4, the vector axis last and the others outermost so
    that they stay in the thread's registers."""
    U: tl.constexpr = 32 // BITS if WORDS else CPU
    V: tl.constexpr = 4 if RUN // U >= 4 else RUN // U
    c = tl.reshape(tl.permute(codes, (1, 2, 0, 3)), (BLOCK_G, RPG, RUN // U, U))
    word = tl.sum(c << (BITS * tl.arange(0, U))[None, None, None, :], axis=3)  # disjoint bits
    word = tl.permute(tl.reshape(word, (BLOCK_G, RPG, RUN // U // V, V)), (2, 0, 1, 3))
    unit = ((first[:, None] + b[None, :] * (RUN // U))[None, :, :, None]
            + (tl.arange(0, RUN // U // V) * V)[:, None, None, None]
            + tl.arange(0, V)[None, None, None, :])
    umask = (gmask[:, None] & (b < GS // RUN)[None, :])[None, :, :, None]
    if WORDS:
        tl.store(packed_ptr + unit, word, mask=umask)
    else:
        for m in tl.static_range(BPU):
            tl.store(packed_ptr + unit * BPU + m, ((word >> (8 * m)) & 0xFF).to(tl.uint8),
                     mask=umask)


@triton.jit
def _rotate_kernel(x_ptr, out_ptr, n_rows, ROWS: tl.constexpr, N: tl.constexpr,
                   LOG2N: tl.constexpr, SCALE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs = r[:, None] * N + tl.arange(0, N)[None, :]
    mask = r[:, None] < n_rows
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, fwht(x, ROWS, N, LOG2N, SCALE), mask=mask)


@triton.jit
def _max_nan(a, b):
    """max that returns NaN when either is NaN (tl.max may drop NaN on a GPU)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _quantize_kernel(x_ptr, noise_ptr, noise_row, packed_ptr, scale_ptr, scale_off, tail_ptr,
                     tail_row, tail_n, n_groups, gpr, row_words, x_row, run_tiles, run_gap,
                     GS: tl.constexpr, BLOCK_G: tl.constexpr, RUN: tl.constexpr, RPG: tl.constexpr,
                     K: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr, SCALE: tl.constexpr,
                     BITS: tl.constexpr, CPU: tl.constexpr, BPU: tl.constexpr, WORDS: tl.constexpr,
                     STOCHASTIC: tl.constexpr, HASH: tl.constexpr, ROWS: tl.constexpr,
                     XROWS: tl.constexpr, TAIL: tl.constexpr, RUNS: tl.constexpr):
    """Rotate and group-quantize ``BLOCK_G`` groups (SDP4Bit 3.3 TLq-HS) as a (RUN // K,
    BLOCK_G, RPG, K) tile: value ``j * K + k`` of run ``b`` of group ``g`` at ``[j, g, b, k]``,
    a run in a thread's registers (``K`` values a load), lanes and warps over runs. ``ROWS``
    (``WORDS``): grid axis 1 the rows of ``gpr`` groups, a wire of ``row_words`` words a row
    (codes, scales: ``scale_ptr`` row 0's first), pointers offset by the row; ``XROWS``: input
    rows ``x_row`` apart; ``RUNS``: a row is runs of ``run_tiles`` programs ``run_gap`` apart
    (``triton_tiles.spaced_runs``). Scales ``scale_off`` past ``scale_ptr``, riders after."""
    J: tl.constexpr = RUN // K
    packed_ptr, scale_ptr = wire_pointers(packed_ptr, scale_ptr, scale_off, WORDS)  # or bytes
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    nbase = 0
    if ROWS:
        n_groups = gpr
        x_ptr, packed_ptr, scale_ptr, noise_ptr, nbase = row_program(
            x_ptr, packed_ptr, scale_ptr, noise_ptr, gpr, row_words, x_row, GS, HASH, XROWS)
    store_riders(scale_ptr, n_groups, tail_ptr, tail_row, tail_n, ROWS, TAIL)
    if RUNS:    # the gaps before this program's run
        x_ptr += run_offset(tl.program_id(0), run_tiles, run_gap)
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    b = tl.arange(0, RPG)
    gmask = g < n_groups
    mask = (gmask[:, None] & (b < GS // RUN)[None, :])[None, :, :, None]
    offs = ((g[:, None] * GS + b[None, :] * RUN)[None, :, :, None]
            + (tl.arange(0, J) * K)[:, None, None, None] + tl.arange(0, K)[None, None, None, :])
    y = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if N > 1 and N <= RUN:  # every n-block inside a run: the butterfly in registers
        y = fwht_runs(y, J, BLOCK_G, RPG, K, LOG2N, SCALE)
    elif N > 1:  # the butterfly on the n-blocks in memory order
        y = tl.reshape(tl.permute(y, (1, 2, 0, 3)), (BLOCK_G * RPG * RUN // N, N))
        y = fwht(y, BLOCK_G * RPG * RUN // N, N, LOG2N, SCALE)
        y = tl.permute(tl.reshape(y, (BLOCK_G, RPG, J, K)), (2, 0, 1, 3))
    # the group max of |y| (register axes first), NaN if any is NaN: non-finite iff bad
    absmax = tl.reduce(tl.reduce(tl.reduce(tl.abs(y), 0, _max_nan), 2, _max_nan), 1, _max_nan)
    bad = (absmax != absmax) | (absmax == float("inf"))
    ok = (~bad) & (absmax > 0)
    # as group_quant.group_scales: absmax / qmax (IEEE division), (1 / absmax) * qmax
    scale = tl.where(bad, float("nan"),
                     tl.math.div_rn(absmax, tl.full(absmax.shape, QMAX, tl.float32)))
    inv = tl.where(ok, tl.math.div_rn(tl.full(absmax.shape, 1.0, tl.float32),
                                      tl.where(ok, absmax, 1.0)) * QMAX, 0.0)
    t = y * inv[None, :, None, None]
    if STOCHASTIC:
        q = tl.floor(t + group_noise_at(
            noise_ptr, nbase + offs, mask, g[None, :, None, None], gmask[None, :, None, None],
            GS, _ROW_ONE if ROWS and HASH == _ROW_GROUPS else HASH, noise_row))
    else:
        q = tl.floor(t + 0.5)
    q = tl.where(q == q, tl.minimum(tl.maximum(q, -QMAX), QMAX), 0.0)
    codes = q.to(tl.int32) + (QMAX + 1)
    U: tl.constexpr = 32 // BITS if WORDS else CPU
    tl.store(scale_ptr + g, scale.to(scale_ptr.dtype.element_ty, bitcast=True), mask=gmask)
    _store_codes(packed_ptr, codes, g * (GS // U), b, gmask, BLOCK_G, RPG, GS, RUN, BITS, CPU, BPU,
                 WORDS)


@functools.lru_cache(maxsize=256)
def _consts(bits: int, group_size: int, hadamard_size: int,
            block: int = BLOCK_ELEMS) -> MappingProxyType:
    """A quantizing tile's constants: whole groups in about ``block`` values, as runs of
    ``RUN`` values (the largest power of two <= RUN_MAX dividing the group size: a run
    never straddles two groups) loaded as vectors of ``K``, ``RPG`` run slots per group.
    On a GPU ``block // RUN`` runs >= the ``QUANT_WARPS * 32`` threads: one run or more per
    thread. ``WORDS``: a run holds whole int32 words of codes (the kernel stores words).
    Cached per argument tuple (the launches' Python cost): read-only."""
    run = min(RUN_MAX, group_size & -group_size)
    rpg = triton.next_power_of_2(group_size // run)
    cpu, bpu = _UNIT[bits]
    return MappingProxyType(dict(
        GS=group_size, BLOCK_G=max(1, block // (rpg * run)), RUN=run, RPG=rpg, K=min(4, run),
        N=hadamard_size, LOG2N=hadamard_size.bit_length() - 1, SCALE=inv_sqrt(hadamard_size),
        BITS=bits, CPU=cpu, BPU=bpu, WORDS=32 % bits == 0 and run % (32 // bits) == 0))


def _block(t: torch.Tensor) -> int:
    return per_program(t, BLOCK_ELEMS, GPU_BLOCK_ELEMS)


def rotate(x: torch.Tensor, hadamard_size: int) -> torch.Tensor:
    """1-D x (numel % hadamard_size == 0) -> float32 ``x.view(-1, n) @ H``, flattened."""
    x = x.contiguous()
    out = torch.empty(x.numel(), dtype=torch.float32, device=x.device)
    n_rows = x.numel() // hadamard_size
    if n_rows:
        rows = max(1, _block(x) // hadamard_size)
        _rotate_kernel[(cdiv(n_rows, rows),)](
            x, out, n_rows, ROWS=rows, N=hadamard_size, LOG2N=hadamard_size.bit_length() - 1,
            SCALE=inv_sqrt(hadamard_size), num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def quantize(x: torch.Tensor, bits: int, group_size: int, hadamard_size: int,
             noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused rotate + group quantize -> (packed uint8 codes, float32 scales)."""
    x = x.contiguous()
    n_groups = x.numel() // group_size
    packed, scale = payload_buffers(packed_nbytes(x.numel(), bits), n_groups, x.device)
    if n_groups:
        k = _consts(bits, group_size, hadamard_size, _block(x))
        _launch_quantize(x, noise, packed.view(torch.int32) if k["WORDS"] else packed, scale,
                         0, n_groups, 1, 0, group_size, k)
    return packed, scale


def _launch_quantize(x: torch.Tensor, noise: torch.Tensor | None, packed: torch.Tensor,
                     scale: torch.Tensor, scale_off: int, n_groups: int, gpr: int,
                     row_words: int, group_size: int, k: dict,
                     tail: torch.Tensor | None = None) -> None:
    """One ``_quantize_kernel`` launch over flat ``x``; ``row_words > 0``: the wire of rows
    of ``gpr`` groups, ``x`` flat or its rows (``triton_tiles.rows_of_groups``), a program
    per ``BLOCK_G`` groups of a row (``triton_noise.row_launch``); the scales ``scale_off``
    elements into ``scale`` (float32, or a wire's int32 words); ``tail``'s rows after each
    row's scales (a wire's)."""
    _quantize_launch(_quantize_plan(x, x.dim() == 2, noise, scale_off, n_groups, gpr,
                                    row_words, group_size, k, tail),
                     x, noise, packed, scale, tail)


def _quantize_plan(x: torch.Tensor, xrows: bool, noise: torch.Tensor | None, scale_off: int,
                   n_groups: int, gpr: int, row_words: int, group_size: int, k: dict,
                   tail: torch.Tensor | None, runs: tuple[int, int] | None = None) -> tuple:
    """:func:`_launch_quantize`'s launch as :func:`_quantize_launch` takes it, no tensor
    held: ``(grid, float noise, the scalar arguments, the keywords)``; ``xrows``: ``x`` is
    read as its rows (``x.stride(0)`` apart), ``runs``: ``(run_tiles, run_gap)``, its values
    as equally spaced runs."""
    _, hashed, row = noise_operand(noise, x.numel(), x, group_size)
    _, t_row, t_n, tail_block = tail_operand(tail, x)
    grid, hashed = row_launch(x.numel(), n_groups, gpr, row_words, group_size, k["BLOCK_G"],
                              hashed, row)
    warps = min(NUM_WARPS, max(QUANT_WARPS, k["BLOCK_G"] * k["RPG"] // 32))
    kw = dict(**k, STOCHASTIC=noise is not None, HASH=hashed, ROWS=row_words > 0,
              XROWS=row_words > 0 and xrows, TAIL=tail_block, RUNS=runs is not None,
              num_warps=warps, enable_fp_fusion=False)
    return grid, noise is not None and noise.dtype != torch.int64, (
        row, scale_off, t_row, t_n, n_groups, gpr, row_words,
        x.stride(0) if xrows else 0, *(runs or (1, 0))), kw


def _quantize_launch(plan: tuple, x: torch.Tensor, noise: torch.Tensor | None,
                     packed: torch.Tensor, scale: torch.Tensor,
                     tail: torch.Tensor | None) -> None:
    """The ``_quantize_kernel`` launch of :func:`_quantize_plan`'s ``plan`` on these
    tensors."""
    grid, noise_flat, scalars, kw = plan
    u = x if noise is None else flat_contiguous(noise) if noise_flat else noise.contiguous()
    t = x if tail is None else tail if tail.stride(-1) == 1 else tail.contiguous()
    _quantize_kernel[grid](x, u, scalars[0], packed, scale, scalars[1], t, *scalars[2:], **kw)


def quantize_rows(x: torch.Tensor, rows: int, bits: int, group_size: int, hadamard_size: int,
                  noise: torch.Tensor | None = None,
                  tail: torch.Tensor | None = None) -> torch.Tensor:
    """The twin's ``quantize_rows`` written in place: the kernel stores every row's codes and
    scales into the uint8 ``[rows, nbytes]`` wire (its rows' int32 words; ``tail``'s rows
    after them, copied by the kernel), no ``cat``; codes in bytes, or rows not whole words,
    go through the twin's join. Rows of whole groups are read in place
    (``triton_tiles.rows_of_groups``). The launch is planned once per signature
    (``launch_plans.py``)."""
    plan = _row_plans((signature(x), rows, bits, group_size, hadamard_size, signature(noise),
                       signature(tail)), x, rows, bits, group_size, hadamard_size, noise, tail)
    return _rows_by_plan(plan, x, rows, bits, group_size, hadamard_size, noise, tail)


def planned_quantize_rows(rows: int, bits: int, group_size: int, hadamard_size: int
                          ) -> Callable[..., torch.Tensor]:
    """:func:`quantize_rows` as ``(x, noise, tail) -> wire`` for operands of one signature
    (``launch_plans.planned_once``): no plan lookup per call."""
    return planned_once(
        lambda x, noise, tail: _row_plan(x, rows, bits, group_size, hadamard_size, noise, tail),
        lambda plan, x, noise, tail: _rows_by_plan(plan, x, rows, bits, group_size,
                                                   hadamard_size, noise, tail))


def _rows_by_plan(plan: tuple | None, x: torch.Tensor, rows: int, bits: int, group_size: int,
                  hadamard_size: int, noise: torch.Tensor | None,
                  tail: torch.Tensor | None) -> torch.Tensor:
    """:func:`quantize_rows` with its :func:`_row_plan` (None: the twin's join)."""
    if plan is None:
        return join_rows(*quantize(x, bits, group_size, hadamard_size, noise), rows, tail)
    copy, width, launch = plan
    if copy:
        x = flat_contiguous(x)
    wire = torch.empty(rows, width, dtype=torch.uint8, device=x.device)
    _quantize_launch(launch, x, noise, wire, wire, tail)   # its words, in the kernel
    return wire


def _row_plan(x: torch.Tensor, rows: int, bits: int, group_size: int, hadamard_size: int,
              noise: torch.Tensor | None, tail: torch.Tensor | None) -> tuple | None:
    """:func:`quantize_rows`' launch on operands of these signatures: ``(x copied flat
    first: read flat and not contiguous, the wire's width, :func:`_quantize_plan`)``; None
    where the twin's join makes the wire (codes in bytes, rows not whole words). A
    contiguous ``x`` is read flat as it is (the kernel takes its pointer: no view); runs of
    one length equally spaced in place (``triton_tiles.spaced_runs``)."""
    n_groups = x.numel() // group_size
    k = _consts(bits, group_size, hadamard_size, _block(x))
    runs = spaced_runs(x, rows, k["BLOCK_G"] * group_size)
    flat = runs is None and rows_of_groups(x, rows, group_size) is None
    gpr = n_groups // rows
    code_bytes = packed_nbytes(gpr * group_size, bits)
    width = code_bytes + 4 * gpr + tail_nbytes(tail)
    if not (k["WORDS"] and n_groups) or width % 4:
        return None
    return flat and not x.is_contiguous(), width, _quantize_plan(
        x, not flat, noise, code_bytes // 4, n_groups, gpr, width // 4, group_size, k, tail,
        runs)


_row_plans = LaunchPlans(_row_plan)


def _dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                hadamard_size: int, dtype: torch.dtype, inverse: bool,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``triton_dequantize_sum`` (both read in place through their row strides), 16-bit
    outputs clipped to their range as the twin's ``finite_range``; into ``out`` if given."""
    return _dsum.dequantize_sum(packed, scale, bits, group_size, dtype, hadamard_size, inverse,
                                clip=True, out=out)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
               hadamard_size: int, dtype: torch.dtype = torch.float32,
               inverse: bool = True) -> torch.Tensor:
    """Dequantize, then (``inverse``) rotate back, in float32; cast to ``dtype`` last."""
    return _dequantize(packed.reshape(1, -1), scale.reshape(1, -1), bits, group_size,
                       hadamard_size, dtype, inverse)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                   hadamard_size: int, inverse: bool = True,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of P peers in the rotated domain, then one inverse rotation (SDP4Bit 3.3). float32;
    ``out``: written there (numel values)."""
    return _dequantize(packed, scale, bits, group_size, hadamard_size, torch.float32, inverse,
                       out)


def dequantize_sum_wire(wire: torch.Tensor, code_bytes: int, n_groups: int, bits: int,
                        group_size: int, hadamard_size: int, inverse: bool = True,
                        out: torch.Tensor | None = None,
                        post: tuple[str, float] | None = None,
                        riders: tuple | None = None) -> torch.Tensor:
    """:func:`dequantize_sum` of the payloads in the rows of the uint8 wire ``[P, width]``,
    their fields read in place (``triton_dequantize_sum.dequantize_sum_wire``); into
    ``out`` (any float dtype, no clipping: a sum's output, as the twin's), ``post``
    applied (``post_op.py``), ``riders`` summed, in the kernel."""
    return _dsum.dequantize_sum_wire(wire, code_bytes, n_groups, bits, group_size,
                                     torch.float32 if out is None else out.dtype,
                                     hadamard_size, inverse, clip=False, out=out, post=post,
                                     riders=riders)


def planned_sum_wire(code_bytes: int, n_groups: int, bits: int, group_size: int,
                     hadamard_size: int, inverse: bool, dtype: torch.dtype,
                     post: tuple[str, float] | None, rider_sum: tuple | None
                     ) -> Callable[..., torch.Tensor]:
    """:func:`dequantize_sum_wire` into an ``out`` of ``dtype`` as ``(wire, out, riders_out)
    -> out`` for operands of one signature (``triton_dequantize_sum.planned_sum_wire``)."""
    return _dsum.planned_sum_wire(code_bytes, n_groups, bits, group_size, dtype,
                                  hadamard_size, inverse, False, post, rider_sum)
