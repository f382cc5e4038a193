"""``hfcompress.Trainer`` pieces in one process: arguments, bad input, LoCo optimizers,
checkpoint state files, messages."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers import HfArgumentParser
from transformers.optimization import Adafactor

import hfcompress
from hfcompress.config import get_config, list_presets
from hfcompress.integrations.exact_params import Segment
from hfcompress.trainer import checkpoint as trainer_state
from hfcompress.optim import LoCoAdafactor, LoCoAdamW
from hfcompress.integrations.ddp import ddp_scheme
from hfcompress.trainer.install import check_integration, one_node_fallback

from trainer_workers import Arithmetic, tiny_llama


def args(tmp_path, **kw):
    return hfcompress.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                        **kw)


def test_argument_parser_reads_the_comm_fields(tmp_path):
    (a,) = HfArgumentParser(hfcompress.TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--comm_compressor", "tlq_hs", "--ranks_per_node", "1",
         "--comm_log_every", "2", "--comm_state_mismatch", "reset", "--use_cpu"])
    assert (a.comm_compressor, a.ranks_per_node, a.comm_log_every, a.comm_state_mismatch) == \
        ("tlq_hs", 1, 2, "reset")
    (d,) = HfArgumentParser(hfcompress.TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu"])
    assert (d.comm_compressor, d.ranks_per_node, d.comm_log_every) == (None, None, 1)


def test_unknown_preset_lists_the_valid_ones(tmp_path):
    with pytest.raises(ValueError) as err:
        args(tmp_path, comm_compressor="sdp4")
    msg = str(err.value)
    assert "unknown comm_compressor preset 'sdp4'" in msg and "'sdp4bit'?" in msg
    assert all(name in msg for name in list_presets())
    with pytest.raises(ValueError, match="Valid presets: none, qw"):
        hfcompress.Trainer(model=tiny_llama(), args=args(tmp_path), comm_compressor="bogus")


@pytest.mark.parametrize("field, value", [("ranks_per_node", 0), ("comm_log_every", -1),
                                          ("comm_state_mismatch", "ignore")])
def test_bad_comm_arguments(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        args(tmp_path, **{field: value})


def test_loco_with_an_optimizer_it_cannot_wrap(tmp_path):
    """Caught when the Trainer is built, naming the supported optimizers."""
    with pytest.raises(ValueError) as err:
        hfcompress.Trainer(model=tiny_llama(), args=args(tmp_path, optim="sgd"),
                           train_dataset=Arithmetic(), comm_compressor="loco")
    msg = str(err.value)
    assert "cannot wrap optimizer SGD (optim='sgd')" in msg
    assert "'adamw_torch'" in msg and "'adafactor'" in msg and "LoCoAdamW" in msg
    model = tiny_llama()
    with pytest.raises(ValueError, match="cannot wrap optimizer SGD"):
        hfcompress.Trainer(model=model, args=args(tmp_path), comm_compressor="loco",
                           optimizers=(torch.optim.SGD(model.parameters(), lr=0.1), None))


def test_fsdp1_is_refused(tmp_path):
    with pytest.raises(ValueError, match="FSDP1 was requested"):
        hfcompress.Trainer(model=tiny_llama(), comm_compressor="sdp4bit",
                           args=args(tmp_path, fsdp=True, fsdp_config={"version": 1}))


class CountingHandle:
    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1


@pytest.mark.parametrize("loco_cls, base_cls, kw", [
    (LoCoAdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (LoCoAdafactor, Adafactor, {"lr": 1e-2, "scale_parameter": False, "relative_step": False})])
def test_loco_optimizer_is_the_wrapped_one_plus_the_clock(loco_cls, base_cls, kw):
    """Same updates as the stock optimizer, bit for bit (LoCo 4.2: the Adam-family update is
    unchanged); ``compression.step()`` once per ``step()``."""
    torch.manual_seed(0)
    ref = [torch.randn(8, 16, requires_grad=True), torch.randn(16, requires_grad=True)]
    mine = [p.detach().clone().requires_grad_() for p in ref]
    handle = CountingHandle()
    opts = [base_cls(ref, **kw), loco_cls(mine, compression=handle, **kw)]
    for step in range(3):
        g = [torch.randn_like(p) for p in ref]
        for params, opt in zip((ref, mine), opts):
            for p, gp in zip(params, g):
                p.grad = gp.clone()
            opt.step()
    assert handle.steps == 3
    for a, b in zip(ref, mine):
        assert torch.equal(a, b)
    unbound = loco_cls([torch.zeros(2, requires_grad=True)], **kw)   # bound later, or never
    unbound.param_groups[0]["params"][0].grad = torch.ones(2)
    unbound.step()


def test_two_node_preset_messages():
    two_hop = one_node_fallback(get_config("tlq_hs"), 2, 2)
    assert "runs only the intra-node hop, so gradients are sent hadamard 8-bit" in two_hop
    assert "hpZ changes nothing" in one_node_fallback(get_config("zeropp"), 4, 4)
    assert one_node_fallback(get_config("tlq_hs"), 1, 2) is None      # 2 nodes: as designed
    assert one_node_fallback(get_config("loco"), 2, 2) is None
    assert ddp_scheme(get_config("sdp4bit")).params["bits"] == 4     # its inter-node scheme
    assert ddp_scheme(get_config("none")) is None
    with pytest.raises(ValueError, match="compresses only FSDP's collectives"):
        check_integration(get_config("qwd"), fsdp=False)
    with pytest.raises(ValueError, match="compresses only DDP's all-reduce"):
        check_integration(get_config("global_qsgd"), fsdp=True)
    check_integration(get_config("global_qsgd"), fsdp=False)
    check_integration(get_config("qwd"), fsdp=True)


class FakeHandle:
    def __init__(self, state=None):
        self.state = state or {}
        self.loaded = None

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.loaded = state


def test_state_file_round_trip_and_mismatch(tmp_path):
    """weights_only-safe (tensors, containers, DDP's Segment records); another compressor's
    file is an error naming the differences, or with 'reset' a warning and nothing loaded."""
    state = {"streams": {0: {"segments": (Segment("w", 4, False),),
                             "state": {"error": torch.arange(4, dtype=torch.uint8),
                                       "rng": {"seed": 3, "states": {"x": torch.zeros(3)}}}}}}
    loco = trainer_state.settings(get_config("loco").to_dict(), "ddp", 2, 2, run="r")
    path = trainer_state.save(FakeHandle(state), loco, str(tmp_path), 1)
    assert os.path.basename(path) == "hfcompress_rank1.pt"
    handle = FakeHandle()
    assert trainer_state.load(handle, loco, str(tmp_path), 1, map_location="cpu:0")
    assert handle.loaded["streams"][0]["segments"] == (Segment("w", 4, False),)
    assert torch.equal(handle.loaded["streams"][0]["state"]["error"], torch.arange(4).byte())
    other = trainer_state.settings(get_config("tlq_hs").to_dict(), "ddp", 2, 2)
    with pytest.raises(ValueError) as err:
        trainer_state.load(FakeHandle(), other, str(tmp_path), 1)
    assert "config.name: checkpoint 'loco', this run 'tlq_hs'" in str(err.value)
    fresh = FakeHandle()
    with pytest.warns(UserWarning, match="starting the compressor state fresh"):
        assert not trainer_state.load(fresh, other, str(tmp_path), 1, on_mismatch="reset")
    assert fresh.loaded is None
    with pytest.raises(ValueError, match="no hfcompress compressor state for rank 0"):
        trainer_state.load(FakeHandle(), loco, str(tmp_path), 0)


def test_resume_where_compressor_state_is_restored(tmp_path, monkeypatch, caplog):
    """Several processes with a compressor (a callback installed): ``True`` takes the newest
    checkpoint whose ``trainer_state.json`` reads (a run stopped while saving leaves it
    missing or cut short), warning about each newer one; HF's message starts ours; a
    checkpoint of another step is not skipped (its compressor state is refused when loaded);
    the rest reaches HF's ``train`` as given (a Path as a str). Without: all as given."""
    monkeypatch.setattr(transformers.Trainer, "train", lambda self, resume, *a, **k: resume)
    trainer = hfcompress.Trainer(model=tiny_llama(), args=args(tmp_path / "out", max_steps=1))
    assert trainer.comm_callback is None
    for given in (True, "True", tmp_path, None):
        assert trainer.train(resume_from_checkpoint=given) is given
    trainer.comm_callback = SimpleNamespace()       # what several processes have
    out = tmp_path / "out"
    shutil.rmtree(out)
    with pytest.raises(FileNotFoundError):           # as HF's get_last_checkpoint's listdir
        trainer.train(resume_from_checkpoint=True)
    out.mkdir()
    with pytest.raises(ValueError) as err:
        trainer.train(resume_from_checkpoint=True)
    assert str(err.value) == f"No valid checkpoint found in output directory ({out})"
    assert trainer.train(resume_from_checkpoint="True") == "True"
    assert trainer.train(resume_from_checkpoint=out / "x") == str(out / "x")
    assert trainer.train(resume_from_checkpoint=False) is None
    for step in (2, 10, 9):
        (out / f"checkpoint-{step}").mkdir()
        (out / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"global_step": step}))
    assert trainer.train(resume_from_checkpoint=True) == str(out / "checkpoint-10")
    (out / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 1')
    (out / "checkpoint-11").mkdir()
    (out / "checkpoint-9" / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    with caplog.at_level("WARNING"):
        assert trainer.train(resume_from_checkpoint=True) == str(out / "checkpoint-9")
    skipped = [r.getMessage() for r in caplog.records if "not resuming from" in r.getMessage()]
    assert len(skipped) == 2 and "checkpoint-11: it has no trainer_state.json" in skipped[0] \
        and "checkpoint-10: its trainer_state.json is unreadable" in skipped[1], skipped
    for step in (2, 9, 10):
        (out / f"checkpoint-{step}" / "trainer_state.json").unlink()
    with pytest.raises(ValueError) as err:
        trainer.train(resume_from_checkpoint=True)
    assert str(err.value).startswith(f"No valid checkpoint found in output directory ({out}): "
                                     f"none has a readable trainer_state.json (the newest, "
                                     f"{out / 'checkpoint-11'}: it has no trainer_state.json")


def test_comm_stats_window_averages_and_totals():
    """A logging window of 2 steps: bytes per step averaged over the window, ratio against the
    uncompressed baseline; totals accumulate over windows (one process: no all-reduce)."""
    from hfcompress.trainer.metrics import CommStats
    stats = CommStats()
    for intra, inter, base in ((100, 300, 1600), (300, 100, 1600)):
        stats.close_step({"intra_bytes": intra, "inter_bytes": inter,
                          "uncompressed_intra_bytes": base // 2,
                          "uncompressed_inter_bytes": base // 2})
    logs = stats.reduce()
    assert logs["comm/intra_node_bytes"] == 200 and logs["comm/inter_node_bytes"] == 200
    assert logs["comm/uncompressed_bytes"] == 1600 and logs["comm/compression_ratio"] == 4.0
    assert logs["comm/time_s"] >= 0
    assert stats.reduce() == {}                      # empty window: nothing to log
    totals = stats.total_logs()
    assert totals["comm/total_bytes"] == 800 and totals["comm/total_bytes_saved"] == 2400


def test_importing_hfcompress_does_not_import_transformers():
    import subprocess
    import sys
    code = "import sys, hfcompress; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
