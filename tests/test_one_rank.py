"""The one-rank switch (``hfcompress/comm/one_rank.py``, issue 28): at world size 1 the
compressed DDP all-reduce hook, HSDP's replica all-reduce hook and FSDP2's gradient
reduce-scatter (1-hop and 2-hop) return before any stage, so a one-GPU check cannot see their
stages' ordering. Under ``compress_one_rank()``, in the CUDA path's control flow
(``inline_on_cpu``, as on a GPU), they run every stage: the profiler sees their exchanges
(all-to-all, all-reduce, all-gather) besides what runs anyway (DDP's broadcast, the stock
reduce-scatter of the parameters kept exact), and the result is the exact one's within the
codec's error, not bit-equal (the codec ran). Without the switch they launch none of their
own and return the exact result bit for bit. One real gloo process.
"""

import contextlib
import os

import torch

from dist_utils import run_distributed
from test_ddp_async import INT8

#: presets by gradient path: 1-hop int4 (ulq), 2-hop int8/int4 (tlq), 2-hop Hadamard (sdp4bit),
#: ZeRO++'s 2-hop, QSGD (qsdp), LoCo's error feedback; DDP / HSDP: every all-reduce path
RS_PRESETS = ("ulq", "tlq", "sdp4bit", "zeropp", "qsdp", "loco")
HOOK_PRESETS = ("global_qsgd", "global_qsgd_exp", "loco", INT8)
#: relative error (of all values together) of one codec pass, about twice what these runs
#: give: int4 groups of 128, stochastic (ulq .. zeropp, LoCo's first step: 0.12-0.17);
#: exponential dithering (0.29); 8-bit groups (0.01); 8-bit linear dithering with one
#: scale per bucket (0.03-0.04: small gradients beside large ones round coarsely)
BOUND = {"ulq": 0.3, "tlq": 0.3, "sdp4bit": 0.3, "zeropp": 0.3, "qsdp": 0.03, "loco": 0.3,
         "global_qsgd": 0.1, "global_qsgd_exp": 0.6, "int8": 0.03}
#: the exchanges of the compressed stages
EXCHANGES = {"c10d::alltoall_base_", "c10d::allreduce_", "c10d::_allgather_base_"}


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def collectives(fn):
    """``fn()``'s value and the c10d collectives it launched (profiler events), by name."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        value = fn()
    return value, [e.name for e in prof.events() if e.name.startswith("c10d::")]


def switch(on: bool):
    from hfcompress.comm.one_rank import compress_one_rank
    return compress_one_rank() if on else contextlib.nullcontext()


def reduce_scatter_report() -> dict:
    import torch.distributed as dist

    import hfcompress
    from hfcompress.testing import tiny_llama
    report = {}
    for preset in RS_PRESETS:
        model = tiny_llama(seed=0)
        handle = hfcompress.apply(model, preset, shard=True)
        comms = handle.comms["model.layers.0"]          # what FSDP2 would call
        grads = torch.randn(comms.layouts.full.numel, generator=torch.Generator().manual_seed(1))
        for on in (False, True):
            out = torch.empty_like(grads)

            def call():
                comms.rs(output_tensor=out, input_tensor=grads, group=dist.group.WORLD,
                         op=dist.ReduceOp.SUM)
            with switch(on):
                _, n = collectives(call)
            report[preset, on] = (n, rel_err(out, grads), torch.equal(out, grads))
        handle.remove()
    return report


def hook_report(engine: str) -> dict:
    """Per preset and switch: (collectives of one backward, relative error of the gradients
    against the uncompressed model's, bit-equal)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hfcompress
    from hfcompress.testing import tiny_llama
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    plain = tiny_llama(seed=0)
    plain(input_ids=ids, labels=ids).loss.backward()
    want = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
    report = {}
    for config in HOOK_PRESETS:
        name = config if isinstance(config, str) else config.name
        for on in (False, True):
            model = tiny_llama(seed=0)
            if engine == "ddp":
                net = DDP(model, bucket_cap_mb=0.1)
                handle = hfcompress.apply(net, config)
            else:
                mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
                net, handle = model, hfcompress.apply(model, config, shard=True, mesh=mesh)
            with switch(on):
                _, n = collectives(lambda: net(input_ids=ids, labels=ids).loss.backward())
            got = torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor")
                              else p.grad).reshape(-1) for p in model.parameters()])
            report[name, on] = (n, rel_err(got, want), torch.equal(got, want))
            handle.remove()
    return report


def one_rank_worker(rank, world):
    from hfcompress.comm import futures
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    with futures.inline_on_cpu():
        return {"reduce_scatter": reduce_scatter_report(), "ddp": hook_report("ddp"),
                "hsdp": hook_report("hsdp")}


def test_one_rank_switch_runs_every_compressed_stage():
    report = run_distributed(one_rank_worker, 1, timeout=600)[0]
    for path, cases in report.items():
        assert {name for name, _ in cases} == set(RS_PRESETS if path == "reduce_scatter" else
                                                  ("global_qsgd", "global_qsgd_exp", "loco",
                                                   "int8")), path
        for name, _ in cases:
            (off, _, off_equal), (on, err, on_equal) = cases[name, False], cases[name, True]
            what = (path, name, off, on, err)
            extra = list(on)
            for c in off:                 # what runs either way
                extra.remove(c)
            assert off_equal, what        # returned before any stage: the exact numbers
            assert extra and set(extra) <= EXCHANGES, what     # the stages' exchanges ran
            assert not on_equal and 0 < err <= BOUND[name], what   # and the codec
