"""Register and spill limits on sm_90 of every Triton kernel the presets launch (issue 20).

One clean subprocess (``gpu_compile.py``) compiles each kernel for sm_90 (no GPU needed) with
the constants the compressors launch it with on a GPU (tile sizes, ``num_warps``), in each
configuration whose code differs in a way that matters (bits, group size, noise mode; output
dtypes differ only in the store), and reads ``ptxas -v`` of Triton's own ptxas run (its
flags): registers per thread and bytes of spill stores / loads. Each must stay <= 128
registers (two resident 256-thread blocks per SM) with no spill (no local-memory traffic).
The table (~1 min on two idle cores)::

    python tests/test_gpu_registers.py
"""

from __future__ import annotations

import sys

import pytest

from gpu_compile import run_compile_script

MAX_REGISTERS = 128

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

def row(label, fn, sig, consts, num_warps):
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                    constexprs=consts)
    with contextlib.redirect_stdout(io.StringIO()) as log:
        triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"enable_fp_fusion": False, "num_warps": num_warps})
    log = log.getvalue()
    regs = max(int(n) for n in re.findall(r"Used (\d+) registers", log))
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    st, ld = (sum(int(m[j]) for m in spill) for j in (0, 1))
    print(f"{label}\t{num_warps}\t{regs}\t{st}\t{ld}", flush=True)

u8, f32, i64, i32 = "*u8", "*fp32", "*i64", "i32"
RG = N.ROW_GROUPS  # row keys of whole groups (compress_rows), else one key pair (HASH 1)

# triton_noise: SeededRNG.uniform_like on CUDA (row keys: one key pair's code and more)
row(f"noise._uniform_kernel HASH={N.ROW_KEYS}", N._uniform_kernel,
    dict(keys_ptr=i64, out_ptr=f32, numel=i32, row_len=i32),
    dict(HASH=N.ROW_KEYS, BLOCK=N.BLOCK), N.NUM_WARPS)

# triton_group_quant: int 4/8 stochastic at 128 (ulq, tlq, zeropp grads), nearest at 2048
# (qw, qwd, zeropp weights); decode and the fused 2-hop requantize
for bits, gs, h in ((4, 128, RG), (8, 128, RG), (8, 128, 1), (8, 2048, 0)):
    row(f"group_quant._quantize_kernel bits={bits} gs={gs} HASH={h}", T._quantize_kernel,
        dict(x_ptr=f32, noise_ptr=i64 if h else f32, noise_row=i32, packed_ptr=u8,
             scale_ptr=f32, n_groups=i32),
        dict(GS=gs, BITS=bits, STOCHASTIC=h != 0, HASH=h,
             **T._tile_consts(bits, gs, T.GPU_BLOCK_ELEMS)), T.NUM_WARPS)
for bits, gs, bf16 in ((8, 128, False), (4, 128, True)):
    cpu, bpu = T._UNIT[bits]
    row(f"group_quant._dequantize_sum_kernel bits={bits} gs={gs} bf16={bf16}",
        T._dequantize_sum_kernel,
        dict(packed_ptr=u8, scale_ptr=f32, out_ptr="*i16" if bf16 else f32, numel="i64",
             n_peers=i32, peer_bytes="i64", peer_groups=i32),
        dict(GS=gs, BITS=bits, CPU=cpu, BPU=bpu, BLOCK=T.GPU_BLOCK_ELEMS, OUT_BF16=bf16),
        T.NUM_WARPS)
k = T._tile_consts(4, 128, T.GPU_BLOCK_ELEMS)
row(f"group_quant._dequantize_sum_quantize_kernel 8->4 HASH={RG}",
    T._dequantize_sum_quantize_kernel,
    dict(packed_ptr=u8, scale_ptr=f32, noise_ptr=i64, noise_row=i32, out_packed_ptr=u8,
         out_scale_ptr=f32, n_groups=i32, n_peers=i32, peer_bytes="i64", peer_groups=i32),
    dict(GS=128, BITS=8, CPU=1, BPU=1, OGS=128, BLOCK_G=k["BLOCK_G"], U_P2=k["U_P2"],
         OBITS=4, OCPU=k["CPU"], OBPU=k["BPU"], STOCHASTIC=True, HASH=RG), T.NUM_WARPS)

# triton_hadamard: tlq_hs / sdp4bit grads, 8 and 4 bits, group 128, n 32 (n 1: the 2-hop
# quantizes values rotated once before)
row("hadamard._rotate_kernel n=32", H._rotate_kernel, dict(x_ptr=f32, out_ptr=f32, n_rows=i32),
    dict(ROWS=H.GPU_BLOCK_ELEMS // 32, N=32, LOG2N=5, SCALE=H.inv_sqrt(32)), H.NUM_WARPS)
for bits, n in ((8, 32), (4, 32), (8, 1)):
    row(f"hadamard._quantize_kernel bits={bits} n={n} HASH={RG}", H._quantize_kernel,
        dict(x_ptr=f32, noise_ptr=i64, noise_row=i32, packed_ptr=u8, scale_ptr=f32,
             n_groups=i32),
        dict(**H._consts(bits, 128, n, H.GPU_BLOCK_ELEMS), STOCHASTIC=True, HASH=RG),
        H.NUM_WARPS)
for bits, inverse, bf16 in ((8, True, True), (4, False, False)):
    row(f"hadamard._dequantize_kernel bits={bits} inverse={inverse} bf16={bf16}",
        H._dequantize_kernel,
        dict(packed_ptr=u8, scale_ptr=f32, out_ptr="*i16" if bf16 else f32, n_peers=i32,
             n_groups=i32, peer_bytes=i32),
        dict(**H._consts(bits, 128, 32, H.GPU_BLOCK_ELEMS), INVERSE=inverse, OUT_BF16=bf16),
        H.NUM_WARPS)

# bucketed, buckets of 1024: qsdp (qsgd 8 bits, random shift 8 bits), qsdp_learned (5 / 4)
block, groups = TT.tile_shape(1024, TT.GPU_TILE)
tile = dict(GROUPS=groups, BLOCK=block)
bucket = dict(n_buckets=i32, bucket_size=i32)
row(f"qsgd._quantize_kernel bits=8 HASH={RG}", Q._quantize_kernel,
    dict(x_ptr=f32, u_ptr=i64, code_ptr=u8, scale_ptr=f32, **bucket, noise_row=i32),
    dict(S=127, HASH=RG, **tile), TT.NUM_WARPS)
row("random_shift._quantize_kernel bits=8", R._quantize_kernel,
    dict(x_ptr=f32, u_ptr=f32, code_ptr=u8, base_ptr=f32, step_ptr=f32, **bucket),
    dict(KMAX=255, **tile), TT.NUM_WARPS)
row("learned_levels._quantize_kernel bits=5", L._quantize_kernel,
    dict(x_ptr=f32, mid_ptr=f32, code_ptr=u8, lo_ptr=f32, rng_ptr=f32, **bucket),
    dict(BITS=5, **tile), TT.NUM_WARPS)
peers = dict(**bucket, n_peers=i32, numel=i32)
row("qsgd._dequantize_kernel bf16=True", Q._dequantize_kernel,
    dict(code_ptr=u8, scale_ptr=f32, out_ptr="*u16", **peers),
    dict(S=127, OUT_BF16=True, **tile), TT.NUM_WARPS)
row("random_shift._dequantize_kernel bf16=True", R._dequantize_kernel,
    dict(code_ptr=u8, base_ptr=f32, step_ptr=f32, out_ptr="*u16", **peers, BIG="fp32"),
    dict(OUT_BF16=True, **tile), TT.NUM_WARPS)
row("learned_levels._dequantize_kernel bf16=True", L._dequantize_kernel,
    dict(code_ptr=u8, lo_ptr=f32, rng_ptr=f32, lv_ptr=f32, out_ptr="*u16", **peers),
    dict(LEVELS=32, OUT_BF16=True, **tile), TT.NUM_WARPS)

# triton_global_qsgd: global_qsgd (linear, int8 wire), global_qsgd_exp (8 bits)
blk = dict(BLOCK=GQ.GPU_BLOCK)
row(f"global_qsgd._linear_quantize_kernel HASH={N.ROW_KEYS}", GQ._linear_quantize_kernel,
    dict(x_ptr=f32, inv_ptr=f32, noise_ptr=i64, noise_row=i32, out_ptr="*i8", n=i32, per=i32,
         levels="fp32"), dict(HASH=N.ROW_KEYS, **blk), GQ.NUM_WARPS)
row("global_qsgd._linear_dequantize_kernel bf16=True", GQ._linear_dequantize_kernel,
    dict(codes_ptr="*i8", step_ptr=f32, out_ptr="*bf16", n=i32, per=i32), blk, GQ.NUM_WARPS)
row(f"global_qsgd._exp_quantize_kernel bits=8 HASH={N.ROW_KEYS}", GQ._exp_quantize_kernel,
    dict(x_ptr=f32, inv_ptr=f32, noise_ptr=i64, noise_row=i32, out_ptr=u8, nbytes=i32,
         per=i32, levels=i32, headroom=i32, sub_mult="fp32"),
    dict(HASH=N.ROW_KEYS, BITS=8, **blk), GQ.NUM_WARPS)
row(f"global_qsgd._exp_combine_kernel bits=8 HASH={N.ROW_KEYS}", GQ._exp_combine_kernel,
    dict(a_ptr=u8, b_ptr=u8, noise_ptr=i64, noise_row=i32, out_ptr=u8, nbytes=i32),
    dict(HASH=N.ROW_KEYS, BITS=8, **blk), GQ.NUM_WARPS)
row("global_qsgd._exp_dequantize_kernel bits=8 bf16=True", GQ._exp_dequantize_kernel,
    dict(codes_ptr=u8, scale_ptr=f32, out_ptr="*bf16", nbytes=i32, per=i32, headroom=i32),
    dict(BITS=8, **blk), GQ.NUM_WARPS)
"""


def usage() -> list[tuple[str, int, int, int, int]]:
    """(kernel and configuration, num_warps, registers, spill store bytes, spill load bytes)
    for every kernel the presets launch, compiled for sm_90 in a clean subprocess."""
    r = run_compile_script(_SCRIPT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = []
    for line in r.stdout.splitlines():
        label, *nums = line.split("\t")
        rows.append((label, *map(int, nums)))
    return rows


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
    sys.path.insert(0, ".")
    print(table(usage()))
