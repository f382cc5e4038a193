"""The compressor state bound to the weights it was saved with, and a second job in one
``output_dir`` (issue 38, item 2). Both rank files of another run (same settings and step)
placed beside this run's weights resumed silently: the run id compared the rank files with
each other only. Now each file records a fingerprint of its rank's weights, checked at load;
and rank 0 keeps a job file in ``output_dir`` that makes a second job warn, naming the first.
Real 2-process Trainer runs in ``binding_workers.py``."""

import json
import os
import socket
import subprocess
import sys
import time
import warnings

import pytest
import torch

import binding_workers as bw
from dist_utils import run_distributed
from hfcompress.trainer import checkpoint

SETTING = checkpoint.settings({"name": "sdp4bit"}, "fsdp2", 2, 1, run="0123456789abcdef")


class Handle:
    """A ``Compression`` handle's part that checkpoints use, on a small model."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(300, 7), torch.nn.Linear(7, 2))
        self.state = {"reference": torch.arange(8.0)}

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


# -- the weights' fingerprint --------------------------------------------------------------
def test_other_weights_are_refused_or_reset(tmp_path):
    h = Handle()
    checkpoint.save(h, SETTING, str(tmp_path), 0, step=3)
    weight = h.model[0].weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight[5, 100] += 1e-6       # one element of 2100 (every 32nd is in the sample)
    with pytest.raises(ValueError) as info:
        checkpoint.load(h, SETTING, str(tmp_path), 0, step=3)
    msg = str(info.value)
    assert "hfcompress_rank0.pt was saved with other weights" in msg, msg
    assert "comm_state_mismatch='reset'" in msg, msg
    with pytest.warns(UserWarning, match="(?s)other weights.*starting the compressor state"):
        assert checkpoint.load(h, SETTING, str(tmp_path), 0, "reset", step=3) is None
    with torch.no_grad():
        weight.copy_(saved)
    assert checkpoint.load(h, SETTING, str(tmp_path), 0, step=3) == SETTING["run"]


def test_the_fingerprint_samples_trainable_weights():
    h = Handle()
    h.model[1].requires_grad_(False)             # frozen weights are not hashed
    before = checkpoint.weights_fingerprint(h.model)
    with torch.no_grad():
        h.model[1].weight += 1
    assert checkpoint.weights_fingerprint(h.model) == before
    h.model.requires_grad_(False)                # nothing trains: all weights are
    assert checkpoint.weights_fingerprint(h.model) != before
    h.model[0].requires_grad_(True)
    h.model[0].weight.data = h.model[0].weight.data.double()       # the dtype is
    assert checkpoint.weights_fingerprint(h.model) != before


def test_format_3_files_load_with_a_warning(tmp_path):
    path = checkpoint.save(Handle(), SETTING, str(tmp_path), 0, step=3)
    record = torch.load(path, weights_only=True)
    record["format"] = 3
    del record["weights"]
    torch.save(record, path)
    with pytest.warns(UserWarning, match="old format 3 .no weights fingerprint.: it cannot"):
        assert checkpoint.load(Handle(), SETTING, str(tmp_path), 0, step=3) == SETTING["run"]


def test_rank_files_of_another_run_beside_these_weights(tmp_path):
    """Runs A and B (same settings, seeds 0 and 1) save checkpoint-3; B's two rank files in
    A's checkpoint resumed silently. Now, under FSDP2 and DDP, every rank refuses, naming its
    file; with comm_state_mismatch='reset' training resumes to step 5 with a fresh state and
    says so; A's own checkpoint resumes."""
    out = run_distributed(bw.foreign_state_worker, 2, str(tmp_path), timeout=400)
    for r in out:
        for kind, _ in bw.KINDS:
            msg = r[kind, "refused"]
            for rank in (0, 1):
                assert f"hfcompress_rank{rank}.pt was saved with other weights" in msg, msg
            assert "comm_state_mismatch='reset'" in msg, msg
            assert r[kind, "reset"] == (3, 5), r             # (started at, ended at)
            assert any("other weights" in w and "starting the compressor state fresh" in w
                       for w in r[kind, "reset_warnings"]), r[kind, "reset_warnings"]
            assert r[kind, "own"] == (3, 5), r
    assert out[0]["fsdp", "refused"] == out[1]["fsdp", "refused"]


# -- a second job in one output_dir --------------------------------------------------------
def test_a_second_job_warns_naming_the_live_one(tmp_path):
    """A job file of a live process on this host: the training warns, naming its pid and
    host; of a process that has ended: no warning. Each training removes its own file."""
    out = run_distributed(bw.second_job_worker, 2, str(tmp_path), timeout=240)
    zero = out[0]
    assert len(zero["live"]) == 1, zero
    assert f"pid {zero['pid']} on host {zero['host']}" in zero["live"][0], zero
    assert "stop one of them, or give this job its own output_dir" in zero["live"][0], zero
    assert zero["ended"] == [] and out[1]["live"] == out[1]["ended"] == [], out
    assert bw.JOB_FILE == checkpoint.JOB_FILE and bw.JOB_FILE not in zero["left"], zero


def write_job(folder, **fields) -> None:
    now = time.time()
    job = {"pid": os.getpid(), "host": socket.gethostname(), "started": now,
           "heartbeat": now, "id": "other", **fields}
    (folder / checkpoint.JOB_FILE).write_text(json.dumps(job))


@pytest.mark.parametrize("other", [
    {"host": "elsewhere", "heartbeat": time.time() - checkpoint.STALE_S - 60},  # stale
    {"pid": os.getpid()},         # this process's own, left by a train() that raised
    {"pid": "not a pid"},         # not a job file
])
def test_files_of_ended_jobs_are_replaced_silently(tmp_path, caplog, other):
    write_job(tmp_path, **other)
    job = checkpoint.JobFile(str(tmp_path))
    job.claim()
    assert "another job" not in caplog.text
    assert json.loads((tmp_path / checkpoint.JOB_FILE).read_text())["id"] == job.job["id"]
    job.release()
    assert os.listdir(tmp_path) == []


def test_a_live_job_elsewhere_warns_and_the_older_job_learns_of_the_newer(tmp_path, caplog,
                                                                         monkeypatch):
    write_job(tmp_path, host="node7", pid=4242)
    job = checkpoint.JobFile(str(tmp_path))
    job.claim()
    assert "another job trains into output_dir" in caplog.text
    assert "pid 4242 on host node7" in caplog.text
    monkeypatch.setattr(checkpoint, "HEARTBEAT_S", 0.0)
    job.beat()                                   # its own file: refreshed
    assert "another job started" not in caplog.text
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_job(tmp_path, pid=sleeper.pid, id="newer")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            job.beat()
            job.beat()                           # warned once
        assert caplog.text.count("another job started training into output_dir") == 1
        assert f"pid {sleeper.pid} on host {socket.gethostname()}" in caplog.text
        job.release()                            # not its file: left to its job
        assert json.loads((tmp_path / checkpoint.JOB_FILE).read_text())["id"] == "newer"
    finally:
        sleeper.kill()
        sleeper.wait()
