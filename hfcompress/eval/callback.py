"""``LMEvalCallback``: a ``transformers.TrainerCallback`` that runs a small lm-eval suite on
the model in memory every N optimizer steps and/or at the end of training.

Scores are logged as ``lm_eval/<task>/<metric>`` next to the training metrics: through
``trainer.log`` (so TensorBoard / W&B reporters see them) when attached with
``LMEvalCallback.attach(trainer)``, otherwise appended to ``state.log_history`` (saved in
every checkpoint's ``trainer_state.json``). Runs on the main process only; the model must be
a full replica there (single process or DDP). FSDP-sharded parameters are refused:
evaluate a saved checkpoint instead.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from transformers import TrainerCallback

from .compare_models import score_rows
from .harness import evaluate
from .task_registry import OFFLINE_TASKS, check_names


class LMEvalCallback(TrainerCallback):
    """Evaluate ``tasks`` every ``every_n_steps`` steps (None: never) and at the end."""

    def __init__(self, tasks: list[str] | None = None, *, every_n_steps: int | None = None,
                 at_end: bool = True, limit: int | float | None = 100,
                 num_fewshot: int | None = 0, batch_size: int = 8, tokenizer=None,
                 prefix: str = "lm_eval", log_fn: Callable[[dict], None] | None = None,
                 **eval_kwargs: Any):
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be None or >= 1, got {every_n_steps}")
        self.tasks = list(tasks) if tasks is not None else list(OFFLINE_TASKS)
        check_names(self.tasks, eval_kwargs.get("include_path"))  # fail before training
        self.every_n_steps, self.at_end = every_n_steps, at_end
        self.tokenizer, self.prefix, self.log_fn = tokenizer, prefix, log_fn
        self.eval_kwargs = {"limit": limit, "num_fewshot": num_fewshot,
                            "batch_size": batch_size, **eval_kwargs}
        self.history: list[dict[str, Any]] = []  # one entry per evaluation
        self._last_step = -1

    def attach(self, trainer) -> "LMEvalCallback":
        """Add to ``trainer`` and log through ``trainer.log`` (reporters see the scores)."""
        trainer.add_callback(self)
        self.log_fn = trainer.log
        return self

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_n_steps and state.global_step % self.every_n_steps == 0:
            self._run(state, control, kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        if self.at_end:
            self._run(state, control, kwargs)

    def _run(self, state, control, kwargs) -> None:
        if state.global_step == self._last_step or not state.is_world_process_zero:
            return
        self._last_step = state.global_step
        model = kwargs["model"]
        if any(type(p).__name__ == "DTensor" for p in model.parameters()):
            raise ValueError("LMEvalCallback needs the full model on the main process; with "
                             "FSDP, save a checkpoint and run `hfcompress eval` on it")
        tok = self.tokenizer or kwargs.get("processing_class") or kwargs.get("tokenizer")
        if tok is None:
            raise ValueError("LMEvalCallback needs a tokenizer: pass tokenizer= or give the "
                             "Trainer processing_class=")
        result = evaluate(model, self.tasks, tokenizer=tok, **self.eval_kwargs)
        metrics = {f"{self.prefix}/{r['task']}/{r['metric']}"
                   + ("" if r["filter"] == "none" else f"/{r['filter']}"): r["value"]
                   for r in score_rows(result)}
        self.history.append({"step": state.global_step, **metrics})
        if self.log_fn is not None:
            # trainer.log clears control.should_log: keep this step's training-loss log
            should_log = control.should_log
            self.log_fn(dict(metrics))
            control.should_log = should_log
        else:
            entry = {**metrics, "step": state.global_step}
            if state.epoch is not None and not math.isnan(state.epoch):
                entry["epoch"] = state.epoch
            state.log_history.append(entry)
