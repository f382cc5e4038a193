"""Decode-and-sum of P peers' group-quantized payloads in one Triton kernel (ZeRO++ 3.2, SDP4Bit
3.3), for ``triton_group_quant`` and ``triton_hadamard``: bit-exact with the torch twins
``group_quant.decode_sum`` and ``hadamard.dequantize_sum`` / ``dequantize``.

Bit-exact by construction: each code ``c`` becomes ``c - 2**(bits-1)`` exactly (the float
``2**23 + c``, built on the bits, minus ``2**23 + 2**(bits-1)``), times its group's scale,
peers added in order 0..P-1 from peer 0's product, the optional inverse rotation as the
twin's butterfly (``hadamard.py``: add/sub stages ``h = 1, 2, .., n/2``, one multiply by
``inv_sqrt(n)``), launches compiled with ``enable_fp_fusion=False`` (no FMA).

A thread owns rows of ``ROWV`` consecutive values of one group (``UPR`` packing units of
``UB`` bytes, ``UC`` codes each) and rotates a row's Hadamard blocks (up to ``ROW_MAX``) in
its registers: one scale load per row and peer, the units read as int32 words (vectors of up
to 4) where the payload is 4-byte aligned, else byte by byte; the peers unrolled (a
compile-time count up to ``MAX_UNROLL``, a loop beyond). ``packed`` (P, nbytes) and ``scale``
(P, groups) are read in place through their row strides: they may be column slices of one
uint8 wire ``[P, row]`` (``scale`` viewed as float32, see :func:`dequantize_sum`).
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Callable

import torch
import triton
import triton.language as tl

from .hadamard import inv_sqrt
from .launch_plans import LaunchPlans, planned_once, signature
from .packing import wire_fields, wire_words
from .post_op import launch_args, sum_riders
from .triton_butterfly import fwht, fwht_runs
from .triton_noise import wire_pointers
from .triton_tiles import OLDER_TRITON, cdiv, per_program, run_offset, spaced_runs

#: values per program under TRITON_INTERPRET (few large programs: its cost is per program);
#: on a GPU ``GPU_ROWS`` rows per program, one per thread of ``NUM_WARPS`` warps (<= 128
#: registers and no spill on sm_90: tests/test_gpu_registers.py)
BLOCK_ELEMS, NUM_WARPS = 4096, 8
GPU_ROWS = 32 * NUM_WARPS
#: riders (``comm/riders.py``) per program under TRITON_INTERPRET; on a GPU 4 per thread
TAIL_BLOCK = 4096
#: peers summed in straight-line code (a compiled variant per count); more run in a loop, as
#: do byte loads of more than ``MAX_UNROLL_BYTES`` per thread (a register each, all in flight)
MAX_UNROLL, MAX_UNROLL_BYTES = 16, 32
#: Triton < 3.9 keeps every unrolled peer's loads in flight: past ``OLDER_UNROLL_ROW_BYTES``
#: per thread (16 peers of int8 rows of 32 values: 512) that is 150 registers (> 128); there
#: more peers run in the loop (108-112 registers, 8.5 SASS per peer value either way). Triton
#: 3.9 unrolls them in 80 (6.0; the loop: 7.8).
OLDER_UNROLL_ROW_BYTES = 256
#: the largest Hadamard block rotated inside a thread's row; a row's bytes of one peer (if
#: its values lie in one group): 8-byte loads
ROW_MAX, ROW_BYTES = 32, 8


@triton.jit
def _bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even as torch (NaN -> 0x7FC0); on the bits
    because the interpreter's float32 -> bfloat16 cast truncates."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r)


@triton.jit
def _rotate(x, R: tl.constexpr, ROWV: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr,
            SCALE: tl.constexpr):
    """Normalized Walsh-Hadamard transform of every N-block of an (ROWV / 4, R, 4) tile: in
    each thread's row where N divides it (``triton_butterfly.fwht_runs``), else on the rows'
    N-blocks in memory order."""
    if N <= ROWV:
        y = fwht_runs(tl.reshape(x, (ROWV // 4, 1, R, 4)), ROWV // 4, 1, R, 4, LOG2N, SCALE)
        return tl.reshape(y, (ROWV // 4, R, 4))
    y = fwht(tl.reshape(tl.permute(x, (1, 0, 2)), (R * ROWV // N, N)), R * ROWV // N, N, LOG2N,
             SCALE)
    return tl.permute(tl.reshape(y, (R, ROWV // 4, 4)), (1, 0, 2))


@triton.jit
def _peer(src_ptr, scale_ptr, r, rmask, GS: tl.constexpr, BITS: tl.constexpr,
          ROWV: tl.constexpr, UPR: tl.constexpr, UB: tl.constexpr, UC: tl.constexpr,
          V: tl.constexpr, WORDS: tl.constexpr):
    """float32 values of one peer's rows ``r`` as an (ROWV / 4, R, 4) tile (row r's value
    ``4 * h + j`` at ``[h, r, j]``; masked rows 0)."""
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    # the row's units as (UPR / V, R, V): loads of V <= 4 consecutive words, 4V-byte aligned
    u = (r[None, :, None] * UPR + V * tl.arange(0, UPR // V)[:, None, None]
         + tl.arange(0, V)[None, None, :])
    umask = rmask[None, :, None]
    if WORDS:
        w = tl.load(tl.multiple_of(src_ptr + u, [4, 4, 4 * V]), mask=umask, other=0)
    else:
        w = tl.zeros(u.shape, tl.int32)
        for m in tl.static_range(UB):
            w = w | (tl.load(src_ptr + u * UB + m, mask=umask, other=0).to(tl.int32) << (8 * m))
    w = tl.reshape(tl.permute(w, (0, 2, 1)), (UPR, r.shape[0]))
    # unit k's codes 4 * a + j at [k, a, r, j]
    shift = BITS * (4 * tl.arange(0, UC // 4)[:, None] + tl.arange(0, 4)[None, :])
    code = (w[:, None, :, None] >> shift[None, :, None, :]) & ((1 << BITS) - 1)
    code = tl.reshape(code, (ROWV // 4, r.shape[0], 4))
    # 2**23 + code exactly, on the bits; minus 2**23 + 2**(bits-1): code - 2**(bits-1), exact
    q = (code | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + QMAX + 1)
    s = tl.load(scale_ptr + r // (GS // ROWV), mask=rmask, other=0)
    return q * s.to(tl.float32, bitcast=True)[None, :, None]


@triton.jit
def _post(total, post, POST: tl.constexpr):
    """A reduce op's last step (``post_op.py``): ``POST`` 1 / 2 divided (IEEE) / multiplied
    by ``post``, 0 as it is."""
    if POST == 1:
        total = tl.math.div_rn(total, tl.zeros_like(total) + post)
    elif POST == 2:
        total = total * post
    return total


@triton.jit
def _rider(ptr, mask, BF16: tl.constexpr):
    """float32 of riders (``BF16``: bfloat16 bits as uint16, widened on the bits; else
    float32 / float16 values, converted exactly)."""
    if BF16:
        return (tl.load(ptr, mask=mask, other=0).to(tl.uint32) << 16).to(tl.float32,
                                                                           bitcast=True)
    return tl.load(ptr, mask=mask, other=0).to(tl.float32)


@triton.jit
def _rider_sum(tail_ptr, tail_off, tail_stride, out_ptr, n_tail, n_peers, pid, post,
               POST: tl.constexpr, BLOCK: tl.constexpr, IN_BF16: tl.constexpr,
               OUT_BF16: tl.constexpr):
    """Riders (``comm/riders.py``): ``BLOCK`` of the ``n_tail`` values that end each peer's
    row (``tail_off`` elements into row 0, rows ``tail_stride`` apart) summed in float32 in
    peer order 0..n_peers-1, the reduce op's last step applied, written to ``out_ptr``. A
    uint8 ``tail_ptr`` is the wire itself: riders of ``out_ptr``'s type."""
    if tail_ptr.dtype.element_ty == tl.uint8:
        tail_ptr = tail_ptr.to(out_ptr.dtype, bitcast=True)
    e = pid * BLOCK + tl.arange(0, BLOCK)
    mask = e < n_tail
    src = tail_ptr + tail_off + e
    total = _rider(src, mask, IN_BF16)
    for _ in range(1, n_peers):
        src += tail_stride
        total = total + _rider(src, mask, IN_BF16)
    total = _post(total, post, POST)
    if OUT_BF16:
        total = _bf16_bits(total)
    tl.store(out_ptr + e, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dequantize_sum_kernel(src_ptr, scale_ptr, out_ptr, n_rows, n_peers, src_stride,
                           scale_stride, scale_off, BIG, post, tail_ptr, tail_off, tail_stride,
                           tail_out_ptr, n_tail, n_main, tail_post, run_tiles, run_gap,
                           PEERS: tl.constexpr,
                           GS: tl.constexpr, BITS: tl.constexpr, ROWV: tl.constexpr,
                           UPR: tl.constexpr, UB: tl.constexpr, UC: tl.constexpr,
                           V: tl.constexpr, WORDS: tl.constexpr,
                           R: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr,
                           SCALE: tl.constexpr, INVERSE: tl.constexpr, CLIP: tl.constexpr,
                           OUT_BF16: tl.constexpr, POST: tl.constexpr, TAIL: tl.constexpr,
                           TAIL_BLOCK: tl.constexpr, TAIL_IN_BF16: tl.constexpr,
                           TAIL_OUT_BF16: tl.constexpr, TAIL_POST: tl.constexpr,
                           RUNS: tl.constexpr):
    """Sum over peers 0..n_peers-1 (``PEERS`` of them unrolled, 0: a runtime loop) of ``R``
    rows, then the optional inverse rotation of its ``N``-blocks; ``POST`` 1 / 2: divided
    (IEEE) / multiplied by ``post`` (a reduce op's AVG / PREMUL_SUM, ``post_op.py``);
    ``CLIP``: values past +-``BIG`` (a 16-bit output's largest) clipped to it (NaN stays
    NaN). The scales start ``scale_off`` elements past ``scale_ptr``, float32 or their bits
    in int32 words (a wire's, :func:`dequantize_sum_wire`). ``TAIL``: the programs from
    ``n_main`` on (their rows all past ``n_rows``) sum the peers' riders instead
    (:func:`_rider_sum`, their own reduce op's step ``TAIL_POST`` by ``tail_post``).
    ``RUNS``: the output is runs of ``run_tiles`` programs' values ``run_gap`` apart
    (``triton_tiles.spaced_runs``)."""
    if TAIL:
        if tl.program_id(0) >= n_main:
            _rider_sum(tail_ptr, tail_off, tail_stride, tail_out_ptr, n_tail, n_peers,
                       tl.program_id(0) - n_main, tail_post, TAIL_POST, TAIL_BLOCK,
                       TAIL_IN_BF16, TAIL_OUT_BF16)
    src_ptr, scale_ptr = wire_pointers(src_ptr, scale_ptr, scale_off, WORDS)  # a wire's bytes
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    rmask = r < n_rows
    total = _peer(src_ptr, scale_ptr, r, rmask, GS, BITS, ROWV, UPR, UB, UC, V, WORDS)
    if PEERS > 0:
        for _ in tl.static_range(1, PEERS):
            src_ptr += src_stride  # 64-bit pointer steps: no int32 offset overflow
            scale_ptr += scale_stride
            total = total + _peer(src_ptr, scale_ptr, r, rmask, GS, BITS, ROWV, UPR, UB, UC,
                                  V, WORDS)
    else:
        for _ in range(1, n_peers):
            src_ptr += src_stride
            scale_ptr += scale_stride
            total = total + _peer(src_ptr, scale_ptr, r, rmask, GS, BITS, ROWV, UPR, UB, UC,
                                  V, WORDS)
    if INVERSE:
        total = _rotate(total, R, ROWV, N, LOG2N, SCALE)
    total = _post(total, post, POST)
    if CLIP:
        total = tl.where(total > BIG, BIG, tl.where(total < -BIG, -BIG, total))
    if RUNS:    # the gaps before this program's run of the output
        out_ptr += run_offset(tl.program_id(0), run_tiles, run_gap)
    e = (r[None, :, None] * ROWV + 4 * tl.arange(0, ROWV // 4)[:, None, None]
         + tl.arange(0, 4)[None, None, :])
    ES: tl.constexpr = out_ptr.dtype.element_ty.primitive_bitwidth // 8
    out = tl.multiple_of(out_ptr + e, [ES, ES, 4 * ES])  # 16-byte aligned (the caller's)
    if OUT_BF16:
        total = _bf16_bits(total)
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=rmask[None, :, None])


@functools.cache
def row_layout(bits: int, group_size: int, hadamard_size: int = 1) -> MappingProxyType:
    """A thread row's constants: ``ROWV`` values inside one group (whole Hadamard blocks up
    to ``ROW_MAX``) in ``UPR`` units of ``UB`` bytes / ``UC`` codes: a 32-bit word of
    ``32 / bits`` codes where one lies in a group, else 4 codes (``group_size`` a multiple
    of 4). Cached per argument tuple (the launches' Python cost): read-only."""
    if group_size % 4:
        raise ValueError(f"group_size={group_size} is not a multiple of 4")
    word = bits != 6 and group_size % (32 // bits) == 0
    ub, uc = (4, 32 // bits) if word else (bits // 2, 4)
    per_row = 1 << ((ROW_BYTES * 8 // bits).bit_length() - 1)  # a power of two
    rowv = max(uc, per_row, hadamard_size if hadamard_size <= ROW_MAX else 1)
    rowv = rowv if group_size % rowv == 0 else uc
    return MappingProxyType(dict(ROWV=rowv, UPR=rowv // uc, UB=ub, UC=uc))


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` as 2-D rows with unit column stride (a copy only where the columns are not)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _source(packed: torch.Tensor, upr: int) -> tuple[torch.Tensor, int]:
    """What the kernel reads and the words per load ``V``: ``packed`` (P, nbytes) as int32
    words (a view) where its start and row stride are multiples of 4 bytes, ``V`` the largest
    power of two <= min(upr, 4) their alignment allows; else the bytes (``V`` 0)."""
    if packed.storage_offset() % 4 or (packed.shape[0] > 1 and packed.stride(0) % 4):
        return packed, 0
    if packed.shape[0] > 1:
        words = packed.view(torch.int32)    # its strides: (row stride, 1), a multiple of 4
    else:   # one row: its stride set to its width (the kernel steps by it)
        words = torch.as_strided(packed, packed.shape, (packed.shape[1], 1)).view(torch.int32)
    return words, _vector(words, upr)


def _vector(words: torch.Tensor, upr: int) -> int:
    """Words per load ``V``: the largest power of two <= min(upr, 4) that the start and the
    row stride of ``words`` (int32 ``[P, n]``) allow."""
    v = min(upr, 4)
    while v > 1 and (words.data_ptr() % (4 * v) or words.stride(0) % v):
        v //= 2
    return v


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                   dtype: torch.dtype = torch.float32, hadamard_size: int = 1,
                   inverse: bool = False, clip: bool = False,
                   out: torch.Tensor | None = None,
                   post: tuple[str, float] | None = None) -> torch.Tensor:
    """Sum over P peers, in order 0..P-1: ``packed`` uint8 (P, nbytes), ``scale`` float32
    (P, groups) -> 1-D ``dtype`` (groups * group_size,); ``inverse``: then every
    ``hadamard_size`` block rotated back (SDP4Bit 3.3); ``clip``: finite values of a 16-bit
    ``dtype`` clipped to its largest.

    Both are read in place through their row strides (columns of stride 1, else copied):
    e.g. column slices of one uint8 wire ``[P, row]``, ``scale`` as the float32 view
    ``wire.view(torch.float32)[:, off // 4:off // 4 + groups]``; that view needs ``off`` and
    the wire's row stride multiples of 4 bytes, else the caller copies the slice. ``packed``
    is read as int32 words where its start and row stride are multiples of 4 bytes.

    ``out``: the caller's 1-D ``dtype`` buffer of ``groups * group_size`` values, written in
    place (e.g. a reduce-scatter's output) where it is contiguous and 16-byte aligned, else
    through a fresh buffer and one copy; returned. ``post``: the sum (rotated back) divided
    or multiplied first, a reduce op's last step (``post_op.py``; no pass of its own)."""
    packed, scale = _strided(packed), _strided(scale)
    k = row_layout(bits, group_size, hadamard_size if inverse else 1)
    src, v = _source(packed, k["UPR"]) if k["UB"] == 4 else (packed, 0)
    return _sum(src, v, scale, 0, scale.stride(0), *scale.shape, bits, group_size, dtype,
                hadamard_size, inverse, clip, out, post)


def dequantize_sum_wire(wire: torch.Tensor, code_bytes: int, n_groups: int, bits: int,
                        group_size: int, dtype: torch.dtype = torch.float32,
                        hadamard_size: int = 1, inverse: bool = False, clip: bool = False,
                        out: torch.Tensor | None = None,
                        post: tuple[str, float] | None = None,
                        riders: tuple | None = None) -> torch.Tensor:
    """:func:`dequantize_sum` of the P payloads in the rows of the uint8 wire ``[P, width]``
    (row p: ``code_bytes`` of codes, then ``n_groups`` float32 scales; more bytes may follow,
    e.g. riders): the kernel reads both fields in place through the wire's int32 words, the
    scales at their word offset (no view per field), where the wire's start, row stride,
    width and ``code_bytes`` are multiples of 4 bytes; else through
    :func:`packing.wire_fields`. ``riders``: ``(out [E], dtype, post)``, each row ends with
    E values of ``dtype`` (``comm/riders.py``): their float32 sum in peer order, their
    ``post`` applied, written into ``out`` (contiguous) by the same launch
    (``post_op.sum_riders``' numbers). The launch is planned once per signature
    (``launch_plans.py``)."""
    args = (wire, code_bytes, n_groups, bits, group_size, dtype, hadamard_size, inverse, clip,
            out, post, riders)
    plan = _wire_plans((signature(wire), wire.storage_offset() % 4, *args[1:9], signature(out),
                        post, None if riders is None else (signature(riders[0]), *riders[1:])),
                       *args)
    return _sum_by_plan(plan, *args)


def planned_sum_wire(code_bytes: int, n_groups: int, bits: int, group_size: int,
                     dtype: torch.dtype, hadamard_size: int, inverse: bool, clip: bool,
                     post: tuple[str, float] | None, rider_sum: tuple | None
                     ) -> Callable[..., torch.Tensor]:
    """:func:`dequantize_sum_wire` as ``(wire, out, riders_out) -> out`` for operands of one
    signature (``launch_plans.planned_once``: no plan lookup per call); ``rider_sum``: the
    riders' ``(dtype, post)``, None without riders."""
    def args(wire: torch.Tensor, out: torch.Tensor | None,
             riders_out: torch.Tensor | None) -> tuple:
        return (wire, code_bytes, n_groups, bits, group_size, dtype, hadamard_size, inverse,
                clip, out, post, None if rider_sum is None else (riders_out, *rider_sum))
    return planned_once(lambda *a: _wire_plan(*args(*a)),
                        lambda plan, *a: _sum_by_plan(plan, *args(*a)))


def _sum_by_plan(plan: tuple | None, wire: torch.Tensor, code_bytes: int, n_groups: int,
                 bits: int, group_size: int, dtype: torch.dtype, hadamard_size: int,
                 inverse: bool, clip: bool, out: torch.Tensor | None,
                 post: tuple[str, float] | None, riders: tuple | None) -> torch.Tensor:
    """:func:`dequantize_sum_wire` with its :func:`_wire_plan` (None: :func:`_sum_wire`)."""
    if plan is None:
        return _sum_wire(wire, code_bytes, n_groups, bits, group_size, dtype, hadamard_size,
                         inverse, clip, out, post, riders)
    numel, launch = plan
    if out is None:
        out = torch.empty(numel, dtype=dtype, device=wire.device)
    _launch(launch, wire, wire, out, dtype, riders)   # its words, in the kernel
    return out


def _sum_wire(wire: torch.Tensor, code_bytes: int, n_groups: int, bits: int,
              group_size: int, dtype: torch.dtype, hadamard_size: int, inverse: bool,
              clip: bool, out: torch.Tensor | None, post: tuple[str, float] | None,
              riders: tuple | None) -> torch.Tensor:
    """:func:`dequantize_sum_wire` deciding at the call (where no plan launches)."""
    k = row_layout(bits, group_size, hadamard_size if inverse else 1)
    words = wire_words(wire) if code_bytes % 4 == 0 and k["UB"] == 4 else None
    if words is None:
        total = dequantize_sum(*wire_fields(wire, code_bytes, n_groups), bits, group_size,
                               dtype, hadamard_size, inverse, clip, out, post)
        if riders is not None:
            sum_riders(wire, riders)
        return total
    return _sum(words, _vector(words, k["UPR"]), words, code_bytes // 4, words.stride(0),
                wire.shape[0], n_groups, bits, group_size, dtype, hadamard_size, inverse, clip,
                out, post, riders)


def _wire_plan(wire: torch.Tensor, code_bytes: int, n_groups: int, bits: int,
               group_size: int, dtype: torch.dtype, hadamard_size: int, inverse: bool,
               clip: bool, out: torch.Tensor | None, post: tuple[str, float] | None,
               riders: tuple | None) -> tuple | None:
    """:func:`dequantize_sum_wire`'s launch on operands of these signatures: ``(the values
    out, :func:`_launch_plan`)``, the fields read through the wire's words; None where
    :func:`_sum_wire` goes another way (fields not in words, ``out`` copied after, nothing to
    sum, ``out`` the wrong size: it raises). ``out`` may be runs of one length equally
    spaced (a root unit's compressed gradient columns), written in place."""
    k = row_layout(bits, group_size, hadamard_size if inverse else 1)
    words = wire_words(wire) if code_bytes % 4 == 0 and k["UB"] == 4 else None
    numel, n_peers = n_groups * group_size, wire.shape[0]
    if words is None or not (numel and n_peers):
        return None
    runs = None if out is None or out.is_contiguous() else spaced_runs(
        out, 1, _rows_per_program(words, k, hadamard_size) * k["ROWV"])
    if out is not None and not (
            out.numel() == numel and out.dtype == dtype and out.data_ptr() % 16 == 0
            and (out.is_contiguous() or runs is not None
                 and runs[1] * out.element_size() % 16 == 0)):
        return None
    return numel, _launch_plan(words, _vector(words, k["UPR"]), code_bytes // 4,
                               words.stride(0), n_peers, n_groups, bits, group_size, dtype,
                               hadamard_size, inverse, clip, post, riders, runs)


_wire_plans = LaunchPlans(_wire_plan)


def _tail(words: torch.Tensor, riders: tuple) -> tuple:
    """The kernel's view of the riders that end the wire's rows (``words``, its int32
    view): ``(values [P, width] of their dtype (bfloat16 as uint16 bits), the offset of row
    0's first, the row stride, the flat output (bfloat16 as uint16 bits), E)``."""
    out, dtype, _ = riders
    n = out.numel()
    values = words.view(torch.uint16 if dtype == torch.bfloat16 else dtype)
    flat = out.view(-1)
    return (values, values.shape[1] - n, values.stride(0) if values.shape[0] > 1 else 0,
            flat.view(torch.uint16) if flat.dtype == torch.bfloat16 else flat, n)


def _sum(src: torch.Tensor, v: int, scale: torch.Tensor, scale_off: int, scale_stride: int,
         n_peers: int, n_groups: int, bits: int, group_size: int, dtype: torch.dtype,
         hadamard_size: int, inverse: bool, clip: bool,
         out: torch.Tensor | None, post: tuple[str, float] | None = None,
         riders: tuple | None = None) -> torch.Tensor:
    """One ``_dequantize_sum_kernel`` launch: ``src`` the codes (int32 words read ``V`` at a
    time, ``v`` > 0, else bytes), the scales ``scale_off`` elements into ``scale``, rows
    ``scale_stride`` apart; ``out`` and ``post`` as :func:`dequantize_sum`; ``riders`` as
    :func:`dequantize_sum_wire` (``src`` a wire's words), summed by programs of their own."""
    numel = n_groups * group_size
    if out is not None and (out.numel() != numel or out.dtype != dtype):
        raise ValueError(f"dequantize_sum: out holds {out.numel()} {out.dtype} values, "
                         f"expected {numel} {dtype}")
    if out is not None and not (out.is_contiguous() and out.data_ptr() % 16 == 0):
        return out.copy_(_sum(src, v, scale, scale_off, scale_stride, n_peers, n_groups, bits,
                              group_size, dtype, hadamard_size, inverse, clip, None,
                              post, riders).view(out.shape))
    if out is None:
        out = torch.empty(numel, dtype=dtype, device=src.device)
    if not (numel and n_peers):
        if riders is not None and n_peers:
            sum_riders(src.view(torch.uint8), riders)
        return out
    _launch(_launch_plan(src, v, scale_off, scale_stride, n_peers, n_groups, bits, group_size,
                         dtype, hadamard_size, inverse, clip, post, riders),
            src, scale, out, dtype, riders)
    return out


def _rows_per_program(src: torch.Tensor, k: MappingProxyType, hadamard_size: int) -> int:
    """``R``: the rows of ``ROWV`` values a program sums (whole Hadamard blocks)."""
    return max(per_program(src, BLOCK_ELEMS // k["ROWV"], GPU_ROWS), hadamard_size // k["ROWV"])


def _launch_plan(src: torch.Tensor, v: int, scale_off: int, scale_stride: int, n_peers: int,
                 n_groups: int, bits: int, group_size: int, dtype: torch.dtype,
                 hadamard_size: int, inverse: bool, clip: bool,
                 post: tuple[str, float] | None, riders: tuple | None,
                 runs: tuple[int, int] | None = None) -> tuple:
    """:func:`_sum`'s launch as :func:`_launch` takes it, no tensor held: ``(grid, the scalar
    arguments, the riders' view dtypes (values, output: None as it is; whether they are one)
    or None, the keywords)``; ``runs``: ``(run_tiles, run_gap)`` of an output of equally
    spaced runs."""
    numel = n_groups * group_size
    k = row_layout(bits, group_size, hadamard_size if inverse else 1)
    rows = _rows_per_program(src, k, hadamard_size)
    n_rows = numel // k["ROWV"]
    n_main, value, kind = cdiv(n_rows, rows), *launch_args(post)
    t, t_off, t_stride, t_out, n_tail = (src, 0, 0, None, 0) if riders is None else \
        _tail(src, riders)
    t_value, t_kind = launch_args(None if riders is None else riders[2])
    t_block = per_program(src, TAIL_BLOCK, 4 * 32 * NUM_WARPS)
    views = None if riders is None else (
        t.dtype, None if t_out.dtype == riders[0].dtype else t_out.dtype, t.dtype == t_out.dtype)
    kw = dict(R=rows, **_sum_consts(bits, group_size, hadamard_size, inverse, clip, dtype,
                                    n_peers, v),
              POST=kind, TAIL=riders is not None, TAIL_BLOCK=t_block,
              TAIL_IN_BF16=t.dtype == torch.uint16,
              TAIL_OUT_BF16=t_out is not None and t_out.dtype == torch.uint16,
              TAIL_POST=t_kind, RUNS=runs is not None, num_warps=NUM_WARPS,
              enable_fp_fusion=False)
    return ((n_main + cdiv(n_tail, t_block),), (
        n_rows, n_peers, src.stride(0), scale_stride, scale_off, _largest(dtype), value,
        t_off, t_stride, n_tail, n_main, t_value, *(runs or (1, 0))), views, kw)


def _launch(plan: tuple, src: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
            dtype: torch.dtype, riders: tuple | None) -> None:
    """The ``_dequantize_sum_kernel`` launch of :func:`_launch_plan`'s ``plan`` on these
    tensors (``riders``' views made here)."""
    grid, scalars, views, kw = plan
    t, t_out = src, out
    if riders is not None:
        # read off a uint8 wire itself where they are the output's type (no view)
        t = src if views[2] and src.dtype == torch.uint8 else src.view(views[0])
        t_out = riders[0] if riders[0].dim() == 1 else riders[0].view(-1)
        t_out = t_out if views[1] is None else t_out.view(views[1])
    _dequantize_sum_kernel[grid](
        src, scale, out.view(torch.uint16) if dtype == torch.bfloat16 else out, *scalars[:7],
        t, *scalars[7:9], t_out, *scalars[9:], **kw)


@functools.cache
def _largest(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max


@functools.cache
def _sum_consts(bits: int, group_size: int, hadamard_size: int, inverse: bool, clip: bool,
                dtype: torch.dtype, n_peers: int, v: int) -> MappingProxyType:
    """``_dequantize_sum_kernel``'s constants but the rows per program ``R``: the peer loop
    unrolled up to ``MAX_UNROLL`` peers (``MAX_UNROLL_BYTES`` per thread in byte loads;
    ``OLDER_UNROLL_ROW_BYTES`` on Triton < 3.9).
    Cached per argument tuple (the launches' Python cost): read-only."""
    k = row_layout(bits, group_size, hadamard_size if inverse else 1)
    row_bytes = n_peers * k["UPR"] * k["UB"]
    unroll = n_peers <= MAX_UNROLL and (v or row_bytes <= MAX_UNROLL_BYTES) and \
        not (OLDER_TRITON and row_bytes > OLDER_UNROLL_ROW_BYTES)
    return MappingProxyType(dict(
        PEERS=n_peers if unroll else 0, GS=group_size, BITS=bits, **k, V=max(v, 1),
        WORDS=v > 0, N=hadamard_size, LOG2N=hadamard_size.bit_length() - 1,
        SCALE=inv_sqrt(hadamard_size), INVERSE=inverse, CLIP=clip and dtype != torch.float32,
        OUT_BF16=dtype == torch.bfloat16))
