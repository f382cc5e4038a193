"""Triton twin of ``noise.py``: counter-based U[0, 1) noise, bit-exact with the torch twin.

The hash runs on uint32 lanes, the finalizer's own arithmetic: products wrap modulo 2**32
and right shifts are logical. A flat index enters as its low word ``i.to(tl.uint32)`` and
high word ``(i >> 32).to(tl.uint32)`` (the torch twin's ``(i & 0xFFFFFFFF) ^ k1`` and
``(i >> 32) ^ k2``), the keys as ``.to(tl.uint32)``: the same 32 bits as the torch twin's
int32 (or int64) lanes, and on a GPU one 32-bit multiply where int64 lanes took several
instructions and two registers per value.

``noise_at`` is what the quantize kernels call where they round: the noise of their flat
indices, hashed from the keys in registers (8 bytes read per program instead of 4 bytes per
value), or loaded from a noise tensor; ``noise_operand`` is its host side and picks the
kernel's ``HASH`` mode. Row keys (``(rows, 2)``, noise.py): index ``i`` is hashed as
``i % row_len`` under the keys of row ``i // row_len``. A kernel working on whole groups
whose rows are whole groups (``group_noise_at``: group quantize, Hadamard quantize, QSGD
buckets) finds the row and loads its keys once per group (``ROW_GROUPS``); otherwise the row
is a 32-bit division per value while every flat index fits in int32 (``ROW_KEYS``), a 64-bit
one past that (``ROW_KEYS_WIDE``, tensors of more than 2G values).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import noise
from .packing import flat_contiguous
from .triton_tiles import cdiv

#: values per program (few large programs: cheap under TRITON_INTERPRET; on GPU 16 lanes
#: per thread with ``NUM_WARPS`` warps)
BLOCK, NUM_WARPS = 4096, 8
MUL1, MUL2 = tl.constexpr(noise.MUL1), tl.constexpr(noise.MUL2)
#: the hash's low bits dropped, and the weight of the lowest kept one (noise.py's BITS)
SHIFT, ULP = tl.constexpr(32 - noise.BITS), tl.constexpr(1.0 / (1 << noise.BITS))

#: ``HASH`` of a kernel: float32 noise values, one key pair, row keys (a row per value,
#: 32-bit or 64-bit division), row keys found once per group (``group_noise_at``); and
#: inside a kernel whose program lies in one row of ``ROW_GROUPS`` keys: that row's key
#: pair at ``noise_ptr``, the indices within the row (``ROW_ONE``, never a launch's)
VALUES, ONE_KEY, ROW_KEYS, ROW_KEYS_WIDE, ROW_GROUPS, ROW_ONE = 0, 1, 2, 3, 4, 5
#: ``ROW_GROUPS`` and ``ROW_ONE`` as the constexprs a kernel compares ``HASH`` with
ROW_MODES = (tl.constexpr(ROW_GROUPS), tl.constexpr(ROW_ONE))
#: ``ROW_KEYS`` while every flat index is below this (int32)
INT32_INDICES = noise.INT32_INDICES


@triton.jit
def _fmix(x):
    """The 32-bit finalizer on uint32 lanes (wrapping products, logical shifts)."""
    x = x ^ (x >> 16)
    x = x * MUL1
    x = x ^ (x >> 15)
    x = x * MUL2
    return x ^ (x >> 16)


@triton.jit
def _uniform(h):
    """The kept top bits of uint32 hashes as float32 U[0, 1) (exact)."""
    return (h >> SHIFT).to(tl.float32) * ULP


@triton.jit
def hashed(i, k1, k2):
    """U[0, 1) of int64 flat indices ``i >= 0`` under uint32 keys (broadcast against ``i``)."""
    return _uniform(_fmix(_fmix(i.to(tl.uint32) ^ k1) ^ ((i >> 32).to(tl.uint32) ^ k2)))


@triton.jit
def hashed32(i, k1, k2):
    """``hashed`` of int32 flat indices ``0 <= i < 2**31`` (high word 0)."""
    return _uniform(_fmix(_fmix(i.to(tl.uint32) ^ k1) ^ k2))


@triton.jit
def row_keys(keys_ptr, r, mask):
    """The uint32 key pair of rows ``r`` (0 where masked)."""
    k1 = tl.load(keys_ptr + 2 * r, mask=mask, other=0).to(tl.uint32)
    k2 = tl.load(keys_ptr + 2 * r + 1, mask=mask, other=0).to(tl.uint32)
    return k1, k2


@triton.jit
def noise_at(noise_ptr, i, mask, HASH: tl.constexpr, row_len):
    """The rounding noise of int64 flat indices ``i``: hashed from the keys at ``noise_ptr``
    (``HASH`` ONE_KEY, or row keys with rows of ``row_len`` indices), else loaded from the
    float32 noise tensor at ``noise_ptr`` (0 where masked)."""
    tl.static_assert(HASH != 4, "ROW_GROUPS noise is group_noise_at's")
    if HASH == 3:  # ROW_KEYS_WIDE
        r = i // row_len
        k1, k2 = row_keys(noise_ptr, r, mask)
        u = hashed(i - r * row_len, k1, k2)
    elif HASH == 2:  # ROW_KEYS: every flat index < 2**31
        i32 = i.to(tl.int32)
        r = i32 // row_len
        k1, k2 = row_keys(noise_ptr, r, mask)
        u = hashed32(i32 - r * row_len, k1, k2)
    elif HASH == 1:
        u = hashed(i, tl.load(noise_ptr).to(tl.uint32), tl.load(noise_ptr + 1).to(tl.uint32))
    else:
        u = tl.load(noise_ptr + i, mask=mask, other=0.0)
    return u


@triton.jit
def group_noise_at(noise_ptr, i, mask, g, gmask, GS, HASH: tl.constexpr, row_len):
    """``noise_at`` of the int64 flat indices ``i`` of a tile of whole groups of ``GS`` values:
    ``g`` the (int32 or int64) group ids and ``gmask`` their mask, shaped to broadcast against
    ``i``. With ``ROW_GROUPS`` (rows of whole groups, below 2**31 groups and 2**31 values per
    row) each group's row and keys are found once, in 32 bits, and the index within the row
    is the low word of ``i`` minus that of the row's first index (exact below 2**31).
    ``ROW_ONE``: ``noise_ptr`` is one row's key pair and ``i`` indices within that row."""
    if HASH == 5:  # ROW_ONE: one row's keys, indices within it (below 2**31)
        u = hashed32(i.to(tl.int32), tl.load(noise_ptr).to(tl.uint32),
                     tl.load(noise_ptr + 1).to(tl.uint32))
    elif HASH == 4:  # ROW_GROUPS
        r = g.to(tl.int32) // (row_len // GS)
        k1, k2 = row_keys(noise_ptr, r, gmask)
        start = (r.to(tl.int64) * row_len).to(tl.int32)
        u = hashed32(i.to(tl.int32) - start, k1, k2)
    else:
        u = noise_at(noise_ptr, i, mask, HASH, row_len)
    return u


@triton.jit
def _uniform_kernel(keys_ptr, out_ptr, numel, row_len, HASH: tl.constexpr,
                    BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < numel
    tl.store(out_ptr + i, noise_at(keys_ptr, i, mask, HASH, row_len), mask=mask)


def noise_operand(noise: torch.Tensor | None, numel: int, unused: torch.Tensor,
                  group: int | None = None) -> tuple[torch.Tensor, int, int]:
    """A kernel's ``noise`` argument for ``numel`` roundings -> (the tensor its ``noise_ptr``
    points to, ``HASH``, ``row_len``): the keys (one pair, or ``(rows, 2)`` row keys, rows of
    ``numel // rows``), the float32 values (flat), or ``unused`` when None. ``group``: the
    kernel works on whole groups of that many values (``group_noise_at``), so row keys whose
    rows are whole groups take ``ROW_GROUPS``."""
    if noise is None:
        return unused, VALUES, 1
    if noise.dtype == torch.int64:
        if noise.dim() == 2 and noise.shape[1] == 2 and noise.shape[0] > 0 \
                and numel % noise.shape[0] == 0:
            row_len = max(numel // noise.shape[0], 1)
            if (group is not None and row_len % group == 0 and row_len <= INT32_INDICES
                    and numel // group < INT32_INDICES):
                mode = ROW_GROUPS
            else:
                mode = ROW_KEYS if numel <= INT32_INDICES else ROW_KEYS_WIDE
            return noise.contiguous(), mode, row_len
        if noise.shape != (2,):
            raise ValueError(f"noise keys must be an int64 tensor (k1, k2), or (rows, 2) row "
                             f"keys with rows dividing {numel}, got shape {tuple(noise.shape)}")
        return noise.contiguous(), ONE_KEY, 1
    if noise.dtype != torch.float32 or noise.numel() != numel:
        raise ValueError(f"noise must be {numel} float32 values or int64 keys (k1, k2), got "
                         f"{noise.dtype} with {noise.numel()} elements")
    return flat_contiguous(noise), VALUES, 1


@triton.jit
def row_program(x_ptr, packed_ptr, scale_ptr, noise_ptr, gpr, row_words, x_row,
                GS: tl.constexpr, HASH: tl.constexpr, XROWS: tl.constexpr):
    """A quantize kernel's program in a wire of rows (:func:`row_launch`'s 2-D grid): its
    pointers offset by its row (grid axis 1; the input's rows ``x_row`` values apart with
    ``XROWS``, else ``gpr`` groups; the wire's ``row_words`` words), the row's key pair
    where the keys are one pair per row (its noise then ``ROW_ONE``: indices within the row,
    base 0), else the flat index of the row's first value as the noise base."""
    row = tl.program_id(1).to(tl.int64)
    x_ptr += row * (x_row if XROWS else gpr * GS)
    nbase = 0
    if HASH == 4:   # ROW_GROUPS
        noise_ptr += 2 * row
    else:
        nbase = row * gpr * GS
    return x_ptr, packed_ptr + row * row_words, scale_ptr + row * row_words, noise_ptr, nbase


@triton.jit
def words_of(ptr):
    """A uint8 wire's pointer as its int32 words' (the launches pass the wire itself, planned
    on its 4-byte aligned start and whole-word row stride and fields: no dtype view per
    call on the host); any other pointer as it is."""
    if ptr.dtype.element_ty == tl.uint8:
        ptr = ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    return ptr


@triton.jit
def wire_pointers(codes_ptr, scale_ptr, scale_off, WORDS: tl.constexpr):
    """A kernel's codes and scales pointers: read as int32 words where they are a wire's
    bytes (:func:`words_of`; the codes only with ``WORDS``, else bytes they are), the scales
    ``scale_off`` elements on."""
    if WORDS:
        codes_ptr = words_of(codes_ptr)
    return codes_ptr, words_of(scale_ptr) + scale_off


#: rider values a kernel's program copies per step (``copy_values``)
TAIL_BLOCK = 1024


@triton.jit
def copy_values(dst_ptr, src_ptr, n, BLOCK: tl.constexpr):
    """``n`` values from ``src_ptr`` to ``dst_ptr`` (a wire row's riders, ``comm/riders.py``,
    into or out of the row: its int32 words given as a pointer of the values' dtype)."""
    for start in range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK)
        tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n), mask=i < n)


@triton.jit
def store_riders(scale_ptr, n_groups, tail_ptr, tail_row, tail_n, ROWS: tl.constexpr,
                 TAIL: tl.constexpr):
    """``TAIL > 0``: a quantize kernel's wire row's ``tail_n`` riders (its row of them,
    ``tail_row`` values apart with ``ROWS``) copied after the row's ``n_groups`` scales
    (``scale_ptr``: the row's first, as :func:`row_program` leaves it) by its first
    program."""
    if TAIL > 0:
        if tl.program_id(0) == 0:
            if ROWS:
                tail_ptr += tl.program_id(1).to(tl.int64) * tail_row
            words = scale_ptr + n_groups
            copy_values(words.to(tl.pointer_type(tail_ptr.dtype.element_ty), bitcast=True),
                        tail_ptr, tail_n, TAIL)


def tail_operand(tail: torch.Tensor | None,
                 unused: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """A kernel's riders ``tail`` (``[rows, E]``, or None) as its arguments: (the values,
    their row stride, ``E``, ``TAIL``: :data:`TAIL_BLOCK`, 0 without riders); columns of
    unit stride (else a copy: only where the kernel reads them)."""
    if tail is None:
        return unused, 0, 0, 0
    if tail.stride(-1) != 1:
        tail = tail.contiguous()
    return tail, tail.stride(0) if tail.shape[0] > 1 else 0, tail.shape[1], TAIL_BLOCK


def row_launch(numel: int, n_groups: int, gpr: int, row_words: int, group_size: int,
               block_g: int, hashed: int, row_len: int) -> tuple[tuple[int, ...], int]:
    """A quantize kernel's grid and ``HASH`` for ``n_groups`` groups of ``numel`` values,
    ``block_g`` a program: flat (``row_words == 0``), or a 2-D grid whose axis 1 is the rows
    of ``gpr`` whole groups (the kernel offsets its pointers by the row). There
    ``ROW_GROUPS`` keys must be one pair per row, which the kernel reads once (``ROW_ONE``);
    keys of other rows than the wire's are found per value from the flat index
    (``ROW_KEYS``, the same numbers)."""
    if not row_words:
        return (cdiv(n_groups, block_g),), hashed
    if numel != n_groups * group_size or n_groups % gpr:
        raise ValueError(f"a wire of rows holds whole rows of whole groups: got {numel} values "
                         f"in {n_groups} groups of {group_size}, {gpr} groups per row")
    if hashed == ROW_GROUPS and row_len != gpr * group_size:
        hashed = ROW_KEYS if n_groups * group_size <= INT32_INDICES else ROW_KEYS_WIDE
    return (cdiv(gpr, block_g), n_groups // gpr), hashed


def uniform_like(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """float32 U[0, 1) of ``x``'s shape on ``x``'s device (``x`` itself is never read);
    ``keys`` int64 ``(k1, k2)`` on ``x``'s device, each in ``[0, 2**32)``, or ``(rows, 2)``
    row keys."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    n = out.numel()
    if n:
        k, mode, row_len = noise_operand(keys, n, out)
        _uniform_kernel[(cdiv(n, BLOCK),)](k, out, n, row_len, HASH=mode, BLOCK=BLOCK,
                                           num_warps=NUM_WARPS)
    return out
