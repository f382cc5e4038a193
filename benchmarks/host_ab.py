"""In-process A/B of the host time per step of one preset's two code paths (issue 35).

The host time of a step moves +-15-30% between runs of this shared machine; within one
process, steps of ``none``, the "old" path and the "new" one interleaved, a load drift hits
them alike. The machine is ``step_ops.py``'s: the small LLaMA's FSDP units (``gpu_check``'s
CPU ``DIMS``) at world size 1 under the one-rank switch, the GPU's code path (Triton chosen,
the GPU tile) with the launches stubbed, each unit's all-gather and reduce-scatter called
as FSDP2 calls them (``step_ops``' own helpers). :func:`compare` prints the median thread-CPU ms per step of
``rounds`` rounds of ``repeats`` steps each, and each path's ratio to ``none``.

    cd <repo> && PYTHONPATH=$PWD:$PWD/benchmarks HFCOMPRESS_COMPILE=0 \
        python benchmarks/results/<run>/ab_<x>.py
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from typing import Callable

import torch
import torch.distributed as dist

import hfcompress
from gpu_check import DIMS
from step_ops import gpu_code_path, interleaved_ms, jobs_of, unit_step
from hfcompress.comm.futures import inline_on_cpu
from hfcompress.comm.one_rank import compress_one_rank
from hfcompress.testing import tiny_llama


def _start() -> contextlib.ExitStack:
    """One gloo rank on the GPU's code path, under the one-rank switch, stages inline."""
    torch.set_num_threads(1)
    gpu_code_path(lambda self, *args, grid, warmup, **kwargs: None)
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store",
                            rank=0, world_size=1)
    ctx = contextlib.ExitStack()
    ctx.enter_context(compress_one_rank())
    ctx.enter_context(inline_on_cpu())
    return ctx


def make_step(preset: str, warmup: int = 3, package=hfcompress) -> Callable[[], None]:
    """One step of ``preset``'s collectives (``step_ops.unit_step``), warmed up ``warmup``
    times; installed by ``package`` (``host_ab_trees.py``: another tree's)."""
    model = tiny_llama(seed=0, **DIMS["cpu"])
    handle = package.apply(model, preset, shard=True, ranks_per_node=1)
    jobs = jobs_of(handle, model, 1, 0)

    def step() -> None:
        unit_step(handle, jobs, dist.ReduceOp.SUM)
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
