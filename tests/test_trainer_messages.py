"""What ``hfcompress.Trainer`` tells the user (one process): the one-process warning, once,
at construction; the install line's wording."""

import logging

import hfcompress
from hfcompress.config import get_config
from hfcompress.trainer import mixin as trainer_module
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
