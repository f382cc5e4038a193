"""The one line on rank 0 before the CPU kernels compile (the first steps otherwise sit
silent for a minute or more), and only where kernels compile (issue 29 item 6): CPU twins
compiled (not ``HFCOMPRESS_COMPILE=0``, not on CUDA with Triton), for a preset that runs
compressor kernels (not ``none``)."""

import logging
import os

import pytest

from dist_utils import run_distributed
from hfcompress.config import AutoSettings, get_config
from hfcompress.integrations import compile_notice as notice


@pytest.fixture
def lines(monkeypatch, caplog):
    def lines(device="cpu", rank="0", preset="sdp4bit", fsdp=True):
        monkeypatch.setenv("RANK", rank)
        caplog.clear()
        config = AutoSettings() if preset == "auto" else get_config(preset)
        with caplog.at_level(logging.WARNING, logger="hfcompress.integrations.compile_notice"):
            notice.compile_notice(device, config, fsdp)
        return [r.getMessage() for r in caplog.records]

    monkeypatch.setattr(notice, "_noticed", False)
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
    monkeypatch.setattr(notice, "_noticed", False)
    [line] = lines()
    assert f"compiling the compression kernels, about {notice.COMPILE_SECONDS} s" in line
    assert lines() == []                                   # once per process


@pytest.mark.parametrize("preset,fsdp,compiles", [
    ("none", True, False), ("none", False, False),          # exact collectives only
    ("sdp4bit", True, True), ("qw", True, True), ("tlq_hs", False, True),
    ("global_qsgd", False, True), ("auto", True, True),      # auto's probe times kernels
])
def test_compile_notice_only_for_presets_that_compile(lines, preset, fsdp, compiles):
    assert bool(lines(preset=preset, fsdp=fsdp)) is compiles


def test_compiles_kernels_needs_a_compressed_collective_of_the_engine():
    assert not notice.compiles_kernels(None, True)
    assert not notice.compiles_kernels(get_config("none"), True)
    assert notice.compiles_kernels(get_config("qwd"), True)
    assert not notice.compiles_kernels(get_config("qwd"), False)    # DDP sends no weights


def apply_worker(rank, world):
    """``hfcompress.apply`` on a DDP model, the notice's log lines returned."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hfcompress

    os.environ.pop("HFCOMPRESS_COMPILE", None)
    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())
    logging.getLogger("hfcompress.integrations.compile_notice").addHandler(handler)
    handle = hfcompress.apply(DDP(torch.nn.Linear(4, 4)), "global_qsgd")
    handle.remove()
    return heard


def test_apply_outside_the_trainer_says_it_too():
    """``hfcompress.apply`` in a plain loop (the README's loop.py, sft.py) says it before the
    first compile, as the Trainer does, on rank 0 only (2 gloo processes)."""
    first, second = run_distributed(apply_worker, 2)
    assert len(first) == 1 and "compiling the compression kernels" in first[0]
    assert second == []
