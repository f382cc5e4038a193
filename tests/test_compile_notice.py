"""The one line on rank 0 before the CPU kernels compile (the first steps otherwise sit
silent for a minute or more)."""

import logging

from hfcompress.trainer import mixin


def test_compile_notice_once_on_rank0(monkeypatch, caplog):
    def lines(device="cpu", rank="0"):
        monkeypatch.setenv("RANK", rank)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hfcompress.trainer.mixin"):
            mixin.compile_notice(device)
        return [r.getMessage() for r in caplog.records]

    monkeypatch.setattr(mixin, "_noticed_compile", False)
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "0")
    assert lines() == []                                   # eager: nothing compiles
    monkeypatch.delenv("HFCOMPRESS_COMPILE")
    assert lines(device="cuda") == []                      # Triton on GPU: not this figure
    assert lines(rank="1") == []                           # other ranks stay quiet
    monkeypatch.setattr(mixin, "_noticed_compile", False)
    [line] = lines()
    assert f"compiling the compression kernels, about {mixin.COMPILE_SECONDS} s" in line
    assert lines() == []                                   # once per process
