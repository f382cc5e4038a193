"""What the hot kernels cost in instructions, read on a CPU: SASS per value for sm_90.

    python benchmarks/kernel_isa.py --out DIR        # DIR/kernel_isa.csv (~1 min of CPU)

Each row calls a kernel's public entry point (``hfcompress.kernels.triton_*``) on CPU
tensors, in a clean subprocess without ``TRITON_INTERPRET``, with the tile sizes the
presets launch on a GPU (``per_program`` answers as for a CUDA tensor). The launch is
captured instead of run, and compiled for sm_90 with the specialization Triton's JIT gives
those very arguments (16-byte pointer alignment, integers divisible by 16: the binary a GPU
would run). ``cuobjdump -sass`` of the cubin gives the static instruction count of the
kernel; every row's kernel is straight-line code per program (or its loops are reported in
``loops``), so instructions per value = instructions / values per thread (a thread's share of
the launch's values; per peer value for the dequantize-sums of 8 peers). NOPs and the
trailing self-branch are not counted. Loads and stores are counted per value with their
widths (``LDG.E.128`` moves 16 bytes); ``bar`` and ``shfl`` are the barriers and warp
shuffles per thread.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIELDS = ["name", "sass_per_value", "instructions", "values_per_thread", "loads_per_value",
          "stores_per_value", "load_widths", "store_widths", "bar", "shfl", "loops",
          "registers", "launches", "host_ops", "host_op_names", "kernel"]

#: the rows: (name, inputs (evaluated before counting host ops), the call on those inputs
#: ``a``, peers summed per output value). Inputs: ``x`` 2^20 float32 values, ``xb`` / ``rb``
#: bfloat16 weights and references, ``keys`` a noise key pair, ``peers(bits)`` 8 peers'
#: (packed, scale) rows, ``wire(bits, gs)`` 8 payloads in the rows of one uint8 wire (as
#: received, riders after them) with their codes' bytes and groups.
ROWS = [
    ("quantize_int4_nearest", "x,", "GQ.quantize(*a, 4, 128)", 1),
    ("quantize_int4_stochastic", "x, keys", "GQ.quantize(a[0], 4, 128, a[1])", 1),
    ("quantize_int8_nearest", "x,", "GQ.quantize(*a, 8, 128)", 1),
    ("quantize_int8_stochastic", "x, keys", "GQ.quantize(a[0], 8, 128, a[1])", 1),
    ("quantize_int4_nearest_g2048", "x,", "GQ.quantize(*a, 4, 2048)", 1),
    ("hadamard_int4_quantize", "x, keys", "H.quantize(a[0], 4, 128, 32, a[1])", 1),
    # the gradient rows of a reduce-scatter: 8 strided rows (the compressed columns of the
    # [8, S] input), row keys, read in place (XROWS)
    ("quantize_int4_stochastic_strided_rows", "x8, rowkeys",
     "GQ.quantize_rows(a[0], 8, 4, 128, a[1])", 1),
    ("hadamard_int4_quantize_strided_rows", "x8, rowkeys",
     "H.quantize_rows(a[0], 8, 4, 128, 32, a[1])", 1),
    # ... of a root unit: each row's compressed columns two runs 64 values apart (embedding
    # | final norm | LM head), read in place (RUNS)
    ("hadamard_int4_quantize_spaced_rows", "x8s, rowkeys",
     "H.quantize_rows(a[0], 8, 4, 128, 32, a[1])", 1),
    ("hadamard_rotate", "x,", "H.rotate(a[0], 32)", 1),
    ("qwd_difference_quantize", "xb, rb", "GQ.quantize_difference(*a, 4, 2048)", 1),
    # qWD's wire row of a root unit's slot: its compressed columns two runs, read in place
    ("qwd_difference_row_spaced", "xbs, rb.view(2, -1)",
     "GQ.quantize_difference_row(*a, 4, 2048)", 1),
    # qWD's update of w~ (bf16) from one int4 payload
    ("qwd_dequantize_add", "(*peers(4, 1), rb)",
     "GQ.dequantize_add(a[0][0], a[1][0], 4, 2048, a[2])", 1),
    # ... from 8 gathered slots read in place in the wire (8 rider bytes after each payload)
    ("qwd_dequantize_add_wire_rows", "(*wire(4, 2048), rb)",
     "GQ.dequantize_add_wire(a[0], a[1], 4, 2048, a[3])", 1),
    # ... written into a root unit's output columns too: each row two runs (RUNS)
    ("qwd_dequantize_add_wire_rows_spaced", "(*wire(4, 2048), rb, spaced_rows(8, True))",
     "GQ.dequantize_add_wire(a[0], a[1], 4, 2048, a[3], a[4])", 1),
    # zeropp's weight gather: 8 int8 g2048 slots decoded in place from the wire into their
    # rows of a bf16 output (a column block of the all-gather's buffer)
    ("dequantize_rows_int8_wire_rows", "(*wire_rows(8, 2048), torch.empty(8, N // 8 + 64, "
     "dtype=torch.bfloat16)[:, :N // 8])", "GQ.dequantize_rows(a[0], a[1], 8, 2048, a[2])", 1),
    # the reduce-scatter's received wire: 8 peers' payloads (and riders) read in place
    ("dequantize_sum_int4", "wire(4, 128, per=N)", "GQ.dequantize_sum_wire(*a, 4, 128)", 8),
    ("dequantize_sum_int8", "wire(8, 128, per=N)", "GQ.dequantize_sum_wire(*a, 8, 128)", 8),
    # the 2-hop: 8 peers' int8 sum requantized to int4 (stochastic, one key pair)
    ("dequantize_sum_quantize_int8_int4", "peers(8)",
     "GQ.dequantize_sum_quantize(*a, 8, 128, 4, 128, keys)", 8),
    ("hadamard_dequantize_sum_int4", "wire(4, 128, per=N)",
     "H.dequantize_sum_wire(*a, 4, 128, 32)", 8),
    # ... into a root unit's output: two runs (RUNS)
    ("hadamard_dequantize_sum_int4_spaced", "(*wire(4, 128, per=N), spaced_rows(1)[0])",
     "H.dequantize_sum_wire(*a[:3], 4, 128, 32, out=a[3])", 8),
    # the preset's launch: int8 wire, one scale per tensor, 127 levels (one peer)
    # LoCo's error feedback of one int4 g128 gradient row (the loco preset's reduce-scatter, one
    # launch per destination row): bf16 gradients and the 8-bit error read, payload and new
    # error written
    ("loco_feedback_int4", "(xb, *K.group_quant.quantize(x, 8, 128))",
     "K.triton_loco.feedback(a[0], a[1], a[2], 0.2, 4, 128)", 1),
    # ... of a hop's 8 destination rows in one launch, each with its stream's error (read and
    # rewritten in place), the wire written
    ("loco_feedback_rows_int4", "loco_rows()",
     "K.triton_loco.feedback_rows(a[0], a[1], None, 0.2, 4, 128)", 1),
    ("global_qsgd_quantize", "x, x.abs().amax().reshape(1), keys",
     "GQS.linear_quantize(a[0], a[1], 127, a[2], torch.int8)", 1),
    # its scale: max |x| of the tensor (before the MAX all-reduce)
    ("global_qsgd_local_scale", "x,", "GQS.local_scale(*a)", 1),
    # qsdp_learned: 5-bit weights quantized with the compressor's cached midpoints (QSDP 5.2),
    # 4-bit gradients decoded (one peer), codes packed in the kernels
    ("learned_levels_quantize_5bit", "x, torch.linspace(0, 1, 32), "
     "K.learned_levels.midpoints(torch.linspace(0, 1, 32))",
     "K.triton_learned_levels.quantize(a[0], a[1], 5, 1024, a[2])", 1),
    ("learned_levels_dequantize_4bit", "torch.randint(0, 255, (N // 2,), dtype=torch.uint8), "
     "torch.rand(N // 1024), torch.rand(N // 1024), torch.linspace(0, 1, 16)",
     "K.triton_learned_levels.dequantize(*a, 4, 1024)", 1),
]

_SCRIPT = r"""
import json, os, re, subprocess, sys, tempfile
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature
import hfcompress.kernels as K
from hfcompress.kernels import (triton_global_qsgd as GQS, triton_group_quant as GQ,
                                triton_hadamard as H, triton_tiles as TT)
from hfcompress.kernels.packing import packed_nbytes

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
# the tile sizes of a CUDA launch: every module's per_program answers as for a GPU tensor
import importlib, pkgutil
for info in pkgutil.iter_modules(K.__path__):
    mod = importlib.import_module(f"hfcompress.kernels.{info.name}")
    if getattr(mod, "per_program", None) is TT.per_program:
        mod.per_program = lambda t, interpreted, gpu: gpu
TT.per_program = lambda t, interpreted, gpu: gpu

LAUNCHES = []
def capture(self, *args, grid, warmup, **kwargs):
    LAUNCHES.append((self, args, dict(kwargs), grid))
JITFunction.run = capture

N = 1 << 20
torch.manual_seed(0)
x = torch.randn(N)
xb, rb = torch.randn(N).bfloat16(), torch.randn(N).bfloat16()
keys = torch.tensor([123, 456], dtype=torch.int64)
x8 = torch.randn(8, N // 8 + 128)[:, :N // 8]
rowkeys = torch.arange(16, dtype=torch.int64).view(8, 2)

def spaced_rows(n, bf16=False):   # n rows of N // n values as two runs, 64 values apart
    per = N // n // 2
    return torch.randn(n, 2, per + 64, dtype=torch.bfloat16 if bf16 else None)[:, :, :per]
x8s, xbs = spaced_rows(8), spaced_rows(1, True)[0]

def peers(bits, n=8):
    packed = torch.randint(0, 255, (n, packed_nbytes(N, bits)), dtype=torch.uint8)
    return packed, torch.rand(n, N // 128)

def wire(bits, gs, n=8, per=N // 8, rider=8):   # n payloads of `per` values in a wire's rows
    ncodes, groups = packed_nbytes(per, bits), per // gs
    w = torch.randint(0, 255, (n, ncodes + 4 * groups + rider), dtype=torch.uint8)
    w[:, ncodes:ncodes + 4 * groups] = torch.rand(n, groups).view(torch.uint8)
    return w, ncodes, groups

def wire_rows(bits, gs, n=8, rider=8):   # n slots' codes and scales: views of one wire
    w, ncodes, groups = wire(bits, gs, n, N // n, rider)
    return w[:, :ncodes], w[:, ncodes:ncodes + 4 * groups].view(torch.float32)

def loco_rows(n=8):   # a hop's n bf16 gradient rows and the table of their 8-bit errors
    rows = torch.randn(n, N // n + 64).bfloat16()[:, :N // n]
    errors = [K.packing.payload_buffers(N // n, N // n // 128, "cpu") for _ in range(n)]
    return rows, torch.tensor([[c.data_ptr(), s.data_ptr(), 1] for c, s in errors])

def compile_launch(fn, args, kwargs):
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(BACKEND, kwargs, bound, spec, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                          options=options.__dict__), bound

def cuobjdump(cubin, flag):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin); f.flush()
        tool = triton.knobs.nvidia.cuobjdump.path
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True,
                              check=True).stdout

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
def count(text, trips):
    ins = []
    for m in LINE.finditer(text):
        ins.append((int(m.group(1), 16), m.group(2)))
    ops = [(a, i.split()[0] if not i.startswith("@") else i.split()[1]) for a, i in ins]
    body = [(a, o, i) for (a, o), (_, i) in zip(ops, ins) if o != "NOP"]
    # the trailing `BRA self` after the last EXIT
    while body and body[-1][1].startswith("BRA") and body[-1][2].endswith(hex(body[-1][0])):
        body.pop()
    # a backward branch closes a runtime loop: its body counts once per trip
    weight = [1] * len(body)
    loops = 0
    for j, (a, o, i) in enumerate(body):
        t = re.search(r"0x([0-9a-f]+)", i.split("BRA", 1)[1]) if o.startswith("BRA") else None
        if t and int(t.group(1), 16) <= a:
            loops += 1
            for k, (b, _, _) in enumerate(body):
                if int(t.group(1), 16) <= b <= a:
                    weight[k] = trips
    def mem(prefix):
        widths = {}
        for (_, o, _), n in zip(body, weight):
            if o.startswith(prefix):
                w = {"128": 16, "64": 8, "U8": 1, "S8": 1, "U16": 2, "S16": 2}
                width = next((v for k, v in w.items() if f".{k}" in o), 4)
                widths[width] = widths.get(width, 0) + n
        return widths
    return dict(instructions=sum(weight), loops=loops, loads=mem("LDG"), stores=mem("STG"),
                bar=sum(o.startswith("BAR") for _, o, _ in body),
                shfl=sum(o.startswith("SHFL") for _, o, _ in body))

from torch.utils._python_dispatch import TorchDispatchMode
#: aten ops that launch no kernel on a GPU (allocation, views, metadata)
FREE = {"empty", "empty_strided", "empty_like", "new_empty", "view", "_unsafe_view", "reshape",
        "as_strided", "expand", "slice", "select", "t", "transpose", "permute", "unsqueeze",
        "squeeze", "alias", "detach", "lift_fresh", "_to_copy_noop", "split",
        "split_with_sizes", "unbind"}

class AtenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))

out = []
for name, inputs, call, peers_per_value in json.loads(sys.argv[1]):
    LAUNCHES.clear()
    a = eval(inputs)
    with AtenOps() as aten:
        eval(call)
    # the row's kernel: the launch that moves the most values (noise / scale launches first)
    assert LAUNCHES, f"{name}: {expr} launched no Triton kernel"
    fn, args, kwargs, grid = LAUNCHES[-1]
    ck, bound = compile_launch(fn, args, kwargs)
    # a runtime loop in a dequantize-sum runs once per peer after the first
    c = count(cuobjdump(ck.asm["cubin"], "-sass"), max(1, peers_per_value - 1))
    regs = int(re.search(r"REG:(\d+)", cuobjdump(ck.asm["cubin"], "-res-usage")).group(1))
    programs = 1
    for n in (grid if isinstance(grid, tuple) else (grid,)):   # a 2-D grid: rows x programs
        programs *= n
    threads = programs * ck.metadata.num_warps * 32
    vpt = N * peers_per_value / threads
    out.append(dict(name=name, kernel=fn.fn.__name__, vpt=vpt,
                    launches=len(LAUNCHES), aten=" ".join(aten.ops),
                    registers=regs, **c))
print("JSON" + json.dumps(out))
"""


def measure(rows=ROWS) -> list[dict]:
    """One dict per row (``FIELDS``), compiled in a clean subprocess."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        run = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(rows)], env=env,
                             capture_output=True, text=True, timeout=900)
    if run.returncode:
        raise RuntimeError(f"kernel_isa compile failed:\n{run.stderr[-4000:]}")
    raw = json.loads(run.stdout.split("JSON", 1)[1])
    table = []
    for r in raw:
        vpt = r["vpt"]  # values per thread of the launch (all peers for a dequantize-sum)
        per_value = lambda n: round(n / vpt, 2)  # noqa: E731
        widths = lambda d: " ".join(f"{w}Bx{n}" for w, n in sorted(d.items()))  # noqa: E731
        table.append(dict(
            name=r["name"], kernel=r["kernel"], sass_per_value=per_value(r["instructions"]),
            instructions=r["instructions"], values_per_thread=round(vpt, 2),
            loads_per_value=per_value(sum(r["loads"].values())),
            stores_per_value=per_value(sum(r["stores"].values())),
            load_widths=widths(r["loads"]), store_widths=widths(r["stores"]),
            bar=r["bar"], shfl=r["shfl"], loops=r["loops"], registers=r["registers"],
            launches=r["launches"], host_ops=len(r["aten"].split()), host_op_names=r["aten"]))
    return table


def print_table(rows: list[dict]) -> None:
    cols = ["name", "sass_per_value", "instructions", "values_per_thread", "loads_per_value",
            "stores_per_value", "bar", "shfl", "loops", "registers", "launches", "host_ops",
            "load_widths"]
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(f"{c:<{width[c]}}" for c in cols))
    for r in rows:
        print("  ".join(f"{str(r[c]):<{width[c]}}" for c in cols))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="write DIR/kernel_isa.csv")
    ap.add_argument("--steps", action="store_true",
                    help="GPU operations and host time per FSDP unit and step of every FSDP2 "
                         "preset instead (benchmarks/step_ops.py; DIR/step_ops.csv)")
    args = ap.parse_args()
    if args.steps:
        sys.path.insert(0, str(REPO / "benchmarks"))
        import step_ops
        step_ops.main(["--out", args.out] if args.out else [])
        return
    rows = measure()
    print_table(rows)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "kernel_isa.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
