"""Faults injected into 2-process gloo runs (issue 23): a rank's compressor-state file missing
on resume, NaN reaching the weights of a qWD (``sdp4bit``) run, ``HFCOMPRESS_AUTO`` set
differently on the ranks, and ``ddp_timeout`` on a CPU Trainer launch."""

import math

import pytest

from dist_utils import run_distributed
from faults_workers import faults_worker

TIMEOUT_S = 7


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """One spawned job for every check (``faults_workers.faults_worker``)."""
    return run_distributed(faults_worker, 2, str(tmp_path_factory.mktemp("faults")), TIMEOUT_S,
                           timeout=300)


def test_missing_rank_file_one_decision_for_all_ranks(out):
    """``comm_state_mismatch`` with rank 1's file missing: rank 0's own file is intact, yet no
    rank loads ('reset') and every rank raises the same error ('error'); training goes on."""
    for r in out:
        m = r["mismatch"]
        assert m["reset"] is None, m
        assert "no hfcompress compressor state for rank 1" in m["error"], m["error"]
        assert math.isfinite(m["after_reset"]), m
    assert out[0]["mismatch"]["error"] == out[1]["mismatch"]["error"]


def test_qwd_references_recover_when_finite_weights_are_restored(out):
    """NaN in a gradient reaches the weights: the loss is NaN (visible, not hidden). Weights
    restored by ``model.load_state_dict`` train finite at once (qWD references re-gathered
    exactly); restored with ``p.copy_`` the NaN reference alone keeps the loss NaN until
    ``reset_references()``."""
    nan = out[0]["nan"]
    assert all(math.isfinite(x) for x in nan["before"]), nan
    assert all(math.isnan(x) for x in nan["poisoned"]), nan
    assert all(math.isfinite(x) for x in nan["load_state_dict"]), nan
    assert abs(nan["load_state_dict"][0] - nan["before"][-1]) < 1.0, nan
    assert math.isnan(nan["copy_only"]), nan        # the reference alone stays NaN
    assert all(math.isfinite(x) for x in nan["copy_and_reset"]), nan
    assert nan["copy_and_reset"][0] == nan["load_state_dict"][0], nan   # same exact re-gather


def test_auto_env_differing_across_ranks_is_an_error_on_every_rank(out):
    for r in out:
        assert r["auto"] is not None and "HFCOMPRESS_AUTO differs across ranks" in r["auto"]
        assert "rank 0: 'weights=qwd'" in r["auto"] and "rank 1: 'weights=exact'" in r["auto"]


def test_ddp_timeout_reaches_the_cpu_process_group(out):
    """transformers leaves ddp_timeout out under use_cpu (the group then had gloo's 30 min).
    ``hfcompress.TrainingArguments`` creates the group with it; with a plain
    ``transformers.TrainingArguments`` or TRL's ``SFTConfig`` (the README's SFTTrainer
    path), transformers creates the group at 30 min while the arguments are built, and the
    Trainer (``CompressionMixin``) sets ``ddp_timeout`` on it (issue 29 F5)."""
    for r in out:
        t = r["ddp_timeout"]
        assert t["hfcompress"] == {"use_cpu": True, "world_size": 2,
                                   "created_s": float(TIMEOUT_S), "timeout_s": float(TIMEOUT_S)}
        for name in ("transformers", "trl"):
            assert t[name] == {"use_cpu": True, "world_size": 2, "created_s": 1800.0,
                               "timeout_s": float(TIMEOUT_S)}, (name, t)
