"""A/B of the riders' sum in the decode-sum (session 27): sdp4bit's steps with the riders
summed by the decode-sum's launch (``sums_riders`` True, "new") and split off and summed by
torch (False: the path before, "old"), and ``none``'s, interleaved in one process (a load
drift hits them alike); the machine and launch stubs of ``benchmarks/step_ops.py``
(world size 1, one-rank switch, the GPU's code path, launches stubbed). Prints the median
thread-CPU ms per step of 8 rounds of 41 steps each.

    cd <repo> && PYTHONPATH=$PWD HFCOMPRESS_COMPILE=0 python benchmarks/results/riders_in_decode_sum/ab_riders.py
"""
import collections, contextlib, importlib, os, pkgutil, sys, tempfile, time
sys.path.insert(0, "/work/main/benchmarks")
import torch, torch.distributed as dist
from triton.runtime.jit import JITFunction
torch.set_num_threads(1)
import hfcompress, hfcompress.kernels as K
from gpu_check import DIMS
from hfcompress.comm.futures import inline_on_cpu
from hfcompress.comm.one_rank import compress_one_rank
from hfcompress.kernels import dispatch
from hfcompress.kernels import triton_tiles as TT
from hfcompress.testing import tiny_llama
use_triton = dispatch.use_triton
def as_on_cuda(t, backend="auto"):
    use_triton(t, "torch" if backend == "torch" else "auto")
    return backend != "torch" and dispatch.triton_available()
gpu_tile = lambda t, interpreted, gpu: gpu
mods = [importlib.import_module(f"hfcompress.kernels.{i.name}") for i in pkgutil.iter_modules(K.__path__)]
for mod in [K, dispatch, *mods]:
    if getattr(mod, "use_triton", None) is use_triton: mod.use_triton = as_on_cuda
    if getattr(mod, "per_program", None) is TT.per_program: mod.per_program = gpu_tile
TT.per_program = gpu_tile
launches = collections.Counter()
def stub(self, *args, grid, warmup, **kwargs): launches[self.fn.__name__] += 1
JITFunction.run = stub
world, rank = int(os.environ.get("W", 1)), int(os.environ.get("R", 0))
store = os.environ.get("STORE") or tempfile.mkdtemp() + "/store"
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
ctx = contextlib.ExitStack()
if world == 1: ctx.enter_context(compress_one_rank())
ctx.enter_context(inline_on_cpu())
def make(preset, dims=DIMS["cpu"], warmup=3):
    model = tiny_llama(seed=0, **dims)
    handle = hfcompress.apply(model, preset, shard=True, ranks_per_node=world)
    params = dict(model.named_parameters()); jobs = []
    with torch.no_grad():
        for comms in handle.comms.values():
            shard = torch.cat([params[n].to_local().reshape(-1) for n in comms.layouts.names])
            n = shard.numel(); gathered = torch.empty(world*n); grads = torch.randn(world*n)
            jobs.append((comms, shard, gathered, gathered[rank*n:(rank+1)*n], grads, torch.empty_like(shard)))
    def step():
        with torch.no_grad():
            for comms, shard, gathered, slot, grads, reduced in jobs:
                slot.copy_(shard)
                comms.ag(output_tensor=gathered, input_tensor=slot, group=dist.group.WORLD, async_op=True).wait()
                comms.rs(output_tensor=reduced, input_tensor=grads, group=dist.group.WORLD, op=dist.ReduceOp.AVG if world > 1 else dist.ReduceOp.SUM)
        handle.step()
    for _ in range(warmup): step()
    return step, handle, jobs
def timeit(steps, repeats=41):
    import statistics
    times = collections.defaultdict(list)
    for _ in range(repeats):
        for p, run in steps.items():
            t0 = time.thread_time(); run(); times[p].append(time.thread_time() - t0)
    return {p: statistics.median(t)*1e3 for p, t in times.items()}

import importlib, statistics
GQ = importlib.import_module("hfcompress.compressors.group_quant").GroupQuantizer
HQ = importlib.import_module("hfcompress.compressors.hadamard").HadamardQuantizer
none = make("none")[0]; new = make("sdp4bit")[0]
def old():
    GQ.sums_riders = HQ.sums_riders = False
    try: old_step()
    finally: GQ.sums_riders = HQ.sums_riders = True
GQ.sums_riders = HQ.sums_riders = False
old_step = make("sdp4bit")[0]
GQ.sums_riders = HQ.sums_riders = True
res = {k: [] for k in ("none", "old", "new")}
for i in range(8):
    r = timeit({"none": none, "old": old, "new": new}, repeats=41)
    for k in r: res[k].append(r[k])
for k, v in res.items(): print(k, round(statistics.median(v), 3), [round(x, 2) for x in v])
