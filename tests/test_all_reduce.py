"""hfcompress.comm.all_reduce across real gloo processes (2 and 4 ranks), one rank per node
(the flat algorithms; ``test_hierarchical_all_reduce.py``: several ranks per node).

One spawned job per world size runs every check. Each rank regenerates every rank's input
and replays every rank's compressor (seeded by rank) locally, so the references are the
algorithms written out: "bitwise" means ``torch.equal``.
"""

import dataclasses
import math
import os

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_distributed
from hfcompress import get_compressor
from hfcompress.comm import QuantizedAllReduce, Topology, WireMeter, all_reduce
from hfcompress.comm.hop import all_gather_single

SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG
SIZES = (1, 37, 1000)
U = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}   # unit roundoff


def inputs(ranks, numel, dtype, seed):
    """Rank r's input (for r in ``ranks``): normals with a few outliers (x20)."""
    xs = []
    for r in ranks:
        g = torch.Generator().manual_seed(1000 * seed + r)
        x = torch.randn(numel, generator=g)
        x[torch.randint(0, numel, (max(1, numel // 50),), generator=g)] *= 20
        xs.append(x.to(dtype))
    return xs


def same_on_all_ranks(t, group=None):
    b = t.contiguous().view(torch.uint8).reshape(-1)
    n = dist.get_world_size(group)
    everyone = torch.empty(n * b.numel(), dtype=torch.uint8)
    all_gather_single(everyone, b, group=group)
    return all(torch.equal(c, b) for c in everyone.chunk(n))


def world_sum(v):
    t = torch.tensor([float(v)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def rows(x, n):
    w = -(-x.numel() // n)
    return torch.nn.functional.pad(x.reshape(-1), (0, n * w - x.numel())).view(n, w)


# -- references: the algorithms written out for every rank's stream ---------------------------
def ref_linear(reps, xs):
    """Alg. 1 with linear dithering: MAX of the scales, exact integer sum, one decode."""
    scale = torch.stack([c.local_scale(x) for c, x in zip(reps, xs)]).amax(0)
    return reps[0].reduce([c.compress(x, scale=scale) for c, x in zip(reps, xs)])


def ref_exponential(reps, xs):
    """Rank k owns chunk k: every rank's codes for it, combined by rank k's C_nat tree. The
    global scale: one for the tensor, or (block_size) per block of each chunk."""
    n = len(xs)
    if reps[0].block_size is None:
        scales = [torch.stack([c.local_scale(x) for c, x in zip(reps, xs)]).amax(0)] * n
    else:
        scales = [torch.stack([c.local_scale(rows(x, n)[k]) for c, x in zip(reps, xs)]).amax(0)
                  for k in range(n)]
    sent = [[c.compress(r, scale=scales[k]) for k, r in enumerate(rows(x, n))]
            for c, x in zip(reps, xs)]
    combined = [reps[k].reduce_packed([sent[r][k] for r in range(n)]) for k in range(n)]
    out = [reps[k].decompress(dataclasses.replace(p, dtype=torch.float32))
           for k, p in enumerate(combined)]
    return torch.cat(out)[:xs[0].numel()]


def tree_variance_bound(xs):
    """Variance bound of the exponential all-reduce, along ``reduce_packed``'s pairwise tree.
    A leaf (one peer's dithering, Global-QSGD 4.2): Var <= x**2 / 8. A combine C_nat(z1 + z2)
    adds E[(z1 + z2)**2] / 8 = (V1 + V2 + (m1 + m2)**2) / 8, so V <= 9/8 (V1 + V2) + m**2 / 8:
    the (9/8)**ceil(log2 n) factor of 4.2 on the peers' variance plus the rounding of the
    partial sums."""
    level = [(x.double(), x.double() ** 2 / 8) for x in xs]
    while len(level) > 1:
        nxt = []
        for (m1, v1), (m2, v2) in zip(level[0::2], level[1::2]):
            nxt.append((m1 + m2, 9 / 8 * (v1 + v2) + (m1 + m2) ** 2 / 8))
        level = nxt + level[len(level) - len(level) % 2:]
    return level[0][1]


def ref_chunked(send, gather, xs):
    """compress chunks -> owner's fp32 sum -> owner compresses -> everyone decodes.
    ``send[r][k]``: rank r's stream for chunk k; ``gather[k]``: owner k's gather stream."""
    n = len(xs)
    sent = [[send[r][k].compress(row) for k, row in enumerate(rows(x, n))]
            for r, x in enumerate(xs)]
    parts = [send[k][0].reduce([sent[r][k] for r in range(n)]).float() for k in range(n)]
    out = [gather[k].decompress(gather[k].compress(p)).float() for k, p in enumerate(parts)]
    return torch.cat(out)[:xs[0].numel()]


# -- the checks ------------------------------------------------------------------------------
def check_uncompressed(rank, world, topo, meter):
    """Compression off == torch's all_reduce bitwise; metered as reduce-scatter + all-gather
    (2 (n - 1) / n of the bytes per rank)."""
    for dtype in (torch.float32, torch.bfloat16):
        for s in SIZES:
            x = inputs([rank], s, dtype, seed=s)[0]
            for op in (SUM, AVG):
                expect = x.clone()
                dist.all_reduce(expect, op=op)
                meter.reset()
                got = QuantizedAllReduce(topology=topo, meter=meter)(x.clone(), op)
                assert torch.equal(got, expect), (dtype, s, op)
                sent = meter.current()
                assert world_sum(sent["intra_bytes"] + sent["inter_bytes"]) == \
                    2 * (world - 1) * s * x.element_size()
    # a non-contiguous tensor is reduced in place too
    x = inputs([rank], 60, torch.float32, seed=3)[0].view(6, 10).t()
    expect = x.contiguous()
    dist.all_reduce(expect)
    all_reduce(x)
    assert torch.equal(x, expect)


def check_linear(rank, world, topo, meter):
    """global_qsgd: the exact integer sum decoded, bitwise, the same on all ranks; within one
    level per peer of the exact sum; overflow refused; Inf stays non-finite."""
    comp = get_compressor("global_qsgd", num_peers=world, seed=rank)
    assert comp.levels * world <= 127        # the wire integer holds the sum of n peers
    ar = QuantizedAllReduce(comp, topology=topo, meter=meter)
    reps = [get_compressor("global_qsgd", num_peers=world, seed=r) for r in range(world)]
    for dtype in (torch.float32, torch.bfloat16):
        for s in SIZES:
            xs = inputs(range(world), s, dtype, seed=10 + s)
            for op in (SUM, AVG):
                div = world if op == AVG else 1
                meter.reset()
                got = ar(xs[rank].clone(), op)
                assert torch.equal(got, (ref_linear(reps, xs) / div).to(dtype)), (dtype, s, op)
                assert same_on_all_ranks(got)
                exact = sum(x.float() for x in xs)
                step = max(x.float().abs().max() for x in xs) / comp.levels
                err = (got.float() * div - exact).abs().max()
                assert err <= world * step * 1.0001 + exact.abs().max() * U[dtype] * div, err
                # one int8 per value + the MAX of one float32 scale, both as stock
                # all-reduces (reduce-scatter + all-gather: 2 (n - 1) x the bytes in total)
                sent = meter.current()
                assert world_sum(sent["intra_bytes"] + sent["inter_bytes"]) == \
                    2 * (world - 1) * (s + 4)
    # the largest codes of n peers sum to n * levels <= 127: exact, no wrap-around
    top = ar(torch.full((64,), 3.0))
    assert ((top - 3.0 * world).abs() <= 3.0 * world * 2 ** -22).all(), top
    # an int32 wire integer works the same way
    wide = QuantizedAllReduce(get_compressor("global_qsgd", num_peers=world, bits=32, seed=rank))
    reps32 = [get_compressor("global_qsgd", num_peers=world, bits=32, seed=r) for r in range(world)]
    xs = inputs(range(world), 100, torch.float32, seed=4)
    assert torch.equal(wide(xs[rank].clone()), ref_linear(reps32, xs))
    # too few num_peers would overflow the int8 sum: refused (the hooks build num_peers = n)
    with pytest.raises(ValueError, match=f"num_peers=1 but the all-reduce group has {world}"):
        QuantizedAllReduce(get_compressor("global_qsgd", num_peers=1))(xs[rank].clone())
    with pytest.raises(ValueError, match="no stock all_reduce"):
        QuantizedAllReduce(get_compressor("global_qsgd", num_peers=world, bits=16))
    # an Inf on one rank: the global scale is Inf and every rank decodes non-finite values
    x = xs[rank].clone()
    if rank == 0:
        x[5] = float("inf")
    assert not torch.isfinite(ar(x)).any()


def check_linear_unbiased(rank, world, topo):
    """E[all-reduce] = exact sum. Each peer rounds to one of two levels ``step`` apart:
    variance <= step**2 / 4, so the sum of n peers has variance <= n step**2 / 4 and the mean
    of R repeats a standard deviation <= sqrt(n / (4 R)) step. Tolerance: 6 of those per
    value (1000 values: a false alarm has probability < 1e-5)."""
    comp = get_compressor("global_qsgd", num_peers=world, seed=100 + rank)
    ar = QuantizedAllReduce(comp)
    xs = inputs(range(world), 1000, torch.float32, seed=21)
    exact = sum(xs)
    reps, first = 300, None
    total = torch.zeros(1000, dtype=torch.float64)
    for i in range(reps):
        got = ar(xs[rank].clone())
        first = got.clone() if first is None else first
        total += got.double()
    step = max(x.abs().max() for x in xs).item() / comp.levels
    sigma = math.sqrt(world / (4 * reps)) * step
    err = (total / reps - exact.double()).abs().max().item()
    assert err <= 6 * sigma, (err, sigma)
    # not vacuous: one all-reduce is further off than the tolerance of the mean
    assert (first - exact).abs().max() > 6 * sigma


def check_exponential(rank, world, topo, meter):
    """global_qsgd_exp: equals the C_nat exponent reduce written out, bitwise, identical on
    every rank, for 8 and 4 bit codes; the unbiased mean and the variance bound
    (9/8)**ceil(log2 n) of Global-QSGD 4.2."""
    for bits in (8, 4):
        comp = get_compressor("global_qsgd_exp", num_peers=world, bits=bits, seed=rank)
        ar = QuantizedAllReduce(comp, topology=topo, meter=meter)
        reps = [get_compressor("global_qsgd_exp", num_peers=world, bits=bits, seed=r)
                for r in range(world)]
        for dtype in (torch.float32, torch.bfloat16):
            for s in SIZES:
                xs = inputs(range(world), s, dtype, seed=30 + s)
                meter.reset()
                got = ar(xs[rank].clone(), AVG)
                assert torch.equal(got, (ref_exponential(reps, xs) / world).to(dtype))
                assert same_on_all_ranks(got)
                # codes only, twice (all-to-all, all-gather), + the MAX of the scale
                w = -(-s // world)
                per_peer = 2 * comp.payload_spec(w)["codes"][1]
                sent = meter.current()
                assert world_sum(sent["intra_bytes"] + sent["inter_bytes"]) == \
                    world * (world - 1) * per_peer + 2 * (world - 1) * 4
    # unbiasedness and the variance factor, 8 bits (127 - headroom levels: no values fall
    # below the last level here, so each peer's variance is <= x**2 / 8, 4.2)
    comp = get_compressor("global_qsgd_exp", num_peers=world, seed=200 + rank)
    ar = QuantizedAllReduce(comp)
    xs = inputs(range(world), 1000, torch.float32, seed=41)
    exact = sum(xs).double()
    reps = 300
    total = torch.zeros(1000, dtype=torch.float64)
    square = torch.zeros(1000, dtype=torch.float64)
    for _ in range(reps):
        got = ar(xs[rank].clone()).double()
        total += got
        square += got * got
    mean = total / reps
    var = (square / reps - mean * mean) * reps / (reps - 1)
    bound = tree_variance_bound(xs)
    err = (mean - exact).abs()
    assert (err <= 6 * (bound / reps).sqrt() + 1e-12).all(), (err / (bound / reps).sqrt()).max()
    # the summed sample variance (relative std ~ sqrt(2 / R) / sqrt(1000) < 1%) is within 10%
    # of the bound or below it
    assert var.sum() <= 1.1 * bound.sum(), (var.sum(), bound.sum())
    assert var.sum() > 0.05 * bound.sum()     # it is a stochastic reduce, not a copy
    with pytest.raises(ValueError, match=f"num_peers={world + 1} but"):
        QuantizedAllReduce(get_compressor("global_qsgd_exp", num_peers=world + 1))(xs[rank])


def check_blocks(rank, world, topo, meter):
    """block_size=32: one global scale per block (the MAX all-reduce of a vector). Block
    magnitudes span 2**-12 .. 1. Bitwise the algorithm written out (linear: the exact integer
    sum), identical on every rank; linear within one level of its own block per peer (a
    per-tensor scale would allow 2**12 times more in the small blocks); the meter counts the
    scale vector as a stock all-reduce of float32; an Inf poisons only its block."""
    bs = 32
    for name in ("global_qsgd", "global_qsgd_exp"):
        comp = get_compressor(name, num_peers=world, seed=rank, block_size=bs)
        ar = QuantizedAllReduce(comp, topology=topo, meter=meter)
        reps = [get_compressor(name, num_peers=world, seed=r, block_size=bs)
                for r in range(world)]
        for s in SIZES:
            f = torch.exp2(-(torch.arange(s) // bs % 13).float())
            xs = [x * f for x in inputs(range(world), s, torch.float32, seed=80 + s)]
            meter.reset()
            got = ar(xs[rank].clone())
            sent = world_sum(meter.current()["intra_bytes"] + meter.current()["inter_bytes"])
            assert same_on_all_ranks(got)
            if name == "global_qsgd":
                assert torch.equal(got, ref_linear(reps, xs)), s
                blocks = -(-s // bs)
                assert sent == 2 * (world - 1) * (s + 4 * blocks)
                top = torch.stack([comp.local_scale(x) for x in xs]).amax(0)
                step = top.repeat_interleave(bs)[:s] / comp.levels
                exact = sum(xs)
                tol = world * step * 1.0001 + exact.abs() * U[torch.float32]
                assert ((got - exact).abs() <= tol).all()
            else:
                assert torch.equal(got, ref_exponential(reps, xs)), s
                w = -(-s // world)
                blocks = world * -(-w // bs)          # per chunk
                assert sent == world * (world - 1) * 2 * comp.payload_spec(w)["codes"][1] \
                    + 2 * (world - 1) * 4 * blocks
        x = inputs([rank], 1000, torch.float32, seed=90)[0]
        if rank == 0:
            x[40] = float("inf")                   # block 1 (also of chunk 0)
        bad = torch.arange(1000) // bs == 1
        got = ar(x)
        assert not torch.isfinite(got[bad]).any() and torch.isfinite(got[~bad]).all(), name


def check_group_schemes(rank, world, topo, meter):
    """int8 / int4 group all-reduce: compress -> all-to-all -> fp32 sum -> compress ->
    all-gather, bitwise equal to that written out, identical on all ranks, within the
    rounding bound; metered bytes = the payloads."""
    for bits in (8, 4):
        comp = get_compressor("int", bits=bits, group_size=128, rounding="stochastic", seed=rank)
        ar = QuantizedAllReduce(comp, topology=topo, meter=meter)
        reps = [get_compressor("int", bits=bits, group_size=128, rounding="stochastic", seed=r)
                for r in range(world)]
        qmax = (1 << (bits - 1)) - 1
        for dtype in (torch.float32, torch.bfloat16):
            for s in SIZES:
                xs = inputs(range(world), s, dtype, seed=50 + s)
                meter.reset()
                got = ar(xs[rank].clone(), SUM)
                ref = ref_chunked([[c] * world for c in reps], reps, xs)
                assert torch.equal(got, ref.to(dtype)), (bits, dtype, s)
                assert same_on_all_ranks(got)
                # stochastic rounding: < one level (absmax / qmax) per peer, then once more
                # on the sum (absmax <= n a (1 + 1/qmax))
                a = max(x.float().abs().max() for x in xs)
                exact = sum(x.float() for x in xs)
                tol = (world * a / qmax) * (2 + 1 / qmax) * 1.001 + exact.abs().max() * U[dtype]
                assert (got.float() - exact).abs().max() <= tol
                w = -(-s // world)
                sent = meter.current()
                assert world_sum(sent["intra_bytes"] + sent["inter_bytes"]) == \
                    2 * world * (world - 1) * comp.wire_bits(w) // 8


def check_loco(rank, world, topo):
    """LoCo error feedback on what each rank sends: one error stream per chunk sent and one
    for the owner's gathered chunk, equal to those streams replayed; the state round trip."""
    inner = get_compressor("int", bits=4, group_size=128, rounding="nearest")
    loco = get_compressor("loco", inner=inner)
    ar = QuantizedAllReduce(loco, topology=topo)
    send = [[loco.fresh() for _ in range(world)] for _ in range(world)]
    gather = [loco.fresh() for _ in range(world)]
    replay = [c for row in send for c in row] + gather
    for step in range(4):
        if step == 2:
            saved = ar.state_dict()
        xs = inputs(range(world), 300, torch.float32, seed=60 + step)
        got = ar(xs[rank].clone(), AVG)
        assert torch.equal(got, ref_chunked(send, gather, xs) / world), step
        for c in ar.compressors() + replay:
            c.step()
        if step == 2:
            again = QuantizedAllReduce(loco.fresh())
            again.load_state_dict(saved)
            assert torch.equal(again(xs[rank].clone(), AVG), got)
    assert len(ar.compressors()) == world + 2     # sends, the gather and the receiver
    with pytest.raises(ValueError, match="keeps state"):
        all_reduce(xs[rank].clone(), compressor=loco)
    with pytest.raises(ValueError, match="loco around global_qsgd"):
        QuantizedAllReduce(get_compressor("loco", inner=get_compressor("global_qsgd")))
    with pytest.raises(ValueError, match="layout"):
        ar(torch.zeros(301))


def check_subgroup(rank, world, topo):
    """Over a sub-group (the inter-node group, as HSDP's replica all-reduce): the sum over its
    ranks only, bitwise the reference, num_peers = the sub-group's size."""
    group = topo.inter_group
    ranks = dist.get_process_group_ranks(group)
    n = len(ranks)
    comp = get_compressor("global_qsgd_exp", num_peers=n, seed=rank)
    reps = [get_compressor("global_qsgd_exp", num_peers=n, seed=r) for r in ranks]
    xs = inputs(ranks, 500, torch.float32, seed=70)
    got = QuantizedAllReduce(comp, topology=topo)(xs[ranks.index(rank)].clone(), group=group)
    assert torch.equal(got, ref_exponential(reps, xs))
    assert same_on_all_ranks(got, group)


def worker(rank, world):
    os.environ["HFCOMPRESS_COMPILE"] = "0"     # eager kernels: same numbers, no compile time
    topo = Topology(ranks_per_node=max(1, world // 2))   # 2 emulated nodes
    flat = Topology(ranks_per_node=1)   # one rank per node: the flat algorithms
    meter = WireMeter()
    check_uncompressed(rank, world, topo, meter)
    check_linear(rank, world, flat, meter)
    check_linear_unbiased(rank, world, flat)
    check_exponential(rank, world, flat, meter)
    check_blocks(rank, world, flat, meter)
    check_group_schemes(rank, world, flat, meter)
    check_loco(rank, world, flat)
    check_subgroup(rank, world, topo)
    return "ok"


@pytest.mark.parametrize("world", [2, 4])
def test_all_reduce(world):
    assert run_distributed(worker, world) == ["ok"] * world
