"""The ``TrainerCallback`` of ``hfcompress.Trainer``: installs the compressed collectives once
the model is prepared, closes the wire meter's step after every optimizer step, and gathers
the communication metrics at logging steps. What it installed lives in one
:class:`CommInstall`, which only this callback writes.

Every hook used here runs on every rank at the same points (the metric gathering is a
collective): ``on_train_begin``, ``on_step_begin``, ``on_optimizer_step``, ``on_step_end``,
``on_epoch_end``, ``on_train_end``. Rank 0 also keeps the job's file in ``output_dir``
(``checkpoint.JobFile``: claimed at ``on_train_begin``, refreshed at step ends, removed at
``on_train_end``), which makes a second job started into that folder warn.

Between a step's ``on_step_begin`` and its optimizer step the step's collectives move the
compressor state past the weights: ``checkpoint.save`` refuses to save then, and
transformers' SIGTERM checkpoint (``--enable_jit_checkpoint``), which saves from
``on_pre_optimizer_step`` too, waits for the end of the step (its ``on_step_end`` saves it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainerCallback

from ..comm.topology import NodeSplit
from ..config import AutoSettings, CompressionConfig, request_dict
from ..integrations.handle import Compression
from ..optim import LoCoOptimizer, loco_optimizer_class
from . import _hf, checkpoint
from .accelerate_cpu import give_ddp_timeout, is_machine_lead, is_rank0
from .install import install, machine_line, memory_line, summary, uses_loco
from .metrics import CommStats

logger = logging.getLogger(__name__)


@dataclass
class CommInstall:
    """What is installed: the handle and the model it is on, the settings its checkpoint
    files must match (with the run id they carry), the logging window, the logs waiting for
    ``Trainer.log``, the LoCo optimizer stepping the handle (if any)."""

    handle: Compression | None = None
    model: Any = None
    settings: dict | None = None
    stats: CommStats = field(default_factory=CommStats)
    pending_logs: dict | None = None
    loco_optimizer: LoCoOptimizer | None = None
    seen: int = 0              # meter steps already added to the stats
    logs: int = 0              # training logs so far (for comm_log_every)
    logged_step: int = -1
    memory_logged: bool = False

    def take_pending_logs(self) -> dict | None:
        logs, self.pending_logs = self.pending_logs, None
        return logs


class CommCallback(TrainerCallback):
    def __init__(self, trainer: Any, config: CompressionConfig | AutoSettings,
                 nodes: NodeSplit, log_every: int, on_mismatch: str) -> None:
        self.trainer, self.config = trainer, config
        self.nodes, self.log_every, self.on_mismatch = nodes, log_every, on_mismatch
        self.state = CommInstall()
        self.job_file: checkpoint.JobFile | None = None    # rank 0's, while training

    # -- installing -------------------------------------------------------------------------
    def install(self, resume_dir: str | None, step: int) -> None:
        """Install the compressed collectives on the prepared model (once per model), bind a
        LoCo optimizer, restore the compressor state when resuming (saved at ``step``, the
        step training resumes at) and take its run id, else keep the run id or draw one.
        Runs on every rank."""
        t, st = self.trainer, self.state
        model = t.model_wrapped
        if st.handle is None or st.model is not model:
            world = t.args.world_size
            # the groups the model was sharded over (and so the node groups built from
            # them) time out after ddp_timeout, as the world does
            give_ddp_timeout(t.args)
            st.handle, st.model = install(model, self.config, self.nodes), model
            give_ddp_timeout(t.args)
            per_node = st.handle.topology.ranks_per_node
            st.stats = CommStats(st.handle.meter)
            st.settings = checkpoint.settings(request_dict(self.config), st.handle.kind, world,
                                              per_node, mesh=device_mesh(t))
            if is_rank0():     # "auto": the chosen config (its table was logged by apply)
                logger.warning(summary(st.handle.config, st.handle.kind, world, per_node,
                                       st.handle.dp_size))
            elif is_machine_lead():
                logger.warning(machine_line(st.handle.config.name, t.args.process_index))
        self._bind_loco_optimizer()
        checkpoint.step_finished(st.handle)
        run = None
        if resume_dir is not None:
            run = checkpoint.load(st.handle, st.settings, resume_dir, t.args.process_index,
                                  self.on_mismatch, t.args.device, st.stats, step=step)
        st.settings["run"] = run or st.settings["run"] or checkpoint.new_run_id()
        st.seen = st.handle.meter.steps
        self._defer_mid_step_jit_checkpoint()

    def _defer_mid_step_jit_checkpoint(self) -> None:
        """transformers' SIGTERM checkpoint saves at the first of its hooks that sees the
        request, ``on_pre_optimizer_step`` included: the weights before the step, the
        compressor state after its collectives. Such a save is skipped with the request left
        standing, so the ``on_step_end`` after the optimizer step saves (training stops there,
        as the request asked; the patch: ``_hf.defer_jit_checkpoint``)."""
        def waiting() -> None:
            if is_rank0():
                logger.warning(f"hfcompress: SIGTERM checkpoint requested during step "
                               f"{self.trainer.state.global_step + 1}, after its "
                               f"communication: it is saved at the end of that step, so that "
                               f"the compressor state and the weights are of one step")

        _hf.defer_jit_checkpoint(self.trainer, lambda: checkpoint.mid_step(self.state.handle),
                                 waiting)

    def _bind_loco_optimizer(self) -> None:
        opt = unwrap_optimizer(self.trainer.optimizer)
        st = self.state
        if isinstance(opt, LoCoOptimizer):
            if opt.compression is None:
                opt.compression = st.handle
            st.loco_optimizer = opt if opt.compression is st.handle else None
        elif uses_loco(self.config):
            loco_optimizer_class(type(opt))       # raises, naming the supported ones

    # -- trainer events -----------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self.install(self.trainer.resume_dir, state.global_step)
        if state.is_world_process_zero:     # after a refused resume, nothing is claimed
            self.job_file = checkpoint.JobFile(args.output_dir)
            self.job_file.claim()

    def on_train_end(self, args, state, control, **kwargs):
        if self.job_file is not None:
            self.job_file.release()
            self.job_file = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.state.handle is not None:
            checkpoint.step_started(self.state.handle)

    def on_optimizer_step(self, args, state, control, **kwargs):
        st = self.state
        handle = st.handle
        if handle is None:
            return
        checkpoint.step_finished(handle)
        if handle.meter.steps == st.seen:
            # a LoCo optimizer steps the handle itself; if it did not, this step was skipped
            # (e.g. a GradScaler overflow): close only the meter's step
            handle.meter.step() if st.loco_optimizer is not None else handle.step()
        st.stats.close_step(handle.meter.history[-1])
        st.seen = handle.meter.steps
        if not st.memory_logged:     # compressor state is allocated by the first step
            st.memory_logged = True
            if is_rank0():
                logger.warning(memory_line(handle.memory_report()))

    def on_step_end(self, args, state, control, **kwargs):
        self._gather_for_log(args, state, control)
        if self.job_file is not None:
            self.job_file.beat()

    def on_epoch_end(self, args, state, control, **kwargs):
        self._gather_for_log(args, state, control)
        if self.state.handle is not None and state.global_step >= state.max_steps:
            # the last steps' bytes, for the totals of the final summary log
            self.state.stats.reduce(args.device)

    def _gather_for_log(self, args, state, control) -> None:
        """At a training log (every ``comm_log_every``-th): the window's metrics, for
        ``Trainer.log`` to add. (The Trainer logs a step once, as this does.)"""
        st = self.state
        st.pending_logs = None
        if st.handle is None or not control.should_log or st.logged_step == state.global_step:
            return
        st.logged_step = state.global_step
        st.logs += 1
        if self.log_every and st.logs % self.log_every == 0:
            st.pending_logs = st.stats.reduce(args.device)


def device_mesh(trainer: Any) -> Any:
    """The device mesh of Accelerate's ``ParallelismConfig`` (None without one)."""
    accelerator = getattr(trainer, "accelerator", None)
    return getattr(accelerator, "torch_device_mesh", None)


def unwrap_optimizer(opt: Any) -> Any:
    """The user's optimizer inside Accelerate's ``AcceleratedOptimizer``."""
    while opt is not None and not isinstance(opt, LoCoOptimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt
