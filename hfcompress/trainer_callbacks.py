"""The ``TrainerCallback`` of ``hfcompress.Trainer``: installs the compressed collectives once
the model is prepared, closes the wire meter's step after every optimizer step, and gathers
the communication metrics at logging steps.

Every hook used here runs on every rank at the same points (the metric gathering is a
collective): ``on_train_begin``, ``on_optimizer_step``, ``on_step_end``, ``on_epoch_end``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class CommCallback(TrainerCallback):
    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.seen = 0      # meter steps already added to the stats
        self.logs = 0      # training logs so far (for comm_log_every)
        self.logged_step = -1

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.install_compression()
        if self.trainer.compression is not None:
            self.seen = self.trainer.compression.meter.steps

    def on_optimizer_step(self, args, state, control, **kwargs):
        t = self.trainer
        handle = t.compression
        if handle is None:
            return
        if handle.meter.steps == self.seen:
            # a LoCo optimizer steps the handle itself; if it did not, this step was skipped
            # (e.g. a GradScaler overflow): close only the meter's step
            handle.meter.step() if t.loco_optimizer is not None else handle.step()
        t.comm_stats.close_step(handle.meter.history[-1])
        self.seen = handle.meter.steps

    def on_step_end(self, args, state, control, **kwargs):
        self._gather_for_log(state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._gather_for_log(state, control)
        if self.trainer.compression is not None and state.global_step >= state.max_steps:
            # the last steps' bytes, for the totals of the final summary log
            self.trainer.comm_stats.reduce(args.device)

    def _gather_for_log(self, state, control) -> None:
        """At a training log (every ``comm_log_every``-th): the window's metrics, for
        ``Trainer.log`` to add. (The Trainer logs a step once, as this does.)"""
        t = self.trainer
        t.pending_comm_logs = None
        if t.compression is None or not control.should_log \
                or self.logged_step == state.global_step:
            return
        self.logged_step = state.global_step
        self.logs += 1
        if t.comm_log_every and self.logs % t.comm_log_every == 0:
            t.pending_comm_logs = t.comm_stats.reduce(t.args.device)
