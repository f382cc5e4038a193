"""``CompressionMixin``: compressed communication for any ``transformers.Trainer`` subclass
(TRL's ``SFTTrainer``, ``DPOTrainer``, your own), with everything ``hfcompress.Trainer`` has
(``hfcompress.Trainer`` is this mixin on ``transformers.Trainer``)::

    from trl import SFTConfig, SFTTrainer

    class CompressedSFTTrainer(hfcompress.CompressionMixin, SFTTrainer):
        pass

    args = SFTConfig(output_dir="out", fsdp=True, fsdp_config={"version": 2})
    trainer = CompressedSFTTrainer(model=model, args=args, train_dataset=ds,
                                   comm_compressor="sdp4bit")

The communication settings are keyword arguments of the constructor (``comm_compressor``,
``ranks_per_node``, ``comm_log_every``, ``comm_state_mismatch``, ``comm_auto_reprobe_steps``),
each defaulting to the field of that name in ``args`` (``hfcompress.TrainingArguments``), so
no merged arguments dataclass is needed. What the mixin adds: the collectives installed on
the prepared FSDP2 / DDP model at ``on_train_begin`` (``callback``), LoCo's optimizer wrap
(``create_optimizer``), the ``comm/*`` logs (``log``), ``nonfinite_losses`` in a training
log whose window had NaN / Inf losses (which HF's ``logging_nan_inf_filter`` hides from
``loss``), the compressor state in checkpoints (``before_checkpoint``, restored by
``train(resume_from_checkpoint=...)``), ``ddp_timeout`` on a CPU launch's process group
(``accelerate_cpu.apply_ddp_timeout``, for any ``TrainingArguments`` class) and on every group
created with torch's default timeout: the device mesh's dims, the node groups
(``accelerate_cpu.give_ddp_timeout``). ``HFCOMPRESS_COMPRESSOR`` in the environment is the
preset when ``comm_compressor`` is given nowhere.

Put the mixin first in the bases (``class X(CompressionMixin, SFTTrainer)``): its methods
wrap the Trainer's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import torch
import transformers

from ..comm.topology import NodeSplit, node_split
from ..config import AUTO, AutoSettings, CompressionConfig, resolve
from ..integrations.compile_notice import compile_notice
from ..integrations.fsdp import fsdp_modules
from ..optim import LoCoOptimizer, loco_optimizer_class
from . import _hf, accelerate_cpu, checkpoint
from . import resume as resume_mod
from .callback import CommCallback, unwrap_optimizer
from ..api import DEEPSPEED_REFUSED
from .install import (check_integration, hpz_choice, reshard_loaded, shard_ranks, uses_hpz,
                      uses_loco)
from .signatures import show_trainer_signatures

logger = logging.getLogger(__name__)

#: the communication settings: constructor keyword arguments, else ``args`` fields
SETTINGS = {"comm_compressor": None, "ranks_per_node": None, "comm_log_every": 1,
            "comm_state_mismatch": "error", "comm_auto_reprobe_steps": 0}

#: the no-code switch: the preset when ``comm_compressor`` is given nowhere (set in the job's
#: environment: the scheduler's script, ``export``, in front of ``accelerate launch``)
COMPRESSOR_ENV = "HFCOMPRESS_COMPRESSOR"
_logged_env = False


def compressor_from_env() -> str | None:
    """``HFCOMPRESS_COMPRESSOR``: a preset name or ``"auto"`` (None: unset or empty);
    ValueError naming the valid presets for any other value. Logged once, on rank 0."""
    global _logged_env
    value = os.environ.get(COMPRESSOR_ENV, "").strip()
    if not value:
        return None
    try:
        resolve(value)
    except ValueError as err:       # the preset check's own words: its hint, the list
        raise ValueError(f"{COMPRESSOR_ENV}={value!r} is not a preset: {err} ('auto' too; or "
                         f"unset {COMPRESSOR_ENV})") from None
    if not _logged_env and accelerate_cpu.is_rank0():
        _logged_env = True
        logger.warning(f"hfcompress: comm_compressor {value!r} from the environment "
                       f"({COMPRESSOR_ENV}); an explicit comm_compressor wins over it")
    return value


def check_settings(comm_compressor: Any = None, ranks_per_node: Any = None,
                   comm_log_every: Any = 1, comm_state_mismatch: Any = "error",
                   comm_auto_reprobe_steps: Any = 0) -> None:
    """ValueError naming the first invalid communication setting."""
    if comm_compressor is not None:
        resolve(comm_compressor)          # unknown preset: ValueError listing them
    name = getattr(comm_compressor, "name", comm_compressor)
    if comm_auto_reprobe_steps and name != AUTO:
        raise ValueError(f"comm_auto_reprobe_steps={comm_auto_reprobe_steps} needs "
                         f"comm_compressor='auto' (got {comm_compressor!r})")
    if ranks_per_node is not None and (isinstance(ranks_per_node, bool) or
                                       not isinstance(ranks_per_node, int)
                                       or ranks_per_node < 1):
        raise ValueError(f"ranks_per_node={ranks_per_node!r} must be a positive int")
    if isinstance(comm_log_every, bool) or not isinstance(comm_log_every, int) \
            or comm_log_every < 0:
        raise ValueError(f"comm_log_every={comm_log_every!r} must be an int >= 0")
    if comm_state_mismatch not in checkpoint.MISMATCH_CHOICES:
        raise ValueError(f"comm_state_mismatch={comm_state_mismatch!r}; allowed: "
                         f"{', '.join(checkpoint.MISMATCH_CHOICES)}")


class CompressionMixin(_hf.TrainerHooks):
    """Compressed communication for a ``transformers.Trainer`` subclass (module docstring).

    ``comm_compressor`` (a preset name, ``"auto"`` or a ``CompressionConfig``) and the other
    settings override the fields of the same name in ``args``; ``args`` may be any
    ``TrainingArguments`` (``SFTConfig``, ...). Unset everywhere: the plain Trainer."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """``__init__`` / ``train`` / ``log`` show the Trainer's signatures (``signatures``)."""
        super().__init_subclass__(**kwargs)
        show_trainer_signatures(cls, CompressionMixin)

    def __init__(self, model: Any = None, args: transformers.TrainingArguments | None = None,
                 *rest: Any,
                 comm_compressor: str | CompressionConfig | AutoSettings | None = None,
                 ranks_per_node: int | None = None, comm_log_every: int | None = None,
                 comm_state_mismatch: str | None = None,
                 comm_auto_reprobe_steps: int | None = None, **kwargs: Any) -> None:
        given = {"comm_compressor": comm_compressor, "ranks_per_node": ranks_per_node,
                 "comm_log_every": comm_log_every, "comm_state_mismatch": comm_state_mismatch,
                 "comm_auto_reprobe_steps": comm_auto_reprobe_steps}
        s = {k: v if v is not None else getattr(args, k, SETTINGS[k]) for k, v in given.items()}
        if s["comm_compressor"] is None:      # given nowhere: the environment's, if any
            s["comm_compressor"] = compressor_from_env()
        check_settings(**s)
        compressor = s["comm_compressor"]
        # what was asked for, passed through to hfcompress.apply as is
        self.comm_config = resolve(compressor) if compressor is not None else None
        every = s["comm_auto_reprobe_steps"]
        if isinstance(self.comm_config, AutoSettings) and every:
            self.comm_config = dataclasses.replace(self.comm_config, reprobe_every=every)
        if self.comm_config is not None:
            _hf.check_internals()
            _check_unsharded(model)
            warn_single_process(self.comm_config.name)
        self.comm_nodes: NodeSplit | None = None     # resolved once, for several processes
        self.comm_callback: CommCallback | None = None
        self.resume_dir: str | None = None
        self._nonfinite_losses: torch.Tensor | None = None   # this logging window's count
        self._warned_nonfinite = False
        if args is not None:
            if not _hf.devices_set_up(args):   # arguments not set up yet: create the
                accelerate_cpu.init_process_group(args)   # CPU group with ddp_timeout
            _ = args.device          # sets up Accelerate's PartialState
            accelerate_cpu.apply_ddp_timeout(args)   # a group created without it
            _check_launch(args, self.comm_config)
            accelerate_cpu.enable_fsdp_on_cpu(args, model)
        super().__init__(model, args, *rest, **kwargs)
        # the mesh Accelerate just built (and one transformers built at load time): its
        # groups get ddp_timeout, as the world has it
        accelerate_cpu.give_ddp_timeout(self.args)
        if self.comm_config is None:
            return
        if self.is_deepspeed_enabled:
            raise ValueError(f"comm_compressor {self.comm_config.name!r} under DeepSpeed: "
                             f"{DEEPSPEED_REFUSED}")
        check_integration(self.comm_config, self.is_fsdp_enabled
                          or accelerate_cpu.sharded_by_transformers(model))
        if uses_loco(self.comm_config):
            self._check_loco_optimizer()
        if self.args.world_size < 2:
            return           # one process: nothing to install (the warning said)
        self.comm_nodes = node_split(self.args.world_size, s["ranks_per_node"])
        if uses_hpz(self.comm_config):
            self._set_hpz_resharding(model)
        self.comm_callback = CommCallback(self, self.comm_config, self.comm_nodes,
                                          s["comm_log_every"], s["comm_state_mismatch"])
        self.add_callback(self.comm_callback)

    @property
    def compression(self) -> Any:
        """The installed handle (None before training starts, without comm_compressor, or in
        one process)."""
        return self.comm_callback.state.handle if self.comm_callback is not None else None

    # -- set-up ----------------------------------------------------------------------------
    def _set_hpz_resharding(self, model: Any) -> None:
        """hpZ (ZeRO++ 3.3): layers reshard to the node after forward, as the FSDP shard
        group is laid out on the nodes (beside TP: its x ranks per node, not the world's).
        Accelerate's FSDP2 plugin takes a bool only; its ``fully_shard`` calls accept the
        int. A model transformers sharded at load time: ``install.reshard_loaded``."""
        loaded = accelerate_cpu.sharded_by_transformers(model)
        if not (loaded or self.is_fsdp_enabled):
            return       # DDP: hpZ is not used (the install summary says so)
        want, per_node = hpz_choice(shard_ranks(self, model), self.comm_nodes)
        plugin = None if loaded else self.accelerator.state.fsdp_plugin
        if want is True or (plugin is not None and plugin.reshard_after_forward is not True):
            return       # the default already, or the user's own choice
        if loaded:
            reshard_loaded(model, want, per_node, self.comm_config.name)
        else:
            plugin.reshard_after_forward = want
        if accelerate_cpu.is_rank0():
            logger.warning(f"hfcompress: hpZ of {self.comm_config.name!r}: layers reshard to "
                           f"reshard_after_forward={want!r} after forward ({per_node} ranks of "
                           f"the shard group per node)")

    def _check_loco_optimizer(self) -> None:
        """LoCo needs an optimizer it can wrap: fail at construction, not after sharding."""
        if self.optimizer is not None:
            if not isinstance(unwrap_optimizer(self.optimizer), LoCoOptimizer):
                loco_optimizer_class(type(unwrap_optimizer(self.optimizer)))
        elif self.optimizer_cls_and_kwargs is not None:
            loco_optimizer_class(self.optimizer_cls_and_kwargs[0])
        else:
            cls, _ = self.get_optimizer_cls_and_kwargs(self.args, self.model)
            loco_optimizer_class(cls, self.args.optim)

    def create_optimizer(self, model=None):
        if self.optimizer is not None or self.comm_config is None \
                or not uses_loco(self.comm_config):
            return super().create_optimizer(model)
        saved = self.optimizer_cls_and_kwargs
        cls, kwargs = saved or self.get_optimizer_cls_and_kwargs(
            self.args, self.model if model is None else model)
        self.optimizer_cls_and_kwargs = (loco_optimizer_class(cls, self.args.optim), kwargs)
        try:
            return super().create_optimizer(model)
        finally:
            self.optimizer_cls_and_kwargs = saved

    # -- training, logging, checkpoints ----------------------------------------------------
    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any):
        """HF's ``train``; with compressor state to restore, ``True`` skips a half-written
        newest checkpoint (``resume``). A re-run into checkpoints, and Ctrl-C, say one line.
        (A command line's ``"True"`` / ``"latest"``: ``resume.command_line``, as the examples
        do; here a str is a folder, as in HF's ``train``.)"""
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            notice = resume_mod.rerun_notice(self.args.output_dir)
            if notice is not None and self.is_world_process_zero():
                logger.warning(notice)
        if self.comm_callback is not None:
            resume_from_checkpoint = resume_mod.resolve(resume_from_checkpoint,
                                                        self.args.output_dir)
            self.resume_dir = resume_from_checkpoint
            compile_notice(self.args.device, self.comm_config, self.is_fsdp_enabled)
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        except KeyboardInterrupt as e:
            resume_mod.report_interrupt(e, self.args.process_index, self.state.global_step,
                                        self.args.output_dir)
            raise
        finally:
            self.resume_dir = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        """HF's; NaN / Inf losses counted on the device (no host sync), for ``log``."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if isinstance(loss, torch.Tensor):
            bad = (~torch.isfinite(loss.detach())).sum()
            self._nonfinite_losses = bad if self._nonfinite_losses is None \
                else self._nonfinite_losses + bad
        return loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and self._nonfinite_losses is not None:
            logs = self._with_nonfinite(logs)
        if self.compression is not None:
            st = self.comm_callback.state
            if "loss" in logs and st.pending_logs:
                logs = {**logs, **st.take_pending_logs()}
            if "train_runtime" in logs:
                logs = {**logs, **st.stats.total_logs()}
        super().log(logs, *args, **kwargs)

    def _with_nonfinite(self, logs: dict[str, float]) -> dict[str, float]:
        """``nonfinite_losses``: the training losses since the last log that were NaN or Inf,
        summed over the ranks (a NaN on rank 1 alone is counted; HF logs the mean of the
        ranks' filtered losses; under TP the ranks of a TP group share a loss, which counts
        once per rank), when there were any. Counted on the device per step
        (``training_step``), reduced here, at the logging step, where HF's loss gather
        synchronizes anyway: every rank logs at the same steps. HF's
        ``logging_nan_inf_filter`` (on by default) leaves them out of ``loss``, which then
        reads finite: the mean of the window's finite losses, 0.0 once every step is
        non-finite (a diverged run)."""
        count, self._nonfinite_losses = self._nonfinite_losses, None
        dist = torch.distributed
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        if ranks > 1:
            count = count.detach().to(torch.int64).clone()
            dist.all_reduce(count)
        n = int(count.item())
        if n == 0:
            return logs
        if not self._warned_nonfinite and self.is_world_process_zero():
            self._warned_nonfinite = True
            hidden = (" the logged 'loss' leaves them out (logging_nan_inf_filter) and reads "
                      "0.0 once every step is;" if self.args.logging_nan_inf_filter else "")
            over = f" (summed over the {ranks} ranks)" if ranks > 1 else ""
            logger.warning(f"hfcompress: {n} training loss{'es' if n > 1 else ''} up to step "
                           f"{self.state.global_step} {'were' if n > 1 else 'was'} NaN / Inf"
                           f"{over};{hidden} the logs count them as 'nonfinite_losses'")
        return {**logs, "nonfinite_losses": n}

    def evaluation_loop(self, *args: Any, **kwargs: Any):
        """Evaluation traffic (FSDP's forward all-gathers) is not a training step's: drop it."""
        output = super().evaluation_loop(*args, **kwargs)
        if self.compression is not None:
            self.compression.meter.discard()
        return output

    def before_checkpoint(self, trial: Any) -> None:
        """The compressor state first, then HF's files (``_hf.TrainerHooks``): HF writes
        ``trainer_state.json`` last, so a folder that has it is complete (``resume.py``)."""
        if self.compression is not None:
            st = self.comm_callback.state
            st.stats.reduce(self.args.device)   # steps since the last log into the totals
            checkpoint.save(self.compression, st.settings, _hf.checkpoint_folder(self, trial),
                            self.args.process_index, st.stats, self.state.global_step)
            if torch.distributed.is_initialized():
                torch.distributed.barrier()     # every rank's file is there before HF's


_warned_single_process = False
def warn_single_process(preset: str) -> None:
    """One launched process has nothing to communicate: say so once, at the start, with how
    to launch several (rank 0 of nothing: there is only this process)."""
    global _warned_single_process
    if accelerate_cpu.launched_world_size() >= 2 or _warned_single_process:
        return
    _warned_single_process = True
    logger.warning(f"hfcompress: one process: no communication to compress, so comm_compressor "
                   f"{preset!r} changes nothing. Launch several: accelerate launch --multi_gpu "
                   f"--num_processes N script.py ... (FSDP2: --config_file with fsdp_version: "
                   f"2), or torchrun --nproc_per_node N script.py ...")


def _check_unsharded(model: Any) -> None:
    """The Trainer shards the model itself (Accelerate's FSDP2 / DDP): refuse one that
    ``hfcompress.apply(..., shard=True)`` or ``fully_shard`` already sharded (not one that
    transformers sharded at load time, ``DistributedConfig``, which the Trainer keeps)."""
    if hasattr(model, "named_modules") and fsdp_modules(model) \
            and not accelerate_cpu.sharded_by_transformers(model):
        raise ValueError("hfcompress: the model given to the Trainer is already fully_shard-ed "
                         "(e.g. by hfcompress.apply(model, shard=True)); pass the unsharded "
                         "model and comm_compressor='<preset>' to the Trainer instead, which "
                         "shards it and installs the compression itself")


def _check_launch(args: transformers.TrainingArguments,
                  config: CompressionConfig | AutoSettings | None) -> None:
    """Refuse set-ups that would train wrongly without saying so."""
    from accelerate.utils import DistributedType

    world = accelerate_cpu.launched_world_size()
    state = args.distributed_state
    if world > 1 and state is not None and state.distributed_type == DistributedType.NO:
        raise ValueError(f"{world} processes were launched but Accelerate runs each of them "
                         f"alone (no GPU and use_cpu=False): pass use_cpu=True or use "
                         f"hfcompress.TrainingArguments, which sets it")
    if config is not None and accelerate_cpu.fsdp_version(args) == 1:
        raise ValueError("hfcompress compresses FSDP2 communication; FSDP1 was requested: set "
                         "fsdp_config={'version': 2} (or fsdp_version: 2 in the accelerate "
                         "config)")
