"""The DDP comm hook returns a chained Future (no collective waited for inside the hook), with
the numbers of the blocking path, and a steady-state step of DDP / HSDP makes no host sync
from hfcompress code. Real gloo processes, a tiny LlamaForCausalLM.
"""

import os

import torch
import torch.distributed as dist

from dist_utils import run_distributed
from hfcompress.config import CompressionConfig, Scheme, get_config, list_presets
from hfcompress.testing import tiny_llama

INT8 = CompressionConfig(name="int8", all_reduce=Scheme("int", {"bits": 8, "group_size": 128,
                                                                "rounding": "stochastic"}))
BLOCKS = CompressionConfig(name="global_qsgd_b1024",
                           all_reduce=Scheme("global_qsgd", {"bits": 8, "block_size": 1024}))


def ddp_presets():
    """Every DDP code path of the presets (one preset per distinct all-reduce scheme, LoCo,
    seed and exact parameters: what DDP's hook reads of a config; e.g. ``tlq`` and ``zeropp``
    run ``ulq``'s hook, ``sdp4bit`` runs ``tlq_hs``'s), and two configs."""
    from hfcompress.integrations.ddp import ddp_scheme
    out, seen = [], set()
    for name in list_presets():
        config = get_config(name)
        try:
            scheme = ddp_scheme(config)
        except ValueError:
            continue
        key = repr((scheme, config.loco, config.seed, config.exact_patterns, config.min_numel))
        if key not in seen:
            seen.add(key)
            out.append(name)
    return out + [INT8, BLOCKS]


def batch(rank):
    return torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(rank))


def step(model, opt, handle, rank):
    x = batch(rank)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    handle.step()
    return loss.detach()


def blocking_hook(state, bucket):
    """The former hook: every stage waited for inside the hook, a completed Future."""
    buf = bucket.buffer()
    names = state.param_names
    state.reduce(bucket.index(), buf, state.layout(
        [(names.get(id(p), "?"), p.numel()) for p in bucket.parameters()]))
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def ddp_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hfcompress
    from hfcompress.integrations import AllReduceState
    from host_sync_guard import count_host_syncs
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    steps = 2    # step 1 with DDP's first buckets, step 2 its rebuilt ones: then steady
    report = {}
    # find_unused_parameters: DDP all-reduces its used-parameter map on the main thread
    # while gloo's worker threads launch the hook's later stages
    for config, unused in [(c, False) for c in ddp_presets()] + [("global_qsgd_exp", True)]:
        name = (config if isinstance(config, str) else config.name) + "/unused" * unused
        runs = {}
        for mode in ("chained", "blocking"):
            torch.manual_seed(0)
            model = DDP(tiny_llama(), bucket_cap_mb=0.1,          # several buckets
                        find_unused_parameters=unused)
            if mode == "chained":
                handle = hfcompress.apply(model, config, ranks_per_node=1)
            else:
                handle = AllReduceState(config, model.process_group)
                handle.param_names = {id(p): n for n, p in model.module.named_parameters()}
                model.register_comm_hook(handle, blocking_hook)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            losses = [step(model, opt, handle, rank) for _ in range(steps)]
            syncs = None
            if mode == "chained":    # steady state: one more step, every host sync counted
                with count_host_syncs() as syncs:
                    losses.append(step(model, opt, handle, rank))
            else:
                losses.append(step(model, opt, handle, rank))
            weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            runs[mode] = (torch.stack(losses), weights, syncs)
        (l1, w1, syncs), (l2, w2, _) = runs["chained"], runs["blocking"]
        # the chained Futures compute exactly what the blocking path computes
        assert torch.equal(l1, l2) and torch.equal(w1, w2), (name, l1, l2)
        report[name] = dict(syncs)
    return report


def assert_no_host_syncs(report: dict, what: str) -> None:
    synced = {name: s for name, s in report.items() if s}
    assert not synced, f"host syncs from hfcompress code in a steady-state {what} step: {synced}"


def test_ddp_chained_future_same_numbers_and_no_host_sync():
    report = run_distributed(ddp_worker, 2, timeout=900)[0]
    assert_no_host_syncs(report, "DDP")
    assert {"global_qsgd", "global_qsgd_exp", "loco", "int8", "global_qsgd_b1024"} <= \
        set(report)


def hsdp_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    import hfcompress
    from host_sync_guard import count_host_syncs
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    report = {}
    for config in ("global_qsgd", "global_qsgd_exp", "loco", INT8):
        name = config if isinstance(config, str) else config.name
        torch.manual_seed(0)
        model = tiny_llama()
        handle = hfcompress.apply(model, config, ranks_per_node=2, shard=True, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        step(model, opt, handle, rank)    # lazy set-up (FSDP2, streams): then steady
        with count_host_syncs() as syncs:
            step(model, opt, handle, rank)
        report[name] = dict(syncs)
    return report


def test_hsdp_replica_hook_no_host_sync():
    report = run_distributed(hsdp_worker, 4, timeout=900)[0]
    assert_no_host_syncs(report, "HSDP")
