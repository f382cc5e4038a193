"""Workers of ``test_trainer_cluster.py`` (issue 38): what a multi-node job meets, on gloo
processes spawned by ``dist_utils``: a NaN loss on one rank only, a rank that stops under
HSDP with ``--ddp_timeout``."""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

import hfcompress
from hfcompress.integrations.timeouts import (TORCH_DEFAULT_TIMEOUTS, group_timeout,
                                              process_groups, set_default_timeout)
from trainer_workers import Arithmetic, setup, tiny_llama

NAN_AT = (0, 1, 2)       # rank 1's losses of these steps (global_step before the step) are NaN


class NaNOnRank1(hfcompress.Trainer):
    """The loss value NaN on rank 1 at ``NAN_AT``, its gradients finite (a NaN constant
    added: no gradient), so the other rank's losses stay finite."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if dist.get_rank() == 1 and self.state.global_step in NAN_AT:
            loss = loss + torch.tensor(float("nan"))
        return loss


def nonfinite_worker(rank: int, world: int, tmp: str) -> dict:
    setup(rank, world)
    args = hfcompress.TrainingArguments(
        output_dir=tmp, max_steps=4, logging_steps=2, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", disable_tqdm=True, seed=0,
        dataloader_num_workers=0)
    trainer = NaNOnRank1(model=tiny_llama(), args=args, train_dataset=Arithmetic())
    trainer.train()
    return {h["step"]: h.get("nonfinite_losses") for h in trainer.state.log_history
            if "loss" in h}


class Stop(Exception):
    """Rank 3 leaves the job after stalling."""


class StallRank(TrainerCallback):
    """Rank ``who`` stops calling collectives for ``stall_s`` at the start of step 2; every
    rank notes when step 2 began."""

    def __init__(self, who: int, stall_s: float) -> None:
        self.who, self.stall_s, self.began = who, stall_s, None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.began = time.monotonic()
            if dist.get_rank() == self.who:
                time.sleep(self.stall_s)
                raise Stop()


def stalled_rank_worker(rank: int, world: int, tmp: str, timeout_s: int,
                        stall_s: float) -> dict:
    """Native HSDP (dp_replicate 2 x dp_shard 2, emulated nodes of 2), ``sdp4bit``,
    ``ddp_timeout=timeout_s``; rank 3 stalls at step 2. The survivors' error and how long
    after step 2 began it came; the timeouts of this rank's groups at train begin."""
    from accelerate import ParallelismConfig

    setup(rank, world)
    # the world as torchrun + the Trainer's arguments make it (the test launcher's has 60 s)
    set_default_timeout(datetime.timedelta(seconds=timeout_s))
    os.environ.pop("ACCELERATE_USE_FSDP", None)
    args = hfcompress.TrainingArguments(
        output_dir=tmp, max_steps=4, logging_steps=100, per_device_train_batch_size=2,
        report_to=[], save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
        ddp_timeout=timeout_s, comm_compressor="sdp4bit", ranks_per_node=2, fsdp=True,
        fsdp_config={"version": 2},
        parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))
    stall = StallRank(3, stall_s)
    trainer = hfcompress.Trainer(model=tiny_llama(), args=args, train_dataset=Arithmetic(),
                                 callbacks=[stall])
    out = {"error": None, "seconds": None}
    try:
        trainer.train()
    except Stop:
        out["stopped"] = True
    except Exception as err:     # noqa: BLE001 (what a survivor's job would print)
        out["seconds"] = time.monotonic() - stall.began
        out["error"] = f"{type(err).__name__}: {err}"
    timeouts = [group_timeout(g) for g in process_groups()]
    out["groups"] = len(timeouts)
    out["torch_default"] = sum(t in TORCH_DEFAULT_TIMEOUTS for t in timeouts)
    out["timeouts_s"] = sorted({t.total_seconds() for t in timeouts if t is not None})
    return out


def apply_mesh_timeouts_worker(rank: int, world: int, timeout_s: int) -> dict:
    """``hfcompress.apply`` on FSDP2 over ``mesh["dp"]`` of a ``(dp, tp)`` mesh that
    ``init_device_mesh`` built (its groups at torch's 30 min), the world at ``timeout_s``:
    the timeouts of the mesh's groups before, and of every group of this rank after (the
    node groups included)."""
    from torch.distributed.device_mesh import init_device_mesh

    setup(rank, world)
    set_default_timeout(datetime.timedelta(seconds=timeout_s))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    before = sorted({group_timeout(g).total_seconds() for g in mesh.get_all_groups()})
    handle = hfcompress.apply(tiny_llama(), "sdp4bit", ranks_per_node=2, shard=True,
                              mesh=mesh["dp"])
    topo = handle.topology
    node_groups = [g for g in (topo.intra_group, topo.inter_group) if g is not None]
    return {"before": before, "node_groups": len(node_groups),
            "after": sorted({group_timeout(g).total_seconds() for g in process_groups()})}
