"""Differential (issue 29): the same small scenarios run with transformers' ``Trainer`` /
``TrainingArguments`` and with hfcompress's (``comm_compressor`` unset, one process), and the
outcomes must be equal: resuming from a str, a Path, ``True``, the string ``"True"``, a newest
checkpoint without ``trainer_state.json``, a ``checkpoint-N`` whose state is of another step,
folders that do not exist (the exception types and messages too); the callbacks (also with a
``comm_compressor`` in one process, where nothing is installed); the signatures of
``__init__`` / ``train`` / ``log``; ``TrainingArguments`` round trips and substituting
hfcompress's for transformers'."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import pathlib
import shutil
import sys

import pytest
import torch
import transformers
from transformers import HfArgumentParser

import hfcompress
from hfcompress.testing import tiny_llama

CLASSES = {"stock": (transformers.Trainer, transformers.TrainingArguments),
           "hfcompress": (hfcompress.Trainer, hfcompress.TrainingArguments)}
COMM_FIELDS = {"comm_compressor", "ranks_per_node", "comm_log_every", "comm_state_mismatch",
               "comm_auto_reprobe_steps"}
ARGS = dict(per_device_train_batch_size=2, save_steps=2, logging_steps=1, learning_rate=1e-2,
            report_to=[], use_cpu=True, seed=0, data_seed=0, disable_tqdm=True)


def data() -> list[dict]:
    ids = torch.randint(0, 256, (8, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": x, "labels": x} for x in ids]


def make(kind: str, out, steps: int, **kw):
    trainer_cls, args_cls = CLASSES[kind]
    args = args_cls(output_dir=str(out), max_steps=steps, **ARGS)
    return trainer_cls(model=tiny_llama(), args=args, train_dataset=data(), **kw)


def outcome(kind: str, out, resume) -> tuple:
    """What ``train(resume_from_checkpoint=resume)`` did: the steps, losses and a digest of the
    weights, or the exception's type and message."""
    trainer = make(kind, out, steps=6)
    try:
        trainer.train(resume_from_checkpoint=resume)
    except Exception as e:
        return type(e), str(e)
    weights = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return (trainer.state.global_step,
            [h["loss"] for h in trainer.state.log_history if "loss" in h],
            hashlib.sha256(weights.numpy().tobytes()).hexdigest())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A stock run of 4 steps: checkpoint-2 and checkpoint-4."""
    out = tmp_path_factory.mktemp("saved")
    make("stock", out, steps=4).train()
    return out


def no_state(out):
    (out / "checkpoint-4" / "trainer_state.json").unlink()


def other_step(out):
    shutil.copy(out / "checkpoint-2" / "trainer_state.json",
                out / "checkpoint-4" / "trainer_state.json")


def no_checkpoints(out):
    for folder in out.glob("checkpoint-*"):
        shutil.rmtree(folder)


def no_output_dir(out):
    shutil.rmtree(out)


def nothing(out):
    pass


CASES = {  # name: (change to the saved folder, resume_from_checkpoint given the folder)
    "str": (nothing, lambda out: str(out / "checkpoint-2")),
    "path": (nothing, lambda out: out / "checkpoint-2"),
    "true": (nothing, lambda out: True),
    "true_string": (nothing, lambda out: "True"),
    "false": (nothing, lambda out: False),
    "none": (nothing, lambda out: None),
    "newest_without_state_true": (no_state, lambda out: True),
    "newest_without_state_named": (no_state, lambda out: str(out / "checkpoint-4")),
    "other_step_true": (other_step, lambda out: True),
    "other_step_named": (other_step, lambda out: str(out / "checkpoint-4")),
    "missing_folder": (nothing, lambda out: str(out / "checkpoint-9")),
    "no_checkpoint_true": (no_checkpoints, lambda out: True),
    "no_output_dir_true": (no_output_dir, lambda out: True),
}


@pytest.mark.parametrize("case", CASES)
def test_resume_outcomes_equal_stock(saved, tmp_path, case):
    """Each class runs on its own fresh copy at the same path (equal paths in messages)."""
    change, resume = CASES[case]
    out = tmp_path / "out"
    got = {}
    for kind in CLASSES:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(saved, out)
        change(out)
        got[kind] = outcome(kind, out, resume(out))
    assert got["hfcompress"] == got["stock"], got


def test_the_cases_cover_resumes_and_errors(saved, tmp_path):
    """The scenarios above do what they are named for (in stock)."""
    def run(case):
        change, resume = CASES[case]
        out = tmp_path / case
        shutil.copytree(saved, out)
        change(out)
        return outcome("stock", out, resume(out))

    assert run("path")[0] == 6 and run("other_step_named")[0] == 6
    assert run("true_string") == (ValueError, "Can't find a valid checkpoint at True")
    kind, message = run("newest_without_state_true")
    assert kind is FileNotFoundError and "trainer_state.json" in message
    kind, message = run("no_checkpoint_true")
    assert kind is ValueError and message.startswith("No valid checkpoint found in output")


@pytest.mark.parametrize("comm", [None, "sdp4bit"])
def test_callbacks_equal_stock_in_one_process(tmp_path, comm):
    """One process: nothing is installed, so no callback is added, with a compressor too."""
    def callbacks(kind, **kw):
        return [type(c) for c in make(kind, tmp_path, 1, **kw).callback_handler.callbacks]
    extra = {} if comm is None else {"comm_compressor": comm}
    assert callbacks("hfcompress", **extra) == callbacks("stock")


def test_signatures_are_the_trainers():
    for name in ("train", "log"):
        assert inspect.signature(getattr(hfcompress.Trainer, name)) == \
            inspect.signature(getattr(transformers.Trainer, name)), name
    stock = list(inspect.signature(transformers.Trainer.__init__).parameters.values())
    ours = list(inspect.signature(hfcompress.Trainer.__init__).parameters.values())
    assert ours[:len(stock)] == stock
    assert {p.name for p in ours[len(stock):]} == COMM_FIELDS
    assert all(p.kind is p.KEYWORD_ONLY and p.default is None for p in ours[len(stock):])


def test_training_arguments_round_trip(tmp_path):
    """to_dict / to_json_string equal stock's plus the comm fields; each class is rebuilt
    from its dict (and by HfArgumentParser.parse_dict) to the same dict."""
    kw = dict(output_dir=str(tmp_path), gradient_accumulation_steps=2, lr_scheduler_type="cosine",
              **ARGS)
    stock, ours = transformers.TrainingArguments(**kw), hfcompress.TrainingArguments(**kw)
    d_stock, d_ours = stock.to_dict(), ours.to_dict()
    assert set(d_ours) - set(d_stock) == COMM_FIELDS
    assert {k: v for k, v in d_ours.items() if k not in COMM_FIELDS} == d_stock
    as_json = json.loads(ours.to_json_string())
    assert {k: v for k, v in as_json.items() if k not in COMM_FIELDS} == \
        json.loads(stock.to_json_string())
    assert transformers.TrainingArguments(**d_stock).to_dict() == d_stock
    assert hfcompress.TrainingArguments(**d_ours).to_dict() == d_ours
    (parsed,) = HfArgumentParser(hfcompress.TrainingArguments).parse_dict(d_ours)
    assert parsed.to_dict() == d_ours
    assert dataclasses.replace(ours, comm_compressor="sdp4bit").comm_compressor == "sdp4bit"


def test_substituted_training_arguments(tmp_path, monkeypatch):
    """``transformers.TrainingArguments`` replaced by hfcompress's (a test suite run against
    both, a library that builds its own arguments): no endless recursion, and the stock
    Trainer takes them; hfcompress's Trainer takes transformers' arguments."""
    # the module objects named transformers here and where hfcompress imported it (transformers
    # may replace its lazy module in sys.modules while importing)
    for module in {id(m): m for m in (transformers, sys.modules["transformers"],
                                      sys.modules["hfcompress.trainer.trainer"].transformers)
                   }.values():
        monkeypatch.setattr(module, "TrainingArguments", hfcompress.TrainingArguments)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), **ARGS)
    assert isinstance(args, hfcompress.TrainingArguments)
    assert args.device == torch.device("cpu") and args.n_gpu == 0
    trainer = transformers.Trainer(model=tiny_llama(), args=args, train_dataset=data())
    assert trainer.args is args
    monkeypatch.undo()
    plain = transformers.TrainingArguments(output_dir=str(tmp_path), **ARGS)
    assert type(plain) is not hfcompress.TrainingArguments
    assert hfcompress.Trainer(model=tiny_llama(), args=plain).args is plain


def test_path_resume_restores_the_progress(saved, tmp_path):
    """Issue 29's first finding, directly: from a Path at step 4, two steps are trained."""
    class Steps(transformers.TrainerCallback):
        trained = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.trained += 1

    out = tmp_path / "out"
    shutil.copytree(saved, out)
    steps = Steps()
    trainer = make("hfcompress", out, steps=6, callbacks=[steps])
    trainer.train(resume_from_checkpoint=pathlib.Path(out / "checkpoint-4"))
    assert (trainer.state.global_step, steps.trained) == (6, 2)
