"""The hierarchical compressed all-reduce (``comm/all_reduce.py``) on 4 gloo processes as
2 nodes x 2 ranks: exact sum inside the node, the flat compressed algorithm across the nodes
on the node's chunk of each local rank, exact all-gather inside the node.

Each rank replays every rank's compressor (seeded by rank), so "bitwise" means
``torch.equal`` with the algorithm written out; the meter's bytes equal the declared traffic
and the inter-node bytes are half the flat algorithm's (2 ranks per node), up to the
one-float scale's MAX.
"""

import os

import pytest
import torch

from dist_utils import run_distributed
from hfcompress import get_compressor
from hfcompress.comm import QuantizedAllReduce, Topology, WireMeter
from hfcompress.comm.traffic import sent
from test_all_reduce import (AVG, SUM, U, inputs, ref_chunked, ref_exponential, ref_linear,
                             rows, same_on_all_ranks, world_sum)

X, Y = 2, 2
SIZES = (1, 37, 1000)


def ref_hierarchical(reference, reps, xs):
    """``reference(reps of one local index, the nodes' chunks)`` on each local index's chunk
    of the node sums, concatenated: what every rank ends with (before AVG's divide)."""
    node_sums = [sum(xs[n * X + l].float() for l in range(X)) for n in range(Y)]
    parts = [reference([reps[n * X + l] for n in range(Y)],
                       [rows(s, X)[l] for s in node_sums]) for l in range(X)]
    return torch.cat([p.float() for p in parts])[:xs[0].numel()]


def linear(reps, chunks):
    return ref_linear(reps, chunks)


def chunked(reps, chunks):
    return ref_chunked([[c] * len(reps) for c in reps], reps, chunks)


def build(name, seed, **kw):
    return get_compressor(name, num_peers=Y, seed=seed, **kw) if name.startswith("global") \
        else get_compressor(name, seed=seed, **kw)


SCHEMES = [("global_qsgd", {}, linear), ("global_qsgd_exp", {}, ref_exponential),
           ("int", {"bits": 8, "group_size": 128, "rounding": "stochastic"}, chunked)]


def check_bitwise(rank, topo, meter):
    """Every scheme: bitwise the written-out algorithm, the same on all ranks, metered bytes
    = the declared traffic; global_qsgd within one level per node of the exact sum."""
    for name, kw, reference in SCHEMES:
        comp = build(name, rank, **kw)
        ar = QuantizedAllReduce(comp, topology=topo, meter=meter)
        reps = [build(name, r, **kw) for r in range(X * Y)]
        for dtype in (torch.float32, torch.bfloat16):
            for s in SIZES:
                xs = inputs(range(X * Y), s, dtype, seed=s)
                for op in (SUM, AVG):
                    div = X * Y if op == AVG else 1
                    meter.reset()
                    got = ar(xs[rank].clone(), op)
                    ref = (ref_hierarchical(reference, reps, xs) / div).to(dtype)
                    assert torch.equal(got, ref), (name, dtype, s, op)
                    assert same_on_all_ranks(got)
                    now = meter.current()
                    declared = sent(QuantizedAllReduce.traffic(s, X, Y, comp, xs[0].element_size()),
                                    X, Y)
                    assert (now["intra_bytes"], now["inter_bytes"]) == declared, (name, s)
                    if name == "global_qsgd":
                        node_sums = [sum(xs[n * X + l].float() for l in range(X))
                                     for n in range(Y)]
                        step = max(v.abs().max() for v in node_sums) / comp.levels
                        exact = sum(node_sums)
                        err = (got.float() * div - exact).abs().max()
                        assert err <= Y * step * 1.0001 + 4 * exact.abs().max() * U[dtype] * div


def check_half_the_inter_node_bytes(rank, topo):
    """global_qsgd's codes cross the node link once per node, not once per rank: half the
    flat algorithm's inter-node bytes at 2 ranks per node (plus the same scale MAX), both
    measured."""
    x = inputs([rank], 4096, torch.float32, seed=5)[0]
    hier, flat = WireMeter(), WireMeter()
    QuantizedAllReduce(build("global_qsgd", rank), topology=topo, meter=hier)(x.clone())
    os.environ["LOCAL_WORLD_SIZE"] = str(X)    # no topology: the flat path, metered on
    QuantizedAllReduce(get_compressor("global_qsgd", num_peers=X * Y, seed=rank),
                       meter=flat)(x.clone())      # nodes of LOCAL_WORLD_SIZE ranks
    # over the 4 ranks: the int8 codes, 2 * 4096 / 4 to each of 2 remote peers flat,
    # 2 * 2048 / 2 to the 1 remote peer hierarchically; the MAX of one float32 scale (as a
    # stock all-reduce of near-equal chunks) 16 bytes either way
    assert world_sum(flat.current()["inter_bytes"]) == 4 * 4096 + 16
    assert world_sum(hier.current()["inter_bytes"]) == 4 * 2048 + 16


def check_loco_streams(rank, topo):
    """A stateful scheme (LoCo around int4) keeps one stream per chunk sent across the nodes,
    restores bitwise, and refuses the flat layout's state."""
    inner = get_compressor("int", bits=4, group_size=128, rounding="nearest")
    loco = get_compressor("loco", inner=inner)
    ar = QuantizedAllReduce(loco, topology=topo)
    # each rank's streams: one per chunk it sends across the nodes, one for its gather
    streams = [([loco.fresh() for _ in range(Y)], loco.fresh()) for _ in range(X * Y)]

    def reference(reps, chunks):
        return ref_chunked([send for send, _ in reps], [gather for _, gather in reps], chunks)
    for step in range(3):
        xs = inputs(range(X * Y), 300, torch.float32, seed=60 + step)
        if step == 2:
            saved = ar.state_dict()
        got = ar(xs[rank].clone(), AVG)
        assert torch.equal(got, ref_hierarchical(reference, streams, xs) / (X * Y)), step
        if step == 2:
            again = QuantizedAllReduce(loco.fresh(), topology=topo)
            again.load_state_dict(saved)
            assert torch.equal(again(xs[rank].clone(), AVG), got)
            flat = QuantizedAllReduce(loco.fresh())
            flat.load_state_dict(saved)
            with pytest.raises(ValueError, match="layout"):
                flat(xs[rank].clone())


def check_refusals(rank, topo):
    """num_peers is the nodes' count: the group's size is refused, naming the fix."""
    with pytest.raises(ValueError, match="num_peers=4 but the all-reduce group has 2 nodes"):
        QuantizedAllReduce(get_compressor("global_qsgd", num_peers=4),
                           topology=topo)(torch.ones(8))


def worker(rank, world):
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    topo = Topology(ranks_per_node=X)
    check_bitwise(rank, topo, WireMeter())
    check_half_the_inter_node_bytes(rank, topo)
    check_loco_streams(rank, topo)
    check_refusals(rank, topo)
    return "ok"


def test_hierarchical_all_reduce():
    assert run_distributed(worker, X * Y) == ["ok"] * (X * Y)
