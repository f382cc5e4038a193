"""What a multi-node job meets (issue 38), on spawned gloo processes:

- ``nonfinite_losses`` counts every rank's NaN / Inf losses (reduced at the logging step):
  a NaN on rank 1 alone was logged by rank 0 as nothing at all;
- ``--ddp_timeout`` reaches every group: the device mesh's dims that Accelerate builds
  (torch's 30 min otherwise) and the node groups hfcompress builds from them; a rank that
  stops under native HSDP ends the others within ~60 s, the error naming the group and the
  timeout (it went undetected for 199 s, "timeout 1800 s");
- ``hfcompress.apply`` gives the world's timeout to the mesh it is given ((dp, tp)) and the
  node groups.
"""

from __future__ import annotations

import cluster_workers as cw
from dist_utils import run_distributed

TIMEOUT_S = 20


def test_a_nan_loss_on_rank_1_alone_is_counted_where_it_is_logged(tmp_path):
    ranks = run_distributed(cw.nonfinite_worker, 2, str(tmp_path), timeout=240)
    # steps 1-3 of rank 1 were NaN: 2 in the window logged at step 2, 1 in the one at 4
    for r in ranks:
        assert r == {2: 2, 4: 1}, ranks


def test_a_stopped_rank_ends_an_hsdp_job_within_the_ddp_timeout(tmp_path):
    ranks = run_distributed(cw.stalled_rank_worker, 4, str(tmp_path), TIMEOUT_S, 65,
                            timeout=300)
    assert ranks[3].get("stopped"), ranks[3]
    survivors = ranks[:3]
    for r in survivors:
        # every group of the job (world, mesh dims, node groups) has ddp_timeout
        assert r["torch_default"] == 0 and r["timeouts_s"] == [TIMEOUT_S], r
        # measured: 20.0-20.2 s each (the shard group's all-gather, the replica all-reduce)
        assert r["error"] is not None and r["seconds"] < 55, survivors
    named = [r["error"] for r in survivors if f"timeout {TIMEOUT_S} s" in r["error"]]
    assert named and all("group 'mesh_dp" in e and "ranks [" in e for e in named), survivors


def test_apply_gives_the_worlds_timeout_to_the_mesh_and_node_groups():
    """``apply`` over ``mesh["dp"]`` of a ``(dp, tp)`` mesh: the mesh's groups (created by
    ``init_device_mesh`` with torch's 30 min), TP's included, and the node groups built from
    the DP group get the world's timeout."""
    ranks = run_distributed(cw.apply_mesh_timeouts_worker, 4, TIMEOUT_S, timeout=400)
    for r in ranks:
        assert r["before"] == [1800.0], r
        assert r["node_groups"] >= 1 and r["after"] == [float(TIMEOUT_S)], r
