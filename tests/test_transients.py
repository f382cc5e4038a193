"""Transient memory of one TLq-HS reduce-scatter (SDP4Bit 3.3; issue: a 7B layer's gradient
must not need several more copies of itself): the bytes allocated and not yet freed during
the call, at their peak, from the profiler's memory events (self allocations of every op
and the frees, in time order), against the float32 input. 2 nodes x 2 ranks on gloo,
compiled CPU kernels (what the GPU's fused kernels also avoid: a rotated copy, a reordered
copy and the hops' float32 sums held at once), and 4 ranks on one node. Measured 1.26x
both (2 x 2: the second half of the intra-node hop, its received payloads, their float32
sum and the first half's payloads; one node: the CPU twin's rotated copy of the input, its
one intra-node call); it was 3.65x with a rotated copy of the whole input and a
transposed copy of it.
"""

import os

import torch
import torch.distributed as dist

from dist_utils import run_distributed

MAX_TRANSIENT = 1.5      # x the float32 input of the call


def live_peak(fn) -> int:
    """Peak of the bytes allocated and not yet freed while ``fn()`` runs (CPU allocator)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def transient_worker(rank, world, s):
    os.environ["HFCOMPRESS_COMPILE"] = "1"
    from hfcompress.comm import Topology, TwoHopReduceScatter
    from hfcompress.config import get_config

    cfg = get_config("tlq_hs")
    x = torch.randn(world * s, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(s)
    ratios = []
    for per_node in (world, 2):   # one node (one intra-node call), then 2 x 2 (two halves)
        rs = TwoHopReduceScatter(Topology(per_node), cfg.grad_intra.build(),
                                 cfg.grad_inter.build())
        rs(out, x, dist.ReduceOp.AVG)       # warm-up: compiles
        peaks = [live_peak(lambda: rs(out, x, dist.ReduceOp.AVG)) for _ in range(2)]
        ratios.append(min(peaks) / (x.numel() * 4))
    # a width that is not a multiple of the Hadamard size: the intra-node hop's rows hold
    # Y input rows side by side, whose blocks must be rotated as the final inverse expects
    errors = []
    for width in (1000, 4096):
        x = torch.randn(world * width, generator=torch.Generator().manual_seed(rank + 7))
        got, exact = torch.empty(width), torch.empty(width)
        rs(got, x, dist.ReduceOp.AVG)
        dist.reduce_scatter_tensor(exact, x.clone(), op=dist.ReduceOp.AVG)
        errors.append(float((got - exact).norm() / exact.norm()))
    return ratios, errors


def test_tlq_hs_reduce_scatter_transients_below_1_5x_input():
    res = run_distributed(transient_worker, 4, 1 << 18, timeout=600)
    ratios = [r for rank_ratios, _ in res for r in rank_ratios]
    print("transient peak / float32 input per rank (one node, 2 x 2):",
          [f"{r:.2f}" for r in ratios])
    print("relative error against the exact reduce-scatter (width 1000, 4096):",
          [[f"{e:.3f}" for e in errs] for _, errs in res])
    assert all(r <= MAX_TRANSIENT for r in ratios), ratios
    # stochastic int8 intra / int4 inter (group 128) of a sum of 4 Gaussian rows: ~0.20
    # measured at both widths; blocks rotated across two input rows would leave ~3% of the
    # width 1000 values wrong by their own size (~0.32)
    for _, (e_odd, e_even) in res:
        assert e_even <= 0.25 and e_odd <= 1.2 * e_even, res
