"""The one line on rank 0 before the CPU kernels compile (the first steps otherwise sit
silent for a minute or more), and only where kernels compile (issue 29 item 6): CPU twins
compiled (not ``HFCOMPRESS_COMPILE=0``, not on CUDA with Triton), for a preset that runs
compressor kernels (not ``none``)."""

import logging

import pytest

from hfcompress.config import AutoSettings, get_config
from hfcompress.integrations import compile_notice as mixin


@pytest.fixture
def lines(monkeypatch, caplog):
    def lines(device="cpu", rank="0", preset="sdp4bit", fsdp=True):
        monkeypatch.setenv("RANK", rank)
        caplog.clear()
        config = AutoSettings() if preset == "auto" else get_config(preset)
        with caplog.at_level(logging.WARNING, logger="hfcompress.integrations.compile_notice"):
            mixin.compile_notice(device, config, fsdp)
        return [r.getMessage() for r in caplog.records]

    monkeypatch.setattr(mixin, "_noticed", False)
    monkeypatch.delenv("HFCOMPRESS_COMPILE", raising=False)
    return lines


def test_compile_notice_once_on_rank0(monkeypatch, lines):
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "0")
    assert lines() == []                                   # eager: nothing compiles
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "off")
    assert lines() == []
    monkeypatch.delenv("HFCOMPRESS_COMPILE")
    assert lines(device="cuda") == []                      # Triton on GPU: not this figure
    assert lines(rank="1") == []                           # other ranks stay quiet
    monkeypatch.setattr(mixin, "_noticed", False)
    [line] = lines()
    assert f"compiling the compression kernels, about {mixin.COMPILE_SECONDS} s" in line
    assert lines() == []                                   # once per process


@pytest.mark.parametrize("preset,fsdp,compiles", [
    ("none", True, False), ("none", False, False),          # exact collectives only
    ("sdp4bit", True, True), ("qw", True, True), ("tlq_hs", False, True),
    ("global_qsgd", False, True), ("auto", True, True),      # auto's probe times kernels
])
def test_compile_notice_only_for_presets_that_compile(lines, preset, fsdp, compiles):
    assert bool(lines(preset=preset, fsdp=fsdp)) is compiles


def test_compiles_kernels_needs_a_compressed_collective_of_the_engine():
    assert not mixin.compiles_kernels(None, True)
    assert not mixin.compiles_kernels(get_config("none"), True)
    assert mixin.compiles_kernels(get_config("qwd"), True)
    assert not mixin.compiles_kernels(get_config("qwd"), False)    # DDP sends no weights


def test_apply_outside_the_trainer_says_it_too(monkeypatch, caplog):
    """``hfcompress.apply`` in a plain loop (the README's loop.py, sft.py) says it before the
    first compile, as the Trainer does (a one-rank gloo group: nothing is sent)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hfcompress

    monkeypatch.delenv("HFCOMPRESS_COMPILE", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(mixin, "_noticed", False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29731")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with caplog.at_level(logging.WARNING, logger="hfcompress.integrations.compile_notice"):
            handle = hfcompress.apply(DDP(torch.nn.Linear(4, 4)), "global_qsgd")
        assert any("compiling the compression kernels" in r.getMessage()
                   for r in caplog.records)
        handle.remove()
    finally:
        dist.destroy_process_group()
