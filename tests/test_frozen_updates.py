"""Parameters frozen when ``hfcompress.apply`` runs that change later, under qWD with FSDP2
on 2 gloo processes (issue 29, F1): unfreezing and training them, and in-place writes
between steps, reach every rank's forward weights (workers in ``fsdp_workers.py``)."""

from __future__ import annotations

import pytest

import fsdp_workers as fw
from dist_utils import run_distributed

#: sdp4bit over 2 emulated nodes (differences cross nodes), qwd on one node of 2 ranks
#: (node-sharded references)
RUNS = (("sdp4bit", 1), ("qwd", 2))


@pytest.fixture(scope="module")
def results():
    return run_distributed(fw.frozen_updates_worker, 2, RUNS, timeout=180)


@pytest.mark.parametrize("run", RUNS, ids=[f"{p}-x{x}" for p, x in RUNS])
def test_changed_frozen_parameters_reach_the_forward_weights(results, run):
    """On every rank: the parameters written in place while frozen, the unfrozen norm (sent
    exactly) and the frozen ones never written compute with the main weights bit for bit;
    the unfrozen projection and the trainable one written in place (qWD: 4-bit differences,
    whose residual the next step corrects) within a small fraction of how far they moved,
    where the install-time weights are as far off as the move itself."""
    for out in (r[run] for r in results):
        gap, moved = out["gap"], out["moved"]
        assert out["identical"]
        for name in fw.WRITTEN + fw.KEPT + fw.UNFROZEN[1:]:
            assert gap[name] == 0, (name, gap[name], moved[name])
        for name in fw.WRITTEN + fw.UNFROZEN:
            assert moved[name] > 5e-3, (name, moved[name])
        for name in (fw.UNFROZEN[0], fw.TRAINED_WRITTEN):
            assert gap[name] < 0.2 * moved[name], (name, gap[name], moved[name])


def test_no_extra_bytes_while_nothing_changes(results):
    """sdp4bit over 2 nodes: each change (unfreezing at step 2, the writes at step 6) costs
    one exact all-gather of the modules concerned; the steps after it send what the frozen
    path sends with the new trainable set, step after step."""
    for r in results:
        inter = r[("sdp4bit", 1)]["inter"]
        assert inter[3] == inter[4] == inter[5] == inter[7], inter
        assert inter[2] > inter[3] and inter[6] > inter[7], inter
        assert inter[1] < inter[3], inter      # more trainable values after unfreezing
