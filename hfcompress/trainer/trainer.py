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
- No code: ``HFCOMPRESS_COMPRESSOR=sdp4bit`` in the job's environment (the scheduler's
  script, ``export``) is the preset when ``comm_compressor`` is given nowhere; an explicit
  one wins; an unknown name is refused, listing the presets.
- ``TrainingArguments`` adds ``comm_compressor`` (a preset or ``"auto"``), ``ranks_per_node``,
  ``comm_auto_reprobe_steps``, ``comm_log_every`` and
  ``comm_state_mismatch`` (``HfArgumentParser``: ``--comm_compressor tlq_hs ...``).
- ``trainer.compression``: the installed handle (``hfcompress.apply``'s: ``.meter``,
  ``.state_dict()``, ``.memory_report()``), after training started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import transformers

from ..config import AUTO, list_presets
from . import _hf, accelerate_cpu, checkpoint
from .mixin import CompressionMixin, check_settings, compressor_from_env, warn_single_process

__all__ = ["Trainer", "TrainingArguments", "warn_single_process"]


@dataclass
class TrainingArguments(_hf.ArgsHooks, transformers.TrainingArguments):
    """``transformers.TrainingArguments`` plus the communication settings of hfcompress."""

    comm_compressor: str | None = field(default=None, metadata={
        "help": "Compress the data-parallel communication with this preset ('none' = exact "
                "collectives, metered; 'auto' = chosen per collective from a probe of the "
                "links and this device; unset = the environment's HFCOMPRESS_COMPRESSOR, "
                "else the plain Trainer's communication)",
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
        if self.comm_compressor is None:     # the no-code switch (HFCOMPRESS_COMPRESSOR)
            self.comm_compressor = compressor_from_env()
        check_settings(self.comm_compressor, self.ranks_per_node, self.comm_log_every,
                       self.comm_state_mismatch, self.comm_auto_reprobe_steps)
        accelerate_cpu.default_use_cpu(self)
        super().__post_init__()

    def before_device_setup(self) -> None:
        """A CPU launch's process group, created with ``ddp_timeout`` before Accelerate sets
        up the devices (``accelerate_cpu.init_process_group``; ``_hf.ArgsHooks``)."""
        accelerate_cpu.init_process_group(self)


class Trainer(CompressionMixin, transformers.Trainer):
    """A drop-in ``transformers.Trainer`` with compressed communication (module docstring).

    ``comm_compressor`` (a preset name or ``CompressionConfig``) overrides
    ``args.comm_compressor``; ``args`` may also be a plain ``transformers.TrainingArguments``.
    Other ``Trainer`` subclasses (TRL's ``SFTTrainer``, ...): ``hfcompress.CompressionMixin``.
    """
