"""The node layout is checked against the ranks' host names at apply() time.

Host names are faked per rank with ``HFCOMPRESS_HOSTNAME`` (the one test seam,
``comm.topology.hostname``), so multi-host placements run as real gloo processes here.
"""

import logging
import os
import warnings

import pytest
import torch

from dist_utils import run_distributed
from hfcompress.comm.topology import NodeSplit, check_node_layout, node_split


def test_node_split_keeps_where_the_value_came_from(monkeypatch):
    """Only a value the user gave is explicit (emulated nodes allowed): the same number
    taken from ``LOCAL_WORLD_SIZE``, or the one-node default, is not."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert node_split(8) == NodeSplit(8, explicit=False)
    assert node_split(8, 8) == NodeSplit(8, explicit=True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert node_split(8) == NodeSplit(2, explicit=False)
    assert node_split(8, 2) == NodeSplit(2, explicit=True)


def test_node_major_hosts_pass_silently(caplog):
    """Nodes of consecutive ranks on one host each (or one host, one node): no error, no
    warning, no log line."""
    with warnings.catch_warnings(), caplog.at_level(logging.DEBUG):
        warnings.simplefilter("error")
        assert check_node_layout(["a", "a", "b", "b"], 2, explicit=False) is None
        assert check_node_layout(["a"] * 4, 4, explicit=False) is None
    assert caplog.records == []


def test_cyclic_placement_raises_naming_the_fix():
    with pytest.raises(ValueError, match=r"ranks 0\.\.1 in node 0, but they run on hosts "
                                         r"\['a', 'b'\].*round-robin.*node-major"):
        check_node_layout(["a", "b", "a", "b"], 2, explicit=False)


def test_node_larger_than_host_raises():
    with pytest.raises(ValueError, match=r"ranks_per_node=4 .* hosts \['a', 'b'\]"):
        check_node_layout(["a", "a", "b", "b"], 4, explicit=True)


def test_host_split_into_nodes_warns_unless_explicit(caplog):
    with pytest.warns(UserWarning, match=r"LOCAL_WORLD_SIZE=1 splits host 'a' \(2 ranks\).*"
                                         r"ranks_per_node=2"):
        check_node_layout(["a", "a", "b", "b"], 1, explicit=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.INFO, logger="hfcompress.comm.topology"):
            check_node_layout(["h"] * 4, 2, explicit=True)     # emulated nodes: allowed
    assert "emulating 2 nodes of 2 ranks on 1 host(s)" in caplog.text


def layout_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hfcompress
    os.environ["HFCOMPRESS_COMPILE"] = "0"

    def model():    # DDP takes one comm hook per model
        return DDP(torch.nn.Linear(8, 8))

    out = {}
    # cyclic: ranks 0, 2 on host a, ranks 1, 3 on host b; nodes of 2 consecutive ranks
    os.environ["HFCOMPRESS_HOSTNAME"] = "ab"[rank % 2]
    with pytest.raises(ValueError, match="round-robin"):
        hfcompress.apply(model(), "global_qsgd", ranks_per_node=2)
    # node-major: ranks 0, 1 on a, 2, 3 on b
    os.environ["HFCOMPRESS_HOSTNAME"] = "ab"[rank // 2]
    handle = hfcompress.apply(model(), "global_qsgd", ranks_per_node=2)
    out["node_major"] = handle.topology.num_nodes
    # LOCAL_WORLD_SIZE=1 on 2 hosts of 2 ranks: a warning naming ranks_per_node=2
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    with pytest.warns(UserWarning, match="ranks_per_node=2 for the real layout"):
        handle = hfcompress.apply(model(), "global_qsgd")
    del os.environ["LOCAL_WORLD_SIZE"]
    # one host, nodes emulated on purpose: allowed without a warning
    os.environ["HFCOMPRESS_HOSTNAME"] = "one"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = hfcompress.apply(model(), "global_qsgd", ranks_per_node=2)
    out["emulated"] = handle.topology.num_nodes
    return out


def test_apply_checks_node_layout_across_processes():
    for out in run_distributed(layout_worker, 4):
        assert out == {"node_major": 2, "emulated": 2}
