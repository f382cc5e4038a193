"""Worker functions of the fault-injection tests (``test_faults_dist.py``), run on 2 gloo
processes by ``dist_utils.run_distributed``: FSDP2 + ``sdp4bit`` on the tiny LLaMA of
``fsdp_workers`` (a missing rank file on resume, NaN weights then restored ones, different
``HFCOMPRESS_AUTO`` per rank) and the process group a CPU Trainer launch creates
(``ddp_timeout``)."""

from __future__ import annotations

import copy
import math
import os

import torch
import torch.distributed as dist

import hfcompress
from fsdp_workers import LR, MP, setup, tiny_llama, train_step
from hfcompress.testing import free_port
from hfcompress.trainer import checkpoint


def sharded(preset: str = "sdp4bit"):
    model = tiny_llama()
    h = hfcompress.apply(model, preset, ranks_per_node=1, shard=True, mp_policy=MP)
    return model, h, torch.optim.AdamW(model.parameters(), lr=LR)


def step(model, h, opt, i: int, poison_grad: bool = False) -> float:
    """One training step; its loss (every rank's, averaged). ``poison_grad``: a NaN in one
    gradient before the optimizer step (NaN then reaches the weights)."""
    loss = train_step(model, i)
    if poison_grad:
        next(model.parameters()).grad.to_local().fill_(math.nan)
    opt.step()
    opt.zero_grad()
    h.step()
    loss = loss.float().reshape(1).clone()
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()


def mismatch_checks(rank: int, tmp: str) -> dict:
    """Resume with rank 1's file missing: with 'reset' and 'error' every rank takes the same
    decision (rank 0's file is intact, yet it must not load it alone), and training goes on
    after the reset (the qWD payloads of both ranks still have the same format)."""
    model, h, opt = sharded()
    for i in range(2):
        step(model, h, opt, i)
    setting = checkpoint.settings({"name": "sdp4bit"}, h.kind, dist.get_world_size(), 1,
                                  run=checkpoint.new_run_id())
    folder = os.path.join(tmp, "checkpoint-2")
    checkpoint.save(h, setting, folder, rank, step=2)
    dist.barrier()
    if rank == 0:
        os.remove(checkpoint.state_path(folder, 1))
    dist.barrier()
    out = {"reset": checkpoint.load(h, setting, folder, rank, "reset", step=2)}
    try:
        checkpoint.load(h, setting, folder, rank, "error", step=2)
        out["error"] = None
    except ValueError as err:
        out["error"] = str(err)
    out["after_reset"] = step(model, h, opt, 2)
    return out


def nan_checks() -> dict:
    """NaN reaches the weights through a gradient: the loss is NaN (visible); finite weights
    (and optimizer state) restored by ``model.load_state_dict`` train finite again (the qWD
    references are re-gathered exactly); restored in place with ``p.copy_`` they stay
    poisoned until ``reset_references()``."""
    model, h, opt = sharded()
    losses = [step(model, h, opt, i) for i in range(3)]
    weights = copy.deepcopy(model.state_dict())
    opt_state = copy.deepcopy(opt.state_dict())
    local = [p.to_local().clone() for p in model.parameters()]
    out = {"before": losses}

    def poison() -> list[float]:
        step(model, h, opt, 3, poison_grad=True)
        return [step(model, h, opt, 4), step(model, h, opt, 5)]

    out["poisoned"] = poison()
    model.load_state_dict(weights)
    opt.load_state_dict(copy.deepcopy(opt_state))
    out["load_state_dict"] = [step(model, h, opt, i) for i in (3, 4)]

    def copy_back() -> None:
        with torch.no_grad():
            for p, saved in zip(model.parameters(), local):
                p.to_local().copy_(saved)
        opt.load_state_dict(copy.deepcopy(opt_state))

    poison()
    copy_back()
    out["copy_only"] = step(model, h, opt, 3)
    copy_back()
    h.reset_references()
    out["copy_and_reset"] = [step(model, h, opt, i) for i in (3, 4)]
    return out


def auto_env_check(rank: int) -> str | None:
    """HFCOMPRESS_AUTO set differently on the two ranks: every rank raises, naming both."""
    os.environ["HFCOMPRESS_AUTO"] = "weights=qwd" if rank == 0 else "weights=exact"
    try:
        hfcompress.apply(tiny_llama(), "auto", ranks_per_node=1, shard=True, mp_policy=MP)
        return None
    except ValueError as err:
        return str(err)
    finally:
        del os.environ["HFCOMPRESS_AUTO"]


def faults_worker(rank: int, world: int, tmp: str, seconds: int) -> dict:
    """Every check of the one spawned job (the ``ddp_timeout`` one replaces the group: last)."""
    setup()
    return {"mismatch": mismatch_checks(rank, tmp), "nan": nan_checks(),
            "auto": auto_env_check(rank), "ddp_timeout": ddp_timeout_check(rank, world, tmp,
                                                                            seconds)}


def ddp_timeout_check(rank: int, world: int, tmp: str, seconds: int) -> dict:
    """The launcher's group is replaced by the one CPU arguments create (as under torchrun:
    no group yet), three times: ``hfcompress.TrainingArguments`` (creates it with
    ``ddp_timeout``); a plain ``transformers.TrainingArguments`` under ``hfcompress.Trainer``
    and TRL's ``SFTConfig`` under ``CompressionMixin`` (transformers creates it without the
    timeout while the arguments are built; the Trainer sets it). Each: the timeout of the
    group as created, and once the Trainer holds the arguments."""
    import transformers
    from trl import SFTConfig, SFTTrainer

    from trl_peft_workers import sft_pieces

    class CompressedSFTTrainer(hfcompress.CompressionMixin, SFTTrainer):
        pass

    def timeout_s() -> float:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        return backend.options._timeout.total_seconds()

    ports = [[free_port() for _ in range(3)] if rank == 0 else None]
    dist.broadcast_object_list(ports)
    os.environ.update({"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    out = {}
    for name, port in zip(("hfcompress", "transformers", "trl"), ports[0]):
        dist.destroy_process_group()
        os.environ["MASTER_PORT"] = str(port)
        kw = {"output_dir": tmp, "ddp_timeout": seconds, "report_to": []}
        if name == "hfcompress":
            args = hfcompress.TrainingArguments(**kw)
            created = timeout_s()
            hfcompress.Trainer(model=tiny_llama(), args=args)
        elif name == "transformers":
            args = transformers.TrainingArguments(use_cpu=True, **kw)
            created = timeout_s()
            hfcompress.Trainer(model=tiny_llama(), args=args)
        else:
            args = SFTConfig(use_cpu=True, max_length=16, **kw)
            created = timeout_s()
            model, tok, ds = sft_pieces()
            CompressedSFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
        out[name] = {"use_cpu": args.use_cpu, "world_size": args.world_size,
                     "created_s": created, "timeout_s": timeout_s()}
        dist.barrier()           # the group works
    return out
