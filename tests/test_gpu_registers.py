"""Register and spill limits on sm_90 of every Triton kernel the presets launch (issue 20).

One clean subprocess (``gpu_compile.py``) compiles each kernel for sm_90 (no GPU needed) with
the constants the compressors launch it with on a GPU (tile sizes, ``num_warps``), in each
configuration that changes its code (bits 2/4/8, group sizes 128 and 2048, Hadamard blocks
32 and 1, every noise mode, float32 and bfloat16 outputs), and reads ``ptxas -v`` of
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
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hfcompress.kernels import (triton_global_qsgd as GQ, triton_group_quant as T,
                                triton_hadamard as H, triton_learned_levels as L,
                                triton_noise as N, triton_qsgd as Q, triton_random_shift as R,
                                triton_tiles as TT)

triton.knobs.nvidia.dump_ptxas_log = True  # Triton's own ptxas run (its flags) prints -v
ROWS = iter(range(1 << 20))

def row(label, fn, sig, consts, num_warps):
    index = next(ROWS)
    if index % SHARDS != SHARD:
        return
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                    constexprs=consts)
    with contextlib.redirect_stdout(io.StringIO()) as log:
        triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"enable_fp_fusion": False, "num_warps": num_warps})
    log = log.getvalue()
    regs = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert regs and spill, f"no ptxas -v report for {label}:\n{log[-2000:]}"
    regs = max(regs)
    st, ld = (sum(int(m[j]) for m in spill) for j in (0, 1))
    print(f"{index}\t{label}\t{num_warps}\t{regs}\t{st}\t{ld}", flush=True)

u8, f32, i64, i32 = "*u8", "*fp32", "*i64", "i32"
RG, RK, RW = N.ROW_GROUPS, N.ROW_KEYS, N.ROW_KEYS_WIDE

# triton_noise: SeededRNG.uniform_like on CUDA (one key pair, row keys)
for h in (N.ONE_KEY, RK):
    row(f"noise._uniform_kernel HASH={h}", N._uniform_kernel,
        dict(keys_ptr=i64, out_ptr=f32, numel=i32, row_len=i32),
        dict(HASH=h, BLOCK=N.BLOCK), N.NUM_WARPS)

# triton_group_quant: int stochastic at 128 (ulq, tlq, zeropp grads; one key pair, or row
# keys of whole groups), nearest at 128 (loco) and 2048 (qw, qwd, zeropp weights); decode
# (qwd's dequantize_add(_rows) are this decode and torch ops); the fused 2-hop requantize
for bits, gs, h in [(b, 128, h) for b in (2, 4, 8) for h in (0, 1, RG)] + [(4, 2048, 0),
                                                                             (8, 2048, 0)]:
    row(f"group_quant._quantize_kernel bits={bits} gs={gs} HASH={h}", T._quantize_kernel,
        dict(x_ptr=f32, noise_ptr=i64 if h else f32, noise_row=i32, packed_ptr=u8,
             scale_ptr=f32, n_groups=i32),
        dict(GS=gs, BITS=bits, STOCHASTIC=h != 0, HASH=h,
             **T._tile_consts(bits, gs, T.GPU_BLOCK_ELEMS)), T.NUM_WARPS)
for bits, gs, bf16 in [(b, g, o) for b in (4, 8) for g in (128, 2048) for o in (False, True)]:
    cpu, bpu = T._UNIT[bits]
    row(f"group_quant._dequantize_sum_kernel bits={bits} gs={gs} bf16={bf16}",
        T._dequantize_sum_kernel,
        dict(packed_ptr=u8, scale_ptr=f32, out_ptr="*i16" if bf16 else f32, numel="i64",
             n_peers=i32, peer_bytes="i64", peer_groups=i32),
        dict(GS=gs, BITS=bits, CPU=cpu, BPU=bpu, BLOCK=T.GPU_BLOCK_ELEMS, OUT_BF16=bf16),
        T.NUM_WARPS)
for bits, h in ((8, 1), (8, RG), (4, RG)):
    k = T._tile_consts(4, 128, T.GPU_BLOCK_ELEMS)
    row(f"group_quant._dequantize_sum_quantize_kernel {bits}->4 HASH={h}",
        T._dequantize_sum_quantize_kernel,
        dict(packed_ptr=u8, scale_ptr=f32, noise_ptr=i64, noise_row=i32, out_packed_ptr=u8,
             out_scale_ptr=f32, n_groups=i32, n_peers=i32, peer_bytes="i64", peer_groups=i32),
        dict(GS=128, BITS=bits, CPU=T._UNIT[bits][0], BPU=1, OGS=128, BLOCK_G=k["BLOCK_G"],
             U_P2=k["U_P2"], OBITS=4, OCPU=k["CPU"], OBPU=k["BPU"], STOCHASTIC=True, HASH=h),
        T.NUM_WARPS)

# triton_hadamard: tlq_hs / sdp4bit grads, group 128, n 32 (n 1: the 2-hop quantizes values
# rotated once before), stochastic (one key pair or row keys; nearest is a subset)
row("hadamard._rotate_kernel n=32", H._rotate_kernel, dict(x_ptr=f32, out_ptr=f32, n_rows=i32),
    dict(ROWS=H.GPU_BLOCK_ELEMS // 32, N=32, LOG2N=5, SCALE=H.inv_sqrt(32)), H.NUM_WARPS)
for bits, n, h in [(b, n, h) for b in (4, 8) for n in (32, 1) for h in (1, RG)] + [(2, 32, RG)]:
    row(f"hadamard._quantize_kernel bits={bits} n={n} HASH={h}", H._quantize_kernel,
        dict(x_ptr=f32, noise_ptr=i64 if h else f32, noise_row=i32, packed_ptr=u8,
             scale_ptr=f32, n_groups=i32),
        dict(**H._consts(bits, 128, n, H.GPU_BLOCK_ELEMS), STOCHASTIC=h != 0, HASH=h),
        H.NUM_WARPS)
for bits, inv, bf16 in [(b, i, o) for b in (4, 8) for i in (True, False) for o in (False, True)]:
    row(f"hadamard._dequantize_kernel bits={bits} inverse={inv} bf16={bf16}",
        H._dequantize_kernel,
        dict(packed_ptr=u8, scale_ptr=f32, out_ptr="*i16" if bf16 else f32, n_peers=i32,
             n_groups=i32, peer_bytes=i32, BIG="fp32"),
        dict(**H._consts(bits, 128, 32, H.GPU_BLOCK_ELEMS), INVERSE=inv, OUT_BF16=bf16,
             CLIP=bf16),
        H.NUM_WARPS)

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
for bits in (5, 4):
    row(f"learned_levels._quantize_kernel bits={bits}", L._quantize_kernel,
        dict(x_ptr=f32, mid_ptr=f32, code_ptr=u8, lo_ptr=f32, rng_ptr=f32, **bucket),
        dict(BITS=bits, **tile), TT.NUM_WARPS)
peers = dict(**bucket, n_peers=i32, numel=i32)
for bf16 in (False, True):
    out = "*u16" if bf16 else f32
    row(f"qsgd._dequantize_kernel bf16={bf16}", Q._dequantize_kernel,
        dict(code_ptr=u8, scale_ptr=f32, out_ptr=out, **peers),
        dict(S=127, OUT_BF16=bf16, **tile), TT.NUM_WARPS)
    row(f"random_shift._dequantize_kernel bf16={bf16}", R._dequantize_kernel,
        dict(code_ptr=u8, base_ptr=f32, step_ptr=f32, out_ptr=out, **peers, BIG="fp32"),
        dict(OUT_BF16=bf16, **tile), TT.NUM_WARPS)
    row(f"learned_levels._dequantize_kernel bf16={bf16}", L._dequantize_kernel,
        dict(code_ptr=u8, lo_ptr=f32, rng_ptr=f32, lv_ptr=f32, out_ptr=out, **peers),
        dict(LEVELS=32, OUT_BF16=bf16, **tile), TT.NUM_WARPS)

# triton_global_qsgd: global_qsgd (linear, int8 wire), global_qsgd_exp (8 bits; 4 packed),
# one key pair or row keys (ROW_KEYS_WIDE: tensors past 2G values)
blk = dict(BLOCK=GQ.GPU_BLOCK)
for h in (1, RK, RW):
    row(f"global_qsgd._linear_quantize_kernel HASH={h}", GQ._linear_quantize_kernel,
        dict(x_ptr=f32, inv_ptr=f32, noise_ptr=i64, noise_row=i32, out_ptr="*i8", n=i32,
             per=i32, levels="fp32"), dict(HASH=h, **blk), GQ.NUM_WARPS)
for out in (f32, "*bf16"):
    row(f"global_qsgd._linear_dequantize_kernel out={out}", GQ._linear_dequantize_kernel,
        dict(codes_ptr="*i8", step_ptr=f32, out_ptr=out, n=i32, per=i32), blk, GQ.NUM_WARPS)
for bits, h in [(b, h) for b in (8, 4) for h in (1, RK, RW)]:
    row(f"global_qsgd._exp_quantize_kernel bits={bits} HASH={h}", GQ._exp_quantize_kernel,
        dict(x_ptr=f32, inv_ptr=f32, noise_ptr=i64, noise_row=i32, out_ptr=u8, nbytes=i32,
             per=i32, levels=i32, headroom=i32, sub_mult="fp32"),
        dict(HASH=h, BITS=bits, **blk), GQ.NUM_WARPS)
    row(f"global_qsgd._exp_combine_kernel bits={bits} HASH={h}", GQ._exp_combine_kernel,
        dict(a_ptr=u8, b_ptr=u8, noise_ptr=i64, noise_row=i32, out_ptr=u8, nbytes=i32),
        dict(HASH=h, BITS=bits, **blk), GQ.NUM_WARPS)
for bits, out in [(b, o) for b in (8, 4) for o in (f32, "*bf16")]:
    row(f"global_qsgd._exp_dequantize_kernel bits={bits} out={out}",
        GQ._exp_dequantize_kernel,
        dict(codes_ptr=u8, scale_ptr=f32, out_ptr=out, nbytes=i32, per=i32, headroom=i32),
        dict(BITS=bits, **blk), GQ.NUM_WARPS)
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
