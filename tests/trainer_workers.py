"""Worker functions of the spawned ``hfcompress.Trainer`` tests (``dist_utils.run_distributed``).

Each worker runs the real Hugging Face Trainer on 2 gloo processes, set up as ``torchrun``
would (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE): tiny ``LlamaForCausalLM`` /
``MixtralForCausalLM`` built from configs (vocab 256, hidden 64, 2 layers) on 24 arithmetic
sequences ``(a + b t) mod 256`` of 16 tokens (384 tokens). Several trainings share one
process group (one spawn per test keeps the suite fast).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import warnings
from typing import Iterator

import torch
import torch.distributed as dist
from transformers import TrainerCallback

SEQS, LENGTH = 24, 16
LR = 3e-3


@contextlib.contextmanager
def hfcompress_log() -> Iterator[list[str]]:
    """The messages hfcompress logs inside the block (a list filled as they come)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("hfcompress").addHandler(handler)
    try:
        yield lines
    finally:
        logging.getLogger("hfcompress").removeHandler(handler)


def setup(rank: int, world: int) -> None:
    # MASTER_ADDR / MASTER_PORT: the launcher's free port (a fixed one collides with the
    # ranks of another test running at the same time: pytest -n 2)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
                       "HFCOMPRESS_COMPILE": "0"})
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging
    logging.set_verbosity_error()


class Arithmetic(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return SEQS

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        a = torch.randint(0, 256, (1,), generator=g)
        b = torch.tensor([1, 2, 3, 5, 7])[torch.randint(0, 5, (1,), generator=g)]
        ids = (a + b * torch.arange(LENGTH)) % 256
        return {"input_ids": ids, "labels": ids}


def tiny_llama():
    from hfcompress.testing import tiny_llama as shared
    return shared(num_key_value_heads=2)


def tiny_mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_local_experts=4, num_experts_per_tok=2))


MODELS = {"llama": tiny_llama, "mixtral": tiny_mixtral}


class LogCapture(TrainerCallback):
    """Keeps what ``on_log`` receives: what the TensorBoard / W&B callbacks get."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def train(out: str, kind: str, preset, model: str = "llama", steps: int = 10,
          resume: str | None = None, trainer_kwargs: dict | None = None,
          callbacks: tuple = (), **arg_kwargs):
    """One Trainer run; returns (trainer, captured on_log dicts). ``callbacks`` come after
    transformers' own (and before hfcompress's)."""
    import hfcompress
    kw = dict(output_dir=out, max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
              report_to=[], save_strategy="no", learning_rate=LR, warmup_steps=0,
              lr_scheduler_type="constant", disable_tqdm=True, seed=0, data_seed=0,
              dataloader_num_workers=0, comm_compressor=preset)
    if kind == "fsdp":
        kw.update(fsdp=True, fsdp_config={"version": 2})
    os.environ.pop("ACCELERATE_USE_FSDP", None)     # an FSDP Accelerator sets it for the process
    kw.update(arg_kwargs)
    args = hfcompress.TrainingArguments(**kw)
    capture = LogCapture()
    trainer = hfcompress.Trainer(model=MODELS[model](), args=args, train_dataset=Arithmetic(),
                                 eval_dataset=Arithmetic(), callbacks=[capture, *callbacks],
                                 **(trainer_kwargs or {}))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, capture.logs


def losses(trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def meter_steps(trainer) -> list[tuple[float, float]]:
    """Per optimizer step: (intra, inter) bytes summed over the ranks, from the wire meters."""
    mine = [(s["intra_bytes"], s["inter_bytes"]) for s in trainer.compression.meter.history]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return [tuple(map(sum, zip(*per_rank))) for per_rank in zip(*everyone)]


def comm_logs(logs: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k.startswith("comm/")} for entry in logs
            if "loss" in entry]


def loco_steps(trainer) -> list[int]:
    from hfcompress.compressors.loco import LoCo
    return sorted({c.steps for c in trainer.compression.compressors() if isinstance(c, LoCo)})


# -- workers ---------------------------------------------------------------------------------
def presets_worker(rank: int, world: int, tmp: str, presets: list[str]) -> dict:
    """FSDP2 (2 emulated nodes: ranks_per_node=1) and DDP with every preset: losses, what
    reached on_log, and the wire meters' per-step bytes. FSDP runs evaluate at step 5 (its
    all-gathers must not count as a training step's)."""
    setup(rank, world)
    out = {}
    for kind in ("fsdp", "ddp"):
        for preset in presets:
            extra = dict(ranks_per_node=1, eval_strategy="steps", eval_steps=5) \
                if kind == "fsdp" else {}
            trainer, logs = train(os.path.join(tmp, f"{kind}-{preset}"), kind, preset, **extra)
            out[kind, preset] = {
                "losses": losses(trainer), "comm": comm_logs(logs),
                "final": [entry for entry in logs if "train_runtime" in entry][0],
                "meter": meter_steps(trainer), "loco_steps": loco_steps(trainer),
                "optimizer": type(trainer.optimizer.optimizer).__name__,
                "sharded": type(trainer.model_wrapped).__name__}
    return out


def resume_worker(rank: int, world: int, tmp: str) -> dict:
    """Save at step 3, resume, compare with the uninterrupted run; resume with another
    compressor (error) and with comm_state_mismatch='reset' (warning)."""
    setup(rank, world)
    out = {}
    for kind, preset in (("fsdp", "sdp4bit"), ("ddp", "loco")):
        d = os.path.join(tmp, f"{kind}-{preset}")
        full, _ = train(d, kind, preset, steps=6, save_strategy="steps", save_steps=3,
                        ranks_per_node=1)
        ckpt = os.path.join(d, "checkpoint-3")
        out[kind, "files"] = sorted(os.path.basename(p)
                                    for p in glob.glob(os.path.join(ckpt, "hfcompress_*")))
        resumed, _ = train(os.path.join(tmp, f"{kind}-resumed"), kind, preset, steps=6,
                           resume=ckpt, ranks_per_node=1)
        out[kind, "full"], out[kind, "resumed"] = losses(full), losses(resumed)
        out[kind, "totals"] = [{k: v for k, v in t.state.log_history[-1].items()
                                if k.startswith("comm/total_")} for t in (full, resumed)]
        try:
            train(os.path.join(tmp, f"{kind}-other"), kind, "tlq_hs", steps=6, resume=ckpt,
                  ranks_per_node=1)
            out[kind, "other"] = "no error"
        except ValueError as err:
            out[kind, "other"] = str(err)
        # the same checkpoint without the compressor files, comm_state_mismatch='reset': warns,
        # and the fresh compressor state changes the trajectory (the state does matter)
        bare = os.path.join(tmp, f"{kind}-bare-checkpoint-3")
        if rank == 0:
            shutil.copytree(ckpt, bare)
            for p in glob.glob(os.path.join(bare, "hfcompress_*")):
                os.remove(p)
        dist.barrier()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reset, _ = train(os.path.join(tmp, f"{kind}-reset"), kind, preset, steps=6,
                             resume=bare, ranks_per_node=1, comm_state_mismatch="reset")
        out[kind, "reset"] = losses(reset)
        out[kind, "reset_warnings"] = [str(w.message) for w in caught
                                       if "hfcompress" in str(w.message)]
    out["true"] = resume_true(rank, tmp, os.path.join(tmp, "fsdp-sdp4bit"))
    return out


def resume_true(rank: int, tmp: str, saved: str) -> dict:
    """``resume_from_checkpoint=True`` with compressor state (FSDP2, sdp4bit), the saved run's
    checkpoint-3 and checkpoint-6: checkpoint-6 cut short while saving (no
    ``trainer_state.json``) is skipped with a warning; with checkpoint-3's
    ``trainer_state.json`` it is taken, and its compressor state (of step 6) refused."""
    d = os.path.join(tmp, "fsdp-true")
    state = os.path.join(d, "checkpoint-6", "trainer_state.json")
    if rank == 0:
        shutil.copytree(saved, d)
        os.remove(state)
    dist.barrier()
    with hfcompress_log() as lines:
        resumed, _ = train(d, "fsdp", "sdp4bit", steps=6, resume=True, ranks_per_node=1)
    if rank == 0:
        shutil.copy(os.path.join(d, "checkpoint-3", "trainer_state.json"), state)
    dist.barrier()
    try:
        train(d, "fsdp", "sdp4bit", steps=6, resume=True, ranks_per_node=1)
        refused = "no error"
    except ValueError as err:
        refused = str(err)
    return {"losses": losses(resumed), "skipped": [m for m in lines if "not resuming" in m],
            "refused": refused}


def loco_models_worker(rank: int, world: int, tmp: str) -> dict:
    """LoCo + AdamW / Adafactor on the tiny LLaMA and Mixtral under FSDP2; Mixtral's fused 3-D
    experts must be compressed. Also: a 2-node preset on one node warns."""
    setup(rank, world)
    out = {}
    for model in ("llama", "mixtral"):
        for optim in ("adamw_torch", "adafactor"):
            trainer, _ = train(os.path.join(tmp, f"{model}-{optim}"), "fsdp", "loco", model=model,
                               steps=12, optim=optim, ranks_per_node=1)
            out[model, optim] = {"losses": losses(trainer), "loco_steps": loco_steps(trainer),
                                 "optimizer": type(trainer.optimizer.optimizer).__name__}
        out[model, "experts"] = expert_segments(trainer)
        out[model, "grad_error"] = expert_grad_error(trainer)
    # LoCoAdafactor on FSDP2's DTensors is the unsharded Adafactor: with exact collectives,
    # FSDP2 and DDP give the same losses
    from hfcompress.optim import LoCoAdafactor
    opt = (LoCoAdafactor, {"lr": LR, "scale_parameter": False, "relative_step": False})
    for kind in ("fsdp", "ddp"):
        trainer, _ = train(os.path.join(tmp, f"adafactor-{kind}"), kind, "none", steps=6,
                           trainer_kwargs={"optimizer_cls_and_kwargs": opt})
        out["adafactor_none", kind] = losses(trainer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(os.path.join(tmp, "one-node"), "fsdp", "tlq_hs", steps=1)
    out["one_node_warnings"] = [str(w.message) for w in caught if "hfcompress" in str(w.message)]
    return out


def expert_segments(trainer) -> dict[str, bool]:
    """Fused expert parameter name -> is it sent exactly (not compressed)?"""
    return {seg.name: seg.exact for comms in trainer.compression.comms.values()
            for seg in comms.layouts.full.segments if "experts" in seg.name}


def expert_grad_error(trainer) -> dict[str, float]:
    """Relative error of the reduce-scattered expert gradients (LoCo int4) against the exact
    ones on the same batch: 0 would mean they were skipped."""
    model, handle = trainer.model_wrapped, trainer.compression
    first = 4 * dist.get_rank()
    batch = torch.utils.data.default_collate([Arithmetic()[i] for i in range(first, first + 4)])

    def grads():
        model.zero_grad()
        model(**batch).loss.backward()
        return {n: p.grad.to_local().clone() for n, p in model.named_parameters()
                if "experts" in n}

    compressed = grads()
    with handle.disabled():
        exact = grads()
    err = {}
    for n in exact:
        num = torch.tensor([(compressed[n] - exact[n]).norm() ** 2, exact[n].norm() ** 2])
        dist.all_reduce(num)
        err[n] = float((num[0] / num[1]).sqrt())
    model.zero_grad()
    return err


def auto_worker(rank: int, world: int, tmp: str) -> dict:
    """``comm_compressor="auto"`` under FSDP2 (2 emulated nodes) with the plan pinned by
    HFCOMPRESS_AUTO: save at step 3, resume with no pin (auto probes afresh; the restored
    handle must run the saved plan: a pin given now would win, tests/auto_workers.py),
    compare with the uninterrupted run."""
    setup(rank, world)
    os.environ["HFCOMPRESS_AUTO"] = "weights=qwd,grad_inter=hs4"
    d = os.path.join(tmp, "auto")
    full, _ = train(d, "fsdp", "auto", steps=6, save_strategy="steps", save_steps=3,
                    ranks_per_node=1)
    os.environ.pop("HFCOMPRESS_AUTO")
    resumed, _ = train(os.path.join(tmp, "auto-resumed"), "fsdp", "auto", steps=6,
                       resume=os.path.join(d, "checkpoint-3"), ranks_per_node=1)
    return {"full": losses(full), "resumed": losses(resumed),
            "plans": [t.compression.auto.choice.plan.label for t in (full, resumed)],
            "config": resumed.compression.config.name,
            "summary_keys": sorted(full.compression.auto.summary())}


# -- faults (test_faults_trainer.py) ---------------------------------------------------------
class Sigterm(TrainerCallback):
    """A preemption's SIGTERM during step ``at + 1``: sent to this process at that step's
    ``on_step_begin`` (after the JIT checkpoint callback's check there), through transformers'
    own handler with its grace period set to 0, waiting until the handler requested the
    checkpoint. The next check of ``--enable_jit_checkpoint`` is ``on_pre_optimizer_step``:
    after the step's forward and backward, as when a SIGTERM lands during them."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_begin(self, args, state, control, **kwargs):
        import signal
        import time
        if state.global_step != self.at:
            return
        manager = signal.getsignal(signal.SIGTERM).__self__   # transformers' CheckpointManager
        manager.kill_wait = 0
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not manager.is_checkpoint_requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert manager.is_checkpoint_requested


def local_weights(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().to_local().clone() for n, p in trainer.model.named_parameters()}


def max_gap(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def checkpoints(folder: str) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "checkpoint-*")))


def run_ids(folder: str) -> list:
    """The run id in each rank's compressor-state file of ``folder``."""
    from hfcompress.trainer import checkpoint
    return [checkpoint._read(checkpoint.state_path(folder, r), "cpu")["settings"].get("run")
            for r in range(dist.get_world_size())]


def jit_checkpoint_worker(rank: int, world: int, tmp: str) -> dict:
    """F3: FSDP2 + sdp4bit, 6 steps uninterrupted, and the same run SIGTERM-ed during step 3
    with ``enable_jit_checkpoint``, then resumed from the checkpoint it saved to step 6."""
    setup(rank, world)
    common = dict(steps=6, ranks_per_node=1)
    full, _ = train(os.path.join(tmp, "full"), "fsdp", "sdp4bit", **common)
    d = os.path.join(tmp, "jit")
    stopped, _ = train(d, "fsdp", "sdp4bit", enable_jit_checkpoint=True,
                       callbacks=(Sigterm(2),), **common)
    saved = checkpoints(d)
    resumed, _ = train(os.path.join(tmp, "jit-resumed"), "fsdp", "sdp4bit",
                       resume=os.path.join(d, saved[-1]), **common)
    return {"stopped_at": stopped.state.global_step, "saved": saved,
            "gap": max_gap(local_weights(full), local_weights(resumed)),
            "losses": (losses(full), losses(resumed))}


def run_identity_worker(rank: int, world: int, tmp: str) -> dict:
    """F2: two runs with the same settings save checkpoint-3; a folder with run A's rank-0
    file and run B's rank-1 file (two jobs started into one output_dir) is refused; run A's
    own checkpoint resumes, and its later checkpoint (same run id) resumes again."""
    setup(rank, world)
    common = dict(steps=3, save_strategy="steps", save_steps=3, ranks_per_node=1)
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    train(a, "fsdp", "sdp4bit", **common)
    train(b, "fsdp", "sdp4bit", **{**common, "learning_rate": 2 * LR})
    mixed = os.path.join(tmp, "mixed", "checkpoint-3")
    if rank == 0:
        shutil.copytree(os.path.join(a, "checkpoint-3"), mixed)
        shutil.copy(os.path.join(b, "checkpoint-3", "hfcompress_rank1.pt"), mixed)
    dist.barrier()
    out = {}
    try:
        train(os.path.join(tmp, "mixed"), "fsdp", "sdp4bit", steps=6, resume=mixed,
              ranks_per_node=1)
        out["mixed"] = "no error"
    except ValueError as err:
        out["mixed"] = str(err)
    a2 = os.path.join(tmp, "a2")
    train(a2, "fsdp", "sdp4bit", **{**common, "steps": 6},
          resume=os.path.join(a, "checkpoint-3"))
    again, _ = train(os.path.join(tmp, "a3"), "fsdp", "sdp4bit", steps=8, ranks_per_node=1,
                     resume=os.path.join(a2, "checkpoint-6"))
    out["again"] = losses(again)
    out["ids"] = {k: run_ids(os.path.join(d, f"checkpoint-{s}"))
                  for k, d, s in (("a", a, 3), ("b", b, 3), ("a2", a2, 6))}
    return out
