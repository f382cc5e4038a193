"""Compressor-state files of Trainer checkpoints under faults (issues 23, 29): each records its
rank, world size, global step, run id and a sha256 of its state; a swapped, stale, flipped,
truncated or empty file is refused naming the file and what differs; writes are atomic, and a
write killed midway leaves nothing that accumulates or is read; a save during a training step
is refused; format-1 and format-2 files still load, with a warning of what cannot be verified.
(Files of two runs in one checkpoint: ``test_faults_trainer.py``.)"""

import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from hfcompress.trainer import checkpoint

RUN = "0123456789abcdef"
SETTING = checkpoint.settings({"name": "sdp4bit"}, "fsdp2", 2, 1, run=RUN)
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


def test_round_trip_restores_the_state_and_the_run_id(tmp_path):
    saved(tmp_path)
    h = Handle(torch.zeros(1))
    other_run = {**SETTING, "run": "a resuming run's own id"}    # not compared with the file's
    assert checkpoint.load(h, other_run, str(tmp_path), 0, step=3) == RUN   # the run goes on
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
        assert checkpoint.load(h, SETTING, str(tmp_path), 0, "reset", step=3) is None
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


def test_format_1_and_2_files_load_with_a_warning(tmp_path):
    """Format 1 has no rank, step or checksum, format 2 no run id: they load, warning what
    cannot be checked, and the resumed run saves under a new id from then on."""
    path = checkpoint.state_path(str(tmp_path), 0)
    before_run_ids = {k: v for k, v in SETTING.items() if k != "run"}
    torch.save({"format": 1, "settings": before_run_ids, "state": {"reference": MARK},
                "totals": None}, path)
    h = Handle(torch.zeros(1))
    with pytest.warns(UserWarning, match="old format 1.*cannot be verified"):
        run = checkpoint.load(h, SETTING, str(tmp_path), 0, step=3)
    assert run and run != RUN and torch.equal(h.state["reference"], MARK)
    saved(tmp_path)
    record = torch.load(path, weights_only=True)
    record["format"] = 2
    del record["settings"]["run"]
    torch.save(record, path)
    h = Handle(torch.zeros(1))
    with pytest.warns(UserWarning, match="old format 2 .no run id.: it cannot be checked"):
        run = checkpoint.load(h, SETTING, str(tmp_path), 0, step=3)
    assert run and run != RUN and torch.equal(h.state["reference"], MARK)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # the current format loads without a warning
        saved(tmp_path)
        assert checkpoint.load(Handle(), SETTING, str(tmp_path), 0, step=3) == RUN


def test_a_save_without_a_run_id_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs the run id"):
        checkpoint.save(Handle(), {**SETTING, "run": None}, str(tmp_path), 0, step=3)
    assert checkpoint.new_run_id() != checkpoint.new_run_id()     # one process: no group


def test_a_save_during_a_training_step_is_refused(tmp_path):
    """F3: between a step's start and its optimizer step the step's collectives have moved
    the compressor state past the weights: nothing is written, the error says where to
    save; after the optimizer step it saves."""
    h = Handle()
    checkpoint.step_started(h)
    with pytest.raises(ValueError) as info:
        checkpoint.save(h, SETTING, str(tmp_path), 0, step=3)
    msg = str(info.value)
    assert "during a training step" in msg and "past the weights of step 3" in msg, msg
    assert "save at a step boundary" in msg.lower(), msg
    assert os.listdir(tmp_path) == []
    checkpoint.step_finished(h)
    checkpoint.save(h, SETTING, str(tmp_path), 0, step=3)
    assert os.listdir(tmp_path) == ["hfcompress_rank0.pt"]


KILLED_WRITER = textwrap.dedent("""
    import os, sys, time, torch
    from hfcompress.trainer import checkpoint

    class Handle:
        def state_dict(self):
            return {"reference": torch.arange(4096.0)}

    def stall(fd):                  # the record is written: stop before fsync and rename
        print("writing", flush=True)
        time.sleep(60)

    os.fsync = stall
    checkpoint.save(Handle(), checkpoint.settings({"name": "sdp4bit"}, "fsdp2", 2, 1,
                                                  run="killed"), sys.argv[1], 0, step=6)
""")


def test_a_write_killed_midway_leaves_nothing_read_or_accumulating(tmp_path):
    """A rank killed (SIGKILL) while writing its file leaves a temporary file beside the
    previous one: the previous file is what loads (the temporary is never read), and the
    rank's next load or save into the folder removes the temporary."""
    path = saved(tmp_path)
    earlier = path + ".tmp1"        # what an earlier killed write left
    open(earlier, "wb").write(b"half a record")
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    # the killed write removed the earlier temporary before writing its own: one is left
    assert sorted(os.listdir(tmp_path)) == ["hfcompress_rank0.pt",
                                            f"hfcompress_rank0.pt.tmp{writer.pid}"]
    h = Handle(torch.zeros(1))
    assert checkpoint.load(h, SETTING, str(tmp_path), 0, step=3) == RUN
    assert torch.equal(h.state["reference"], MARK)
    assert os.listdir(tmp_path) == ["hfcompress_rank0.pt"]
    # only a temporary, no file: nothing to load (the temporary is not taken for the state)
    os.replace(path, earlier)
    assert "no hfcompress compressor state for rank 0" in refused(tmp_path)
    assert os.listdir(tmp_path) == []
    other = checkpoint.state_path(str(tmp_path), 10)       # another rank's are not touched
    for stale in (earlier, other + ".tmp2"):
        open(stale, "wb").write(b"half a record")
    saved(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["hfcompress_rank0.pt", "hfcompress_rank10.pt.tmp2"]


def test_a_foreign_torch_file_is_refused(tmp_path):
    path = checkpoint.state_path(str(tmp_path), 0)
    torch.save({"weights": torch.zeros(2)}, path)
    assert f"{path} is not an hfcompress compressor-state file" in refused(tmp_path)
