"""Worker functions of ``test_checkpoint_binding.py``: the real Hugging Face Trainer with
hfcompress on 2 gloo processes (the set-up and tiny model of ``trainer_workers.py``)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings

import torch.distributed as dist
from transformers import TrainerCallback

from trainer_workers import hfcompress_log, setup, train

#: rank 0's file in output_dir while a job trains
JOB_FILE = "hfcompress_job.json"
#: (kind, preset): FSDP2 (each rank fingerprints its shard) and DDP (a full copy per rank)
KINDS = (("fsdp", "sdp4bit"), ("ddp", "loco"))


class StartStep(TrainerCallback):
    """The global step training starts at (the checkpoint's, when resuming)."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.step = state.global_step


def _error(fn, *args, **kwargs) -> str:
    """The ValueError's message ``fn`` raises ("no error" if it returns)."""
    try:
        fn(*args, **kwargs)
    except ValueError as err:
        return str(err)
    return "no error"


def foreign_state_worker(rank: int, world: int, tmp: str) -> dict:
    """Runs A and B: same settings, saved at step 3, different seeds (data orders). A's
    checkpoint-3 with both of B's rank files in place of A's is refused on every rank; with
    comm_state_mismatch='reset' it resumes with a fresh compressor state, warning why. A's
    own checkpoint-3 resumes."""
    setup(rank, world)
    out = {}
    common = dict(steps=3, save_strategy="steps", save_steps=3, ranks_per_node=1)
    for kind, preset in KINDS:
        a, b = os.path.join(tmp, f"{kind}-a"), os.path.join(tmp, f"{kind}-b")
        train(a, kind, preset, **common)
        train(b, kind, preset, **common, seed=1, data_seed=1)
        foreign = os.path.join(tmp, f"{kind}-foreign", "checkpoint-3")
        if rank == 0:
            shutil.copytree(os.path.join(a, "checkpoint-3"), foreign)
            for path in glob.glob(os.path.join(b, "checkpoint-3", "hfcompress_rank*.pt")):
                shutil.copy(path, foreign)
        dist.barrier()
        resume = dict(steps=5, ranks_per_node=1, resume=foreign)
        out[kind, "refused"] = _error(train, os.path.join(tmp, f"{kind}-refused"), kind,
                                      preset, **resume)
        start = StartStep()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reset, _ = train(os.path.join(tmp, f"{kind}-reset"), kind, preset, **resume,
                             comm_state_mismatch="reset", callbacks=(start,))
        out[kind, "reset"] = (start.step, reset.state.global_step)
        out[kind, "reset_warnings"] = [str(w.message) for w in caught
                                       if "hfcompress" in str(w.message)]
        start = StartStep()
        own, _ = train(os.path.join(tmp, f"{kind}-own"), kind, preset, steps=5,
                       ranks_per_node=1, resume=os.path.join(a, "checkpoint-3"),
                       callbacks=(start,))
        out[kind, "own"] = (start.step, own.state.global_step)
    return out


def second_job_worker(rank: int, world: int, tmp: str) -> dict:
    """A training started into an output_dir whose job file is of another live process on
    this host (rank 0 writes it as that job's rank 0 would) warns naming it; the file of a
    process that has ended is replaced silently. Each training removes its file at its end."""
    setup(rank, world)
    d = os.path.join(tmp, "out")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) \
        if rank == 0 else None
    out = {"pid": other.pid if other else None, "host": socket.gethostname()}
    try:
        out["live"] = _train_beside(rank, d, other.pid if other else 0)
    finally:
        if other is not None:
            other.kill()
            other.wait()
    out["ended"] = _train_beside(rank, d, other.pid if other else 0)
    out["left"] = sorted(os.listdir(d))
    return out


def _train_beside(rank: int, d: str, pid: int) -> list[str]:
    """Rank 0 writes a job file of ``pid`` into ``d``; a 2-step training into ``d``: the
    hfcompress log lines that mention an other job."""
    if rank == 0:
        os.makedirs(d, exist_ok=True)
        now = time.time()
        job = {"pid": pid, "host": socket.gethostname(), "started": now - 30,
               "heartbeat": now - 5, "id": "the other job"}
        with open(os.path.join(d, JOB_FILE), "w") as f:
            json.dump(job, f)
    dist.barrier()
    with hfcompress_log() as lines:
        train(d, "fsdp", "sdp4bit", steps=2, ranks_per_node=1)
    dist.barrier()
    return [line for line in lines if "another job" in line]
