"""In-process A/B of the host time per step of one preset's two code paths (issue 35).

The host time of a step moves +-15-30% between runs of this shared machine; within one
process, steps of ``none``, the "old" path and the "new" one interleaved, a load drift hits
them alike. The machine is ``step_ops.py``'s: the small LLaMA's FSDP units (``gpu_check``'s
CPU ``DIMS``) at world size 1 under the one-rank switch, the GPU's code path (Triton chosen,
the GPU tile) with the launches stubbed, each unit's all-gather and reduce-scatter called
as FSDP2 calls them. :func:`compare` prints the median thread-CPU ms per step of
``rounds`` rounds of ``repeats`` steps each, and each path's ratio to ``none``.

    cd <repo> && PYTHONPATH=$PWD HFCOMPRESS_COMPILE=0 python benchmarks/results/<run>/ab_<x>.py
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import statistics
import tempfile
from typing import Callable

import torch
import torch.distributed as dist
from triton.runtime.jit import JITFunction

import hfcompress
import hfcompress.kernels as kernels
from gpu_check import DIMS
from step_ops import interleaved_ms
from hfcompress.comm.futures import inline_on_cpu
from hfcompress.comm.one_rank import compress_one_rank
from hfcompress.kernels import dispatch
from hfcompress.kernels import triton_tiles
from hfcompress.testing import tiny_llama


def _gpu_path() -> None:
    """Every kernel module chooses Triton and the GPU tile on CPU tensors; launches are
    stubbed (the host's cost of a launch call, not of Triton's launcher)."""
    use_triton, per_program = dispatch.use_triton, triton_tiles.per_program

    def as_on_cuda(t, backend="auto"):
        use_triton(t, "torch" if backend == "torch" else "auto")
        return backend != "torch" and dispatch.triton_available()

    def gpu_tile(t, interpreted, gpu):
        return gpu
    mods = [importlib.import_module(f"hfcompress.kernels.{m.name}")
            for m in pkgutil.iter_modules(kernels.__path__)]
    for mod in [kernels, dispatch, *mods]:
        if getattr(mod, "use_triton", None) is use_triton:
            mod.use_triton = as_on_cuda
        if getattr(mod, "per_program", None) is per_program:
            mod.per_program = gpu_tile
    triton_tiles.per_program = gpu_tile
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: None


def _start() -> contextlib.ExitStack:
    torch.set_num_threads(1)
    _gpu_path()
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store",
                            rank=0, world_size=1)
    ctx = contextlib.ExitStack()
    ctx.enter_context(compress_one_rank())
    ctx.enter_context(inline_on_cpu())
    return ctx


def make_step(preset: str, warmup: int = 3) -> Callable[[], None]:
    """One step of ``preset``'s collectives (every unit's all-gather, then reduce-scatter,
    then the handle's step), warmed up ``warmup`` times."""
    model = tiny_llama(seed=0, **DIMS["cpu"])
    handle = hfcompress.apply(model, preset, shard=True, ranks_per_node=1)
    params, jobs = dict(model.named_parameters()), []
    with torch.no_grad():
        for comms in handle.comms.values():
            shard = torch.cat([params[n].to_local().reshape(-1) for n in comms.layouts.names])
            gathered = torch.empty(shard.numel())    # FSDP2's in-place input: a view
            jobs.append((comms, shard, gathered, gathered[:shard.numel()],
                         torch.randn(shard.numel()), torch.empty_like(shard)))

    def step() -> None:
        with torch.no_grad():
            for comms, shard, gathered, slot, grads, reduced in jobs:
                slot.copy_(shard)
                comms.ag(output_tensor=gathered, input_tensor=slot, group=dist.group.WORLD,
                         async_op=True).wait()
                comms.rs(output_tensor=reduced, input_tensor=grads, group=dist.group.WORLD,
                         op=dist.ReduceOp.SUM)
        handle.step()
    for _ in range(warmup):
        step()
    return step


def compare(preset: str, use_old: Callable[[], None], use_new: Callable[[], None],
            rounds: int = 8, repeats: int = 41) -> dict[str, list[float]]:
    """``none`` / old / new steps of ``preset`` interleaved; ``use_old`` / ``use_new``
    switch the code path (each path's step is built and run under its own switch)."""
    with _start():
        none = make_step("none")
        use_old()
        old_step = make_step(preset)
        use_new()
        new = make_step(preset)

        def old() -> None:
            use_old()
            try:
                old_step()
            finally:
                use_new()
        res: dict[str, list[float]] = {"none": [], "old": [], "new": []}
        for _ in range(rounds):
            for name, ms in interleaved_ms({"none": none, "old": old, "new": new},
                                           repeats).items():
                res[name].append(ms)
    for name, ms in res.items():
        print(name, round(statistics.median(ms), 3), [round(x, 2) for x in ms])
    for name in ("old", "new"):
        ratios = [a / b for a, b in zip(res[name], res["none"])]
        print(f"{name} / none", round(statistics.median(ratios), 3))
    return res
