"""The cluster-scale cost model (``hfcompress/cost``, issue 31), pure arithmetic: bytes per node
link against formulas derived by hand here (NCCL ring for all-gather / reduce-scatter, direct
sends for all-to-all, k DP groups sharing a node's link), the meter's count against the
collectives' declarations (``tests/test_traffic.py`` checks those against the real meter),
the pipelined 2-hop, the engines' overlap, hpZ, the baseline's compute, the codec and the
layout errors."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hfcompress.comm.all_gather import QuantizedAllGather
from hfcompress.comm.all_reduce import QuantizedAllReduce
from hfcompress.comm.reduce_scatter import QuantizedReduceScatter
from hfcompress.comm.traffic import sent
from hfcompress.comm.two_hop import TwoHopReduceScatter
from hfcompress.config import CompressionConfig, get_config
from hfcompress.cost import (ENGINES, ClusterLayout, ClusterLinks, compute_from_baseline,
                             price_step)
from hfcompress.cost.codec_rates import GPU_RATES, PER_CALL_S, ROTATE, estimated
from hfcompress.cost.collectives import Senders, unit_collectives
from hfcompress.cost.step_model import _Pricer, engine_spec
from hfcompress.cost.units import Unit

S = 1 << 20            # values per rank of a unit: a multiple of every group size here
NODES = 16
LAYOUTS = [(x, k) for x in (1, 2, 4, 8) for k in (1, 2, 4, 8)]   # x DP ranks, k groups / node
# wire bytes per value (payload + one fp32 scale per group)
INT8_G2048 = (8 + 32 / 2048) / 8      # zeropp's weights
INT4_G2048 = (4 + 32 / 2048) / 8      # qWD's coded differences
INT4_G128 = (4 + 32 / 128) / 8        # zeropp's gradient hops, sdp4bit's inter-node hop
INT8_G128 = (8 + 32 / 128) / 8        # sdp4bit's intra-node hop
#: the engines that shard (the ``ddp`` engine, replicated: ``tests/test_cost_ddp.py``)
SHARDED = [e for e in ENGINES if not engine_spec(e).replicated]
FAST = ClusterLinks(inter_node_gbps=100, intra_node_gbps=1000, inter_latency_us=0,
                    intra_latency_us=0)


def layout(x: int, k: int, nodes: int = NODES) -> ClusterLayout:
    """x DP ranks and k DP groups per node: k-way tensor parallelism on x * k GPUs."""
    return ClusterLayout(nodes=nodes, gpus_per_node=x * k, tp=k)


def price(preset, lay, units=None, links=FAST, **kw):
    kw.setdefault("compute_s", 0.0)
    return price_step(preset, units or [Unit("layer", S)], lay, links, **kw)


def link(cost, name: str | None = None) -> float:
    return sum(c.link_bytes_per_node for c in cost.collectives if name in (None, c.name))


def by_name(cost) -> dict:
    return {c.name: c for c in cost.collectives}


# -- bytes on a node's link, hand-derived ---------------------------------------------------
@pytest.mark.parametrize("x,k", LAYOUTS)
def test_link_bytes_of_the_exact_fsdp2_and_zero3_steps(x, k):
    """FSDP2 ``none``: forward and backward bf16 all-gathers and the fp32 reduce-scatter, each
    a ring over W = x * 16 ranks: (W - 1) chunks leave a node per ring, k rings at once.
    ZeRO-3 (DeepSpeed: the reduce-scatter in bf16 too) is the same step at 2 bytes."""
    w = x * NODES
    none = price("none", layout(x, k))
    got = by_name(none)
    assert got["weights_fwd"].link_bytes_per_node == k * (w - 1) * S * 2
    assert got["weights_bwd"].link_bytes_per_node == k * (w - 1) * S * 2
    assert got["grads"].link_bytes_per_node == k * (w - 1) * S * 4
    assert {c.algorithm for c in none.collectives} == {"ring"}
    zero3 = price("none", layout(x, k), grad_bytes=2)
    assert link(zero3) == k * 3 * (w - 1) * S * 2


@pytest.mark.parametrize("x,k", LAYOUTS)
def test_link_bytes_of_zeropp(x, k):
    """ZeRO++: int8 weights over the world ring; hpZ keeps the backward gather in the node
    (none at all with one rank per node); qgZ's 2-hop all-to-all sends only hop 2 over the
    network: x ranks x (y - 1) peers x one int4 row of S values."""
    w, y = x * NODES, NODES
    got = by_name(price("zeropp", layout(x, k)))
    assert math.isclose(got["weights_fwd"].link_bytes_per_node, k * (w - 1) * S * INT8_G2048)
    assert got["grads"].algorithm == "2-hop"
    assert math.isclose(got["grads"].link_bytes_per_node, k * x * (y - 1) * S * INT4_G128)
    if x == 1:
        assert "weights_bwd" not in got
    else:
        assert got["weights_bwd"].link_bytes_per_node == 0
        assert got["weights_bwd"].intra_bytes_per_gpu == (x - 1) * y * S * 2


@pytest.mark.parametrize("x,k", LAYOUTS)
def test_link_bytes_of_sdp4bit_and_below_none_everywhere(x, k):
    """SDP4Bit: qWD's coded differences gathered over the inter-node group (x groups of y
    ranks per DP group: x (y - 1) rows leave a node), the rebuilt slots and the backward
    gather inside the node; TLq-HS's int4 inter-node hop as ZeRO++'s. Fewer link bytes than
    ``none`` at every layout."""
    y = NODES
    sdp = price("sdp4bit", layout(x, k))
    got = by_name(sdp)
    assert math.isclose(got["weights_fwd"].link_bytes_per_node, k * x * (y - 1) * S * INT4_G2048)
    assert got.get("weights_bwd") is None or got["weights_bwd"].link_bytes_per_node == 0
    assert math.isclose(got["grads"].link_bytes_per_node, k * x * (y - 1) * S * INT4_G128)
    assert link(sdp) < link(price("none", layout(x, k)))


def test_ring_versus_direct_sends_at_8_by_16():
    """The meter counts direct sends: x * x (y - 1) chunks leave a node for each ring's
    (W - 1): 8 * 8 * 15 / 127 = 7.56x at 8 GPUs x 16 nodes."""
    got = by_name(price("none", layout(8, 1)))["weights_fwd"]
    assert math.isclose(got.meter_bytes_per_node / got.link_bytes_per_node, 8 * 8 * 15 / 127)
    assert round(got.meter_bytes_per_node / got.link_bytes_per_node, 1) == 7.6
    # all-to-all: the meter's count is what the link carries
    grads = by_name(price("sdp4bit", layout(8, 1)))["grads"]
    assert grads.meter_bytes_per_node == grads.link_bytes_per_node


@pytest.mark.parametrize("nodes,x", [(2, 1), (2, 2)])
@pytest.mark.parametrize("preset", ["none", "qwd", "sdp4bit", "zeropp", "tlq", "global_qsgd_exp"])
def test_meter_bytes_are_the_declarations_the_meter_checks(nodes, x, preset):
    """The emulated runs' layouts (slow-link benchmark: 2 x 1, 2 x 2): the model's
    meter_bytes_per_node is x ranks x the inter-node bytes of the collectives' ``traffic``
    declarations (``tests/test_traffic.py`` checks them against the WireMeter)."""
    y, w, cfg = nodes, nodes * x, get_config(preset)
    s = Senders.of(cfg, w, x)
    units = [Unit("layer", S), Unit("root", S, backward_gather=False)]
    if cfg.all_reduce is not None:
        buckets = math.ceil(2 * w * S * 4 / (25 << 20))
        phases = buckets * QuantizedAllReduce.traffic(-(-2 * w * S // buckets), x, y,
                                                      s.all_reduce, 4)
    else:
        fwd = QuantizedAllGather.traffic(S, x, y, s.weights, 2)
        bwd = [] if cfg.hpz else QuantizedAllGather.traffic(S, x, y, s.weights, 2, True)
        grads = TwoHopReduceScatter.traffic(S, x, y, s.grad_intra, s.grad_inter, 4) \
            if cfg.two_hop else QuantizedReduceScatter.traffic(S, x, y, s.grad_inter, 4)
        phases = 2 * fwd + bwd + 2 * grads     # the root: no backward gather
    cost = price(preset, ClusterLayout(nodes, x), units)
    meter = sum(c.meter_bytes_per_node for c in cost.collectives)
    assert math.isclose(meter, x * sent(phases, x, y)[1])


# -- time ---------------------------------------------------------------------------------
def test_two_hop_gradients_are_pipelined():
    """4 layers of S values and a root of 2 S, ``ulq`` (int4 both hops) at 4 x 16, no
    latency: per S values hop 1 sends (x - 1) rows of y * S int4 values per GPU inside the
    node, hop 2 k x (y - 1) rows of S per node over the network; the gradients take the
    slower hop's sum plus the faster hop of the unit reduced first (the last layer, not the
    root), not the sum of both."""
    x, k, y, n = 4, 2, NODES, 4
    links = ClusterLinks(100, 50, 0, 0)
    hop1 = (x - 1) * y * S * INT4_G128 / (50e9 / 8)
    hop2 = k * x * (y - 1) * S * INT4_G128 / (100e9 / 8)
    units = [Unit(f"l{i}", S) for i in range(n)] + [Unit("root", 2 * S, backward_gather=False)]
    grads = by_name(price("ulq", layout(x, k), units, links))["grads"]
    assert math.isclose(grads.wire_s, (n + 2) * max(hop1, hop2) + min(hop1, hop2))
    assert grads.wire_s < (n + 2) * (hop1 + hop2)


def test_a_phase_crossing_nodes_takes_its_slower_part_and_latency_per_ring_step():
    """``none``'s forward gather at 2 x 4: (W - 1) = 7 ring steps, each 10 us; the bytes
    take the slower of the node link (7 S bf16 chunks at 100 Gbit/s) and the GPU's NVLink
    (the same bytes at 10 Gbit/s here)."""
    lay, w = ClusterLayout(4, 2), 8
    for intra_gbps in (1000, 10):
        links = ClusterLinks(100, intra_gbps, inter_latency_us=10, intra_latency_us=2)
        fwd = by_name(price("none", lay, links=links))["weights_fwd"]
        nbytes = (w - 1) * S * 2
        assert math.isclose(fwd.wire_s, (w - 1) * 10e-6
                            + max(nbytes / 12.5e9, nbytes / (intra_gbps * 1e9 / 8)))


@pytest.mark.parametrize("compute", [0.0, 0.01, 10.0])
def test_engines_overlap_rule(compute):
    """FSDP2: the all-gathers and the reduce-scatter share the link behind compute, the
    reduce-scatter of the last unit exposed (here the only unit): exposed = max(its
    reduce-scatter, wire - compute); ZeRO-3 (as ZeRO++ measured it) and Megatron-style:
    everything exposed. Step = compute + exposed + codec; the full-overlap limit =
    max(compute, wire) + codec."""
    lay = layout(2, 1)
    for engine in SHARDED:
        cost = price("sdp4bit", lay, compute_s=compute, engine=engine)
        hides = engine_spec(engine).hides_gathers
        tail = max(c.wire_s for c in cost.collectives if c.part == "grads")
        exposed = max(tail, cost.wire_s - compute) if hides else cost.wire_s
        assert math.isclose(cost.exposed_s, exposed)
        assert math.isclose(cost.step_s, compute + exposed + cost.codec_s)
        assert math.isclose(cost.full_overlap_s, max(compute, cost.wire_s) + cost.codec_s)
        assert all(c.overlappable == hides for c in cost.collectives)
    assert {e for e in SHARDED if engine_spec(e).hides_gathers} == {"fsdp2", "fsdp2_each_batch"}
    with pytest.raises(ValueError, match="fsdp2, fsdp2_each_batch, zero3, megatron, ddp"):
        price("none", lay, engine="deepspeed")


def test_megatron_gathers_the_weights_once_per_step():
    """Megatron's distributed optimizer gathers the parameters once per step: no backward
    gather, the forward gather and the gradients as under FSDP2."""
    fsdp2, megatron = (by_name(price("none", layout(8, 1), engine=e))
                       for e in ("fsdp2", "megatron"))
    assert "weights_bwd" in fsdp2 and "weights_bwd" not in megatron
    assert megatron["weights_fwd"] == dataclasses.replace(fsdp2["weights_fwd"], overlappable=False)
    assert megatron["grads"] == dataclasses.replace(fsdp2["grads"], overlappable=False)


@pytest.mark.parametrize("engine", SHARDED)
def test_grad_accumulation_runs_each_collective_as_the_engine_does(engine):
    """An optimizer step of 3 micro-batches: compute for all of them; FSDP2 under the HF
    Trainer / Accelerate gathers the weights every micro-batch and reduces once (no_sync),
    ZeRO-3 does both every micro-batch, Megatron both once. FSDP2's step is two micro-batches
    without the reduction plus one with it, each hiding its gathers behind its own compute."""
    lay, units, ga, c = layout(4, 2), [Unit(f"l{i}", S) for i in range(3)], 3, 0.004
    one = by_name(price("sdp4bit", lay, units, engine=engine, compute_s=c))
    step = price("sdp4bit", lay, units, engine=engine, compute_s=ga * c, grad_accum=ga)
    assert step.compute_s == ga * c
    every = {"fsdp2": {"weights"}, "fsdp2_each_batch": {"weights", "grads"},
             "zero3": {"weights", "grads"}, "megatron": set()}[engine]
    for got in step.collectives:
        times = ga if got.part in every else 1
        assert got.times_per_step == times
        assert math.isclose(got.link_bytes_per_node, times * one[got.name].link_bytes_per_node)
        assert math.isclose(got.wire_s, times * one[got.name].wire_s)
        assert math.isclose(got.codec_s, times * one[got.name].codec_s)
    if engine == "fsdp2":
        gathers = [g for g in one.values() if g.part == "weights"]
        wire, codec = sum(g.wire_s for g in gathers), sum(g.codec_s for g in gathers)
        no_sync = c + max(0.0, wire - c) + codec
        last = price("sdp4bit", lay, units, engine=engine, compute_s=c).step_s
        assert math.isclose(step.step_s, (ga - 1) * no_sync + last)
    assert price("sdp4bit", lay, units, engine=engine, compute_s=c, grad_accum=1) == \
        price("sdp4bit", lay, units, engine=engine, compute_s=c)
    with pytest.raises(ValueError, match="grad_accum=0 must be an int >= 1"):
        price("none", lay, grad_accum=0)


def _ungrouped(preset, units, lay, links, compute_s, engine="fsdp2"):
    """The step priced unit by unit (no grouping of equal shapes): per collective, the sum
    over the units; a 2-hop collective pipelined behind the last layer's faster hop."""
    config = get_config(preset)
    spec = engine_spec(engine)
    units = [dataclasses.replace(u, backward_gather=spec.backward_gather and u.backward_gather)
             for u in units]
    senders = Senders.of(config, lay.dp, lay.dp_per_node)
    pricer = _Pricer(config, lay, links, None)
    rows, first = {}, None
    for u in units:
        for c in unit_collectives(senders, u, lay.dp_nodes):
            p = pricer.collective(c)
            row = rows.setdefault(c.name, dict.fromkeys(("link", "hop1", "hop2", "codec"), 0.0))
            for key in ("link", "hop1", "hop2", "codec"):
                row[key] += p[key]
            row["two_hop"], row["part"] = c.two_hop, c.part
            if c.two_hop and (u.backward_gather or first is None):
                first = min(p["hop1"], p["hop2"])
    wire, hidden, codec = {}, 0.0, 0.0
    for name, r in rows.items():
        wire[name] = max(r["hop1"], r["hop2"]) + first if r["two_hop"] else r["hop1"] + r["hop2"]
        codec += r["codec"]
        hidden += wire[name] if spec.hides_gathers and r["part"] == "weights" else 0.0
    total = sum(wire.values())
    return rows, wire, compute_s + max(0.0, hidden - compute_s) + total - hidden + codec


@pytest.mark.parametrize("engine", SHARDED)
@pytest.mark.parametrize("preset", ["none", "qwd", "sdp4bit", "zeropp", "loco"])
def test_units_of_equal_shape_priced_once_give_the_unit_by_unit_step(preset, engine):
    """Grouping equal units (priced once, times their count) changes nothing but rounding,
    with two layer shapes interleaved, a root and exact columns."""
    units = [Unit("a0", S, 512), Unit("b0", S // 2, 256), Unit("a1", S, 512),
             Unit("b1", S // 2, 256), Unit("a2", S, 512), Unit("root", 2 * S, 0, False)]
    lay = layout(4, 2)
    links = ClusterLinks(100, 1000)
    rows, wire, step = _ungrouped(preset, units, lay, links, 0.01, engine)
    cost = price(preset, lay, units, links=links, compute_s=0.01, engine=engine)
    assert set(by_name(cost)) == set(rows)
    for c in cost.collectives:
        assert math.isclose(c.link_bytes_per_node, rows[c.name]["link"], rel_tol=1e-12)
        assert math.isclose(c.codec_s, rows[c.name]["codec"], rel_tol=1e-12)
        assert math.isclose(c.wire_s, wire[c.name], rel_tol=1e-12)
    assert math.isclose(cost.step_s, step, rel_tol=1e-12)


def test_hpz_backward_gather_stays_in_the_node():
    """hpZ on an exact step: with x > 1 the backward gather is the node's secondary
    partition (y slots), exact, over the x ranks of the node; with x = 1 there is none; the
    forward gather and the gradients are unchanged."""
    hpz = dataclasses.replace(CompressionConfig(), hpz=True, name="hpz")
    for x in (1, 4):
        plain, got = by_name(price("none", layout(x, 1))), by_name(price(hpz, layout(x, 1)))
        assert got["weights_fwd"] == plain["weights_fwd"] and got["grads"] == plain["grads"]
        if x == 1:
            assert "weights_bwd" not in got
        else:
            assert got["weights_bwd"].link_bytes_per_node == 0
            assert got["weights_bwd"].intra_bytes_per_gpu == (x - 1) * NODES * S * 2


def test_exact_columns_ride_or_travel_in_exact_collectives():
    """A unit with E exactly sent values: ``none`` sends them in its one call; ``sdp4bit``
    carries them on its compressed collectives' rows (``comm/riders.py``: the qWD forward
    gather, the 2-hop gradients; no collective of their own) and the backward gather of
    unchanged qWD weights gathers them exactly; ``zeropp``'s int8 weights carry them in both
    directions."""
    e, x, w = 4096, 2, 2 * NODES
    unit = [Unit("layer", S, exact_numel=e)]
    assert by_name(price("none", layout(x, 1), unit))["grads"].link_bytes_per_node == \
        (w - 1) * (S + e) * 4
    plain = by_name(price("sdp4bit", layout(x, 1), [Unit("layer", S)]))
    got = by_name(price("sdp4bit", layout(x, 1), unit))
    assert "exact_fwd" not in got and "exact_grads" not in got
    assert got["exact_bwd"].link_bytes_per_node == (w - 1) * e * 2
    # inter-node: the forward gather's step 1 carries E bf16 values to each other node's
    # rank of the same local index; hop 2 of the gradients E float32 partial sums
    for name, itemsize in (("weights_fwd", 2), ("grads", 4)):
        extra = got[name].link_bytes_per_node - plain[name].link_bytes_per_node
        assert extra == x * (NODES - 1) * e * itemsize, (name, extra)
    zeropp = by_name(price("zeropp", layout(x, 1), unit))
    assert not {"exact_fwd", "exact_bwd", "exact_grads"} & set(zeropp)


def test_codec_seconds_from_given_rates():
    """``zeropp`` at 4 x 16 with every scheme at 1e9 values/s: the forward gather compresses
    S and decodes W rows; hpZ's backward gather decodes nothing; hop 1 compresses and
    decodes W S values, hop 2 y S."""
    x, y = 4, NODES
    w = x * y
    cost = price("zeropp", layout(x, 1), codec_rates={"int": 1e9})
    assert math.isclose(cost.codec_s, ((S + w * S) + 2 * w * S + 2 * y * S) / 1e9)
    assert price("zeropp", layout(x, 1)).codec_s > 0     # the H200's measured defaults


def test_each_compressed_call_costs_at_least_its_host_work():
    """A unit too small for its kernels or its bytes to matter costs PER_CALL_S per compressed
    collective, its wire time included (sdp4bit: the forward qWD gather and the 2-hop gradients; its backward gather sends the
    weights unchanged since the forward, no codec), none nothing; a large unit costs its
    kernels' time, above that floor."""
    lay = layout(8, 1)
    small = price("sdp4bit", lay, [Unit("layer", 1024)])
    compressed = [c for c in small.collectives if c.codec_s > 0]
    assert {c.name for c in compressed} == {"weights_fwd", "grads"}
    assert all(math.isclose(c.codec_s + c.wire_s, PER_CALL_S) for c in compressed)
    assert price("none", lay, [Unit("layer", 1024)]).codec_s == 0
    assert price("sdp4bit", lay, [Unit("layer", 64 * S)]).codec_s > 2 * PER_CALL_S
    assert 2e-4 < PER_CALL_S < 5e-3      # the H200 runs' median: ~0.84 ms


def test_hadamard_gradients_decode_as_the_sum_then_the_inverse_rotation():
    """The Hadamard schemes' decode-sum of 8 peers is the int sum plus one rotation pass over
    its output (an 8th of the values summed), and every unmeasured rate says so."""
    assert math.isclose(1 / GPU_RATES["hadamard4"][2],
                        1 / GPU_RATES["int4"][2] + 1 / (8 * ROTATE))
    cost = price("sdp4bit", layout(8, 1), [Unit("layer", 64 * S)])
    assert set(cost.estimated_rates) == {"qwd", "hadamard8"}   # decode; the 8-bit hop
    assert estimated("int4") is None and "int4" in estimated("qsgd4")

def test_compute_from_baseline():
    """The baseline's compute = its measured step minus ``none``'s exposed communication:
    priced again with that compute, ``none`` takes the measured step; never negative."""
    lay, units = layout(4, 2), [Unit(f"l{i}", S) for i in range(4)]
    for engine in SHARDED:
        none = price("none", lay, units, engine=engine, compute_s=0.0)
        step = 3 * none.wire_s
        compute = compute_from_baseline(step, units, lay, FAST, engine=engine)
        assert math.isclose(price("none", lay, units, engine=engine,
                                  compute_s=compute).step_s, step)
        assert compute_from_baseline(none.wire_s / 10, units, lay, FAST, engine=engine) >= 0.0
        # a step of 4 micro-batches: the compute of all of them, the same round trip
        none4 = price("none", lay, units, engine=engine, compute_s=0.0, grad_accum=4)
        compute = compute_from_baseline(3 * none4.wire_s, units, lay, FAST, engine=engine,
                                        grad_accum=4)
        assert math.isclose(price("none", lay, units, engine=engine, compute_s=compute,
                                  grad_accum=4).step_s, 3 * none4.wire_s)


def test_state_bytes_per_gpu():
    """qWD's node-sharded references: y slots of each unit's shard, bf16; nothing for
    ``none`` / ``zeropp``."""
    assert price("none", layout(4, 1)).state_bytes_per_gpu == 0
    assert price("zeropp", layout(4, 1)).state_bytes_per_gpu == 0
    assert price("qwd", layout(4, 1)).state_bytes_per_gpu == NODES * S * 2


def test_cluster_layout_and_its_errors():
    lay = ClusterLayout(nodes=16, gpus_per_node=8, tp=2, pp=2)
    assert (lay.dp_per_node, lay.groups_per_node, lay.dp_nodes, lay.dp) == (4, 2, 8, 32)
    assert ClusterLayout(4, 8, tp=2, cp=2).groups_per_node == 4
    with pytest.raises(ValueError, match="must divide gpus_per_node=8"):
        ClusterLayout(16, 8, tp=3)
    with pytest.raises(ValueError, match="pp=3 must divide nodes=16"):
        ClusterLayout(16, 8, pp=3)
    with pytest.raises(ValueError, match=">= 1"):
        ClusterLayout(0, 8)
    with pytest.raises(ValueError, match="must be > 0"):
        ClusterLinks(0, 100)


def test_a_preset_that_cannot_run_on_the_group_says_so():
    # one GPU on each of 128 nodes: the flat all-reduce sums 128 payloads, which int8 cannot
    # hold; with 8 GPUs on each of 16 nodes it is hierarchical and sums 16 (it runs)
    with pytest.raises(ValueError, match="cannot run on a data-parallel group of 128"):
        price("global_qsgd", layout(1, 1, nodes=128))
    assert price("global_qsgd", layout(8, 1)).step_s > 0
