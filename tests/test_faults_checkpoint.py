"""Compressor-state files of Trainer checkpoints under faults (issue 23): each records its
rank, world size, global step and a sha256 of its state; a swapped, stale, flipped, truncated
or empty file is refused naming the file and what differs; writes are atomic; format-1 files
still load, with a warning that they cannot be verified."""

import os
import warnings

import pytest
import torch

from hfcompress.trainer import checkpoint

SETTING = checkpoint.settings({"name": "sdp4bit"}, "fsdp2", 2, 1)
MARK = torch.arange(4096, dtype=torch.float32)


class Handle:
    """The part of a ``Compression`` handle that checkpoints use."""

    def __init__(self, value: torch.Tensor | None = None) -> None:
        self.state = {"reference": MARK.clone() if value is None else value}

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def saved(tmp_path, rank: int = 0, step: int = 3) -> str:
    return checkpoint.save(Handle(), SETTING, str(tmp_path), rank, step=step)


def refused(tmp_path, rank: int = 0, step: int = 3) -> str:
    with pytest.raises(ValueError) as info:
        checkpoint.load(Handle(torch.zeros(1)), SETTING, str(tmp_path), rank, step=step)
    return str(info.value)


def test_round_trip_restores_the_state(tmp_path):
    saved(tmp_path)
    h = Handle(torch.zeros(1))
    assert checkpoint.load(h, SETTING, str(tmp_path), 0, step=3) is True
    assert torch.equal(h.state["reference"], MARK)
    assert os.listdir(tmp_path) == ["hfcompress_rank0.pt"]       # no temporary file left


def test_swapped_rank_files_are_refused(tmp_path):
    path = saved(tmp_path, rank=0)
    os.replace(path, checkpoint.state_path(str(tmp_path), 1))
    msg = refused(tmp_path, rank=1)
    assert "hfcompress_rank1.pt holds the state of rank 0, not of rank 1" in msg, msg


def test_a_file_of_another_step_is_refused(tmp_path):
    saved(tmp_path, step=3)
    msg = refused(tmp_path, step=6)
    assert "hfcompress_rank0.pt was saved at global step 3" in msg and "at step 6" in msg, msg


def test_a_flipped_byte_is_refused(tmp_path):
    path = saved(tmp_path)
    data = bytearray(open(path, "rb").read())
    at = data.find(MARK.numpy().tobytes()[400:464]) + 17     # inside the saved reference
    assert at > 17
    data[at] ^= 0x01
    open(path, "wb").write(bytes(data))
    msg = refused(tmp_path)
    assert "hfcompress_rank0.pt: the state's sha256 is" in msg and "changed" in msg, msg
    # comm_state_mismatch='reset': a warning naming the file, and nothing loaded
    h = Handle(torch.zeros(1))
    with pytest.warns(UserWarning, match="sha256"):
        assert checkpoint.load(h, SETTING, str(tmp_path), 0, "reset", step=3) is False
    assert torch.equal(h.state["reference"], torch.zeros(1))


@pytest.mark.parametrize("keep", [0, 0.5])
def test_truncated_or_empty_files_name_the_file(tmp_path, keep):
    path = saved(tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:int(len(data) * keep)])
    msg = refused(tmp_path)
    assert path in msg and ("is empty" if keep == 0 else "truncated or corrupt") in msg, msg


def test_an_interrupted_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = saved(tmp_path)
    before = open(path, "rb").read()

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(Handle(torch.ones(3)), SETTING, str(tmp_path), 0, step=6)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["hfcompress_rank0.pt"]


def test_format_1_files_load_with_a_warning(tmp_path):
    path = checkpoint.state_path(str(tmp_path), 0)
    torch.save({"format": 1, "settings": SETTING, "state": {"reference": MARK},
                "totals": None}, path)
    h = Handle(torch.zeros(1))
    with pytest.warns(UserWarning, match="old format 1.*cannot be verified"):
        assert checkpoint.load(h, SETTING, str(tmp_path), 0, step=3) is True
    assert torch.equal(h.state["reference"], MARK)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # the current format loads without a warning
        saved(tmp_path)
        assert checkpoint.load(Handle(), SETTING, str(tmp_path), 0, step=3) is True


def test_a_foreign_torch_file_is_refused(tmp_path):
    path = checkpoint.state_path(str(tmp_path), 0)
    torch.save({"weights": torch.zeros(2)}, path)
    assert f"{path} is not an hfcompress compressor-state file" in refused(tmp_path)
