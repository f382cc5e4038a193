"""What the node-layout check says (issue 38): under ``srun`` (no ``LOCAL_WORLD_SIZE``) the
refusal names where its number came from (nothing set: the whole world as one node) and the
value to set (the ranks per host, and SLURM's own variables); a ``ranks_per_node`` the user gave
that splits the hosts of a multi-host job is warned about. Host names faked per rank with
``HFCOMPRESS_HOSTNAME``, on real gloo processes."""

from __future__ import annotations

import os
import warnings

import pytest

from dist_utils import run_distributed
from hfcompress.comm.topology import check_node_layout, node_split


def test_node_split_names_the_whole_world_when_nothing_is_set(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert node_split(4).source == "world"
    assert node_split(4, 2).source == "ranks_per_node"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert node_split(4).source == "LOCAL_WORLD_SIZE"


def test_whole_world_node_over_two_hosts_names_no_unset_variable(monkeypatch):
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    with pytest.raises(ValueError) as err:
        check_node_layout(["a", "a", "b", "b"], 4, explicit=False, source="world")
    message = str(err.value)
    assert "LOCAL_WORLD_SIZE=4" not in message
    assert "neither ranks_per_node nor LOCAL_WORLD_SIZE is set, so all 4 ranks are one node" \
        in message
    assert "set ranks_per_node=2 (or LOCAL_WORLD_SIZE=2): the ranks per host " \
           "(SLURM_TASKS_PER_NODE=2(x2))" in message


def test_given_ranks_per_node_that_splits_hosts_of_a_multi_host_job_warns(caplog):
    with pytest.warns(UserWarning, match=r"ranks_per_node=1 splits host 'a' \(2 ranks\) into 2 "
                                         r"nodes, though the job runs on 2 hosts.*"
                                         r"ranks_per_node=2 for the real layout"):
        check_node_layout(["a", "a", "b", "b"], 1, explicit=True)
    with warnings.catch_warnings():            # one host: nodes emulated on purpose
        warnings.simplefilter("error")
        check_node_layout(["h"] * 4, 1, explicit=True)


def srun_worker(rank: int, world: int) -> dict:
    """2 hosts x 2 ranks, as srun starts them: no LOCAL_WORLD_SIZE, SLURM's variables."""
    import torch.distributed as dist

    from hfcompress.comm import Topology

    assert "LOCAL_WORLD_SIZE" not in os.environ
    os.environ["HFCOMPRESS_HOSTNAME"] = "ab"[rank // 2]
    os.environ["SLURM_NTASKS_PER_NODE"] = "2"
    out = {}
    try:
        Topology()
    except ValueError as e:
        out["refused"] = str(e)
    with warnings.catch_warnings(record=True) as caught:   # loop.py's ranks_per_node=1
        warnings.simplefilter("always")
        out["nodes"] = Topology(ranks_per_node=1).num_nodes
    out["warned"] = [str(w.message) for w in caught if "hfcompress" in str(w.message)]
    dist.barrier()
    return out


def test_srun_refusal_and_a_wrong_ranks_per_node_on_real_processes():
    for out in run_distributed(srun_worker, 4):
        assert "LOCAL_WORLD_SIZE=4" not in out["refused"]
        assert "neither ranks_per_node nor LOCAL_WORLD_SIZE is set" in out["refused"]
        assert "set ranks_per_node=2" in out["refused"]
        assert "SLURM_NTASKS_PER_NODE=2" in out["refused"]
        assert out["nodes"] == 4
        assert len(out["warned"]) == 1 and "though the job runs on 2 hosts" in out["warned"][0]
