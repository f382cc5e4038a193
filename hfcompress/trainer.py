"""``hfcompress.Trainer`` and ``hfcompress.TrainingArguments``: Hugging Face's Trainer with one
more argument, ``comm_compressor`` (a preset name or a ``CompressionConfig``)::

    args = hfcompress.TrainingArguments(output_dir="out", comm_compressor="tlq_hs",
                                        fsdp=True, fsdp_config={"version": 2})
    trainer = hfcompress.Trainer(model=model, args=args, train_dataset=ds)
    trainer.train()

- FSDP2 when FSDP was asked for (``args.fsdp`` / ``fsdp_config``, or an ``accelerate launch``
  FSDP config with ``fsdp_version: 2``): ``hfcompress.apply`` on the sharded model. DDP
  otherwise: the compressed all-reduce comm hook (see ``trainer_install`` for what a preset
  all-reduces). On a CPU-only machine the run is made distributed and FSDP kept
  (``cpu_fsdp``), each with one log line.
- LoCo presets train with ``hfcompress.optim.LoCoAdamW`` / ``LoCoAdafactor`` in place of the
  optimizer ``args.optim`` names (``adamw_torch``, ``adamw_torch_fused``, ``adafactor``).
- Logs (console, TensorBoard, W&B, ``state.log_history``): ``comm/intra_node_bytes``,
  ``comm/inter_node_bytes``, ``comm/uncompressed_bytes`` (bytes per optimizer step, all
  ranks), ``comm/compression_ratio``, ``comm/time_s`` (seconds per step in the collectives,
  per rank); run totals in the final summary (``trainer_metrics``).
- Checkpoints hold one ``hfcompress_rank{r}.pt`` per rank, restored by
  ``train(resume_from_checkpoint=...)``; other compression settings in the checkpoint raise,
  or with ``comm_state_mismatch="reset"`` warn and start fresh (``trainer_state``).
- ``TrainingArguments`` adds ``comm_compressor``, ``ranks_per_node``, ``comm_log_every`` and
  ``comm_state_mismatch`` (``HfArgumentParser``: ``--comm_compressor tlq_hs ...``).
- ``trainer.compression``: the installed handle (``.meter``, ``.state_dict()``), after
  training started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import transformers
from torch.nn.parallel import DistributedDataParallel
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from . import cpu_fsdp, trainer_state
from .comm.topology import resolve_ranks_per_node
from .config import CompressionConfig, get_config, list_presets
from .integrations.fsdp import fsdp_modules, hpz_reshard
from .optim import LoCoOptimizer, loco_optimizer_class
from .trainer_callbacks import CommCallback
from .trainer_install import check_integration, describe, install_ddp, install_fsdp
from .trainer_metrics import CommStats


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    """``transformers.TrainingArguments`` plus the communication settings of hfcompress."""

    comm_compressor: str | None = field(default=None, metadata={
        "help": f"Compress the data-parallel communication with this preset: "
                f"{', '.join(list_presets())}. 'none' = exact collectives, metered; "
                f"unset = the plain Trainer's communication"})
    ranks_per_node: int | None = field(default=None, metadata={
        "help": "Ranks per node (default: LOCAL_WORLD_SIZE, i.e. one node per machine); a "
                "smaller value emulates several nodes on one machine"})
    comm_log_every: int = field(default=1, metadata={
        "help": "Add the communication metrics to every N-th training log (0: never)"})
    comm_state_mismatch: str = field(default="error", metadata={
        "help": "Resuming from a checkpoint saved with other compression settings: 'error' "
                "or 'reset' (warn and start the compressor state fresh)",
        "choices": list(trainer_state.MISMATCH_CHOICES)})

    def __post_init__(self) -> None:
        if self.comm_compressor is not None:
            get_config(self.comm_compressor)       # unknown preset: ValueError listing them
        if self.ranks_per_node is not None and (isinstance(self.ranks_per_node, bool) or
                                                not isinstance(self.ranks_per_node, int)
                                                or self.ranks_per_node < 1):
            raise ValueError(f"ranks_per_node={self.ranks_per_node!r} must be a positive int")
        if isinstance(self.comm_log_every, bool) or not isinstance(self.comm_log_every, int) \
                or self.comm_log_every < 0:
            raise ValueError(f"comm_log_every={self.comm_log_every!r} must be an int >= 0")
        if self.comm_state_mismatch not in trainer_state.MISMATCH_CHOICES:
            raise ValueError(f"comm_state_mismatch={self.comm_state_mismatch!r}; allowed: "
                             f"{', '.join(trainer_state.MISMATCH_CHOICES)}")
        cpu_fsdp.default_use_cpu(self)
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
        self.ranks_per_node = getattr(args, "ranks_per_node", None)
        self.comm_log_every = getattr(args, "comm_log_every", 1)
        self.comm_state_mismatch = getattr(args, "comm_state_mismatch", "error")
        self.compression: Any = None
        self.compression_model: Any = None
        self.comm_stats = CommStats()
        self.loco_optimizer: LoCoOptimizer | None = None
        self.pending_comm_logs: dict | None = None
        self._resume_dir: str | None = None
        if args is not None:
            _ = args.device          # sets up Accelerate's PartialState
            _check_launch(args, self.comm_config)
            cpu_fsdp.enable_fsdp_on_cpu(args)
        super().__init__(model, args, *rest, **kwargs)
        if self.comm_config is None:
            return
        if self.is_deepspeed_enabled:
            raise ValueError("hfcompress.Trainer compresses FSDP2 and DDP communication; "
                             "DeepSpeed is not supported (drop comm_compressor or DeepSpeed)")
        check_integration(self.comm_config, self.is_fsdp_enabled)
        self.add_callback(CommCallback(self))
        if self.comm_config.loco is not None:
            self._check_loco_optimizer()
        if self.is_fsdp_enabled and self.comm_config.hpz:
            self._set_hpz_resharding()

    # -- set-up ----------------------------------------------------------------------------
    def _world(self) -> tuple[int, int]:
        world = self.args.world_size
        return world, resolve_ranks_per_node(world, self.ranks_per_node)

    def _set_hpz_resharding(self) -> None:
        """hpZ (ZeRO++ 3.3): layers reshard to the node after forward. Accelerate's FSDP2
        plugin takes a bool only; its ``fully_shard`` calls accept the int."""
        world, x = self._world()
        plugin = self.accelerator.state.fsdp_plugin
        want = hpz_reshard(x, world)
        if plugin.reshard_after_forward is True and want is not True:
            plugin.reshard_after_forward = want
            cpu_fsdp.say(f"hfcompress: hpZ of {self.comm_config.name!r}: layers reshard to "
                         f"reshard_after_forward={want!r} after forward ({x} ranks per node)")

    def _check_loco_optimizer(self) -> None:
        """LoCo needs an optimizer it can wrap: fail at construction, not after sharding."""
        if self.optimizer is not None:
            if not isinstance(_unwrap_optimizer(self.optimizer), LoCoOptimizer):
                loco_optimizer_class(type(_unwrap_optimizer(self.optimizer)))
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

    def install_compression(self) -> None:
        """Install the compressed collectives on the prepared model (once per model), bind a
        LoCo optimizer, restore the compressor state when resuming. Runs on every rank."""
        if self.comm_config is None:
            return
        model = self.model_wrapped
        if self.compression is None or self.compression_model is not model:
            if self.args.world_size < 2:
                cpu_fsdp.say("hfcompress: a single process has no communication to compress; "
                             "training without hfcompress")
                return
            world, x = self._world()
            if isinstance(model, DistributedDataParallel):
                self.compression, kind = install_ddp(model, self.comm_config, x,
                                                     self.comm_stats), "ddp"
            elif fsdp_modules(model):
                self.compression, kind = install_fsdp(model, self.comm_config, x,
                                                      self.comm_stats), "fsdp2"
            else:
                raise ValueError(f"hfcompress.Trainer: the prepared model is a "
                                 f"{type(model).__name__}, neither FSDP2 nor DDP; nothing to "
                                 f"install comm_compressor {self.comm_config.name!r} on")
            self.compression_model = model
            self.comm_settings = trainer_state.settings(self.comm_config.to_dict(), kind,
                                                        world, x)
            cpu_fsdp.say(self._summary(kind, world, x))
        self._bind_loco_optimizer()
        if self._resume_dir is not None:
            trainer_state.load(self.compression, self.comm_settings, self._resume_dir,
                               self.args.process_index, self.comm_state_mismatch,
                               self.args.device)

    def _bind_loco_optimizer(self) -> None:
        opt = _unwrap_optimizer(self.optimizer)
        if isinstance(opt, LoCoOptimizer):
            if opt.compression is None:
                opt.compression = self.compression
            self.loco_optimizer = opt if opt.compression is self.compression else None
        elif self.comm_config.loco is not None:
            loco_optimizer_class(type(opt))       # raises, naming the supported ones

    def _summary(self, kind: str, world: int, x: int) -> str:
        c = self.comm_config
        if kind == "ddp":
            what = f"all-reduce {describe(c.all_reduce or c.grad_inter)}"
            unused = [name for name, on in (("weight scheme", c.weights is not None),
                                            ("2-hop layout", c.two_hop), ("hpZ", c.hpz)) if on]
            if unused:
                what += f" (its {', '.join(unused)} need FSDP2)"
        else:
            grads = (f"2-hop {describe(c.grad_intra)} / {describe(c.grad_inter)}"
                     if c.two_hop else describe(c.grad_inter))
            what = f"weights {describe(c.weights)}, gradients {grads}" + \
                (", hpZ" if c.hpz else "")
        loco = " with LoCo error feedback" if c.loco is not None else ""
        return (f"hfcompress: {'DDP' if kind == 'ddp' else 'FSDP2'} comm_compressor {c.name!r} "
                f"on {world} ranks ({world // x} node(s) x {x}): {what}{loco}")

    # -- training, logging, checkpoints ----------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        resume = resume_from_checkpoint
        if resume is True:
            resume = get_last_checkpoint(self.args.output_dir) or True   # True: HF raises
        self._resume_dir = resume if isinstance(resume, str) else None
        try:
            return super().train(resume, *args, **kwargs)
        finally:
            self._resume_dir = None

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self.compression is not None:
            if "loss" in logs and self.pending_comm_logs:
                logs = {**logs, **self.pending_comm_logs}
                self.pending_comm_logs = None
            if "train_runtime" in logs:
                logs = {**logs, **self.comm_stats.total_logs()}
        super().log(logs, *args, **kwargs)

    def evaluation_loop(self, *args: Any, **kwargs: Any):
        """Evaluation traffic (FSDP's forward all-gathers) is not a training step's: drop it."""
        output = super().evaluation_loop(*args, **kwargs)
        if self.compression is not None:
            self.compression.meter.discard()
            self.comm_stats.discard_step()
        return output

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        if self.compression is not None:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            trainer_state.save(self.compression, self.comm_settings,
                               os.path.join(self._get_output_dir(trial=trial), folder),
                               self.args.process_index)


def _unwrap_optimizer(opt: Any) -> Any:
    """The user's optimizer inside Accelerate's ``AcceleratedOptimizer``."""
    while opt is not None and not isinstance(opt, LoCoOptimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt


def _check_launch(args: transformers.TrainingArguments,
                  config: CompressionConfig | None) -> None:
    """Refuse set-ups that would train wrongly without saying so."""
    from accelerate.utils import DistributedType

    world = cpu_fsdp.launched_world_size()
    state = args.distributed_state
    if world > 1 and state is not None and state.distributed_type == DistributedType.NO:
        raise ValueError(f"{world} processes were launched but Accelerate runs each of them "
                         f"alone (no GPU and use_cpu=False): pass use_cpu=True or use "
                         f"hfcompress.TrainingArguments, which sets it")
    if config is not None and cpu_fsdp.fsdp_version(args) == 1:
        raise ValueError("hfcompress compresses FSDP2 communication; FSDP1 was requested: set "
                         "fsdp_config={'version': 2} (or fsdp_version: 2 in the accelerate "
                         "config)")
