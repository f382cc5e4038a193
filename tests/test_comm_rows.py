"""The collectives' one-call-per-hop path (``compress_rows`` / ``reduce_rows``) against the
per-destination path (one ``compress`` per peer, ``reduce`` of the unflattened payloads):
bitwise equal with stochastic rounding, over several calls (the RNG streams stay in step),
for the 1-hop and 2-hop reduce-scatters (1, 2 and 4 emulated nodes, pipelined chunks,
TLq-HS in the rotated domain) and the chunked all-reduce, on 4 real gloo ranks."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dist_utils import run_distributed, run_jobs
from hfcompress import get_compressor
from hfcompress.comm import QuantizedReduceScatter, Topology, TwoHopReduceScatter
from hfcompress.comm.all_reduce import QuantizedAllReduce
from hfcompress.comm.futures import completed
from hfcompress.compressors.base import Compressor, into, stack_payloads

SIZES = (37, 300)   # S: none a multiple of a group size


def per_destination(c: Compressor) -> Compressor:
    """``c`` with the row methods replaced by one call per row (the per-destination path)."""
    c.compress_rows = types.MethodType(Compressor.compress_rows, c)
    c.reduce_rows = types.MethodType(Compressor.reduce_rows, c)
    if hasattr(c, "compress_rotated"):
        c.compress_rotated_rows = lambda y, tail=None: stack_payloads(
            [c.compress_rotated(r) for r in y], tail)
        c.reduce_rotated_rows = lambda w, shape, dt, out=None, post=None: into(
            c.reduce_rotated([c.unflatten(r, shape, dt) for r in w]), out, post)
    return c


def schemes():
    return {
        "int4": lambda: get_compressor("int", bits=4, group_size=128, rounding="stochastic",
                                       seed=1),
        "int8": lambda: get_compressor("int", bits=8, group_size=64, rounding="stochastic",
                                       seed=2),
        "qsgd": lambda: get_compressor("qsgd", bits=8, bucket_size=64, seed=3),
        "hs4": lambda: get_compressor("hadamard", bits=4, group_size=128, hadamard_size=32,
                                      seed=4),
        "hs8": lambda: get_compressor("hadamard", bits=8, group_size=128, hadamard_size=32,
                                      seed=5),
    }


def inputs(world, numel, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g) for _ in range(world)]


def worker(rank, world):
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    os.environ["HFCOMPRESS_COMPILE"] = "0"   # eager kernels (the compiled twin: same numbers)
    make = schemes()
    checked = 0
    for x in (world, 2, 1):
        topo = Topology(ranks_per_node=x)
        cases = []
        if x == world:   # the 1-hop collectives need one layout only
            for name in ("int4", "qsgd"):
                cases.append((f"1hop-{name}", lambda c: QuantizedReduceScatter(c(), topo),
                              make[name]))
            cases.append(("all_reduce-int8", lambda c: QuantizedAllReduce(c(), topo),
                          make["int8"]))
        for intra, inter in (("int8", "int4"), ("hs8", "hs4")):
            for chunks in (1, 2):
                def build(wrap, intra=intra, inter=inter, chunks=chunks):
                    return TwoHopReduceScatter(topo, wrap(make[intra]), wrap(make[inter]),
                                               chunks=chunks)
                cases.append((f"2hop-{intra}-{inter}-{chunks}", build, None))
        for name, build, factory in cases:
            if factory is None:
                fast, slow = build(lambda f: f()), build(lambda f: per_destination(f()))
            else:
                fast, slow = build(factory), build(lambda: per_destination(factory()))
            for s in SIZES:
                for step in range(2):
                    xs = inputs(world, world * s, seed=100 * s + step)
                    if name.startswith("all_reduce"):
                        a, b = xs[rank].clone(), xs[rank].clone()
                        fast(a)
                        slow(b)
                    else:
                        a, b = torch.empty(s), torch.empty(s)
                        fast(a, xs[rank])
                        slow(b, xs[rank])
                    assert torch.equal(a, b), (name, x, s, step)
                    checked += 1
    return checked


def single_hop_worker(rank, world):
    """The 2-hop reduce-scatter's one hop alone (one node of 4, or 4 nodes of 1), planned per
    operand signature (``TwoHopReduceScatter._plan``: built at a signature's first call,
    reused at its second) and in straight-line code (``_single``, plans off) against its
    general path (``_one_hop`` answering None), bitwise: SUM / AVG / PREMUL_SUM, exact
    columns riding (the decode-sum sums them) or none, a contiguous output or a strided one
    (no kernel writes it: no plan); the Hadamard schemes also with their Triton kernels
    (interpreted: the kernels' planned launches)."""
    import torch.distributed as dist
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    make = schemes()
    make["hs8t"], make["hs4t"] = (
        lambda bits=bits, seed=seed: get_compressor("hadamard", bits=bits, group_size=128,
                                                    hadamard_size=32, seed=seed,
                                                    backend="triton")
        for bits, seed in ((8, 5), (4, 4)))
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PREMUL_SUM(0.25))
    every = [(op, r, st) for op in ops for r in (False, True) for st in (False, True)]
    # interpreted kernels are slow: two cases, the planned path against the general one
    interpreted = [(dist.ReduceOp.SUM, False, False), (dist.ReduceOp.AVG, True, False)]
    checked = 0
    for x in (world, 1):
        topo = Topology(ranks_per_node=x)
        for intra, inter in (("int8", "int4"), ("hs8", "hs4"), ("hs8t", "hs4t")):
            planned, single, general = (TwoHopReduceScatter(topo, make[intra](), make[inter]())
                                        for _ in range(3))
            single._plans = lambda key, *args: None
            general._one_hop = lambda *args: None
            cases = interpreted if intra == "hs8t" else every
            for step, (op, riders, strided) in enumerate(cases):
                for again in range(2):
                    s, e = 320, 7   # Hadamard blocks of 32 within the rows; groups padded
                    xs = inputs(world, world * (s + e), seed=2 * step + again)[rank]
                    xs = xs.view(world, s + e)
                    outs = []
                    for coll in (planned, single, general) if cases is every else \
                            (planned, general):
                        out = torch.empty(s, 2)[:, 0] if strided else torch.empty(s)
                        exact = (xs[:, s:], torch.empty(e)) if riders else None
                        coll(out, xs[:, :s], op, exact=exact)
                        outs.append((out, exact))
                    for out, ex in outs[:-1]:
                        assert torch.equal(out, outs[-1][0]), (x, intra, op, riders, strided)
                        assert not riders or torch.equal(ex[1], outs[-1][1][1]), (x, intra, op)
                    checked += 1
            # a plan for each contiguous output's (op, riders); none for a strided output
            plans = list(planned._plans._plans.values())
            assert sum(p is not None for p in plans) == len(plans) - sum(
                strided for _, _, strided in cases) > 0, (x, intra)
    return checked


@pytest.fixture(scope="module")
def four_ranks():
    """One 4-rank launch for the tests (process start-up costs seconds per rank):
    :func:`worker`, :func:`single_hop_worker`, then :func:`ops_worker` (last: it runs the
    all-reduce's chain inline for good)."""
    checked, single, ops = run_jobs(4, (worker,), (single_hop_worker,), (ops_worker,))
    return {"checked": checked, "single": single, "ops": ops}


def test_one_compress_per_hop_is_the_per_destination_path(four_ranks):
    counts = four_ranks["checked"]
    assert counts[0] == counts[-1] > 0


def test_one_hop_alone_is_the_general_path(four_ranks):
    assert four_ranks["single"] == [2 * (2 * 12 + 2) * 2] * 4


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _inline_chain(fut, fn, devices=None):
    """``futures.chain`` run on the caller's thread (the dispatch-mode count is per thread;
    the all-reduce's later stages otherwise run on gloo's completion thread)."""
    nxt = fn(fut.wait())
    return completed(nxt.wait() if isinstance(nxt, torch._C.Future) else nxt)


def ops_worker(rank, world):
    """Torch ops of one call (after a warm-up call) of each collective."""
    # the module (``hfcompress.comm.all_reduce`` as an attribute is the function)
    sys.modules[QuantizedAllReduce.__module__].chain = _inline_chain
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    make = schemes()
    s = 1000
    one_node, per_rank = Topology(ranks_per_node=world), Topology(ranks_per_node=1)
    cases = {
        "reduce_scatter": QuantizedReduceScatter(make["int4"](), per_rank),
        "2hop_intra": TwoHopReduceScatter(one_node, make["hs8"](), make["hs4"]()),
        "2hop_inter": TwoHopReduceScatter(per_rank, make["int8"](), make["int4"]()),
        "all_reduce": QuantizedAllReduce(make["int8"](), per_rank),
        "all_reduce_exp": QuantizedAllReduce(get_compressor("global_qsgd_exp", num_peers=world,
                                                            bits=4, seed=rank), per_rank),
    }
    out = {}
    for name, coll in cases.items():
        for step in range(2):
            x = inputs(world, world * s, seed=step)[rank]
            mode = _CountOps()
            with mode:
                if name.startswith("all_reduce"):
                    coll(x)
                else:
                    coll(torch.empty(s), x)
        out[name] = mode.count
    # one level of the exponential all-reduce's combine tree (ceil(log2 n) levels)
    c = get_compressor("global_qsgd_exp", num_peers=world, bits=4)
    codes = torch.zeros(2, s // 2, dtype=torch.uint8)
    mode = _CountOps()
    with mode:
        c.combine_rows(codes)
    out["tree_level"] = mode.count
    return out


def test_collective_ops_do_not_grow_with_world_size(four_ranks):
    """One compress per hop: from 2 to 4 ranks a collective's torch ops grow only by the
    receiver's in-order float32 adds of the peers (one select + one add per extra peer and
    receive; the exact sum of the per-destination path), not by a compress per peer; the
    exponential Global-QSGD all-reduce by one level of its combine tree (log2 of the
    world size levels, each one call)."""
    two = run_distributed(ops_worker, 2)[0]
    four = four_ranks["ops"][0]
    print("2 ranks:", two, "4 ranks:", four)
    for name in two:
        if name == "tree_level":
            continue
        bound = (two["tree_level"] if name == "all_reduce_exp" else 0) + 2 * 2
        assert 0 <= four[name] - two[name] <= bound, (name, two[name], four[name])
