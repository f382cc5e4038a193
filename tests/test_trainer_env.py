"""The no-code switch (``HFCOMPRESS_COMPRESSOR``, issue 38) and ``resume_from_checkpoint``
given as a command line's string (``"True"`` / ``"latest"``), in one process."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

import hfcompress
from hfcompress.config import list_presets
from hfcompress.trainer.mixin import COMPRESSOR_ENV
from hfcompress.trainer.resume import command_line as resume_argument

from trainer_workers import tiny_llama


def args(tmp_path, **kw):
    return hfcompress.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                        **kw)


def test_training_arguments_take_the_preset_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(COMPRESSOR_ENV, "sdp4bit")
    assert args(tmp_path).comm_compressor == "sdp4bit"
    assert args(tmp_path, comm_compressor="tlq_hs").comm_compressor == "tlq_hs"   # explicit wins
    monkeypatch.setenv(COMPRESSOR_ENV, "")                      # empty: unset
    assert args(tmp_path).comm_compressor is None


def test_an_unknown_preset_in_the_environment_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(COMPRESSOR_ENV, "sdp4")
    with pytest.raises(ValueError) as err:
        args(tmp_path)
    msg = str(err.value)
    assert "HFCOMPRESS_COMPRESSOR='sdp4' is not a preset" in msg and "'sdp4bit'?" in msg
    assert all(name in msg for name in [*list_presets(), "auto"])
    # an explicit argument wins, so the bad variable is not read at all
    assert args(tmp_path, comm_compressor="none").comm_compressor == "none"


def test_the_mixin_reads_the_environment_under_any_training_arguments(tmp_path, monkeypatch):
    """A plain ``transformers.TrainingArguments`` (or TRL's ``SFTConfig``) has no
    ``comm_compressor`` field: the mixin reads the variable; a constructor argument wins."""
    plain = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[],
                                           use_cpu=True)
    monkeypatch.setenv(COMPRESSOR_ENV, "tlq_hs")
    trainer = hfcompress.Trainer(model=tiny_llama(), args=plain)
    assert trainer.comm_config.name == "tlq_hs"
    trainer = hfcompress.Trainer(model=tiny_llama(), args=plain, comm_compressor="none")
    assert trainer.comm_config.name == "none"
    monkeypatch.delenv(COMPRESSOR_ENV)
    assert hfcompress.Trainer(model=tiny_llama(), args=plain).comm_config is None
    monkeypatch.setenv(COMPRESSOR_ENV, "bogus")
    with pytest.raises(ValueError, match="HFCOMPRESS_COMPRESSOR='bogus' is not a preset"):
        hfcompress.Trainer(model=tiny_llama(), args=plain)


def test_resume_argument_takes_the_command_lines_words(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resume_argument("True") is True and resume_argument("true") is True
    assert resume_argument("latest") is True
    assert resume_argument("False") is None and resume_argument(None) is None
    assert resume_argument(True) is True and resume_argument(False) is False
    assert resume_argument("out/checkpoint-4") == "out/checkpoint-4"
    # latest: a run without a checkpoint yet starts from step 0 (the first launch of a job
    # that is restarted with the same command); True: HF's, no checkpoint is an error
    assert resume_argument("latest", str(tmp_path / "new")) is None
    os.makedirs(tmp_path / "out" / "checkpoint-2")
    assert resume_argument("latest", str(tmp_path / "out")) is True
    assert resume_argument("True", str(tmp_path / "new")) is True
    os.mkdir("latest")                      # a folder of that name is a folder
    assert resume_argument("latest") == "latest"


def test_trainer_resumes_from_the_newest_checkpoint_given_the_string_true(tmp_path):
    """``trainer.train(resume_from_checkpoint=resume.command_line(args.resume_from_checkpoint,
    args.output_dir))`` (what the examples do) with ``--resume_from_checkpoint True`` / ``latest``
    (a str) resumes from the newest checkpoint; given as is, HF's ``train`` (and so
    ``hfcompress.Trainer``, equal to stock: ``test_trainer_differential``) looks for a folder
    named 'True'."""
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 256, (16, 16))]
    kw = dict(per_device_train_batch_size=4, save_steps=2, logging_steps=1)
    first = hfcompress.Trainer(model=tiny_llama(), args=args(tmp_path, max_steps=2, **kw),
                               train_dataset=data)
    first.train()
    assert os.path.isdir(tmp_path / "checkpoint-2")
    for word, steps in (("True", 3), ("latest", 4)):
        again = hfcompress.Trainer(model=tiny_llama(),
                                   args=args(tmp_path, max_steps=steps,
                                             resume_from_checkpoint=word, **kw),
                                   train_dataset=data)
        ran = StepsRun()
        again.add_callback(ran)
        again.train(resume_from_checkpoint=resume_argument(again.args.resume_from_checkpoint,
                                                           again.args.output_dir))
        assert again.state.global_step == steps
        assert ran.steps == [steps], ran.steps   # one step, from the newest checkpoint on


class StepsRun(transformers.TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_apply_refuses_a_deepspeed_engine_naming_the_alternatives():
    """DeepSpeed runs its own collectives: refused by name (before any process group is
    needed), pointing at FSDP2, DeepSpeed's own ZeRO++ and ``plan --engine zero3``."""
    class DeepSpeedEngine(torch.nn.Module):      # deepspeed's class, by name
        pass

    class Engine(DeepSpeedEngine):
        pass

    with pytest.raises(ValueError) as err:
        hfcompress.apply(Engine(), "sdp4bit")
    msg = str(err.value)
    assert "got a DeepSpeed engine" in msg and "FSDP2" in msg
    assert "zero_quantized_weights" in msg and "plan --engine zero3" in msg
