"""What ``hfcompress.Trainer`` tells the user (one process): the one-process warning, once,
at construction; the install line's wording; a re-run into checkpoints; Ctrl-C."""

import logging
import os
import subprocess
import sys

import pytest
import torch
from transformers import TrainerCallback

import hfcompress
from hfcompress.config import get_config
from hfcompress.trainer import mixin as trainer_module
from hfcompress.trainer import resume
from hfcompress.trainer.install import summary

from trainer_workers import tiny_llama


def test_one_process_warns_once_at_construction(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(trainer_module, "_warned_single_process", False)
    args = hfcompress.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                        comm_compressor="sdp4bit")
    with caplog.at_level(logging.WARNING, logger="hfcompress"):
        hfcompress.Trainer(model=tiny_llama(), args=args)
        hfcompress.Trainer(model=tiny_llama(), args=args)
    lines = [r.getMessage() for r in caplog.records if "one process" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "comm_compressor 'sdp4bit' changes nothing" in lines[0]
    assert "accelerate launch --multi_gpu --num_processes N" in lines[0]
    assert "torchrun --nproc_per_node N" in lines[0]


def test_no_warning_without_a_compressor(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(trainer_module, "_warned_single_process", False)
    args = hfcompress.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with caplog.at_level(logging.WARNING, logger="hfcompress"):
        hfcompress.Trainer(model=tiny_llama(), args=args)
    assert not [r for r in caplog.records if "one process" in r.getMessage()]


def test_install_line_wording():
    ddp = summary(get_config("sdp4bit"), "ddp", 2, 1)
    assert "on 2 ranks (2 nodes x 1 rank)" in ddp
    assert "(its weight scheme and 2-hop layout: FSDP2 only, not used under DDP)" in ddp
    assert "on 4 ranks (1 node x 4 ranks)" in summary(get_config("sdp4bit"), "fsdp2", 4, 4)
    # dp 2 x tp 2: the DP groups' layout, named as such
    assert "on the data-parallel groups of 2 of the 4 ranks (2 nodes x 1 rank)" in \
        summary(get_config("sdp4bit"), "fsdp2", 4, 1, 2)
    # HSDP: says so, and names the replica all-reduce, which is what crosses the nodes
    hsdp = summary(get_config("global_qsgd"), "hsdp", 4, 1, 2)
    assert hsdp.startswith("hfcompress: HSDP (FSDP2 shards, replicas all-reduced)")
    assert "replica all-reduce global_qsgd" in hsdp and "across the replicas" in hsdp


def small_trainer(out, **kw):
    kw = {"report_to": [], "use_cpu": True, "max_steps": 3, "per_device_train_batch_size": 2,
          "disable_tqdm": True, "save_strategy": "no", **kw}
    args = hfcompress.TrainingArguments(output_dir=str(out), **kw)
    ids = torch.randint(0, 256, (6, 8), generator=torch.Generator().manual_seed(0))
    return hfcompress.Trainer(model=tiny_llama(), args=args,
                              train_dataset=[{"input_ids": x, "labels": x} for x in ids])


def test_a_rerun_into_checkpoints_names_the_newest(tmp_path, caplog, monkeypatch):
    """Started again without resume_from_checkpoint where checkpoints are: one line (rank 0)
    naming the newest and how to resume; nothing else changes (it trains from step 0)."""
    for step in (3, 12):
        (tmp_path / f"checkpoint-{step}").mkdir()
    trainer = small_trainer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hfcompress"):
        trainer.train()
    lines = [r.getMessage() for r in caplog.records if "already has checkpoints" in r.getMessage()]
    newest = tmp_path / "checkpoint-12"
    assert len(lines) == 1 and f"(newest: {newest})" in lines[0], lines
    assert f"--resume_from_checkpoint {newest}, or trainer.train(resume_from_checkpoint=True)" \
        in lines[0]
    assert trainer.state.global_step == 3
    caplog.clear()
    monkeypatch.setattr(hfcompress.Trainer, "is_world_process_zero", lambda self: False)
    with caplog.at_level(logging.WARNING, logger="hfcompress"):
        trainer.train()
    assert not [r for r in caplog.records if "already has checkpoints" in r.getMessage()]


class Interrupt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise KeyboardInterrupt


def test_ctrl_c_is_one_line_per_rank(tmp_path, caplog, capsys, monkeypatch):
    """KeyboardInterrupt still propagates (``except KeyboardInterrupt`` works); its line says
    where it stopped and, on rank 0, how to resume; its traceback is not printed."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    trainer = small_trainer(tmp_path, save_strategy="steps", save_steps=1)
    trainer.add_callback(Interrupt())
    with caplog.at_level(logging.WARNING, logger="hfcompress"):
        with pytest.raises(KeyboardInterrupt) as info:
            trainer.train()
    lines = [r.getMessage() for r in caplog.records if "interrupted" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "hfcompress: rank 0: training interrupted at step 2 (in on_step_end, "), lines
    assert lines[0].endswith(f"; to continue: --resume_from_checkpoint "
                             f"{tmp_path / 'checkpoint-1'}"), lines
    capsys.readouterr()
    sys.excepthook(KeyboardInterrupt, info.value, info.tb)
    assert capsys.readouterr().err == ""
    sys.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)    # another: printed
    assert "KeyboardInterrupt" in capsys.readouterr().err
    resume.report_interrupt(KeyboardInterrupt(), 1, 7, str(tmp_path))
    assert caplog.records[-1].getMessage() == "hfcompress: rank 1: training interrupted at step 7"


def test_ctrl_c_ends_the_process_with_one_line(tmp_path):
    """A real SIGINT during training: the process fails as with transformers' Trainer (an
    uncaught KeyboardInterrupt: here status 1), with one line and no traceback."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal, sys, torch, transformers, hfcompress\n"
        # Python's handler, as a shell starts a process: the test worker that spawns this
        # one may have SIGINT ignored, which a child inherits (then no KeyboardInterrupt)
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from hfcompress.testing import tiny_llama\n"
        "class Stop(transformers.TrainerCallback):\n"
        "    def on_step_end(self, args, state, control, **kwargs):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "args = hfcompress.TrainingArguments(output_dir=sys.argv[1], report_to=[], "
        "use_cpu=True, max_steps=3, disable_tqdm=True, save_strategy='no')\n"
        "ids = torch.randint(0, 256, (6, 8))\n"
        "hfcompress.Trainer(model=tiny_llama(), args=args, callbacks=[Stop()], "
        "train_dataset=[{'input_ids': x, 'labels': x} for x in ids]).train()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "training interrupted" in line]
    assert len(lines) == 1 and "rank 0: training interrupted at step 1" in lines[0], lines


def test_every_machine_says_it_is_on(monkeypatch):
    """A 2-machine launch: global rank 0 logs the summary; local rank 0 of the other machine
    one line of its own (it printed nothing before); other local ranks stay quiet."""
    from hfcompress.trainer import accelerate_cpu
    from hfcompress.trainer.install import machine_line

    for rank, local, lead in (("0", "0", False), ("2", "0", True), ("3", "1", False)):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local)
        assert accelerate_cpu.is_machine_lead() is lead
    assert machine_line("sdp4bit", 2) == ("hfcompress: comm_compressor 'sdp4bit' installed on "
                                          "this machine (rank 2 and its local peers); the "
                                          "start-up summary is on global rank 0, and the comm/* "
                                          "figures logged (on each machine, as transformers logs) "
                                          "are the whole job's")
