"""The stream contract (``hfcompress/comm/futures.py``, docs/architecture.md), as far as a CPU
can see it. On CUDA no stage is chained to a future (a CUDA ``then`` orders a stage only
after the tensors in its parent's value; a stage returning nothing orders what follows
after nothing): every stage is enqueued in program order on one side stream, and the
caller gets a future completed there *with the tensor written*. ``inline_on_cpu()`` runs
that control flow on gloo: the DDP hook's, the HSDP hook's and FSDP2's asynchronous
all-gather's numbers must be bit-identical to the chained CPU path's, and every future
handed to DDP / FSDP2 must be complete when returned (no chain left behind), holding the
bucket / the all-gather output.
"""

import contextlib
import os

import pytest
import torch

from dist_utils import run_distributed, run_jobs
from hfcompress.comm import futures
from hfcompress.testing import tiny_llama
from test_ddp_async import INT8, step

#: one case per all-reduce path (stock SUM of codes, exponent tree, chunked with error
#: feedback, chunked int8): the stage structures the CUDA control flow must keep
DDP_CASES = ("global_qsgd", "global_qsgd_exp", "loco", INT8)


def test_chain_runs_inline_with_devices_and_holds_the_tensor():
    t = torch.zeros(3)
    ran = []
    with futures.inline_on_cpu():
        fut = futures.chain(futures.completed(t), lambda v: ran.append(1) or v.add_(1),
                            futures.devices_of(t))
        assert ran == [1] and fut.done()                           # ran before chain returned
        assert fut.value().data_ptr() == t.data_ptr()
        out = futures.side_stream_call(lambda: t.mul_(2), t)
        assert out.done() and out.value().data_ptr() == t.data_ptr() and t.tolist() == [2.0] * 3
    assert futures.devices_of(t) is None                           # chained again on CPU


def test_async_op_on_cuda_never_gets_an_eventless_future():
    """On CUDA an ``async_op`` collective must run through ``side_stream_call``: ``finish``
    / ``finish_all`` refuse it (their ``completed(None)`` would order the waiter after
    nothing). No CUDA call is made: the check is on the device type alone."""
    cuda = torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="side_stream_call"):
        futures.finish(None, None, True, cuda)
    with pytest.raises(RuntimeError, match="side_stream_call"):
        futures.finish_all([], lambda: None, True, cuda)
    assert futures.finish(None, None, False, cuda) is None          # blocking: fine
    assert futures.finish(None, None, True, torch.device("cpu")).done()


def spy_hook(seen):
    """``all_reduce_hook`` recording, per bucket, whether its future was complete when
    returned and held the bucket's own buffer."""
    from hfcompress.integrations.ddp import all_reduce_hook

    def hook(state, bucket):
        fut = all_reduce_hook(state, bucket)
        done = fut.done()
        seen.append(done and fut.value().data_ptr() == bucket.buffer().data_ptr())
        return fut
    return hook


def ddp_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hfcompress.comm import Topology
    from hfcompress.integrations.ddp import AllReduceState, own_group
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    report = {}
    for config in DDP_CASES:
        name = config if isinstance(config, str) else config.name
        runs = {}
        for mode in ("chained", "inline"):
            torch.manual_seed(0)
            model = DDP(tiny_llama(), bucket_cap_mb=0.1)       # several buckets
            state = AllReduceState(config, own_group(model.process_group), Topology(1))
            state.param_names = {id(p): n for n, p in model.module.named_parameters()}
            seen: list[bool] = []
            model.register_comm_hook(state, spy_hook(seen))
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            with futures.inline_on_cpu() if mode == "inline" else contextlib.nullcontext():
                losses = [step(model, opt, state, rank) for _ in range(2)]
            weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            runs[mode] = (torch.stack(losses), weights, seen)
        (l1, w1, _), (l2, w2, seen) = runs["chained"], runs["inline"]
        report[name] = {"same": torch.equal(l1, l2) and torch.equal(w1, w2),
                        "buckets": len(seen), "complete_with_bucket": all(seen)}
    return report


@pytest.fixture(scope="module")
def two_ranks():
    """Rank 0's reports of :func:`ddp_worker`, then :func:`prefetch_worker` (it patches FSDP's
    all-gather for good): one 2-rank launch for both tests (start-up costs seconds per
    rank)."""
    ddp, prefetch = run_jobs(2, (ddp_worker,), (prefetch_worker,), timeout=900)
    return {"ddp": ddp[0], "prefetch": prefetch[0]}


def test_ddp_hook_cuda_control_flow_same_numbers_no_chain_left(two_ranks):
    report = two_ranks["ddp"]
    assert {"global_qsgd", "global_qsgd_exp", "loco", "int8"} <= set(report), report
    for name, r in report.items():
        assert r["same"], (name, "inline stages changed the numbers")
        assert r["buckets"] > 3 and r["complete_with_bucket"], (name, r)


def hsdp_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    import hfcompress
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    report = {}
    for config in ("global_qsgd_exp", INT8):
        name = config if isinstance(config, str) else config.name
        runs = []
        for mode in ("chained", "inline"):
            torch.manual_seed(0)
            model = tiny_llama()
            handle = hfcompress.apply(model, config, ranks_per_node=2, shard=True, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            with futures.inline_on_cpu() if mode == "inline" else contextlib.nullcontext():
                runs.append(torch.stack([step(model, opt, handle, rank) for _ in range(2)]))
        report[name] = torch.equal(*runs)
    return report


def test_hsdp_hook_cuda_control_flow_same_numbers():
    report = run_distributed(hsdp_worker, 4, timeout=900)[0]
    assert report and all(report.values()), report


def prefetch_worker(rank, world):
    """FSDP2's asynchronous unshard (``unshard(async_op=True)``, what explicit prefetching
    issues): the all-gather returns a Work;
    under the CUDA control flow it is complete when returned and its future holds the
    all-gather output."""
    import hfcompress
    from hfcompress.integrations import fsdp as fsdp_integration
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    seen: list[bool] = []
    call = fsdp_integration.FSDPAllGather.__call__

    def spy(self, output_tensor, input_tensor, group, async_op=False):
        work = call(self, output_tensor, input_tensor, group, async_op)
        if async_op and futures.inline(output_tensor.device):
            fut = work.get_future()
            value = fut.value() if fut.done() else None
            seen.append(value is not None and value.data_ptr() == output_tensor.data_ptr())
        return work
    fsdp_integration.FSDPAllGather.__call__ = spy
    report = {}
    for preset in ("sdp4bit", "qsdp"):
        runs = []
        for mode in ("chained", "inline"):
            torch.manual_seed(0)
            model = tiny_llama()
            handle = hfcompress.apply(model, preset, ranks_per_node=1, shard=True)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            seen.clear()
            losses = []
            with futures.inline_on_cpu() if mode == "inline" else contextlib.nullcontext():
                for _ in range(2):
                    for layer in model.model.layers:     # every forward all-gather async
                        layer.unshard(async_op=True)
                    losses.append(step(model, opt, handle, rank))
            runs.append(torch.stack(losses))
            handle.remove()
        report[preset] = {"same": torch.equal(*runs), "async_calls": len(seen),
                          "complete_with_output": all(seen)}
    return report


def test_fsdp2_async_all_gather_cuda_control_flow(two_ranks):
    report = two_ranks["prefetch"]
    for preset, r in report.items():
        assert r["same"], (preset, "inline stages changed the numbers")
        assert r["async_calls"] > 0 and r["complete_with_output"], (preset, r)
