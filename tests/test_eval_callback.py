"""LMEvalCallback with a plain ``transformers.Trainer``: evaluates every N steps and at the
end, logs next to the training loss, hands the model back in train mode."""

import functools
import math

import pytest
import torch
from transformers import (Trainer, TrainerCallback, TrainerControl, TrainerState,
                          TrainingArguments)

from eval_tools import toy
from hfcompress.eval import LMEvalCallback, TaskError

pytest.importorskip("lm_eval", reason="the eval harness needs pip install 'hfcompress[eval]'")

KEY = "lm_eval/arith_mmlu_cont/acc"


@pytest.fixture(scope="module")
def model_and_tok():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: intra-op threads only cost time
    torch.manual_seed(0)
    tok = toy.train_tokenizer([p + a for p, a in toy.training_pairs(500)])
    yield toy.tiny_model(tok), tok
    torch.set_num_threads(n)


class _Modes(TrainerCallback):
    """Records model.training at the start of every step."""

    def __init__(self):
        self.modes = []

    def on_step_begin(self, args, state, control, model=None, **kw):
        self.modes.append(model.training)


def test_trainer_eval_every_n_steps_and_at_end(model_and_tok, tmp_path):
    model, tok = model_and_tok
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=5, logging_steps=2,
                             per_device_train_batch_size=8, learning_rate=1e-3, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True)
    modes = _Modes()
    trainer = Trainer(model=model, args=args, processing_class=tok, callbacks=[modes],
                      train_dataset=toy.encode(toy.training_pairs(40), tok),
                      data_collator=functools.partial(toy.collate, pad_id=tok.pad_token_id))
    cb = LMEvalCallback(["arith_mmlu_cont"], every_n_steps=2, limit=8, batch_size=8)
    cb.attach(trainer)  # logs through trainer.log, as reporters (TensorBoard, W&B) need
    trainer.train()
    assert [h["step"] for h in cb.history] == [2, 4, 5]  # every 2 steps, then at the end
    hist = trainer.state.log_history
    evals = [e for e in hist if KEY in e]
    assert [e["step"] for e in evals] == [2, 4, 5]
    assert all(0.0 <= e[KEY] <= 1.0 and "epoch" in e for e in evals)
    assert "lm_eval/arith_mmlu_cont/acc_norm" in evals[0]
    # the training loss is logged at the same steps, in the same history
    assert [e["step"] for e in hist if "loss" in e] == [2, 4]
    assert all(math.isfinite(e["loss"]) for e in hist if "loss" in e)
    assert modes.modes == [True] * 5  # each step after an eval trains in train mode


def test_without_trainer_log_appends_to_log_history(model_and_tok, tmp_path):
    model, tok = model_and_tok
    cb = LMEvalCallback(["arith_mmlu", "arith_gsm8k"], limit=3, batch_size=4,
                        gen_kwargs={"max_gen_toks": 8})
    state, control = TrainerState(global_step=7, epoch=1.5), TrainerControl()
    cb.on_step_end(None, state, control, model=model, processing_class=tok)  # not due: no eval
    assert state.log_history == []
    cb.on_train_end(None, state, control, model=model, processing_class=tok)
    (entry,) = state.log_history
    assert entry["step"] == 7 and entry["epoch"] == 1.5
    assert set(entry) == {"step", "epoch", "lm_eval/arith_mmlu/acc",
                          "lm_eval/arith_gsm8k/exact_match/strict-match",
                          "lm_eval/arith_gsm8k/exact_match/flexible-extract"}
    with pytest.raises(ValueError, match="needs a tokenizer"):
        LMEvalCallback(["arith_mmlu"], limit=2).on_train_end(None, TrainerState(), control,
                                                               model=model)


def test_bad_arguments_fail_before_training():
    with pytest.raises(ValueError, match="every_n_steps"):
        LMEvalCallback(["arith_mmlu"], every_n_steps=0)
    with pytest.raises(TaskError, match="arith_gsm8k"):
        LMEvalCallback(["arith_gsm8"])
