"""The ``TrainerCallback`` of ``hfcompress.Trainer``: installs the compressed collectives once
the model is prepared, closes the wire meter's step after every optimizer step, and gathers
the communication metrics at logging steps.

Every hook used here runs on every rank at the same points (the metric gathering is a
collective): ``on_train_begin``, ``on_optimizer_step``, ``on_step_end``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class CommCallback(TrainerCallback):
    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.seen = 0      # meter steps already added to the stats
        self.logs = 0      # training logs so far (for comm_log_every)

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.install_compression()
        if self.trainer.compression is not None:
            self.seen = len(self.trainer.compression.meter.history)

    def on_optimizer_step(self, args, state, control, **kwargs):
        t = self.trainer
        handle = t.compression
        if handle is None:
            return
        if len(handle.meter.history) == self.seen:
            # a LoCo optimizer steps the handle itself; if it did not, this step was skipped
            # (e.g. a GradScaler overflow): close only the meter's step
            handle.meter.step() if t.loco_optimizer is not None else handle.step()
        t.comm_stats.close_step(handle.meter.history[-1])
        self.seen = len(handle.meter.history)

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        if t.compression is None:
            return
        pending = None
        if control.should_log:
            self.logs += 1
            if t.comm_log_every and self.logs % t.comm_log_every == 0:
                pending = t.comm_stats.reduce()
        if pending is None and state.max_steps and state.global_step >= state.max_steps:
            t.comm_stats.reduce()       # the run totals of the final summary log
        t.pending_comm_logs = pending
