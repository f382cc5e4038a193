"""hfcompress.comm across real gloo processes (2 and 4 ranks; 1, 2 and 4 emulated nodes).

One spawned job per world size runs every check for every node layout (spawning costs
seconds). Exact means bitwise (``torch.equal``). Each rank regenerates every rank's input
from its seed, so the references are computed locally.
"""

import os

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_distributed
from hfcompress import get_compressor
from hfcompress.comm import (QuantizedAllGather, QuantizedReduceScatter, Topology,
                             TwoHopReduceScatter, WireMeter, all_gather, reduce_scatter,
                             reduce_scatter_2hop)
from hfcompress.comm.hop import RawCodec, all_gather_single, reduce_scatter_single

SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG
SIZES = (1, 37, 300)          # S: shard / slice sizes, none a multiple of a group size
DTYPES = (torch.float32, torch.bfloat16)
U = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}   # unit roundoff


def inputs(world, numel, dtype, seed, kind="randn"):
    """Every rank's input: integers in [-8, 8] (all sums exact in any order) or normals with
    a few outliers (x100)."""
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(1000 * seed + r)
        if kind == "int":
            x = torch.randint(-8, 9, (numel,), generator=g).float()
        else:
            x = torch.randn(numel, generator=g)
            x[torch.randint(0, numel, (max(1, numel // 50),), generator=g)] *= 100
        xs.append(x.to(dtype))
    return xs


def torch_reduce_scatter(x, s, op):
    out = torch.empty(s, dtype=x.dtype)
    reduce_scatter_single(out, x.clone(), op=op)
    return out


def torch_all_gather(x, world):
    out = torch.empty(world * x.numel(), dtype=x.dtype)
    all_gather_single(out, x.clone())
    return out


def same_on_all_ranks(t):
    """The tensor's bytes are identical on every rank."""
    b = t.contiguous().view(torch.uint8).reshape(-1)
    everyone = torch.empty(dist.get_world_size() * b.numel(), dtype=torch.uint8)
    all_gather_single(everyone, b)
    return all(torch.equal(c, b) for c in everyone.chunk(dist.get_world_size()))


def split_bytes(per_peer, world, me, x):
    """(intra, inter) bytes of sending ``per_peer`` bytes to every other rank of the world."""
    intra = sum(per_peer for r in range(world) if r != me and r // x == me // x)
    inter = sum(per_peer for r in range(world) if r // x != me // x)
    return intra, inter


# -- references ----------------------------------------------------------------------------
def ref_two_hop(xs, me, x, y, s, bounds, intra, inter, rotated=False):
    """SDP4Bit Alg. 3 / ZeRO++ qgZ written out for rank ``me``: node m's rank (m, l) sums what
    its node's ranks send for the shards {n*X + l}; rank (n, l) sums the Y node partials."""
    p, (n, l) = x * y, divmod(me, x)
    rows = [t.reshape(p, s) for t in xs]
    if rotated:
        rows = [torch.stack([intra.rotate(r) for r in t]) for t in rows]
    out = torch.empty(s)
    for a, b in bounds:
        node_partials = []
        for m in range(y):
            parts = [rows[m * x + k][[nn * x + l for nn in range(y)], a:b].reshape(-1)
                     for k in range(x)]
            if x == 1:
                partial = parts[0]
            elif rotated:
                partial = intra.reduce_rotated([intra.compress_rotated(t) for t in parts])
            else:
                partial = intra.reduce([intra.compress(t) for t in parts])
            node_partials.append(partial.reshape(y, b - a)[n])
        if y == 1:
            out[a:b] = node_partials[0].float()
        elif rotated:
            out[a:b] = inter.reduce_rotated([inter.compress_rotated(t) for t in node_partials])
        else:
            out[a:b] = inter.reduce([inter.compress(t) for t in node_partials])
    return intra.rotate(out) if rotated else out


# -- the checks, run on every rank ---------------------------------------------------------
def check_uncompressed(rank, world, topo, meter):
    """Compression off == torch's collectives, bitwise; the wire meter counts raw bytes."""
    x = topo.ranks_per_node
    for dtype in DTYPES:
        es = torch.tensor([], dtype=dtype).element_size()
        for s in SIZES:
            shard = inputs(world, s, dtype, seed=s)[rank]
            out = torch.empty(world * s, dtype=dtype)
            meter.reset()
            all_gather(out, shard, topology=topo, meter=meter)
            assert torch.equal(out, torch_all_gather(shard, world)), (dtype, s)
            cur = meter.current()
            assert (cur["intra_bytes"], cur["inter_bytes"]) == split_bytes(s * es, world, rank, x)
            # FSDP2 style: the input is a view of this rank's slot of the output
            out2 = torch.zeros(world * s, dtype=dtype)
            out2[rank * s:(rank + 1) * s] = shard
            all_gather(out2, out2[rank * s:(rank + 1) * s], topology=topo)
            assert torch.equal(out2, out)
            for kind in ("int", "randn"):
                xs = inputs(world, world * s, dtype, seed=7 + s, kind=kind)
                for op in (SUM, AVG):
                    expect = torch_reduce_scatter(xs[rank], s, op)
                    got = torch.empty(s, dtype=dtype)
                    reduce_scatter(got, xs[rank], op=op, topology=topo)
                    assert torch.equal(got, expect), ("1-hop", dtype, s, kind, op)
                    for chunks in (1, 3):
                        meter.reset()
                        got = torch.full((s,), float("nan"), dtype=dtype)
                        reduce_scatter_2hop(got, xs[rank], topo, op=op, chunks=chunks, meter=meter)
                        if kind == "int" or world == 2:
                            # order-independent sums: the 2-hop equals torch bit for bit
                            assert torch.equal(got, expect), ("2-hop", dtype, s, kind, op, chunks)
                        else:
                            # random floats, 4 ranks: gloo adds in another order. Each order is
                            # within (P-1) roundings of u * sum|x| of the exact sum, the 2-hop
                            # rounds at most 2 more times to the dtype (after each hop).
                            mag = sum(t.reshape(world, s)[rank].float().abs() for t in xs)
                            tol = (2 * (world - 1) + 2) * U[dtype] * mag
                            if op == AVG:
                                tol = tol / world
                            err = (got.float() - expect.float()).abs()
                            assert (err <= tol).all(), ("2-hop", dtype, s, op, err.max())
                        cur = meter.current()
                        y = topo.num_nodes
                        assert cur["intra_bytes"] == (x - 1) * y * s * es
                        assert cur["inter_bytes"] == (y - 1) * s * es


def check_compressed_all_gather(rank, world, topo, meter):
    """int4 all-gather: every slot is the local round trip of its rank's shard, within half a
    level of it, bit-identical on all ranks; payload bytes metered per peer."""
    c = get_compressor("int", bits=4, group_size=128, rounding="nearest")
    for dtype in DTYPES:
        for s in SIZES:
            xs = inputs(world, s, dtype, seed=3 + s)
            out = torch.empty(world * s, dtype=dtype)
            meter.reset()
            all_gather(out, xs[rank], compressor=c, topology=topo, meter=meter)
            assert same_on_all_ranks(out)
            for r in range(world):
                slot = out[r * s:(r + 1) * s]
                assert torch.equal(slot, c.decompress(c.compress(xs[r])))
                # nearest rounding: |error| <= scale / 2 = absmax / (2 * 7), + dtype rounding
                absmax = xs[r].float().abs().max()
                err = (slot.float() - xs[r].float()).abs().max()
                assert err <= absmax / 14 * (1 + 1e-6) + absmax * U[dtype], (err, absmax)
            cur = meter.current()
            assert (cur["intra_bytes"], cur["inter_bytes"]) == \
                split_bytes(c.wire_bits(s) // 8, world, rank, topo.ranks_per_node)


def qwd_bytes(topo, s, payload):
    """(intra, inter) bytes a rank sends in one node-sharded qWD all-gather: its payload to
    the other Y - 1 nodes, then its Y rebuilt bf16 slots to the other X - 1 ranks of its node
    (X = 1: SDP4Bit's layout, the payload to every other rank)."""
    x, y = topo.ranks_per_node, topo.num_nodes
    return y * s * 2 * (x - 1), payload * (y - 1)


def check_weight_difference_all_gather(rank, world, topo, meter):
    """qWD (SDP4Bit Alg. 2 / 4): first all-gather exact, then 4-bit differences; every rank
    holds bit-identical weights equal to a local replay of each slot's stream; an all-gather
    told ``unchanged`` (FSDP's backward) returns the same weights; state round trip; the
    node-sharded references give bitwise the same outputs as SDP4Bit's full ones."""
    s = 300
    ag = QuantizedAllGather(get_compressor("qwd"), topology=topo, meter=meter)
    full = QuantizedAllGather(get_compressor("qwd"), topology=topo, shard_references=False)
    replay = [get_compressor("qwd") for _ in range(world)]     # slot r's stream, locally
    w = inputs(world, s, torch.bfloat16, seed=11)
    inner_bytes = get_compressor("int", group_size=2048).wire_bits(s) // 8
    prev = None
    for step in range(4):
        if step in (1, 3):  # an optimizer step on every rank
            w = [(t.float() + 0.01 * torch.randn(s, generator=torch.Generator().manual_seed(step))
                  ).to(torch.bfloat16) for t in w]
        if step == 3:
            saved = ag.state_dict()
        out = torch.empty(world * s, dtype=torch.bfloat16)
        same = step == 2             # no optimizer step since the last all-gather
        meter.reset()
        ag(out, w[rank], unchanged=same)
        assert same_on_all_ranks(out)
        expect = torch.cat([q.decompress(q.compress(w[r], unchanged=same))
                            for r, q in enumerate(replay)])
        assert torch.equal(out, expect), step
        out_full = torch.empty(world * s, dtype=torch.bfloat16)
        full(out_full, w[rank], unchanged=same)
        assert torch.equal(out_full, out), step
        cur = meter.current()
        payload = 0 if same else 2 * s if step == 0 else inner_bytes
        assert (cur["intra_bytes"], cur["inter_bytes"]) == qwd_bytes(topo, s, payload), step
        ref = torch.cat(w).float()
        if step == 0:
            assert torch.equal(out, torch.cat(w))     # w~_0 = w_0 exactly (Alg. 4 line 2)
        elif step == 2:
            assert torch.equal(out, prev)             # zero differences: the same weights
        else:
            # one int4 group (2048 > s) per slot: |w~ - w| <= max|w - w~_prev| / 14, plus the
            # bf16 rounding of w~
            d = (ref - prev.float()).reshape(world, s).abs().amax(1)
            err = (out.float() - ref).reshape(world, s).abs().amax(1)
            bound = d / 14 * (1 + 1e-6) + ref.abs().max() * U[torch.bfloat16]
            assert (err <= bound).all() and (err > 0).any(), (err, bound)
        prev = out
    # state: the references of this rank's slots only (1 / ranks_per_node of the tensor)
    assert ag.state_bytes() == {"references": world * s * 2 // topo.ranks_per_node}
    assert full.state_bytes() == {"references": world * s * 2}
    # a restored collective continues the same streams
    again = QuantizedAllGather(get_compressor("qwd"), topology=topo)
    again.load_state_dict(saved)
    out2 = torch.empty(world * s, dtype=torch.bfloat16)
    again(out2, w[rank])
    assert torch.equal(out2, prev)
    # a state from another node layout is refused, naming both layouts
    if topo.ranks_per_node > 1:
        with pytest.raises(ValueError, match=f"saved with world_size={world}, ranks_per_node="
                           f"{topo.ranks_per_node}.*this run has world_size={world}, "
                           f"ranks_per_node=1"):
            full.load_state_dict(saved)


def check_compressed_reduce_scatter(rank, world, topo, meter):
    """1-hop int8 and 2-hop TLq / TLq-HS: bitwise equal to the algorithm written out, within
    the quantization bound of the exact sum; inter-node bytes are the 4-bit hop's only."""
    x, y = topo.ranks_per_node, topo.num_nodes
    i8 = get_compressor("int", bits=8, group_size=128, rounding="nearest")
    i4 = get_compressor("int", bits=4, group_size=128, rounding="nearest")
    h8 = get_compressor("hadamard", bits=8, group_size=128, hadamard_size=32, rounding="nearest")
    h4 = get_compressor("hadamard", bits=4, group_size=128, hadamard_size=32, rounding="nearest")
    for dtype in DTYPES:
        for s in SIZES:
            xs = inputs(world, world * s, dtype, seed=5 + s)
            mine = [t.reshape(world, s)[rank].float() for t in xs]
            exact = sum(mine)
            a_max = max(t.float().abs().max() for t in xs)
            for op in (SUM, AVG):
                div = world if op == AVG else 1
                got = torch.empty(s, dtype=dtype)
                reduce_scatter(got, xs[rank], compressor=i8, op=op, topology=topo)
                ref = i8.reduce([i8.compress(t) for t in mine]) if world > 1 else exact
                assert torch.equal(got, (ref / div).to(dtype)), ("1-hop", dtype, s, op)
                # per value: one int8 rounding per sender, <= absmax / (2 * 127) each
                tol = world * a_max / 254 * 1.001 + exact.abs() * U[dtype]
                assert ((got.float() * div - exact).abs() <= tol).all()
            for chunks in (1, 2):
                bounds = [(s * i // min(chunks, s), s * (i + 1) // min(chunks, s))
                          for i in range(min(chunks, s))]
                # TLq, TLq-HS, and ZeRO++-style exact intra-node hop with an int4 inter hop
                for intra, inter, rotated in ((i8, i4, False), (h8, h4, True), (None, i4, False)):
                    meter.reset()
                    rs = TwoHopReduceScatter(topo, intra, inter, chunks=chunks, meter=meter)
                    assert rs.rotated == rotated
                    got = torch.empty(s, dtype=dtype)
                    rs(got, xs[rank])
                    intra = intra or RawCodec()
                    ref = ref_two_hop(xs, rank, x, y, s, bounds, intra, inter, rotated)
                    assert torch.equal(got, ref.to(dtype)), (dtype, s, chunks, rotated)
                    # hop 1: X int8 roundings <= a/254 each; hop 2: Y int4 roundings of
                    # partials bounded by X * a (1 + 1/254), <= that / 14 each. With the
                    # Hadamard rotation the bound holds in the rotated domain, i.e. in L2.
                    b1 = x * a_max / 254 if x > 1 and intra.name != "raw" else 0.0
                    b2 = y * (x * a_max + b1) / 14 if y > 1 else 0.0
                    per_value = (b1 + b2) * 1.001 + exact.abs().max() * U[dtype]
                    err = got.float() - exact
                    if rotated:
                        assert err.norm() <= per_value * s ** 0.5, (err.norm(), per_value)
                    else:
                        assert err.abs().max() <= per_value, (err.abs().max(), per_value)
                    cur = meter.current()
                    widths = [b - a for a, b in bounds]
                    hop1_bytes = [y * w * xs[0].element_size() if intra.name == "raw"
                                  else intra.wire_bits(y * w) // 8 for w in widths]
                    assert cur["intra_bytes"] == (x - 1) * sum(hop1_bytes)
                    assert cur["inter_bytes"] == (y - 1) * sum(inter.wire_bits(w) // 8
                                                               for w in widths)


def check_stateful_reduce_scatter(rank, world, topo):
    """LoCo error feedback through the 1-hop and 2-hop all-to-all: each (sender, slice)
    stream keeps its own error, so the result equals a local replay of those streams."""
    s, steps = 100, 3
    loco = get_compressor("loco", inner=get_compressor("int", bits=4, group_size=128))
    one = QuantizedReduceScatter(loco, topology=topo)
    replay = [loco.fresh() for _ in range(world)]   # sender r's stream for my slice
    for step in range(steps):
        xs = inputs(world, world * s, torch.float32, seed=50 + step)
        got = torch.empty(s)
        one(got, xs[rank])
        mine = [t.reshape(world, s)[rank] for t in xs]
        expect = loco.reduce([q.compress(t) for q, t in zip(replay, mine)]) if world > 1 \
            else mine[0]
        assert torch.equal(got, expect), step
        for c in one.compressors() + replay:
            c.step()
    assert len(one.compressors()) == (world + 1 if world > 1 else 0)
    # each sender stream keeps the 8-bit error of its row: 100 codes padded to 128, 1 scale
    assert one.state_bytes() == ({"errors": world * (128 + 4)} if world > 1 else {})
    with pytest.raises(ValueError, match="keeps state"):
        reduce_scatter(torch.empty(s), xs[rank], compressor=loco, topology=topo)
    # first 2-hop call: every error buffer is still zero, so LoCo sends exactly its inner's
    two = TwoHopReduceScatter(topo, loco, loco, chunks=2)
    got, plain = torch.empty(s), torch.empty(s)
    two(got, xs[rank])
    i4 = get_compressor("int", bits=4, group_size=128)
    reduce_scatter_2hop(plain, xs[rank], topo, i4, i4, chunks=2)
    assert torch.equal(got, plain)
    with pytest.raises(ValueError, match="layout"):
        two(torch.empty(s + 1), torch.zeros(world * (s + 1)))


def worker(rank, world):
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    # eager kernels: torch.compile in every worker would cost more than the checks (same
    # numbers either way; the kernels' own tests cover the compiled path)
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    layouts = [x for x in (world, 2, 1) if world % x == 0 and x <= world]
    topos = [Topology(ranks_per_node=x) for x in dict.fromkeys(layouts)]
    meter = WireMeter()
    for topo in topos:
        assert topo.node * topo.ranks_per_node + topo.local_rank == rank
        check_uncompressed(rank, world, topo, meter)
        check_compressed_all_gather(rank, world, topo, meter)
        check_weight_difference_all_gather(rank, world, topo, meter)
        check_compressed_reduce_scatter(rank, world, topo, meter)
        check_stateful_reduce_scatter(rank, world, topo)
    # a 2-hop LoCo state from another node layout is refused when loaded, naming both
    loco = get_compressor("loco", inner=get_compressor("int", bits=4, group_size=128))
    saved_on = TwoHopReduceScatter(topos[0], loco, loco)
    saved_on(torch.empty(10), torch.ones(world * 10))
    with pytest.raises(ValueError, match=f"saved with world_size={world}, ranks_per_node="
                       f"{world}; this run has world_size={world}, ranks_per_node=1"):
        TwoHopReduceScatter(topos[-1], loco, loco).load_state_dict(saved_on.state_dict())
    # a layout that does not divide the world is refused before any group is created
    with pytest.raises(ValueError, match=f"world size {world} .*ranks_per_node=3"):
        Topology(ranks_per_node=3)
    os.environ["LOCAL_WORLD_SIZE"] = "3"
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=3"):
        Topology()
    return [t.num_nodes for t in topos]


@pytest.mark.parametrize("world", [2, 4])
def test_collectives(world):
    nodes = run_distributed(worker, world)
    assert nodes == [[1, 2] if world == 2 else [1, 2, 4]] * world


def failing_worker(rank, world):
    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()   # never completes: rank 1 is gone


def test_a_failing_rank_is_reported_not_hung():
    with pytest.raises(AssertionError, match=r"(?s)rank 1 raised:.*ValueError: boom on rank 1"):
        run_distributed(failing_worker, 2, timeout=60)
