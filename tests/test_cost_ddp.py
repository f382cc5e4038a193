"""The planner's ``ddp`` engine (``cost/step_model.py``): DistributedDataParallel's bucketed
all-reduce, hidden behind backward but for the last bucket, each preset in its DDP form, the
training state replicated; against numbers derived by hand."""

from __future__ import annotations

import pytest
import torch

from hfcompress import get_compressor
from hfcompress.cost import ClusterLayout, ClusterLinks, price_step
from hfcompress.cost.model_shape import ModelShape
from hfcompress.cost.plan import plan
from hfcompress.cost.state import all_reduce_state_bytes
from hfcompress.cost.units import Unit

S = 1 << 20                   # values per rank's shard: 2 ranks hold 2 S gradient values
MIB = 1 << 20
# 1 GB/s between nodes, nothing else costs time
ONE_GBS = ClusterLinks(inter_node_gbps=8.0, intra_node_gbps=2400.0, inter_latency_us=0,
                       intra_latency_us=0)
PAIR = ClusterLayout(2, 1)


def ddp(preset, compute_s, bucket_bytes=2 * MIB):
    return price_step(preset, [Unit("layer", S)], PAIR, ONE_GBS, compute_s=compute_s,
                      engine="ddp", bucket_bytes=bucket_bytes)


@pytest.mark.parametrize("compute_s", [9e-3, 30e-3])
def test_exact_all_reduce_hides_behind_backward_but_the_last_bucket(compute_s):
    """2 S fp32 gradients = 8 MiB in 4 buckets of 2 MiB; a ring all-reduce over 2 ranks puts
    2 (W - 1) / W = 1 x each bucket on the node link: 2 MiB / 1 GB/s per bucket, 8 MiB in
    all. Backward is 2/3 of compute: exposed = max(last bucket, all - backward)."""
    cost = ddp("none", compute_s)
    bucket_s, wire_s = 2 * MIB / 1e9, 8 * MIB / 1e9
    (c,) = cost.collectives
    assert (c.name, c.calls, c.link_bytes_per_node) == ("all_reduce", 4, 8 * MIB)
    assert cost.wire_s == pytest.approx(wire_s)
    exposed = max(bucket_s, wire_s - 2 / 3 * compute_s)
    assert cost.exposed_s == pytest.approx(exposed)
    assert cost.step_s == pytest.approx(compute_s + exposed)
    # one bucket for everything: all of it after backward
    assert ddp("none", compute_s, bucket_bytes=64 * MIB).exposed_s == pytest.approx(wire_s)


def test_presets_run_their_ddp_form():
    """global_qsgd: int8 codes through the same ring (a quarter of the bytes, plus one fp32
    scale MAX per bucket); tlq_hs / sdp4bit: their inter-node scheme (4-bit Hadamard) as the
    chunked all-reduce; qwd sends nothing DDP sends: refused, naming FSDP2."""
    q = ddp("global_qsgd", 30e-3)
    assert q.collectives[0].link_bytes_per_node == pytest.approx(2 * MIB + 4 * 4, abs=1)
    assert ddp("sdp4bit", 30e-3).collectives == ddp("tlq_hs", 30e-3).collectives
    assert ddp("tlq_hs", 30e-3).wire_s < q.wire_s
    with pytest.raises(ValueError, match="compresses only FSDP's collectives"):
        ddp("qwd", 30e-3)


def test_ddp_replicates_the_training_state_and_keeps_locos_error():
    shape = ModelShape(hidden=2048, layers=24)
    kw = dict(nodes=4, gpu_tflops=300, inter_node_gbps=100, presets=["loco", "global_qsgd"])
    fsdp = plan(shape, **kw)
    replicated = plan(shape, engine="ddp", **kw)
    dp = fsdp["layout"]["dp"]
    assert replicated["train_state_bytes_per_gpu"] == dp * fsdp["train_state_bytes_per_gpu"]
    assert replicated["presets"]["global_qsgd"]["state_bytes_per_gpu"] == 0
    # 8 GPUs on each of 4 nodes: hierarchical, LoCo's 8-bit error of this rank's 1/8 of the
    # gradient (the chunks it sends across the nodes) and of the 1/32 it gathers
    values = shape.params - sum(n * u.exact_numel for u, n in shape.unit_counts(
        ClusterLayout(1, 1), ("norm", "bias"), 0))
    loco = replicated["presets"]["loco"]["state_bytes_per_gpu"]
    share = 1 / 8 + 1 / dp
    assert values * share <= loco <= values * share * 1.1
    assert loco == sum(all_reduce_state_bytes("loco", values, 8, 4, torch.bfloat16).values())


def test_all_reduce_state_follows_the_flat_or_hierarchical_streams():
    """Flat (one rank per node): streams of the whole gradient sent and of 1/world gathered;
    hierarchical: of 1/X sent across the nodes and 1/(X Y) gathered. Global-QSGD keeps none,
    and its num_peers is the node count (int8 holds 16 nodes' sum, not 128 ranks')."""
    n = 1 << 20
    one = get_compressor("loco", inner=get_compressor("int", bits=4, group_size=128,
                                                       rounding="nearest"))

    def per(values):
        return sum(one.state_bytes_for(values, torch.bfloat16).values())
    flat = sum(all_reduce_state_bytes("loco", n, 1, 4, torch.bfloat16).values())
    assert flat == per(n) + per(n // 4)
    hier = sum(all_reduce_state_bytes("loco", n, 2, 2, torch.bfloat16).values())
    assert hier == per(n // 2) + per(n // 4)
    assert sum(all_reduce_state_bytes("global_qsgd", n, 8, 16, torch.bfloat16).values()) == 0
    cost = price_step("global_qsgd", [Unit("layer", S)], ClusterLayout(16, 8), ONE_GBS,
                      compute_s=1.0, engine="ddp")
    assert cost.state_bytes_per_gpu == 0


@pytest.mark.parametrize("compute_s", [3e-3, 9e-3, 30e-3])
def test_the_baselines_compute_inverts_the_ddp_step(compute_s):
    """compute_from_baseline under ddp: the compute whose priced none step is the measured
    one, on both sides of the last-bucket kink (3 ms: the all-reduce mostly exposed; 30 ms:
    only the last bucket)."""
    from hfcompress.cost import compute_from_baseline
    step = ddp("none", compute_s).step_s
    assert compute_from_baseline(step, [Unit("layer", S)], PAIR, ONE_GBS, engine="ddp",
                                 bucket_bytes=2 * MIB) == pytest.approx(compute_s)
