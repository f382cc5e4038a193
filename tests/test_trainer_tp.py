"""``hfcompress.Trainer`` on N-D meshes: native HSDP through Accelerate's
``ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)`` and dp_shard 2 x tp 2 (TP inside a
node), on 4 gloo ranks as 2 emulated nodes of 2; one spawned job (``trainer_tp_workers``) runs
every training. Per mesh:

- ``none`` gives losses and final shards bit-identical to the plain Trainer's;
- ``sdp4bit`` keeps the loss within the FSDP tests' bound;
- every rank's metered bytes per step (intra- and inter-node) equal the collectives'
  declarations, per collective (HSDP: the shard group's inside a node, the replica all-reduce
  across nodes), with Accelerate's norm + lm_head unit (one ``fully_shard`` call for two
  modules) counted once; ``handle.node_traffic()`` sums them per node and per DP group;
- HSDP: ``remove()`` gives every unit FSDP2's replica all-reduce back;
- HSDP: compressor state saved at step 2 and resumed gives the uninterrupted run's later
  steps bit for bit; the files record the mesh shape and the rank's coordinate
  (transformers 5.24 refuses checkpoints of the load-time-sharded TP model).

A resume on another mesh shape is refused naming both shapes (a unit test, no processes).
"""

import pytest
import torch

from dist_utils import run_distributed
from hfcompress.trainer import checkpoint
from test_fsdp_training import LOSS_BOUND
from trainer_tp_workers import SAVE_AT, STEPS, meshes, worker

MESHES = {"hsdp": {"dp_replicate": 2, "dp_shard": 2}, "tp": {"dp_shard": 2, "tp": 2}}
TRAINED = [pytest.param(m, marks=() if m in meshes() else pytest.mark.skip(
    reason="this transformers cannot load a TP x FSDP2 model (5.24 can)")) for m in MESHES]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_distributed(worker, 4, str(tmp_path_factory.mktemp("trainer_tp")), timeout=400)


@pytest.mark.parametrize("mesh", TRAINED)
def test_none_is_bit_identical_to_the_plain_trainer(runs, mesh):
    for r in runs:
        base, none = r[mesh][None], r[mesh]["none"]
        assert none["losses"] == base["losses"] and len(base["losses"]) == STEPS
        for n, p in base["params"].items():
            assert torch.equal(none["params"][n], p), (mesh, n)


@pytest.mark.parametrize("mesh", TRAINED)
def test_sdp4bit_keeps_the_loss(runs, mesh):
    for r in runs:
        base, loss = r[mesh][None]["losses"], r[mesh]["sdp4bit"]["losses"]
        dev = max(abs(loss[s] - base[s]) for s in base)
        assert dev <= LOSS_BOUND["sdp4bit"], (mesh, loss, base)
        assert loss[STEPS] < loss[1], loss


def test_data_parallel_groups(runs):
    """HSDP: the shard group is a node's 2 ranks (x = 2, y = 1); dp x tp: one DP rank per node
    (x = 1, y = 2), TP inside the node."""
    for rank, r in enumerate(runs):
        assert r["hsdp"]["sdp4bit"]["topology"] == (2, 1, [rank // 2 * 2, rank // 2 * 2 + 1])
        assert "native HSDP: replica all-reduce over 2" in r["hsdp"]["sdp4bit"]["describe"]
        if "tp" in r:
            assert r["tp"]["sdp4bit"]["topology"] == (1, 2, [rank % 2, rank % 2 + 2])


@pytest.mark.parametrize("mesh", TRAINED)
@pytest.mark.parametrize("preset", ["none", "sdp4bit"])
def test_meter_equals_declared_traffic(runs, mesh, preset):
    """Every rank's intra- and inter-node bytes per collective and step equal the
    declarations (``declared``: the shard group's collectives of each FSDP unit, and with
    HSDP the replica all-reduce of its gradient shard; the stock all-reduce's chunks are
    equal here, every shard being even)."""
    first = 0 if preset == "none" else 1        # qWD's first all-gather is exact
    tags = set(runs[0][mesh][preset]["declared"])
    for r in runs:
        run = r[mesh][preset]
        for s in range(first, STEPS):
            assert set(run["meter"][s]["collectives"]) == tags, (s, run["meter"][s])
            for tag in tags:
                got = run["meter"][s]["collectives"][tag]
                assert (got["intra_bytes"], got["inter_bytes"]) == run["declared"][tag], \
                    (mesh, preset, s, tag, got, run["declared"][tag])
    if preset == "none":                        # and so the exact collectives' baseline
        for step in runs[0][mesh]["none"]["meter"]:
            assert step["inter_bytes"] == step["uncompressed_inter_bytes"] > 0
            assert step["intra_bytes"] == step["uncompressed_intra_bytes"]


def test_one_unit_per_fully_shard_call(runs):
    """Accelerate shards the final norm and lm_head in one ``fully_shard([norm, lm_head])``
    call: one param group, one unit (its collectives installed and declared once). Native
    HSDP's replica all-reduce is FSDP2's own again on every unit after ``remove()``."""
    for r in runs:
        for mesh in r:
            assert r[mesh]["sdp4bit"]["units"] == ["model.embed_tokens", "model.layers.0",
                                                   "model.layers.1", "model.norm+lm_head"]
        assert r["hsdp"]["sdp4bit"]["hsdp_after_remove"] == [True] * 4


NODES = {0: [0, 1], 1: [2, 3]}
GROUPS = {"hsdp": {(0, 1): [0, 1], (2, 3): [2, 3]},    # shard groups: a node each
          "tp": {(0, 2): [0, 2], (1, 3): [1, 3]}}      # DP groups: across the nodes


@pytest.mark.parametrize("mesh", TRAINED)
@pytest.mark.parametrize("preset", ["none", "sdp4bit"])
def test_node_traffic_is_the_declarations_of_the_nodes_ranks(runs, mesh, preset):
    """``handle.node_traffic()`` (the same report on every rank): per node and per
    data-parallel group, the last step's bytes are the sum of the declarations of its ranks,
    and the run's the sum of its ranks' metered steps. ``pytest -s`` prints the per-node
    inter-node bytes of a step."""
    report = runs[0][mesh][preset]["nodes"]
    assert all(r[mesh][preset]["nodes"] == report for r in runs)
    declared = [[sum(d[i] for d in r[mesh][preset]["declared"].values()) for i in (0, 1)]
                for r in runs]
    metered = [[sum(s[k] for s in r[mesh][preset]["meter"]) for k in ("intra_bytes",
                                                                      "inter_bytes")]
               for r in runs]
    for kind, members in (("nodes", NODES), ("groups", GROUPS[mesh])):
        assert set(report[kind]) == set(members)
        for key, ranks in members.items():
            entry = report[kind][key]
            assert entry["ranks"] == ranks
            for when, per_rank in (("last_step", declared), ("total", metered)):
                got = entry[when]["intra_bytes"], entry[when]["inter_bytes"]
                assert got == tuple(sum(per_rank[r][i] for r in ranks) for i in (0, 1)), \
                    (kind, key, when, got)
    nodes = [report["nodes"][n]["last_step"] for n in NODES]
    assert all(n["inter_bytes"] > 0 for n in nodes)
    print(f"{mesh} {preset}: inter-node bytes per step and node "
          f"{[n['inter_bytes'] for n in nodes]} "
          f"(uncompressed {[n['uncompressed_inter_bytes'] for n in nodes]})")


@pytest.mark.parametrize("mesh", ["hsdp"])     # transformers: no checkpoints of "tp" here
def test_resume_is_bit_identical(runs, mesh):
    for rank, r in enumerate(runs):
        full, resumed = r[mesh]["sdp4bit"], r[mesh]["resumed"]
        later = range(SAVE_AT + 1, STEPS + 1)     # the resumed history holds steps 1-2 too
        assert [full["losses"][s] for s in later] == [resumed["losses"][s] for s in later]
        for n, p in full["params"].items():
            assert torch.equal(resumed["params"][n], p), (mesh, n)
        settings = r[mesh]["settings"]
        assert settings["mesh"] == MESHES[mesh]
        assert sorted(settings["coordinate"]) == sorted(MESHES[mesh])


def _settings(mesh):
    return checkpoint.settings({"name": "sdp4bit"}, "fsdp2", 4, 2, run="r", mesh=mesh)


class _Mesh:
    """What ``checkpoint.mesh_layout`` reads of a ``DeviceMesh``."""

    def __init__(self, shape: dict, coordinate: list) -> None:
        self.mesh_dim_names, self.ndim = tuple(shape), len(shape)
        self.mesh = torch.zeros(tuple(shape.values()))
        self._coordinate = coordinate

    def get_coordinate(self):
        return self._coordinate


def test_another_mesh_shape_is_refused_naming_both():
    hsdp = _settings(_Mesh(MESHES["hsdp"], [1, 0]))
    tp = _settings(_Mesh(MESHES["tp"], [0, 1]))
    assert hsdp["mesh"] == MESHES["hsdp"] and hsdp["coordinate"] == {"dp_replicate": 1,
                                                                     "dp_shard": 0}
    lines = checkpoint._differences(hsdp, tp)
    assert len(lines) == 1, lines
    assert "dp_replicate=2 x dp_shard=2" in lines[0] and "dp_shard=2 x tp=2" in lines[0]
    # same shape, another rank's coordinate: the same settings
    assert checkpoint._differences(hsdp, _settings(_Mesh(MESHES["hsdp"], [0, 1]))) == []


def test_files_without_a_mesh_are_of_the_flat_mesh():
    old = {k: v for k, v in _settings(None).items() if k not in ("mesh", "coordinate")}
    assert checkpoint._differences(old, _settings(None)) == []
    assert checkpoint._differences(old, _settings(_Mesh(MESHES["tp"], [0, 0])))
