"""Pipeline parallelism in the planner (``cost/step_model.py``): the 1F1B bubble, (pp - 1)
micro-batches' compute, and the stages' activation sends on the node links; against numbers
derived by hand."""

from __future__ import annotations

import pytest

from hfcompress.cost import ClusterLayout, ClusterLinks, compute_from_baseline, price_step
from hfcompress.cost.model_shape import ModelShape
from hfcompress.cost.units import Unit

S, MIB = 1 << 20, 1 << 20
ONE_GBS = ClusterLinks(inter_node_gbps=8.0, intra_node_gbps=2400.0, inter_latency_us=0,
                       intra_latency_us=0)
# 4 nodes of 2 GPUs, 2 stages of 2 nodes: each stage's DP group has 2 ranks per node
STAGES = ClusterLayout(4, 2, pp=2)


def priced(compute_s, grad_accum=4, activation_bytes=MIB, engine="megatron"):
    return price_step("none", [Unit("layer", S)], STAGES, ONE_GBS, compute_s=compute_s,
                      engine=engine, grad_accum=grad_accum, activation_bytes=activation_bytes)


def test_bubble_and_stage_sends():
    """4 micro-batches of 3 ms on 2 stages: a 3 ms bubble (one micro-batch); each of a
    node's 2 DP ranks sends 1 MiB forward and 1 MiB back per micro-batch: 16 MiB on the
    node's link at 1 GB/s, exposed, unmetered (not hfcompress's)."""
    cost = priced(12e-3)
    assert cost.bubble_s == pytest.approx(3e-3)
    sends = {c.name: c for c in cost.collectives}["pipeline_sends"]
    assert sends.link_bytes_per_node == 16 * MIB and sends.meter_bytes_per_node == 0
    assert sends.wire_s == pytest.approx(16 * MIB / 1e9) and not sends.overlappable
    assert cost.step_s == pytest.approx(12e-3 + 3e-3 + cost.exposed_s + cost.codec_s)
    assert cost.exposed_s == pytest.approx(cost.wire_s)          # megatron hides nothing
    assert cost.full_overlap_s == pytest.approx(max(12e-3, cost.wire_s) + 3e-3)
    # one micro-batch: the bubble is (pp - 1) = 1 x the whole compute
    assert priced(12e-3, grad_accum=1).bubble_s == pytest.approx(12e-3)
    # no pipeline: neither
    flat = price_step("none", [Unit("layer", S)], ClusterLayout(4, 2), ONE_GBS,
                      compute_s=12e-3, engine="megatron", grad_accum=4)
    assert flat.bubble_s == 0 and "pipeline_sends" not in {c.name for c in flat.collectives}


def test_activation_bytes_of_a_stage_boundary():
    shape = ModelShape(hidden=4096, layers=32)
    assert shape.activation_bytes(ClusterLayout(8, 8, pp=4), 2, 4096) == 2 * 4096 * 4096 * 2
    assert shape.activation_bytes(ClusterLayout(8, 8), 2, 4096) == 0


@pytest.mark.parametrize("engine", ["megatron", "fsdp2"])
def test_the_baselines_compute_counts_the_bubble(engine):
    step = priced(12e-3, engine=engine).step_s
    got = compute_from_baseline(step, [Unit("layer", S)], STAGES, ONE_GBS, engine=engine,
                                grad_accum=4, activation_bytes=MIB)
    assert got == pytest.approx(12e-3)
