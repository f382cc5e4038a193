"""Faults injected into 2-process gloo runs (issue 23): a rank's compressor-state file missing
on resume, NaN reaching the weights of a qWD (``sdp4bit``) run, ``HFCOMPRESS_AUTO`` set
differently on the ranks, and ``ddp_timeout`` on a CPU Trainer launch."""

import math

from dist_utils import run_distributed
from faults_workers import ddp_timeout_worker, fsdp_faults_worker


def test_fsdp_faults(tmp_path):
    out = run_distributed(fsdp_faults_worker, 2, str(tmp_path), timeout=300)
    # a missing rank file: one decision on every rank (rank 0's own file is intact)
    for r in out:
        m = r["mismatch"]
        assert m["reset"] is False, m
        assert "no hfcompress compressor state for rank 1" in m["error"], m["error"]
        assert math.isfinite(m["after_reset"]), m
    assert out[0]["mismatch"]["error"] == out[1]["mismatch"]["error"]
    # NaN in a gradient reaches the weights: visible; restored weights recover
    nan = out[0]["nan"]
    assert all(math.isfinite(x) for x in nan["before"]), nan
    assert all(math.isnan(x) for x in nan["poisoned"]), nan
    assert all(math.isfinite(x) for x in nan["load_state_dict"]), nan
    assert abs(nan["load_state_dict"][0] - nan["before"][-1]) < 1.0, nan
    assert math.isnan(nan["copy_only"]), nan        # the reference alone stays NaN
    assert all(math.isfinite(x) for x in nan["copy_and_reset"]), nan
    assert nan["copy_and_reset"][0] == nan["load_state_dict"][0], nan   # same exact re-gather
    # HFCOMPRESS_AUTO differing: every rank raises, naming both values
    for r in out:
        assert r["auto"] is not None and "HFCOMPRESS_AUTO differs across ranks" in r["auto"]
        assert "rank 0: 'weights=qwd'" in r["auto"] and "rank 1: 'weights=exact'" in r["auto"]


def test_ddp_timeout_reaches_the_cpu_process_group(tmp_path):
    """transformers leaves ddp_timeout out under use_cpu (which hfcompress sets on a CPU
    launch); the gloo group hfcompress.TrainingArguments creates has it."""
    out = run_distributed(ddp_timeout_worker, 2, str(tmp_path), 7, timeout=120)
    for r in out:
        assert r == {"use_cpu": True, "world_size": 2, "timeout_s": 7.0}, r
