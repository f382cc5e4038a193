"""Workers of the FSDP2 hot-path tests (``test_fsdp_hotpath.py``): asynchronous all-gathers,
host syncs in a steady-state step, torch ops per step, a custom gradient divide factor.

Same model, data and mixed precision as ``fsdp_workers`` (tiny LLaMA, bf16 parameters, fp32
gradient reduction, AdamW)."""

from __future__ import annotations

import collections
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.utils._python_dispatch import TorchDispatchMode

import hfcompress
from hfcompress.integrations import fsdp as fsdp_integration
from hfcompress.trainer.metrics import CommStats
from fsdp_workers import LR, MP, global_mean, setup, tiny_llama, train_step
from host_sync_guard import count_host_syncs


def _fsdp_modules(model) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _step(model, opt, h, step: int) -> float:
    loss = train_step(model, step)
    opt.step()
    opt.zero_grad()
    h.step()
    return loss


# -- 1. overlap -----------------------------------------------------------------------------
def _train_overlap(preset, ranks_per_node: int, steps: int, async_op: bool) -> dict:
    """Train ``steps`` steps; ``async_op``: every unshard asynchronous (FSDP2's
    ``unshard_async_op``), explicit forward / backward prefetching of the next layer, and
    the first layer unsharded with ``unshard(async_op=True)`` before each forward."""
    model = tiny_llama()
    h = hfcompress.apply(model, preset, ranks_per_node=ranks_per_node, shard=True, mp_policy=MP)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    layers = list(model.model.layers)
    if async_op:
        for m in _fsdp_modules(model):
            m._set_unshard_async_op(True)
        for a, b in zip(layers, layers[1:]):
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])
    losses = []
    for step in range(steps):
        if async_op:
            layers[0].unshard(async_op=True)
        losses.append(global_mean(_step(model, opt, h, step)))
    weights = [p.to_local().detach().clone() for p in model.parameters()]
    h.remove()
    return {"loss": losses, "weights": weights}


def overlap_worker(rank, world, presets, ranks_per_node, steps):
    """Per preset: the losses and final weights of a synchronous and an asynchronous run,
    and the all-gather calls of the latter (how many with ``async_op``, what they returned)."""
    setup()
    calls = collections.Counter()
    original = fsdp_integration.FSDPAllGather.__call__

    def counting(self, output_tensor, input_tensor, group, async_op=False):
        work = original(self, output_tensor, input_tensor, group, async_op)
        calls[(async_op, type(work).__name__, isinstance(work, dist.distributed_c10d.Work))] \
            += 1
        return work
    fsdp_integration.FSDPAllGather.__call__ = counting
    out = {}
    for p in presets:
        calls.clear()
        sync = _train_overlap(p, ranks_per_node, steps, False)
        sync_calls = dict(calls)
        calls.clear()
        asyn = _train_overlap(p, ranks_per_node, steps, True)
        out[p] = {"sync_loss": sync["loss"], "async_loss": asyn["loss"],
                  "same_weights": all(torch.equal(a, b) for a, b in
                                      zip(sync["weights"], asyn["weights"])),
                  "sync_calls": sync_calls, "async_calls": dict(calls)}
    fsdp_integration.FSDPAllGather.__call__ = original
    return out


# -- 4. host syncs --------------------------------------------------------------------------
def host_sync_worker(rank, world, presets, ranks_per_node, warmup):
    """Per preset: ``warmup`` steps, then one step counting host syncs from hfcompress code."""
    setup()
    out = {}
    for p in presets:
        model = tiny_llama()
        h = hfcompress.apply(model, p, ranks_per_node=ranks_per_node, shard=True, mp_policy=MP)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        for step in range(warmup):
            _step(model, opt, h, step)
        with count_host_syncs() as syncs:
            _step(model, opt, h, warmup)
        out[p] = dict(syncs)
        # control: a logging step reads the reduced counts back on purpose (not a step's hot
        # path); the guard must see it in these processes
        with count_host_syncs() as control:
            CommStats(h.meter).reduce()
        out.setdefault("control", dict(control))
        h.remove()
    return out


# -- 2. torch ops per step ------------------------------------------------------------------
class _CountOps(TorchDispatchMode):
    """Torch ops dispatched, by where they come from: inside the FSDP custom all-gather or
    reduce-scatter (``integrations/fsdp.py``), and of those, inside a compressor's
    ``compress*`` (the per-destination sends), or elsewhere (model, FSDP2, optimizer)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[_category()] += 1
        return func(*args, **(kwargs or {}))


def _category() -> str:
    f, compress = sys._getframe(2), False
    while f is not None:
        code = f.f_code
        if code.co_filename.startswith(_COMPRESSORS) and code.co_name.startswith("compress"):
            compress = True
        if code.co_filename == fsdp_integration.__file__ and code.co_name == "__call__":
            kind = "all_gather" if "output_tensor" in f.f_locals and "op" not in f.f_locals \
                else "reduce_scatter"
            return f"{kind}.compress" if compress else kind
        f = f.f_back
    return "other"


_COMPRESSORS = os.path.join(os.path.dirname(hfcompress.__file__), "compressors") + os.sep


def op_count_worker(rank, world, presets, ranks_per_node, warmup):
    """Per preset (None: plain FSDP2): torch ops dispatched by one steady-state training
    step (forward, backward, optimizer step) on this rank, by ``_category``."""
    setup()
    out = {}
    for p in presets:
        model = tiny_llama()
        if p is None:
            fsdp_integration.shard_model(model, ranks_per_node, False, mp_policy=MP)
            h = hfcompress.apply(model, "none", ranks_per_node=ranks_per_node)
        else:
            h = hfcompress.apply(model, p, ranks_per_node=ranks_per_node, shard=True,
                                 mp_policy=MP)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
        for step in range(warmup):
            _step(model, opt, h, step)
        if p is None:
            h.remove()       # plain FSDP2's own collectives
        mode = _CountOps()
        with mode:
            train_step(model, warmup)
            opt.step()
            opt.zero_grad()
        if p is not None:
            h.step()
            h.remove()
        out[str(p)] = dict(mode.count)
    return out


# -- 3. gradient divide factor --------------------------------------------------------------
def divide_factor_worker(rank, world, presets, ranks_per_node, factor, force_sum):
    """Per preset (``none``: exact): the local gradient shards of one step with
    ``set_gradient_divide_factor(factor)`` on every FSDP module (and, if ``force_sum``,
    ``set_force_sum_reduction_for_comms(True)``), plus the same step's gradients with the
    default factor (the world size)."""
    setup()
    out = {}
    for p in presets:
        grads = {}
        for f in (None, factor):
            model = tiny_llama()
            h = hfcompress.apply(model, p, ranks_per_node=ranks_per_node, shard=True,
                                 mp_policy=MP)
            for m in _fsdp_modules(model):
                if f is not None:
                    m.set_gradient_divide_factor(f)
                if force_sum:
                    m.set_force_sum_reduction_for_comms(True)
            train_step(model, 0)
            grads[f] = torch.cat([q.grad.to_local().float().reshape(-1)
                                  for q in model.parameters()])
            h.remove()
        out[p] = {"default": grads[None], "factor": grads[factor]}
    return out
