"""FSDP2 units' collectives planned per buffer signature (``FSDPAllGather._plan``,
``FSDPReduceScatter._plan`` and, beneath them, ``ShardedReferences._plan`` and
``TwoHopReduceScatter._plan``: a unit's host time) against the same training with every
one of those plans off: bitwise the same losses, weights and bytes on the wire, sdp4bit on
2 gloo ranks as one node of 2 (the reduce-scatter's intra-node hop alone) and as 2 nodes
of 1 (the inter-node hop alone, qWD's one-node all-gather), real FSDP2 training."""

from __future__ import annotations

import contextlib

import torch

import hfcompress
from dist_utils import run_distributed
from fsdp_workers import LR, MP, global_mean, setup, tiny_llama, train_step
from hfcompress.comm.reference_gather import ShardedReferences
from hfcompress.comm.two_hop import TwoHopReduceScatter
from hfcompress.integrations.fsdp import FSDPAllGather, FSDPReduceScatter

PLANNERS = (FSDPAllGather, FSDPReduceScatter, ShardedReferences, TwoHopReduceScatter)
STEPS = 4


@contextlib.contextmanager
def plans_off():
    """Collectives built inside decide at every call (their plans are bound at build)."""
    saved = [cls._plan for cls in PLANNERS]
    for cls in PLANNERS:
        cls._plan = lambda self, *args: None
    try:
        yield
    finally:
        for cls, plan in zip(PLANNERS, saved):
            cls._plan = plan


def _train(ranks_per_node: int) -> dict:
    model = tiny_llama()
    h = hfcompress.apply(model, "sdp4bit", ranks_per_node=ranks_per_node, shard=True,
                         mp_policy=MP)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, wire = [], []
    for step in range(STEPS):
        losses.append(global_mean(train_step(model, step)))
        opt.step()
        opt.zero_grad()
        wire.append(h.step())
    planned = [sum(p is not None for comms in h.comms.values()
                   for p in getattr(comms, kind)._plans._plans.values()) for kind in ("ag", "rs")]
    weights = [p.to_local().detach().clone() for p in model.parameters()]
    h.remove()
    return {"loss": losses, "weights": weights, "wire": wire, "planned": planned}


def plans_worker(rank: int, world: int) -> list[int]:
    setup()
    planned = []
    for ranks_per_node in (world, 1):
        on = _train(ranks_per_node)
        with plans_off():
            off = _train(ranks_per_node)
        assert on["loss"] == off["loss"], ranks_per_node
        assert all(torch.equal(a, b) for a, b in zip(on["weights"], off["weights"]))
        assert on["wire"] == off["wire"], ranks_per_node
        assert off["planned"] == [0, 0]
        planned.append(on["planned"])
    return planned


def test_planned_fsdp_collectives_train_as_the_deciding_ones():
    for (ag_node, rs_node), (ag_nodes, rs_nodes) in run_distributed(plans_worker, 2):
        # every decoder layer's reduce-scatter planned (the root unit's spaced columns not);
        # its qWD all-gather where a rank is a node (step 3 decides on one node of 2)
        assert rs_node >= 2 and rs_nodes >= 2 and ag_nodes >= 2 and ag_node == 0
