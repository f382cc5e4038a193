"""The node layout resolved once (``apply`` / the Trainer pass the ``NodeSplit`` down, taken
as is), and hpZ in the Trainer chosen from the FSDP shard group's node layout, not the
world's: on dp 2 x tp 2 (TP inside a node, one shard-group rank per node) ``zeropp`` trains, its layers
keeping the full weights after forward; a node partition transformers' load-time sharding
cannot take is refused with what to do instead."""

import pytest

from dist_utils import run_distributed
from hfcompress.comm.topology import NodeSplit, node_split
from hfcompress.trainer.install import hpz_choice, reshard_loaded
from test_fsdp_training import LOSS_BOUND
from trainer_hpz_workers import worker
from trainer_tp_workers import STEPS, meshes


def test_a_resolved_split_is_taken_as_is(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    given = node_split(8, 2)
    assert given == NodeSplit(2, explicit=True) and node_split(8, given) is given
    from_env = node_split(8)
    assert not from_env.explicit and node_split(8, from_env) is from_env
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=4 ranks; ranks_per_node must divide"):
        node_split(6, from_env)


def test_hpz_from_the_shard_groups_layout():
    nodes = NodeSplit(2, explicit=True)
    assert hpz_choice([0, 2], nodes) == (False, 1)      # dp x tp: one rank per node
    assert hpz_choice([0, 1], nodes) == (True, 2)       # HSDP shard group: one node
    assert hpz_choice([0, 1, 2, 3], nodes) == (2, 2)    # the world: 2 nodes of 2
    assert hpz_choice([0, 2, 4, 6], NodeSplit(4, explicit=True)) == (2, 2)  # tp 2 of 4


def test_a_node_partition_on_a_loaded_model_is_refused_with_the_fix():
    with pytest.raises(ValueError) as err:
        reshard_loaded(None, 2, 2, "zeropp")
    message = str(err.value)
    assert "reshard_after_forward=2" in message and "distributed_config" in message
    assert "fsdp=True" in message and "'sdp4bit'" in message


@pytest.mark.skipif("tp" not in meshes(), reason="this transformers cannot load a TP x FSDP2 "
                                                 "model (5.24 can)")
def test_zeropp_trains_on_dp2_x_tp2(tmp_path):
    runs = run_distributed(worker, 4, str(tmp_path), timeout=400)
    for rank, r in enumerate(runs):
        assert r["hpz"] and r["topology"] == (1, 2, [rank % 2, rank % 2 + 2])
        assert all(v is False for v in r["reshard"].values()), r["reshard"]
        loss, base = r["losses"], r["base"]
        assert len(loss) == STEPS and loss[STEPS] < loss[1], loss
        assert max(abs(loss[s] - base[s]) for s in base) <= LOSS_BOUND["zeropp"], (loss, base)
