"""Exact columns riding the compressed exchanges (``comm/riders.py``) on 4 gloo ranks, as 1,
2 and 4 emulated nodes: the riding values come out as torch's exact collectives give them
(integer-valued inputs: every sum exact in any order, so bitwise), the compressed columns
bit for bit as without a rider, and the wire carries exactly the exact values' bytes more;
the Triton decode-sums (interpreted) sum the riders in their own launch."""

import torch
import torch.distributed as dist

from dist_utils import run_distributed
from hfcompress import get_compressor
from hfcompress.comm import (QuantizedAllGather, QuantizedReduceScatter, Topology,
                             TwoHopReduceScatter, WireMeter)
from hfcompress.comm.hop import all_gather_single, reduce_scatter_single
from hfcompress.comm.traffic import sent
from test_comm_collectives import inputs

E = 24      # exact values per slot


def _ints(world, numel, dtype, seed):
    return inputs(world, numel, dtype, seed, kind="int")


def check_reduce_scatter(rank, world, topo, meter):
    h8 = get_compressor("hadamard", bits=8, group_size=128, hadamard_size=32, rounding="nearest")
    h4 = get_compressor("hadamard", bits=4, group_size=128, hadamard_size=32, rounding="nearest")
    int4 = get_compressor("int", bits=4, group_size=128, rounding="nearest")
    # the Triton kernels (interpreted, bfloat16 at AVG only: the interpreter is slow): the
    # last hop's decode-sum sums the riders itself
    k8, k4 = (get_compressor("hadamard", bits=b, group_size=128, hadamard_size=32,
                             rounding="nearest", backend="triton") for b in (8, 4))
    kernels_case = (torch.bfloat16, dist.ReduceOp.AVG)
    s, x, y = 300, topo.ranks_per_node, topo.num_nodes
    for dtype in (torch.float32, torch.bfloat16):
        size = dtype.itemsize
        xs = inputs(world, world * s, dtype, seed=7)
        es = _ints(world, world * E, dtype, seed=8)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            exact = torch.empty(E, dtype=dtype)
            reduce_scatter_single(exact, es[rank].clone(), op=op)
            declared = (lambda e: TwoHopReduceScatter.traffic(s, x, y, h8, h4, size, exact=e),
                        lambda e: TwoHopReduceScatter.traffic(s, x, y, h8, h4, size, chunks=2,
                                                              exact=e),
                        lambda e: QuantizedReduceScatter.traffic(s, x, y, h4, size, exact=e),
                        lambda e: QuantizedReduceScatter.traffic(s, x, y, int4, size, exact=e),
                        lambda e: TwoHopReduceScatter.traffic(s, x, y, k8, k4, size, exact=e),
                        lambda e: QuantizedReduceScatter.traffic(s, x, y, k4, size, exact=e))
            makers = [lambda: TwoHopReduceScatter(topo, h8, h4, meter=meter),
                      lambda: TwoHopReduceScatter(topo, h8, h4, chunks=2, meter=meter),
                      lambda: QuantizedReduceScatter(h4, topo, meter),
                      lambda: QuantizedReduceScatter(get_compressor("loco", inner=int4),
                                                     topo, meter)]
            if (dtype, op) == kernels_case:
                makers += [lambda: TwoHopReduceScatter(topo, k8, k4, meter=meter),
                           lambda: QuantizedReduceScatter(k4, topo, meter)]
            for make, traffic in zip(makers, declared):
                meter.reset()
                plain = torch.empty(s, dtype=dtype)
                make()(plain, xs[rank], op)
                alone = meter.current()
                meter.reset()
                got, got_e = torch.empty(s, dtype=dtype), torch.empty(E, dtype=dtype)
                make()(got, xs[rank], op, exact=(es[rank].view(world, E), got_e))
                assert torch.equal(got, plain), (dtype, op)          # payload untouched
                assert torch.equal(got_e, exact), (dtype, op, got_e, exact)
                cur = meter.current()
                rider = sum(cur[k] - alone[k] for k in ("intra_bytes", "inter_bytes"))
                # (world - 1) rows of E values sent, as a ring reduce-scatter would (2-hop:
                # (X - 1) Y rows in the node, then Y - 1 partial sums across nodes)
                assert rider == (world - 1) * E * size, rider
                # as the cost model declares it (comm/traffic.py)
                assert sum(sent(traffic(E), x, y)) - sum(sent(traffic(0), x, y)) == rider


def check_qwd_all_gather(rank, world, topo, meter):
    """Gap 8: other columns between the slots and the exact values; gap 0: each rank's row
    is its slot then its exact values (on one node step 3 gathers straight into it), also
    with the input in its row (FSDP2's in-place all-gather)."""
    s = 4096
    for dtype, gap in ((torch.float32, 8), (torch.bfloat16, 8), (torch.bfloat16, 0)):
        plain_ag = QuantizedAllGather(get_compressor("qwd"), topology=topo, meter=meter)
        ride_ag = QuantizedAllGather(get_compressor("qwd"), topology=topo, meter=meter)
        place_ag = QuantizedAllGather(get_compressor("qwd"), topology=topo)
        for step in range(3):     # the exact first gather, then differences
            xs = inputs(world, s, dtype, seed=20 + step)
            es = _ints(world, E, dtype, seed=30 + step)
            exact = torch.empty(world * E, dtype=dtype)
            all_gather_single(exact, es[rank].clone())
            plain = torch.empty(world * s, dtype=dtype)
            meter.reset()
            plain_ag(plain, xs[rank])
            alone = meter.current()
            # the slots into columns of a wider buffer, the exact values into a strided view
            rows = torch.full((world, s + E + gap), -1.0, dtype=dtype)
            meter.reset()
            ride_ag(rows, xs[rank], exact=(es[rank], rows[:, s + gap:]), columns=((0, s),))
            cur = meter.current()
            assert torch.equal(rows[:, :s].reshape(-1), plain), (dtype, step)
            assert torch.equal(rows[:, s + gap:].reshape(-1), exact), (dtype, step)
            assert (rows[:, s:s + gap] == -1).all()              # other columns untouched
            extra = sum(cur[k] - alone[k] for k in ("intra_bytes", "inter_bytes"))
            assert extra == (world - 1) * E * es[0].element_size(), (extra, step)
            # FSDP2's in-place all-gather: the input is this rank's slot of the output row
            # (its exact values already where they go)
            inplace = torch.full((world, s + E), -1.0, dtype=dtype)
            inplace[rank, :s], inplace[rank, s:] = xs[rank], es[rank]
            mine = inplace[rank]
            place_ag(inplace, mine[:s], exact=(mine[s:], inplace[:, s:]), columns=((0, s),))
            assert torch.equal(inplace[:, :s].reshape(-1), plain), (dtype, step)
            assert torch.equal(inplace[:, s:].reshape(-1), exact), (dtype, step)
            x, y, qwd = topo.ranks_per_node, topo.num_nodes, get_compressor("qwd")
            declared = [sent(QuantizedAllGather.traffic(s, x, y, qwd, dtype.itemsize, exact=e),
                             x, y) for e in (E, 0)]
            assert sum(declared[0]) - sum(declared[1]) == extra


def check_stateless_all_gather(rank, world, topo, meter):
    """ZeRO++'s int8 weights (a stateless scheme): the exact values ride its one gather."""
    s, x, y = 4096, topo.ranks_per_node, topo.num_nodes
    int8 = get_compressor("int", bits=8, group_size=2048, rounding="nearest")
    for dtype in (torch.float32, torch.bfloat16):
        xs, es = inputs(world, s, dtype, seed=40), _ints(world, E, dtype, seed=41)
        exact = torch.empty(world * E, dtype=dtype)
        all_gather_single(exact, es[rank].clone())
        plain = torch.empty(world * s, dtype=dtype)
        meter.reset()
        QuantizedAllGather(int8, topology=topo, meter=meter)(plain, xs[rank])
        alone = meter.current()
        got, got_e = torch.empty(world * s, dtype=dtype), torch.empty(world, E + 3, dtype=dtype)
        meter.reset()
        QuantizedAllGather(int8, topology=topo, meter=meter)(got, xs[rank],
                                                             exact=(es[rank], got_e[:, :E]))
        cur = meter.current()
        assert torch.equal(got, plain) and torch.equal(got_e[:, :E].reshape(-1), exact), dtype
        extra = sum(cur[k] - alone[k] for k in ("intra_bytes", "inter_bytes"))
        assert extra == (world - 1) * E * dtype.itemsize, extra
        declared = [sent(QuantizedAllGather.traffic(s, x, y, int8, dtype.itemsize, exact=e),
                         x, y) for e in (E, 0)]
        assert sum(declared[0]) - sum(declared[1]) == extra


def worker(rank, world):
    for x in (1, 2, 4):
        meter = WireMeter()
        topo = Topology(ranks_per_node=x)
        check_reduce_scatter(rank, world, topo, meter)
        check_qwd_all_gather(rank, world, topo, meter)
        check_stateless_all_gather(rank, world, topo, meter)
    return True


def test_exact_columns_ride_the_compressed_exchanges():
    assert run_distributed(worker, 4) == [True] * 4
