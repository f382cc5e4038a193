"""A run that diverges is shown as diverged (issue 29 F4): NaN reaches the weights of a
one-process ``hfcompress.Trainer`` run; Hugging Face's ``logging_nan_inf_filter`` then logs
the loss as 0.0, while ``hfcompress.Trainer`` counts the NaN losses (``nonfinite_losses``,
one warning line) and the example's summary calls the run diverged."""

import logging
import math
import os
import sys

import torch
from transformers import TrainerCallback

import hfcompress

from trainer_workers import tiny_llama

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "trainer_examples"))
from run_summary import summarize  # noqa: E402


class Poison(TrainerCallback):
    """NaN into one weight at the end of optimizer step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at:
            with torch.no_grad():
                next(model.parameters()).fill_(math.nan)


def run(out, poison_at, **kw):
    args = hfcompress.TrainingArguments(
        output_dir=str(out), report_to=[], use_cpu=True, max_steps=6, logging_steps=2,
        per_device_train_batch_size=2, disable_tqdm=True, save_strategy="no", **kw)
    ids = torch.randint(0, 256, (12, 8), generator=torch.Generator().manual_seed(0))
    trainer = hfcompress.Trainer(model=tiny_llama(), args=args,
                                 train_dataset=[{"input_ids": x, "labels": x} for x in ids],
                                 callbacks=[Poison(poison_at)] if poison_at else [])
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


def test_nan_weights_are_counted_and_the_run_is_diverged(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with caplog.at_level(logging.WARNING, logger="hfcompress"):
        logged = run(tmp_path / "nan", poison_at=3)
    # HF's filter: step 4's window mean of its finite loss, then 0.0
    assert [e["loss"] == 0.0 for e in logged] == [False, False, True], logged
    assert [e.get("nonfinite_losses") for e in logged] == [None, 1, 2], logged
    lines = [r.getMessage() for r in caplog.records if "NaN / Inf" in r.getMessage()]
    assert len(lines) == 1 and "1 training loss up to step 4 was NaN / Inf" in lines[0], lines
    assert "reads 0.0 once every step is" in lines[0]
    summary = summarize(logged, {"eval_loss": math.nan})
    assert summary["diverged"] and summary["diverged_at_step"] == 4
    assert math.isnan(summary["train_loss_last"])


def test_a_finite_run_logs_as_stock(tmp_path, monkeypatch):
    """No NaN: no extra key (the logs are the plain Trainer's)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    logged = run(tmp_path / "ok", poison_at=None)
    assert all("nonfinite_losses" not in e for e in logged)
    summary = summarize(logged, {"eval_loss": 5.0})
    assert not summary["diverged"] and summary["nonfinite_steps"] == []
