"""Bucket tiles shared by the Triton kernels of QSDP's bucketed quantizers (QSDP 5.1):
``triton_qsgd``, ``triton_random_shift`` and ``triton_learned_levels``.

Each program handles ``GROUPS`` buckets as a (GROUPS, BLOCK) tile, BLOCK the bucket size
rounded up to a power of two (masked). Kernels read and write one uint8 code per value (the
host packs and unpacks them), or the codes densely packed (``store_packed`` /
``load_packed``: the little-endian bit stream of ``packing.py`` and of odd bits in
``learned_levels.py``, code i in bits [i * bits, (i + 1) * bits)), and launch with
``enable_fp_fusion=False``, so no multiply-add is contracted into an FMA the torch twins do not
do. Also what every Triton module shares: the tile sizes, host-side ``cdiv``, the strided
rows and equally spaced runs the kernels read and write in place (``rows_of_groups``,
``spaced_runs`` and its device-side ``run_offset``). Imported only by Triton modules.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from .packing import pack_codes, unpack_codes

#: values per program: few large programs under TRITON_INTERPRET (its cost is per program);
#: on a GPU ``GPU_TILE`` over ``NUM_WARPS`` warps, 8 values per thread (<= 128 registers and
#: no spill on sm_90: tests/test_gpu_registers.py)
TILE, GPU_TILE, NUM_WARPS = 8192, 2048, 8
#: the installed Triton is older than 3.9 (3.6: torch 2.10-2.12, the GPU image), whose layout
#: choices some kernels' tiles are tuned for (``triton_loco``; ``tests/test_kernel_isa.py``)
OLDER_TRITON = tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` on the host (``triton.cdiv`` is a constexpr function: ~3 us a call,
    several per launch)."""
    return -(-a // b)


def rows_of_groups(x: torch.Tensor, rows: int, group_size: int) -> int | None:
    """The row stride of 2-D ``x`` whose ``rows > 1`` strided rows of whole groups a
    quantizing kernel reads in place (unit column stride, e.g. the compressed columns of a
    reduce-scatter's ``[world, S]`` input): where the stride and the start are multiples of
    16 values and bytes, which the JIT specializes on, so the loads stay 16-byte vectors.
    None where ``x`` is read flat (a copy if it is not contiguous)."""
    if (x.dim() != 2 or rows < 2 or x.shape[0] != rows or x.stride(1) != 1
            or x.shape[1] % group_size or x.is_contiguous() or x.stride(0) % 16
            or x.data_ptr() % 16):
        return None
    return x.stride(0)


def spaced_runs(x: torch.Tensor, rows: int, tile: int) -> tuple[int, int] | None:
    """``(run_tiles, run_gap)`` where ``x`` is ``[..., count, length]`` runs of one length
    equally spaced (``runs.view(spaced=True)``: a root unit's embedding and LM head around its
    final norm) that a kernel of ``tile``-value programs reads or writes in place, each
    program inside one run (``length`` a multiple of ``tile``, ``run_tiles`` programs a
    run): program ``p`` of a row (its leading index, ``rows`` of them ``x.stride(0)``
    apart) starts ``(p // run_tiles) * run_gap`` values past its flat start (an int32
    division per program: 64-bit costs ~4 SASS per value). None where ``x`` is not such a
    view (or a row spans 2^31 values)."""
    if x.dim() < 2 or x.shape[-2] < 2 or x.stride(-1) != 1 or x.shape[-1] % tile:
        return None
    lead = x.shape[:-2]
    if not (rows == 1 and all(n == 1 for n in lead) or len(lead) == 1 and lead[0] == rows):
        return None
    length, period = x.shape[-1], x.stride(-2)
    if period <= length or x.shape[-2] * period >= 1 << 31:
        return None
    return length // tile, period - length


@triton.jit
def run_offset(pid, run_tiles, run_gap):
    """Where program ``pid`` of :func:`spaced_runs`' ``(run_tiles, run_gap)`` starts past its
    flat start: the gaps before its run, ``(pid // run_tiles) * run_gap`` values (the
    division in int32, the product in int64)."""
    return (pid // run_tiles).to(tl.int64) * run_gap


def per_program(t: torch.Tensor, interpreted: int, gpu: int) -> int:
    """Values per program of a kernel on ``t``'s device: ``gpu`` on a GPU, else
    ``interpreted`` (TRITON_INTERPRET runs CPU tensors)."""
    return gpu if t.is_cuda else interpreted


def tile_shape(bucket_size: int, tile: int = TILE) -> tuple[int, int]:
    """(BLOCK, GROUPS): the padded bucket width and buckets per program of ``tile`` values."""
    block = triton.next_power_of_2(bucket_size)
    return block, max(1, tile // block)


@triton.jit
def tile(n_buckets, bucket_size, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's bucket ids, their mask, the value mask and the value offsets."""
    rows = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    cols = tl.arange(0, BLOCK)
    row_ok = rows < n_buckets
    mask = row_ok[:, None] & (cols < bucket_size)[None, :]
    offs = rows.to(tl.int64)[:, None] * bucket_size + cols[None, :]
    return rows, row_ok, mask, offs


@triton.jit
def load_values(x_ptr, offs, mask):
    """The tile's input values as float32 (0 where masked)."""
    return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def row_min_max(x, mask):
    """Per row: the min and max of the unmasked values (QSDP 5.1 min-max buckets)."""
    lo = tl.min(tl.where(mask, x, float("inf")), axis=1)
    hi = tl.max(tl.where(mask, x, -float("inf")), axis=1)
    return lo, hi


@triton.jit
def scaled(x, base, step):
    """Per row ``(x - base) / step`` (IEEE division), 0 in rows whose step is not > 0."""
    pos = step > 0.0
    t = tl.math.div_rn(x - base[:, None], tl.where(pos, step, 1.0)[:, None])
    return tl.where(pos[:, None], t, 0.0)


@triton.jit
def nonfinite_rows(x):
    """Per row: does it hold a NaN or an Inf (explicit; tl.max may drop NaN on GPU)."""
    return tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=1) > 0


@triton.jit
def load_rows(ptr, rows, row_ok):
    """One float32 per bucket of the tile (0 past the last bucket)."""
    return tl.load(ptr + rows, mask=row_ok, other=0.0)


@triton.jit
def store_rows(ptr, rows, row_ok, v):
    """Store one float32 per bucket of the tile."""
    tl.store(ptr + rows, v, mask=row_ok)


@triton.jit
def affine_rows(v, base_ptr, step_ptr, rows, row_ok):
    """``base + v * step`` with one (base, step) per bucket: the min-max buckets' decode."""
    base = load_rows(base_ptr, rows, row_ok)
    step = load_rows(step_ptr, rows, row_ok)
    return base[:, None] + v * step[:, None]


@triton.jit
def load_codes(code_ptr, offs, mask):
    """The tile's codes, one per value as stored (0 where masked)."""
    return tl.load(code_ptr + offs, mask=mask, other=0)


@triton.jit
def store_codes(code_ptr, offs, mask, code):
    """Store the tile's codes as uint8, one per value."""
    tl.store(code_ptr + offs, code.to(tl.uint8), mask=mask)


def unit_codes(bits: int) -> int:
    """Codes per packing unit (whole bytes): 4 at even ``bits``, 8 at odd."""
    return 8 if bits % 2 else 4


@triton.jit
def unit_tile(n_buckets, bucket_size, GROUPS: tl.constexpr, BLOCK: tl.constexpr,
              CPU: tl.constexpr):
    """The tile as (GROUPS, BLOCK / CPU, CPU): units of ``CPU`` codes, whole bytes when
    packed (:func:`unit_codes`). -> bucket ids, their mask, the unit mask (GROUPS,
    BLOCK / CPU), the value mask and the value offsets."""
    rows = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    u = tl.arange(0, BLOCK // CPU)
    row_ok = rows < n_buckets
    umask = row_ok[:, None] & (u < bucket_size // CPU)[None, :]
    k = tl.arange(0, CPU)
    offs = (rows.to(tl.int64)[:, None] * bucket_size + u[None, :] * CPU)[:, :, None] + k
    return rows, row_ok, umask, umask[:, :, None] & (k < CPU), offs


@triton.jit
def _piece_ptr(code_ptr, UNIT_BYTES: tl.constexpr):
    """``code_ptr`` as pieces of the widest power-of-two bytes (<= 4) dividing a unit."""
    if UNIT_BYTES % 4 == 0:
        return code_ptr.to(tl.pointer_type(tl.uint32))
    elif UNIT_BYTES % 2 == 0:
        return code_ptr.to(tl.pointer_type(tl.uint16))
    else:
        return code_ptr


@triton.jit
def _piece_at(rows, U: tl.constexpr, bucket_size, CPU: tl.constexpr, N: tl.constexpr):
    """Index of each unit's first piece (GROUPS, U), ``N`` pieces per unit."""
    return rows.to(tl.int64)[:, None] * (bucket_size // CPU * N) + tl.arange(0, U)[None, :] * N


@triton.constexpr_function
def _word_type(bits):
    """The integer type of a unit of ``bits`` bits: int32 up to 32 bits, else int64."""
    return tl.int32 if bits <= 32 else tl.int64


@triton.jit
def store_packed(code_ptr, code, rows, umask, bucket_size, BITS: tl.constexpr):
    """Store codes (GROUPS, U, CPU) (each < 2**BITS) densely packed: a bucket's codes start
    at byte ``bucket * bucket_size * BITS / 8``; each unit is one word ``c0 | c1 << BITS |
    ...`` of ``BITS * CPU / 8`` bytes, stored as little-endian pieces (:func:`_piece_ptr`:
    one uint16 per unit at 4 bits, five bytes at 5)."""
    CPU: tl.constexpr = code.shape[2]
    word = tl.sum(code.to(_word_type(BITS * CPU)) << (BITS * tl.arange(0, CPU)), axis=2)
    ptr = _piece_ptr(code_ptr, BITS * CPU // 8)
    W: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth
    N: tl.constexpr = BITS * CPU // W
    at = _piece_at(rows, code.shape[1], bucket_size, CPU, N)
    for j in tl.static_range(N):
        piece = word if N == 1 else (word >> (W * j)) & ((1 << W) - 1)
        tl.store(ptr + at + j, piece.to(ptr.dtype.element_ty), mask=umask)


@triton.jit
def load_packed(code_ptr, rows, umask, bucket_size, BITS: tl.constexpr, U: tl.constexpr,
                CPU: tl.constexpr):
    """The codes (GROUPS, U, CPU) as int32 (0 where masked) from :func:`store_packed`'s
    layout: each unit's pieces, then its codes."""
    ptr = _piece_ptr(code_ptr, BITS * CPU // 8)
    W: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth
    N: tl.constexpr = BITS * CPU // W
    at = _piece_at(rows, U, bucket_size, CPU, N)
    word = tl.zeros(at.shape, _word_type(BITS * CPU))
    for j in tl.static_range(N):
        piece = tl.load(ptr + at + j, mask=umask, other=0).to(word.dtype, bitcast=W == 32)
        word = word | (piece << (W * j))
    code = word[:, :, None] >> (BITS * tl.arange(0, CPU))
    return (code & ((1 << BITS) - 1)).to(tl.int32)


@triton.jit
def store_out(out_ptr, offs, y, mask, OUT_BF16: tl.constexpr):
    """Store float32 y in out's dtype; bf16 is rounded to nearest even by hand (bits into a
    uint16 view, see :func:`_out_view`), as torch does and as the interpreter's own bf16 cast
    does not."""
    if OUT_BF16:
        b = y.to(tl.uint32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)
        tl.store(out_ptr + offs, r.to(tl.uint16), mask=mask)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _out_view(out: torch.Tensor) -> torch.Tensor:
    """The tensor :func:`store_out` writes to (bf16 as its uint16 bits)."""
    return out.view(torch.uint16) if out.dtype == torch.bfloat16 else out


def quantize_buckets(kernel, x: torch.Tensor, aux: torch.Tensor, n_params: int, bits: int,
                     bucket_size: int, pack: Callable | None = pack_codes,
                     gpu_tile: int = GPU_TILE, **consts) -> tuple[torch.Tensor, ...]:
    """Run ``kernel(x, aux, codes, *params, n_buckets, bucket_size, **consts, GROUPS, BLOCK)``
    on 1-D x (a partial last bucket: the kernel pads it, as learned levels' do with x's last
    value): -> (packed uint8 codes, then ``n_params`` float32 tensors of one value per
    bucket). ``pack`` packs the kernel's one code per value; None: the kernel packs them
    (:func:`store_packed`). ``gpu_tile``: values per program on a GPU."""
    nb = -(-x.numel() // bucket_size)
    n = nb * bucket_size
    codes = torch.empty(n if pack else n // 8 * bits, dtype=torch.uint8, device=x.device)
    params = [torch.empty(nb, dtype=torch.float32, device=x.device) for _ in range(n_params)]
    if nb:
        block, groups = tile_shape(bucket_size, per_program(x, TILE, gpu_tile))
        kernel[(cdiv(nb, groups),)](
            x.contiguous(), aux.contiguous(), codes, *params, nb, bucket_size, **consts,
            GROUPS=groups, BLOCK=block, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return (pack(codes, bits) if pack else codes, *params)


def dequantize_peers(kernel, packed: torch.Tensor, operands: tuple[torch.Tensor, ...],
                     bits: int, bucket_size: int, dtype: torch.dtype,
                     unpack: Callable = unpack_codes, **consts) -> torch.Tensor:
    """Run ``kernel(codes, *operands, out, n_buckets, bucket_size, n_peers, numel, **consts,
    GROUPS, BLOCK, OUT_BF16)``: packed (P, nbytes) and operands whose first is (P, buckets)
    -> the 1-D ``dtype`` sum over the P peers."""
    n_peers, nb = operands[0].shape
    n = nb * bucket_size
    codes = unpack(packed.reshape(-1), bits).contiguous()
    out = torch.empty(n, dtype=dtype, device=packed.device)
    if nb:
        block, groups = tile_shape(bucket_size, per_program(codes, TILE, GPU_TILE))
        kernel[(cdiv(nb, groups),)](
            codes, *(t.contiguous() for t in operands), _out_view(out), nb, bucket_size,
            n_peers, n, **consts, GROUPS=groups, BLOCK=block,
            OUT_BF16=dtype == torch.bfloat16, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def rows_last_contiguous(t: torch.Tensor) -> torch.Tensor:
    """2-D ``t`` whose rows may be strided (columns of a wire), its last dimension dense."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def decode_rows(kernel, packed: torch.Tensor, operands: tuple[torch.Tensor, ...],
                bucket_size: int, out: torch.Tensor, peers: bool, gpu_tile: int = GPU_TILE,
                **consts) -> torch.Tensor:
    """Run ``kernel(codes, *operands, out, n_buckets, bucket_size, n_peers, numel,
    code_stride, *operand strides, out_stride, **consts, GROUPS, BLOCK, OUT_BF16)`` on 2-D
    packed codes and operands (one row per peer, rows possibly strided: a wire's fields) into
    2-D ``out`` (rows of ``numel <= n_buckets * bucket_size`` values): ``peers`` -> the sum
    over the rows into out's one row, else row r decoded into ``out[r]``. Returns ``out``.
    ``gpu_tile``: values per program on a GPU."""
    packed = rows_last_contiguous(packed)
    if packed.data_ptr() % 4 or (packed.shape[0] > 1 and packed.stride(0) % 4):
        packed = packed.clone(memory_format=torch.contiguous_format)  # whole uint32 pieces
    operands = tuple(rows_last_contiguous(t) for t in operands)
    if out.stride(-1) != 1 and out.shape[-1] > 1:
        raise ValueError("decode_rows: out's rows must be contiguous")
    rows, nb = operands[0].shape
    if nb and out.numel():
        block, groups = tile_shape(bucket_size, per_program(packed, TILE, gpu_tile))
        grid = (cdiv(nb, groups), 1 if peers else rows)
        kernel[grid](
            packed, *operands, _out_view(out), nb, bucket_size, rows if peers else 1,
            out.shape[-1], packed.stride(0), *(t.stride(0) for t in operands), out.stride(0),
            **consts, GROUPS=groups, BLOCK=block, OUT_BF16=out.dtype == torch.bfloat16,
            num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out
