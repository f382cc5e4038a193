"""Each collective's ``traffic`` declaration (``comm/traffic.py``) equals what its call records
on the WireMeter, on 4 gloo ranks as 2 nodes x 2, 1 node x 4 and 4 nodes x 1."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dist_utils import run_distributed
from hfcompress.comm import WireMeter
from hfcompress.comm.all_gather import QuantizedAllGather
from hfcompress.comm.all_reduce import QuantizedAllReduce, summing_peers
from hfcompress.comm.reduce_scatter import QuantizedReduceScatter
from hfcompress.comm.topology import Topology
from hfcompress.comm.traffic import sent
from hfcompress.comm.two_hop import TwoHopReduceScatter
from hfcompress.compressors import get_compressor

S = 1536    # values per rank: not a multiple of every group size / Hadamard block


def _measure(meter: WireMeter, call) -> tuple[int, int]:
    meter.reset()
    call()
    step = meter.step()
    return step["intra_bytes"], step["inter_bytes"]


def _cases(rank: int, world: int, x: int, topo: Topology):
    """(label, declared (intra, inter), one call recording on a meter)."""
    y = world // x
    gen = torch.Generator().manual_seed(rank)
    grads = torch.randn(world * S, generator=gen)
    weights = torch.randn(S, generator=gen).to(torch.bfloat16)
    int8 = lambda: get_compressor("int", bits=8, group_size=128, seed=rank)  # noqa: E731
    hs4 = lambda: get_compressor("hadamard", bits=4, seed=rank)              # noqa: E731
    for label, c in (("exact", None), ("int8", int8())):
        yield (f"all_gather {label}", QuantizedAllGather.traffic(S, x, y, c, 2),
               lambda m, c=c: QuantizedAllGather(c, topo, m)(
                   torch.empty(world * S, dtype=torch.bfloat16), weights))
        yield (f"reduce_scatter {label}", QuantizedReduceScatter.traffic(S, x, y, c, 4),
               lambda m, c=c: QuantizedReduceScatter(c, topo, m)(torch.empty(S), grads))
    qwd = QuantizedAllGather(get_compressor("qwd"), topo)
    out = torch.empty(world * S, dtype=torch.bfloat16)
    qwd(out, weights)     # the first, exact call
    for unchanged in (False, True):
        declared = QuantizedAllGather.traffic(S, x, y, get_compressor("qwd"), 2, unchanged)
        yield f"qwd unchanged={unchanged}", declared, \
            lambda m, u=unchanged: (setattr(qwd, "meter", m), qwd(out, weights, unchanged=u))
    for intra, inter, chunks in ((None, None, 1), (int8(), hs4(), 1), (hs4(), hs4(), 3)):
        declared = TwoHopReduceScatter.traffic(S, x, y, intra, inter, 4, chunks)
        yield f"two_hop {intra} {inter} chunks={chunks}", declared, \
            lambda m, a=intra, b=inter, k=chunks: TwoHopReduceScatter(topo, a, b, k, m)(
                torch.empty(S), grads)
    peers = summing_peers(x, y)      # hierarchical at x > 1 on y > 1 nodes: the nodes
    for c in (None, int8(), get_compressor("global_qsgd", num_peers=peers, seed=rank),
              get_compressor("global_qsgd", num_peers=peers, block_size=256, seed=rank),
              get_compressor("global_qsgd_exp", num_peers=peers, seed=rank),
              get_compressor("global_qsgd_exp", num_peers=peers, block_size=256, seed=rank)):
        yield f"all_reduce {c}", QuantizedAllReduce.traffic(world * S - 5, x, y, c, 4), \
            lambda m, c=c: QuantizedAllReduce(c, topo, m)(grads[5:].clone())


def _run(rank: int, world: int) -> list:
    out = []
    for x in (2, 4, 1):
        topo = Topology(ranks_per_node=x)
        for label, phases, call in _cases(rank, world, x, topo):
            meter = WireMeter()
            out.append((f"x={x} {label}", sent(phases, x, world // x),
                        _measure(meter, lambda: call(meter))))
        dist.barrier()
    return out


def test_declared_traffic_is_what_the_meter_records():
    """Per rank where the collective is symmetric; the all-reduce's stock chunks (numel not
    a multiple of the world) differ per rank by a few bytes: the declaration is their mean."""
    ranks = run_distributed(_run, 4)
    for cases in zip(*ranks):
        label, declared = cases[0][0], cases[0][1]
        recorded = [c[2] for c in cases]
        if label.split()[1] == "all_reduce":
            mean = tuple(sum(r[i] for r in recorded) / len(recorded) for i in (0, 1))
            assert mean == declared, (label, declared, recorded)
        else:
            assert all(r == declared for r in recorded), (label, declared, recorded)
