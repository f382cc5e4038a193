"""Register and spill limits on sm_90 of every Triton kernel the presets launch (issue 20).

One clean subprocess (``gpu_compile.py``) compiles each kernel for sm_90 (no GPU needed) with
the constants the compressors launch it with on a GPU (tile sizes, ``num_warps``), in each
configuration that changes its code (bits 2/4/8, group sizes 128 and 2048, Hadamard blocks
32 and 1, every noise mode, float32 and bfloat16 outputs) and the JIT's specialization of a
launch on fresh tensors (pointers 16-byte aligned), and reads ``ptxas -v`` of
Triton's own ptxas run (its flags): registers per thread and bytes of spill stores / loads.
Each must stay <= 128 registers (two resident 256-thread blocks per SM) with no spill (no
local-memory traffic). The kernels are split between two such subprocesses (every other
one), run at once: the compiles are independent and a machine has at least two cores. The
table (~35 s of CPU)::

    python tests/test_gpu_registers.py
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from gpu_compile import run_compile_script

MAX_REGISTERS = 128
SHARDS = 2      # subprocesses compiling at once; shard i compiles rows i, i + SHARDS, ..

_SCRIPT = r"""
import contextlib, io, re
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from hfcompress.kernels import (triton_dequantize_sum as D, triton_global_qsgd as GQ,
                                triton_group_quant as T, triton_hadamard as H,
                                triton_learned_levels as L, triton_loco as LC,
                                triton_noise as N, triton_qsgd as Q,
                                triton_random_shift as R, triton_tiles as TT)

triton.knobs.nvidia.dump_ptxas_log = True  # Triton's own ptxas run (its flags) prints -v
TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
ROWS = iter(range(1 << 20))

def row(label, fn, sig, consts, num_warps):
    index = next(ROWS)
    if index % SHARDS != SHARD:
        return
    # pointers 16-byte aligned, as the JIT specializes a launch on fresh allocations (the
    # binary a GPU runs: its vector loads may need more registers than unaligned code)
    aligned = {(fn.arg_names.index(k),): BACKEND.parse_attr("D")
               for k, v in sig.items() if v.startswith("*") or k in DIV16}
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                    constexprs=consts, attrs=aligned)
    with contextlib.redirect_stdout(io.StringIO()) as log:
        triton.compile(src, target=TARGET,
                       options={"enable_fp_fusion": False, "num_warps": num_warps})
    log = log.getvalue()
    regs = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert regs and spill, f"no ptxas -v report for {label}:\n{log[-2000:]}"
    regs = max(regs)
    st, ld = (sum(int(m[j]) for m in spill) for j in (0, 1))
    print(f"{index}\t{label}\t{num_warps}\t{regs}\t{st}\t{ld}", flush=True)

u8, f32, i64, i32 = "*u8", "*fp32", "*i64", "i32"
# integers the wrappers pass only as multiples of 16, which the JIT specializes: the strided
# input rows' stride (triton_tiles.rows_of_groups)
DIV16 = {"x_row"}
RG, RK, RW = N.ROW_GROUPS, N.ROW_KEYS, N.ROW_KEYS_WIDE

# triton_noise: SeededRNG.uniform_like on CUDA (one key pair, row keys)
for h in (N.ONE_KEY, RK):
    row(f"noise._uniform_kernel HASH={h}", N._uniform_kernel,
        dict(keys_ptr=i64, out_ptr=f32, numel=i32, row_len=i32),
        dict(HASH=h, BLOCK=N.BLOCK), N.NUM_WARPS)

# triton_group_quant: int stochastic at 128 (ulq, tlq, zeropp grads; one key pair, or row
# keys of whole groups), nearest at 128 (loco) and 2048 (qw, qwd, zeropp weights); qwd's
# fused difference (bf16 w and w~, ragged tail) and update (dequantize_add, bf16 or float32
# w~); the fused 2-hop requantize
# the scales as float32, or (a wire of rows) their bits in the wire's int32 words
quant = dict(ref_ptr=f32, noise_row=i32, scale_ptr=f32, scale_off=i32, tail_ptr=f32,
             tail_row=i32, tail_n=i32, n_groups=i32, numel=i32, gpr=i32, row_words=i32,
             x_row=i32, run_tiles=i32, run_gap=i32)
TAIL = N.TAIL_BLOCK   # a wire's rows copy their riders (norms: bf16 values)
for bits, gs, h in [(b, 128, h) for b in (2, 4, 8) for h in (0, 1, RG)] + [(4, 2048, 0),
                                                                             (8, 2048, 0)]:
    k = T._tile_consts(bits, gs, T.GPU_BLOCK_ELEMS)
    for xrows in (False, True) if h == RG else (False,):   # strided input rows
        row(f"group_quant._quantize_kernel bits={bits} gs={gs} HASH={h} XROWS={xrows}",
            T._quantize_kernel, dict(x_ptr=f32, noise_ptr=i64 if h else f32,
                                     packed_ptr="*i32",
                                     **{**quant, "scale_ptr": "*i32" if h == RG else f32,
                                        "tail_ptr": "*bf16" if h == RG else f32}),
            dict(GS=gs, BITS=bits, STOCHASTIC=h != 0, HASH=h, DIFF=False, RAGGED=False,
                 ROWS=h == RG, XROWS=xrows, TAIL=TAIL if h == RG else 0, RUNS=False, **k),
            T.NUM_WARPS)
# (RUNS: a root unit's compressed columns as equally spaced runs, read in place)
for bits, h, runs in ((4, 0, False), (4, 1, False), (8, RG, False), (4, 0, True)):
    k = T._tile_consts(bits, 2048, T.GPU_BLOCK_ELEMS, itemsize=2)
    row(f"group_quant._quantize_kernel difference bits={bits} gs=2048 HASH={h}"
        + (" RUNS" if runs else ""),
        T._quantize_kernel, dict(x_ptr="*bf16", noise_ptr=i64 if h else f32,
                                 packed_ptr="*i32",
                                 **{**quant, "ref_ptr": "*bf16", "scale_ptr": "*i32",
                                    "tail_ptr": "*bf16"}),
        dict(GS=2048, BITS=bits, STOCHASTIC=h != 0, HASH=h, DIFF=True, RAGGED=not runs,
             ROWS=False, XROWS=False, TAIL=TAIL, RUNS=runs, **k),
        T.NUM_WARPS)
for bits, gs, out, rows, also, runs in [
        (4, 2048, "*bf16", False, False, False), (4, 128, "*bf16", False, True, False),
        (8, 2048, "*bf16", False, False, False), (4, 2048, f32, False, True, False),
        (4, 2048, "*bf16", True, False, False), (4, 2048, "*bf16", True, True, False),
        (4, 2048, "*bf16", False, True, True), (4, 2048, "*bf16", True, True, True)]:
    k = T._tile_consts(bits, gs, T.GPU_BLOCK_ELEMS, itemsize=2 if out != f32 else 4)
    o = "*i16" if out != f32 else f32
    row(f"group_quant._dequantize_add_kernel bits={bits} gs={gs} out={out} ROWS={rows} "
        f"ALSO={also}" + (" RUNS" if runs else ""),
        T._dequantize_add_kernel, dict(packed_ptr="*i32", scale_ptr="*i32" if rows else f32,
                                       scale_off=i32, ref_ptr=out, out_ptr=o, also_ptr=o,
                                       tail_ptr=out, tail_row=i32, tail_off=i32, tail_n=i32,
                                       numel=i32, gpr=i32, row_words=i32, scale_row=i32,
                                       also_row=i32, run_tiles=i32, run_gap=i32),
        dict(GS=gs, BITS=bits, RAGGED=not rows and not runs, OUT_BF16=out != f32, ROWS=rows,
             ALSO=also, TAIL=TAIL if rows else 0, RUNS=runs, **k), T.NUM_WARPS)
# the slots of a gathered wire decoded in place (zeropp's int8 weights; int4 for qw-style),
# the exact values riding them copied too (bfloat16)
for bits, gs, out, tail in [(8, 2048, "*bf16", 0), (8, 2048, f32, 0), (4, 128, "*bf16", 0),
                            (8, 2048, "*bf16", N.TAIL_BLOCK)]:
    k = T._tile_consts(bits, gs, T.GPU_BLOCK_ELEMS, itemsize=2 if out != f32 else 4)
    row(f"group_quant._dequantize_rows_kernel bits={bits} gs={gs} out={out}"
        f"{' riders' if tail else ''}",
        T._dequantize_rows_kernel, dict(packed_ptr="*i32", scale_ptr=f32,
                                        out_ptr="*i16" if out != f32 else f32, numel=i32,
                                        gpr=i32, row_words=i32, scale_row=i32, out_row=i32,
                                        tail_ptr=out, tail_row=i32, tail_out_ptr=out,
                                        tail_out_row=i32, tail_n=i32),
        dict(GS=gs, BITS=bits, RAGGED=True, OUT_BF16=out != f32, TAIL=tail, **k),
        T.NUM_WARPS)
# triton_loco: LoCo's error feedback (loco: int4 nearest, loco_zeropp: int4 stochastic with
# one key pair; bf16 or float32 gradients; the first call without an error)
for bits, h, x, err in ((4, 0, "*bf16", True), (4, 1, "*bf16", True), (4, 0, f32, False),
                        (8, 0, f32, True)):
    size = 2 if x != f32 else 4
    n = LC._values_per_thread(bits, size)   # the launch's values per thread
    k = T._tile_consts(bits, 128, T.NUM_WARPS * 32 * n, itemsize=size, per_thread=n)
    row(f"loco._feedback_kernel bits={bits} HASH={h} x={x} HAS_ERROR={err}",
        LC._feedback_kernel, dict(x_ptr=x, ecode_ptr="*i32", escale_ptr=f32,
                                  noise_ptr=i64 if h else x, noise_row=i32,
                                  packed_ptr="*i32", scale_ptr=f32, ecode_out_ptr="*i32",
                                  escale_out_ptr=f32, n_groups=i32, numel=i32, coeff="fp32"),
        dict(GS=128, BITS=bits, STOCHASTIC=h != 0, HASH=h, HAS_ERROR=err, SMALL=True, **k),
        T.NUM_WARPS)
# (the riders copied after each row's scales: the exact columns riding, bfloat16)
for bits, stochastic, x, tail in ((4, False, "*bf16", 0), (4, True, "*bf16", N.TAIL_BLOCK),
                                  (8, True, f32, 0)):
    size = 2 if x != f32 else 4
    n = LC._values_per_thread(bits, size)   # the launch's values per thread
    k = T._tile_consts(bits, 128, T.NUM_WARPS * 32 * n, itemsize=size, per_thread=n)
    row(f"loco._feedback_rows_kernel bits={bits} stochastic={stochastic} x={x}"
        f"{' riders' if tail else ''}",
        LC._feedback_rows_kernel, dict(x_ptr=x, x_row=i32, errors_ptr=i64, noise_ptr=i64,
                                       wire_ptr="*i32", row_words=i32, code_words=i32,
                                       n_groups=i32, numel=i32, coeff="fp32", tail_ptr=x,
                                       tail_row=i32, tail_n=i32),
        dict(GS=128, BITS=bits, STOCHASTIC=stochastic, HASH=N.ONE_KEY, SMALL=True, TAIL=tail,
             **k), T.NUM_WARPS)
for bits, h in ((8, 1), (8, RG), (4, RG)):
    v = T.SUM_VALUES_PER_THREAD
    k = dict(T._tile_consts(4, 128, T.NUM_WARPS * 32 * v, per_thread=v))
    row(f"group_quant._dequantize_sum_quantize_kernel {bits}->4 HASH={h}",
        T._dequantize_sum_quantize_kernel,
        dict(packed_ptr=u8, scale_ptr=f32, noise_ptr=i64, noise_row=i32,
             out_packed_ptr="*i32", out_scale_ptr=f32, n_groups=i32, n_peers=i32,
             peer_bytes="i64", peer_groups=i32),
        dict(GS=128, BITS=bits, CPU=T._UNIT[bits][0], BPU=1, OGS=128, OBITS=4,
             OCPU=k.pop("CPU"), OBPU=k.pop("BPU"), STOCHASTIC=True, HASH=h, **k),
        T.NUM_WARPS)

# triton_hadamard: tlq_hs / sdp4bit grads, group 128, n 32 (n 1: the 2-hop quantizes values
# rotated once before), stochastic (one key pair or row keys; nearest is a subset)
row("hadamard._rotate_kernel n=32", H._rotate_kernel, dict(x_ptr=f32, out_ptr=f32, n_rows=i32),
    dict(ROWS=H.GPU_BLOCK_ELEMS // 32, N=32, LOG2N=5, SCALE=H.inv_sqrt(32)), H.NUM_WARPS)
for bits, n, h, xrows, runs in [(b, n, h, False, False) for b in (4, 8) for n in (32, 1)
                                for h in (1, RG)] \
        + [(2, 32, RG, False, False), (4, 32, RG, True, False), (8, 32, RG, True, False),
           (4, 32, RG, True, True)]:
    row(f"hadamard._quantize_kernel bits={bits} n={n} HASH={h} XROWS={xrows}"
        + (" RUNS" if runs else ""),
        H._quantize_kernel,
        dict(x_ptr=f32, noise_ptr=i64 if h else f32, noise_row=i32, packed_ptr="*i32",
             scale_ptr="*i32" if h == RG else f32, scale_off=i32,
             tail_ptr="*bf16" if h == RG else f32, tail_row=i32, tail_n=i32, n_groups=i32,
             gpr=i32, row_words=i32, x_row=i32, run_tiles=i32, run_gap=i32),
        dict(**H._consts(bits, 128, n, H.GPU_BLOCK_ELEMS), STOCHASTIC=h != 0, HASH=h,
             ROWS=h == RG, XROWS=xrows, TAIL=TAIL if h == RG else 0, RUNS=runs),
        H.QUANT_WARPS)

# triton_dequantize_sum: the decode-sums of both (8 peers unrolled; 16 unrolled, as
# _sum_consts unrolls them: in the loop on Triton < 3.9 past OLDER_UNROLL_ROW_BYTES, "(loop)";
# and the loop past MAX_UNROLL; bytes where the payload is not 4-byte aligned, unrolled up to
# MAX_UNROLL_BYTES, a loop beyond; 6 bits), group quant at 128 / 2048
# (the Hadamard sum without the inverse), the inverse of n 32 fused, float32 and bfloat16
dsum = [(b, g, 1, 8, o, True) for b in (4, 8) for g in (128, 2048) for o in (False, True)]
dsum += [(b, 128, 32, 8, o, True) for b in (4, 8) for o in (False, True)]
dsum += [(4, 128, 1, 16, False, True), (8, 128, 32, 16, True, True), (4, 128, 32, 0, True, True),
         (8, 128, 32, 0, True, False), (8, 128, 1, 4, False, False), (6, 128, 1, 5, True, False)]
dsum = [(*d, 0, False) for d in dsum]
# the reduce op's AVG in the epilogue (FSDP2's op over more than one rank), TLq-HS's last hop;
# the riders summed by programs of their own (sdp4bit's last hop: bfloat16 riders, AVG)
dsum += [(4, 128, 32, 8, True, True, 1, False), (4, 2048, 1, 8, False, True, 2, False),
         (4, 128, 32, 8, True, True, 1, True), (8, 128, 1, 0, False, True, 0, True)]
dsum = [(*d, False) for d in dsum]
# a root unit's compressed gradient columns written in place (equally spaced runs)
dsum += [(4, 128, 32, 8, True, True, 1, True, True)]
for bits, gs, n, peers, bf16, words, post, tail, runs in dsum:
    k = D.row_layout(bits, gs, n)
    v = min(k["UPR"], 4) if words else 0
    unrolled = peers and D._sum_consts(bits, gs, n, n > 1, True, torch.bfloat16 if bf16 else
                                       torch.float32, peers, v)["PEERS"]
    row(f"dequantize_sum._dequantize_sum_kernel bits={bits} gs={gs} n={n} peers={peers} "
        f"bf16={bf16} words={words}{f' post={post}' if post else ''}"
        f"{' riders' if tail else ''}{' RUNS' if runs else ''}"
        f"{'' if unrolled == peers else ' (loop)'}",
        D._dequantize_sum_kernel,
        dict(src_ptr="*i32" if words else u8, scale_ptr="*i32" if words else f32,
             out_ptr="*u16" if bf16 else f32, n_rows=i32, n_peers=i32, src_stride=i32,
             scale_stride=i32, scale_off=i32, BIG="fp32", post="fp32",
             tail_ptr="*u16" if bf16 else f32, tail_off=i32, tail_stride=i32,
             tail_out_ptr="*u16" if bf16 else f32, n_tail=i32, n_main=i32, tail_post="fp32",
             run_tiles=i32, run_gap=i32),
        dict(PEERS=unrolled, GS=gs, BITS=bits, **k,
             V=min(k["UPR"], 4) if words else 1, WORDS=words,
             R=D.GPU_ROWS, N=n, LOG2N=n.bit_length() - 1, SCALE=H.inv_sqrt(n), INVERSE=n > 1,
             CLIP=bf16 and n > 1 and not post, OUT_BF16=bf16, POST=post, TAIL=tail,
             TAIL_BLOCK=4 * 32 * D.NUM_WARPS, TAIL_IN_BF16=bf16, TAIL_OUT_BF16=bf16,
             TAIL_POST=post, RUNS=runs), D.NUM_WARPS)

# bucketed, buckets of 1024: qsdp (qsgd 8 bits, random shift 8 bits), qsdp_learned (5 / 4)
block, groups = TT.tile_shape(1024, TT.GPU_TILE)
tile = dict(GROUPS=groups, BLOCK=block)
bucket = dict(n_buckets=i32, bucket_size=i32)
for h in (1, RG):
    row(f"qsgd._quantize_kernel bits=8 HASH={h}", Q._quantize_kernel,
        dict(x_ptr=f32, u_ptr=i64, code_ptr=u8, scale_ptr=f32, **bucket, noise_row=i32),
        dict(S=127, HASH=h, **tile), TT.NUM_WARPS)
row("random_shift._quantize_kernel bits=8", R._quantize_kernel,
    dict(x_ptr=f32, u_ptr=f32, code_ptr=u8, base_ptr=f32, step_ptr=f32, **bucket),
    dict(KMAX=255, **tile), TT.NUM_WARPS)
block, groups = TT.tile_shape(1024, L.GPU_TILE)
ll_tile = dict(GROUPS=groups, BLOCK=block)  # learned levels: 16 values per thread
for bits in (5, 4):
    row(f"learned_levels._quantize_kernel bits={bits}", L._quantize_kernel,
        dict(x_ptr=f32, mid_ptr=f32, code_ptr=u8, lo_ptr=f32, rng_ptr=f32, **bucket, numel=i32),
        dict(BITS=bits, CPU=TT.unit_codes(bits), **ll_tile), TT.NUM_WARPS)
peers = dict(**bucket, n_peers=i32, numel=i32)
for bf16 in (False, True):
    out = "*u16" if bf16 else f32
    row(f"qsgd._dequantize_kernel bf16={bf16}", Q._dequantize_kernel,
        dict(code_ptr=u8, scale_ptr=f32, out_ptr=out, **peers),
        dict(S=127, OUT_BF16=bf16, **tile), TT.NUM_WARPS)
    row(f"random_shift._dequantize_rows_kernel bf16={bf16}", R._dequantize_rows_kernel,
        dict(code_ptr=u8, base_ptr=f32, step_ptr=f32, out_ptr=out, **peers, code_stride=i32,
             base_stride=i32, step_stride=i32, out_stride=i32, BIG="fp32"),
        dict(OUT_BF16=bf16, **tile), TT.NUM_WARPS)
    for bits in (5, 4):
        row(f"learned_levels._dequantize_kernel bits={bits} bf16={bf16}", L._dequantize_kernel,
            dict(code_ptr=u8, lo_ptr=f32, rng_ptr=f32, lv_ptr=f32, out_ptr=out, **peers,
                 code_stride=i32, lo_stride=i32, rng_stride=i32, lv_stride=i32,
                 out_stride=i32),
            dict(BITS=bits, CPU=TT.unit_codes(bits), OUT_BF16=bf16, **ll_tile),
            TT.NUM_WARPS)

# triton_global_qsgd: global_qsgd (linear, int8 wire), global_qsgd_exp (8 bits; 4 packed),
# one key pair or row keys (ROW_KEYS_WIDE: tensors past 2G values); one scale, one per
# program or one per value (SCALES 0 / 1 / 2; linear: the wide tile with one key pair and a
# scale per program, else the small one); whole programs or a ragged tail (EVEN); the local
# scale (whole blocks per program, or atomic_max of a long block's segments); a ragged wide
# tile is GPU_LINEAR_RAGGED (16 values per thread on Triton < 3.9)
blk = dict(BLOCK=GQ.GPU_BLOCK)
for h, sc, even in [(1, 0, True), (1, 0, False), (1, 1, False), (1, 2, False), (RK, 0, False),
                    (RK, 2, False), (RW, 0, False), (RW, 2, False)]:
    wide = h == 1 and sc < 2
    row(f"global_qsgd._linear_quantize_kernel HASH={h} SCALES={sc} EVEN={even}",
        GQ._linear_quantize_kernel,
        dict(x_ptr=f32, scale_ptr=f32, noise_ptr=i64, noise_row=i32, out_ptr="*i8", n=i32,
             per=i32, levels="fp32"),
        dict(HASH=h, SCALES=sc, EVEN=even,
             BLOCK=(GQ.GPU_LINEAR_BLOCK if even else GQ.GPU_LINEAR_RAGGED) if wide
             else GQ.GPU_LINEAR_SMALL), GQ.NUM_WARPS)
for out, sc in [(o, s) for o in (f32, "*bf16") for s in (0, 2)]:
    row(f"global_qsgd._linear_dequantize_kernel out={out} SCALES={sc}",
        GQ._linear_dequantize_kernel,
        dict(codes_ptr="*i8", scale_ptr=f32, out_ptr=out, n=i32, per=i32, levels="fp32"),
        dict(SCALES=sc, BLOCK=GQ.GPU_LINEAR_BLOCK if sc < 2 else GQ.GPU_LINEAR_SMALL),
        GQ.NUM_WARPS)
for bits, h, sc in [(b, h, s) for b in (8, 4) for h in (1, RK, RW) for s in (0, 2)]:
    row(f"global_qsgd._exp_quantize_kernel bits={bits} HASH={h} SCALES={sc}",
        GQ._exp_quantize_kernel,
        dict(x_ptr=f32, scale_ptr=f32, noise_ptr=i64, noise_row=i32, out_ptr=u8, nbytes=i32,
             per=i32, levels=i32, headroom=i32, sub_mult="fp32"),
        dict(HASH=h, SCALES=sc, BITS=bits, **blk), GQ.NUM_WARPS)
for bits, h in [(b, h) for b in (8, 4) for h in (1, RK, RW)]:
    row(f"global_qsgd._exp_combine_kernel bits={bits} HASH={h}", GQ._exp_combine_kernel,
        dict(a_ptr=u8, b_ptr=u8, noise_ptr=i64, noise_row=i32, out_ptr=u8, nbytes=i32),
        dict(HASH=h, BITS=bits, **blk), GQ.NUM_WARPS)
for bits, out, sc in [(b, o, s) for b in (8, 4) for o in (f32, "*bf16") for s in (0, 2)]:
    row(f"global_qsgd._exp_dequantize_kernel bits={bits} out={out} SCALES={sc}",
        GQ._exp_dequantize_kernel,
        dict(codes_ptr=u8, scale_ptr=f32, out_ptr=out, nbytes=i32, per=i32, headroom=i32),
        dict(SCALES=sc, BITS=bits, **blk), GQ.NUM_WARPS)
for x, w, ragged in [(f32, GQ.GPU_TILE, False), ("*bf16", GQ.GPU_TILE, False),
                     (f32, 4096, False), (f32, 256, False), (f32, 32, False),
                     (f32, 32, True)]:
    row(f"global_qsgd._abs_max_kernel x={x} W={w} RAGGED={ragged}", GQ._abs_max_kernel,
        dict(x_ptr=x, out_ptr="*i32", n=i32, segs=i32, blocks=i32, width=i32, per=i32,
             n_segs=i32),
        dict(RAGGED=ragged, ATOMIC=w == GQ.GPU_TILE, G=max(GQ.GPU_BLOCKS_TILE // w, 1), W=w),
        GQ.NUM_WARPS)
print(f"rows\t{next(ROWS)}")
"""


def usage() -> list[tuple[str, int, int, int, int]]:
    """(kernel and configuration, num_warps, registers, spill store bytes, spill load bytes)
    for every kernel the presets launch, compiled for sm_90 in clean subprocesses."""
    scripts = [f"SHARD, SHARDS = {i}, {SHARDS}\n{_SCRIPT}" for i in range(SHARDS)]
    with ThreadPoolExecutor(SHARDS) as pool:
        runs = list(pool.map(lambda s: run_compile_script(s, timeout=600), scripts))
    rows, totals = {}, set()
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
        for line in r.stdout.splitlines():
            index, label, *nums = line.split("\t")
            if index == "rows":
                totals.add(int(label))
            else:
                rows[int(index)] = (label, *map(int, nums))
    [total] = totals
    assert sorted(rows) == list(range(total)), "a kernel's report is missing"
    return [rows[i] for i in range(total)]


def table(rows) -> str:
    width = max(len(r[0]) for r in rows)
    head = f"{'kernel':<{width}}  warps  regs  spill st/ld (B)"
    return "\n".join([head] + [f"{k:<{width}}  {w:>5}  {n:>4}  {s}/{ld}"
                               for k, w, n, s, ld in rows])


@pytest.mark.triton
def test_every_preset_kernel_fits_sm90_registers_without_spills():
    """<= 128 registers per thread and no spill for every kernel the presets launch (the int
    4/8-bit stochastic group quantize once took 255 registers and 132-292 B of spills)."""
    pytest.importorskip("triton.backends.nvidia")
    rows = usage()
    print("\n" + table(rows))
    over = [r for r in rows if r[2] > MAX_REGISTERS or r[3] or r[4]]
    assert not over, "over the limits (<= 128 registers, no spill):\n" + table(over)


if __name__ == "__main__":
    print(table(usage()))
