"""qWD's all-gather planned per operand signature (``ShardedReferences._plan``, issue 35's
host budget) against the same collective deciding at every call (plans off), bitwise over
several steps (the references evolve, the RNG streams stay in step), with exact columns
riding and the slots placed into columns of a wider buffer, with the torch twins and the
Triton kernels (interpreted: their planned launches), on 2 gloo ranks as 2 nodes of 1."""

from __future__ import annotations

import torch

from dist_utils import run_distributed
from hfcompress import get_compressor
from hfcompress.comm import QuantizedAllGather, Topology
from hfcompress.comm.wire_meter import WireMeter
from test_comm_collectives import inputs

S, E, GAP = 1024, 24, 8     # slot values, exact values riding, columns between them


def _gather(backend: str, dtype: torch.dtype, planned: bool) -> QuantizedAllGather:
    inner = get_compressor("int", bits=4, group_size=128, rounding="stochastic", seed=3,
                           backend=backend)
    ag = QuantizedAllGather(get_compressor("qwd", inner=inner), topology=Topology(
        ranks_per_node=1), meter=WireMeter())
    if not planned:
        ag.references._plans = lambda key, *args: None
    return ag


def planned_gather_worker(rank: int, world: int) -> int:
    checked = 0
    for backend in ("torch", "triton"):
        for dtype in (torch.float32, torch.bfloat16):
            pair = [_gather(backend, dtype, planned) for planned in (True, False)]
            for step in range(4):   # the exact first gather, then differences
                xs = inputs(world, S, dtype, seed=10 + step)
                es = inputs(world, E, dtype, seed=20 + step)
                got = []
                for ag in pair:
                    rows = torch.full((world, S + GAP + E), -1.0, dtype=dtype)
                    ag(rows, xs[rank], exact=(es[rank], rows[:, S + GAP:]), columns=((0, S),))
                    got.append((rows, ag.references.qwd.reference, ag.meter.current()))
                (a, ref_a, meter_a), (b, ref_b, meter_b) = got
                assert torch.equal(a, b), (backend, dtype, step)
                assert torch.equal(ref_a, ref_b) and meter_a == meter_b, (backend, dtype, step)
                assert (a[:, S:S + GAP] == -1).all()
                checked += 1
            plans = pair[0].references._plans._plans
            assert [p is not None for p in plans.values()] == [True], (backend, dtype)
    return checked


def test_planned_qwd_gather_is_the_deciding_one():
    assert run_distributed(planned_gather_worker, 2) == [2 * 2 * 4] * 2
