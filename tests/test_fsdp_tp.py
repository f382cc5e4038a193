"""FSDP2 x TP: ``hfcompress.apply`` on a model tensor-parallel over ``mesh["tp"]`` and
``fully_shard``-ed over ``mesh["dp"]`` of a (dp 2, tp 2) mesh, on 4 gloo ranks as 2 emulated
nodes of 2 with TP inside a node (each DP group has one rank per node: no intra-node hop).
One spawned job (``tp_workers.worker``) runs every check.

- ``none`` is bit-identical to the same run without hfcompress (losses and final shards);
- ``sdp4bit`` and ``zeropp`` (sharded by ``apply(..., shard=True, mesh=mesh["dp"])``) keep
  the loss within ``test_fsdp_training``'s bounds and train;
- hfcompress's collectives run on the DP groups only, never on a TP group;
- the meter's bytes per step equal the collectives' declarations on the DP group's layout
  (x = 1, y = 2), per collective, and ``test_traffic``'s cases on that topology too;
- ``handle.node_traffic()`` sums them per node (both DP groups share a node's link) and per
  DP group: the declarations of the node's / group's ranks, for the last step and the run;
- ``sdp4bit``'s compressor state of each (DP, TP) coordinate, restored with the model and
  optimizer shards, repeats the next steps bit for bit;
- native HSDP beside TP ((dp_replicate 2, dp_shard 1, tp 2): replicas across the nodes):
  ``none`` bit-identical, ``sdp4bit`` compresses the replica all-reduce within the loss bound;
- the DP group's topology builds no subgroup of one rank (x = 1: no intra-node groups; one
  node: no inter-node groups);
- refused clearly, naming the way out: HSDP through ``apply``'s ('replicate', 'shard') mesh
  over a sub-mesh (native HSDP instead), a DP group with more ranks on one node than another,
  and different models per rank (pipeline stages); ``auto`` over a sub-mesh works
  (``tests/test_auto_submesh.py``). Native HSDP (``fully_shard`` over
  ``mesh["dp_replicate", "dp_shard"]``, also beside TP) is compressed: ``tests/test_trainer_tp.py``.
"""

import pytest
import torch

from dist_utils import run_distributed
from test_fsdp_training import LOSS_BOUND
from tp_workers import worker

STEPS = 8
DP_GROUPS = {(0, 2), (1, 3)}


@pytest.fixture(scope="module")
def runs():
    return run_distributed(worker, 4, STEPS, timeout=300)


def test_topology_of_the_dp_group(runs):
    for rank, r in enumerate(runs):
        for preset in ("sdp4bit", "zeropp"):
            t = r["train"][preset]["topology"]
            assert t == {"ranks": [rank % 2, rank % 2 + 2], "x": 1, "y": 2, "size": 2,
                         "groups_per_node": 2}, t


def test_none_is_bit_identical_to_plain_fsdp_tp(runs):
    for r in runs:
        base, none = r["train"][None], r["train"]["none"]
        assert none["loss"] == base["loss"]
        for n, p in base["params"].items():
            assert torch.equal(none["params"][n], p), n


@pytest.mark.parametrize("preset", ["sdp4bit", "zeropp"])
def test_compressed_presets_keep_the_loss(runs, preset):
    """``zeropp`` goes through ``apply(..., shard=True, mesh=mesh["dp"])`` (hpZ with one DP
    rank per node: ``reshard_after_forward=False``)."""
    base = runs[0]["train"][None]["loss"]
    for r in runs:
        loss = r["train"][preset]["loss"]
        assert loss == runs[0]["train"][preset]["loss"]     # global means agree
        dev = max(abs(a - b) for a, b in zip(loss, base))
        assert dev <= LOSS_BOUND[preset], (dev, loss, base)
    drop = base[0] - sum(base[-3:]) / 3
    assert loss[0] - sum(loss[-3:]) / 3 >= 0.8 * drop, (loss, base)


def test_only_dp_groups_carry_our_collectives(runs):
    for rank, r in enumerate(runs):
        for preset in ("none", "sdp4bit", "zeropp"):
            groups = set(r["train"][preset]["groups"])
            assert groups, preset
            # the DP group, or its intra/inter-node subgroups (x = 1: singletons / itself)
            mine = next(g for g in DP_GROUPS if rank in g)
            assert all(set(g) <= set(mine) for g in groups), (preset, groups)


@pytest.mark.parametrize("preset", ["none", "sdp4bit", "zeropp"])
def test_meter_equals_declared_traffic(runs, preset):
    for r in runs:
        run = r["train"][preset]
        declared = run["declared"]
        first = 0 if preset == "none" else 1       # qWD's first all-gather is exact
        for step in run["meter"][first:]:
            assert set(step["collectives"]) == set(declared), (preset, step["collectives"])
            for tag, (intra, inter) in declared.items():
                got = step["collectives"][tag]
                assert (got["intra_bytes"], got["inter_bytes"]) == (intra, inter), \
                    (preset, tag, got, intra, inter)
        if preset == "none":   # compression off: the uncompressed baseline to the byte
            for step in run["meter"]:
                assert step["inter_bytes"] == step["uncompressed_inter_bytes"] > 0
                assert step["intra_bytes"] == step["uncompressed_intra_bytes"] == 0


@pytest.mark.parametrize("preset", ["none", "sdp4bit", "zeropp"])
def test_node_traffic_sums_the_dp_groups_of_a_node(runs, preset):
    """Per node (ranks 2n, 2n + 1: one rank of each DP group) and per DP group, the report
    (the same on every rank) holds the sum of its ranks' declared bytes of a steady step,
    and over the run the sum of its ranks' metered steps."""
    report = runs[0]["train"][preset]["node_traffic"]
    assert all(r["train"][preset]["node_traffic"] == report for r in runs)
    declared = [[sum(d[i] for d in r["train"][preset]["declared"].values()) for i in (0, 1)]
                for r in runs]                                  # (intra, inter) per rank
    metered = [[sum(s[k] for s in r["train"][preset]["meter"]) for k in ("intra_bytes",
                                                                         "inter_bytes")]
               for r in runs]
    members = {("nodes", n): [2 * n, 2 * n + 1] for n in (0, 1)}
    members.update({("groups", g): list(g) for g in DP_GROUPS})
    assert set(report["nodes"]) == {0, 1} and set(report["groups"]) == DP_GROUPS
    for (kind, key), ranks in members.items():
        entry = report[kind][key]
        assert entry["ranks"] == ranks, (kind, key, entry)
        for when, per_rank in (("last_step", declared), ("total", metered)):
            got = entry[when]["intra_bytes"], entry[when]["inter_bytes"]
            assert got == tuple(sum(per_rank[r][i] for r in ranks) for i in (0, 1)), \
                (preset, kind, key, when, got)
        assert entry["last_step"]["inter_bytes"] > 0 == entry["last_step"]["intra_bytes"]
        if preset == "none":
            assert entry["total"]["inter_bytes"] == entry["total"]["uncompressed_inter_bytes"]
    # the node's link carries both groups: per node = the two groups' sum / 2 nodes each
    for when in ("last_step", "total"):
        nodes = [report["nodes"][n][when]["inter_bytes"] for n in (0, 1)]
        groups = [report["groups"][g][when]["inter_bytes"] for g in DP_GROUPS]
        assert sum(nodes) == sum(groups)


def test_no_subgroup_of_one_rank(runs):
    """The DP groups {0, 2}, {1, 3}: with 2 ranks per node (x = 1, y = 2) only their
    inter-node groups are built (the groups themselves), with 4 (x = 2, y = 1) only their
    intra-node groups; the other kind is None (each would hold one rank). Before: 6 groups."""
    for r in runs:
        for per_node, none in ((2, (True, False)), (4, (False, True))):
            made, *absent = r["subgroups"][per_node]
            assert made == [(0, 2), (1, 3)], (per_node, made)
            assert tuple(absent) == none, per_node


def test_collectives_declare_what_they_send_on_the_dp_group(runs):
    for cases in zip(*(r["traffic"] for r in runs)):
        label, declared = cases[0][0], cases[0][1]
        recorded = [c[2] for c in cases]
        if label.split()[0] == "all_reduce":   # stock chunks: the mean over the ranks
            mean = tuple(sum(x[i] for x in recorded) / len(recorded) for i in (0, 1))
            assert mean == declared, (label, declared, recorded)
        else:
            assert all(x == declared for x in recorded), (label, declared, recorded)


def test_compressor_state_of_each_coordinate_resumes_bit_identically(runs):
    """sdp4bit on dp 2 x tp 2: each rank's compressor state (its (DP, TP) coordinate's qWD
    references), restored with the model and optimizer shards, repeats the next steps' losses
    bit for bit, and they differ from step to step (the run moves)."""
    for r in runs:
        first, again = r["resume"]["first"], r["resume"]["again"]
        assert first == again and first[0] != first[1], (first, again)


def test_native_hsdp_beside_tp(runs):
    """HSDP x TP (replicas across the nodes, TP inside): ``none`` bit-identical to plain
    native HSDP x TP, ``sdp4bit`` compresses the replica all-reduce (the only inter-node
    traffic here) and keeps the loss within the FSDP bound."""
    for r in runs:
        base, none, sdp = (r["hsdp_tp"][p] for p in (None, "none", "sdp4bit"))
        assert none["loss"] == base["loss"]
        assert all(torch.equal(none["params"][n], p) for n, p in base["params"].items())
        assert "native HSDP: replica all-reduce over 2" in sdp["describe"]
        assert none["inter_bytes"] == none["uncompressed_inter_bytes"] > 0
        assert sdp["inter_bytes"] * 4 < sdp["uncompressed_inter_bytes"], sdp
        assert max(abs(a - b) for a, b in zip(sdp["loss"], base["loss"])) <= LOSS_BOUND["sdp4bit"]


def test_refusals_name_the_way_out(runs):
    """Native HSDP (also beside TP) and the Trainer's sub-meshes are supported now
    (``tests/test_trainer_tp.py``); ``apply``'s ('replicate', 'shard') mode over a sub-mesh
    names native HSDP as the way."""
    for r in runs:
        msg = r["refusals"]
        assert "HSDP over a sub-mesh" in msg["hsdp_tp"] and "native" in msg["hsdp_tp"]
        assert "different number of ranks on each node" in msg["uneven"], msg["uneven"]
        assert "pipeline parallelism is not supported" in msg["pipeline"], msg["pipeline"]


def test_each_node_link_carries_the_compressed_bytes(runs):
    """Per node (``handle.node_traffic()``: its 2 ranks, one of each DP group, share the
    node's link), a steady step: both nodes send the same bytes; ``none`` what the exact
    collectives would, the compressed presets under a third of it."""
    for preset in ("none", "sdp4bit", "zeropp"):
        nodes = runs[0]["train"][preset]["node_traffic"]["nodes"]
        node = [nodes[n]["last_step"]["inter_bytes"] for n in (0, 1)]
        base = [nodes[n]["last_step"]["uncompressed_inter_bytes"] for n in (0, 1)]
        assert node[0] == node[1] > 0 and base[0] == base[1], (preset, node, base)
        if preset == "none":
            assert node == base, (node, base)
        else:
            assert 3 * node[0] < base[0], (preset, node, base)


def test_ddp_over_the_dp_group(runs):
    """DDP over a data-parallel subgroup: the hook's topology is the group's, its
    collectives run on that group only, and the group's ranks end with the same gradients."""
    for rank, r in enumerate(runs):
        d = r["ddp"]
        assert (d["x"], d["y"]) == (1, 2)
        mine = next(g for g in DP_GROUPS if rank in g)
        assert d["groups"] and all(set(g) <= set(mine) for g in d["groups"]), d["groups"]
        assert d["same_as_dp_peer"]
        assert all(s["inter_bytes"] > 0 and s["intra_bytes"] == 0 for s in d["meter"])
