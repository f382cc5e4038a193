"""Faults of Trainer checkpoints injected into real 2-process runs (issue 29, F2 and F3):
FSDP2 + ``sdp4bit`` through ``hfcompress.Trainer`` (workers in ``trainer_workers.py``)."""

import pytest

import trainer_workers as tw
from dist_utils import run_distributed


def test_sigterm_checkpoint_resumes_bit_identically(tmp_path):
    """F3: a SIGTERM during step 3 with ``enable_jit_checkpoint``. transformers saves at its
    next hook, ``on_pre_optimizer_step``: the weights of step 2, the compressor state after
    step 3's collectives (resumed from it, the weights ended 1.4e-2 from the uninterrupted
    run's). The save now waits for the end of step 3 (checkpoint-3, training stops there) and
    the resume ends on the uninterrupted run's weights exactly."""
    out = run_distributed(tw.jit_checkpoint_worker, 2, str(tmp_path), timeout=240)
    for r in out:
        assert r["saved"] == ["checkpoint-3"] and r["stopped_at"] == 3, r
        assert r["gap"] == 0.0, r
    full, resumed = out[0]["losses"]
    assert all(resumed[s] == full[s] for s in (4, 5, 6)), (full, resumed)


def test_files_of_two_runs_in_one_checkpoint_are_refused(tmp_path):
    """F2: checkpoint-3 with run A's rank-0 file and run B's rank-1 file (same rank, step and
    settings: two jobs started into one output_dir) resumed silently, the ranks on different
    weights. Now every rank raises, naming each file's run and what to do. Run A's own
    checkpoint resumes; the resumed run keeps A's id, so its checkpoint-6 resumes too."""
    out = run_distributed(tw.run_identity_worker, 2, str(tmp_path), timeout=240)
    ids = out[0]["ids"]
    (a,), (b,) = set(ids["a"]), set(ids["b"])
    assert a != b and ids["a2"] == ids["a"], ids
    for r in out:
        msg = r["mixed"]
        assert "holds the compressor state of 2 different runs" in msg, msg
        assert f"run {a}: hfcompress_rank0.pt; run {b}: hfcompress_rank1.pt" in msg, msg
        assert "start each training in its own output_dir" in msg, msg
        assert sorted(r["again"]) == list(range(1, 9)), r["again"]
    assert out[0]["mixed"] == out[1]["mixed"]
