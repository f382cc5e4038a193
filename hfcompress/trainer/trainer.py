"""``hfcompress.Trainer`` and ``hfcompress.TrainingArguments``: Hugging Face's Trainer with one
more argument, ``comm_compressor`` (a preset name or a ``CompressionConfig``)::

    args = hfcompress.TrainingArguments(output_dir="out", comm_compressor="tlq_hs",
                                        fsdp=True, fsdp_config={"version": 2})
    trainer = hfcompress.Trainer(model=model, args=args, train_dataset=ds)
    trainer.train()

- FSDP2 when FSDP was asked for (``args.fsdp`` / ``fsdp_config``, or an ``accelerate launch``
  FSDP config with ``fsdp_version: 2``): ``hfcompress.apply`` on the sharded model. DDP
  otherwise: the compressed all-reduce comm hook (see ``integrations.ddp`` for what a preset
  all-reduces). On a CPU-only machine the run is made distributed and FSDP kept
  (``accelerate_cpu``), each with one log line.
- LoCo presets train with ``hfcompress.optim.LoCoAdamW`` / ``LoCoAdafactor`` in place of the
  optimizer ``args.optim`` names (``adamw_torch``, ``adamw_torch_fused``, ``adafactor``).
- Logs (console, TensorBoard, W&B, ``state.log_history``): ``comm/intra_node_bytes``,
  ``comm/inter_node_bytes``, ``comm/uncompressed_bytes`` (bytes per optimizer step, all
  ranks), ``comm/compression_ratio``, ``comm/time_s`` (seconds per step in the collectives,
  per rank); run totals in the final summary (``metrics``). After the first optimizer step,
  one line with the handle's ``memory_report()`` (rank 0).
- One launched process has nothing to communicate: a warning when the Trainer is created
  says how to launch several (``warn_single_process``, once per process).
- Checkpoints hold one ``hfcompress_rank{r}.pt`` per rank, restored by
  ``train(resume_from_checkpoint=...)``; other compression settings in the checkpoint raise,
  or with ``comm_state_mismatch="reset"`` warn and start fresh (``checkpoint``).
- ``TrainingArguments`` adds ``comm_compressor`` (a preset or ``"auto"``), ``ranks_per_node``,
  ``comm_auto_reprobe_steps``, ``comm_log_every`` and
  ``comm_state_mismatch`` (``HfArgumentParser``: ``--comm_compressor tlq_hs ...``).
- ``trainer.compression``: the installed handle (``hfcompress.apply``'s: ``.meter``,
  ``.state_dict()``, ``.memory_report()``), after training started.
"""

from __future__ import annotations

import dataclasses

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..comm.topology import resolve_ranks_per_node
from ..config import AUTO, CompressionConfig, get_config, list_presets
from ..integrations.fsdp import hpz_reshard
from ..optim import LoCoOptimizer, loco_optimizer_class
from . import accelerate_cpu, checkpoint
from .callback import CommCallback, unwrap_optimizer
from .install import check_integration

logger = logging.getLogger(__name__)


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    """``transformers.TrainingArguments`` plus the communication settings of hfcompress."""

    comm_compressor: str | None = field(default=None, metadata={
        "help": "Compress the data-parallel communication with this preset ('none' = exact "
                "collectives, metered; 'auto' = chosen per collective from a probe of the "
                "links and this device; unset = the plain Trainer's communication)",
        "choices": [*list_presets(), AUTO]})
    comm_auto_reprobe_steps: int = field(default=0, metadata={
        "help": "With comm_compressor 'auto' (FSDP2): probe and choose again every N "
                "optimizer steps, switching at a step boundary (0: choose once)"})
    ranks_per_node: int | None = field(default=None, metadata={
        "help": "Ranks per node (default: LOCAL_WORLD_SIZE, i.e. one node per machine); a "
                "smaller value emulates several nodes on one machine"})
    comm_log_every: int = field(default=1, metadata={
        "help": "Add the communication metrics to every N-th training log (0: never)"})
    comm_state_mismatch: str = field(default="error", metadata={
        "help": "Resuming from a checkpoint saved with other compression settings: 'error' "
                "or 'reset' (warn and start the compressor state fresh)",
        "choices": list(checkpoint.MISMATCH_CHOICES)})

    def __post_init__(self) -> None:
        if self.comm_compressor is not None:
            get_config(self.comm_compressor)       # unknown preset: ValueError listing them
        if self.comm_auto_reprobe_steps and self.comm_compressor != AUTO:
            raise ValueError(f"comm_auto_reprobe_steps={self.comm_auto_reprobe_steps} needs "
                             f"comm_compressor='auto' (got {self.comm_compressor!r})")
        if self.ranks_per_node is not None and (isinstance(self.ranks_per_node, bool) or
                                                not isinstance(self.ranks_per_node, int)
                                                or self.ranks_per_node < 1):
            raise ValueError(f"ranks_per_node={self.ranks_per_node!r} must be a positive int")
        if isinstance(self.comm_log_every, bool) or not isinstance(self.comm_log_every, int) \
                or self.comm_log_every < 0:
            raise ValueError(f"comm_log_every={self.comm_log_every!r} must be an int >= 0")
        if self.comm_state_mismatch not in checkpoint.MISMATCH_CHOICES:
            raise ValueError(f"comm_state_mismatch={self.comm_state_mismatch!r}; allowed: "
                             f"{', '.join(checkpoint.MISMATCH_CHOICES)}")
        accelerate_cpu.default_use_cpu(self)
        super().__post_init__()


class Trainer(transformers.Trainer):
    """A drop-in ``transformers.Trainer`` with compressed communication (module docstring).

    ``comm_compressor`` (a preset name or ``CompressionConfig``) overrides
    ``args.comm_compressor``; ``args`` may also be a plain ``transformers.TrainingArguments``.
    """

    def __init__(self, model: Any = None, args: transformers.TrainingArguments | None = None,
                 *rest: Any, comm_compressor: str | CompressionConfig | None = None,
                 **kwargs: Any) -> None:
        compressor = comm_compressor if comm_compressor is not None \
            else getattr(args, "comm_compressor", None)
        self.comm_config = get_config(compressor) if compressor is not None else None
        every = getattr(args, "comm_auto_reprobe_steps", 0)
        if self.comm_config is not None and self.comm_config.auto is not None and every:
            self.comm_config = get_config(dataclasses.replace(self.comm_config.auto,
                                                              reprobe_every=every))
        if self.comm_config is not None:
            warn_single_process(self.comm_config.name)
        self.ranks_per_node = getattr(args, "ranks_per_node", None)
        self.comm_callback: CommCallback | None = None
        self.resume_dir: str | None = None
        if args is not None:
            _ = args.device          # sets up Accelerate's PartialState
            _check_launch(args, self.comm_config)
            accelerate_cpu.enable_fsdp_on_cpu(args)
        super().__init__(model, args, *rest, **kwargs)
        if self.comm_config is None:
            return
        if self.is_deepspeed_enabled:
            raise ValueError("hfcompress.Trainer compresses FSDP2 and DDP communication; "
                             "DeepSpeed is not supported (drop comm_compressor or DeepSpeed)")
        check_integration(self.comm_config, self.is_fsdp_enabled)
        self.comm_callback = CommCallback(self, self.comm_config, self.ranks_per_node,
                                          getattr(args, "comm_log_every", 1),
                                          getattr(args, "comm_state_mismatch", "error"))
        self.add_callback(self.comm_callback)
        if self.comm_config.loco is not None:
            self._check_loco_optimizer()
        if self.is_fsdp_enabled and self.comm_config.hpz:
            self._set_hpz_resharding()

    @property
    def compression(self) -> Any:
        """The installed handle (None before training starts or without comm_compressor)."""
        return self.comm_callback.state.handle if self.comm_callback is not None else None

    # -- set-up ----------------------------------------------------------------------------
    def _set_hpz_resharding(self) -> None:
        """hpZ (ZeRO++ 3.3): layers reshard to the node after forward. Accelerate's FSDP2
        plugin takes a bool only; its ``fully_shard`` calls accept the int."""
        world = self.args.world_size
        x = resolve_ranks_per_node(world, self.ranks_per_node)
        plugin = self.accelerator.state.fsdp_plugin
        want = hpz_reshard(x, world)
        if plugin.reshard_after_forward is True and want is not True:
            plugin.reshard_after_forward = want
            if accelerate_cpu.is_rank0():
                logger.warning(f"hfcompress: hpZ of {self.comm_config.name!r}: layers reshard "
                               f"to reshard_after_forward={want!r} after forward ({x} ranks "
                               f"per node)")

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
        if self.optimizer is not None or self.comm_config is None or self.comm_config.loco is None:
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
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        resume = resume_from_checkpoint
        if resume is True:
            resume = get_last_checkpoint(self.args.output_dir) or True   # True: HF raises
        self.resume_dir = resume if isinstance(resume, str) else None
        try:
            return super().train(resume, *args, **kwargs)
        finally:
            self.resume_dir = None

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self.compression is not None:
            st = self.comm_callback.state
            if "loss" in logs and st.pending_logs:
                logs = {**logs, **st.take_pending_logs()}
            if "train_runtime" in logs:
                logs = {**logs, **st.stats.total_logs()}
        super().log(logs, *args, **kwargs)

    def evaluation_loop(self, *args: Any, **kwargs: Any):
        """Evaluation traffic (FSDP's forward all-gathers) is not a training step's: drop it."""
        output = super().evaluation_loop(*args, **kwargs)
        if self.compression is not None:
            self.compression.meter.discard()
        return output

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        if self.compression is not None:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            st = self.comm_callback.state
            st.stats.reduce(self.args.device)   # steps since the last log into the totals
            checkpoint.save(self.compression, st.settings,
                            os.path.join(self._get_output_dir(trial=trial), folder),
                            self.args.process_index, st.stats)


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


def _check_launch(args: transformers.TrainingArguments,
                  config: CompressionConfig | None) -> None:
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
