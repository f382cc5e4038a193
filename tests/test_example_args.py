"""trainer_examples argument handling: default output folders per model / preset / engine,
and mistakes caught before any work (one message on rank 0, nothing written)."""

import os
import subprocess
import sys

import pytest

from hfcompress.testing import free_port
from test_examples import ROOT

sys.path.insert(0, os.path.join(ROOT, "trainer_examples"))
import clm  # noqa: E402
from finetune_llama import ModelArguments  # noqa: E402


def parse(*argv: str, name: str = "llama"):
    """In this (single) process: WORLD_SIZE is unset."""
    return clm.parse_args(ModelArguments, clm.TRAINING_DEFAULTS, list(argv), name=name)


@pytest.mark.parametrize("world, fsdp, argv, expected", [
    (2, True, ["--comm_compressor", "sdp4bit"], "runs/llama-sdp4bit"),
    (2, True, ["--comm_compressor=none"], "runs/llama-none"),
    (2, False, ["--comm_compressor", "tlq_hs"], "runs/llama-tlq_hs-ddp"),
    (1, False, ["--comm_compressor", "sdp4bit"], "runs/llama-sdp4bit-1proc"),
    (2, False, [], "runs/llama-plain-ddp"),
    (2, False, ["--fsdp", "full_shard", "--comm_compressor", "qwd"], "runs/llama-qwd"),
])
def test_default_output_dir_tells_runs_apart(monkeypatch, world, fsdp, argv, expected):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true" if fsdp else "false")   # a FSDP config
    assert clm.default_output_dir("llama", argv, world) == expected


def test_parsed_defaults_output_dir_and_model_name(tmp_path):
    _, dargs, targs = parse("--comm_compressor", "sdp4bit")
    assert targs.output_dir == "runs/llama-sdp4bit-1proc"
    assert dargs.data_cache_dir == "runs/data_cache"       # shared by the runs
    _, dargs, targs = parse("--output_dir", str(tmp_path), "--comm_compressor", "sdp4bit")
    assert targs.output_dir == str(tmp_path) and dargs.data_cache_dir is None
    _, _, targs = parse("--model_name_or_path", "org/SmolLM2-360M/", "--comm_compressor", "qwd")
    assert targs.output_dir == "runs/SmolLM2-360M-qwd-1proc"
    assert targs.learning_rate == float(clm.PRETRAINED_LEARNING_RATE)
    _, _, targs = parse("--comm_compressor", "loco", name="mixtral")
    assert targs.output_dir == "runs/mixtral-loco-1proc"


def test_mistakes_raise_one_clear_error():
    with pytest.raises(clm.ArgumentError) as err:
        parse("--comm_compressor", "sdp4bt")
    # the valid presets, the closest first
    assert "'sdp4bt'" in str(err.value) and "Did you mean 'sdp4bit'" in str(err.value)
    assert "loco_zeropp" in str(err.value)
    with pytest.raises(clm.ArgumentError, match=r"--max_stepz \(did you mean --max_steps\?\)"):
        parse("--max_stepz", "3")
    with pytest.raises(clm.ArgumentError, match="invalid choice: 'rest'.*Did you mean 'reset'"):
        parse("--comm_state_mismatch", "rest")
    _, _, targs = parse("--comm_compressor", "sdp4bit", "--ranks_per_node", "3")
    with pytest.raises(clm.ArgumentError, match=r"world size 2 cannot be split into nodes of "
                       r"ranks_per_node=3 ranks.*one of 1, 2"):
        clm.check_layout(targs, world=2)
    clm.check_layout(targs, world=6)


def launch_in(cwd, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
           "2", "--main_process_port", str(free_port()),
           os.path.join(ROOT, "trainer_examples", "finetune_llama.py"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--comm_compressor", "sdp4bt"], "Did you mean 'sdp4bit'"),
    (["--comm_compressor", "sdp4bit", "--ranks_per_node", "3"], "finetune_llama.py: error: "
     "--ranks_per_node: world size 2 cannot be split into nodes of ranks_per_node=3 ranks"),
])
def test_launched_mistake_one_message_no_files(tmp_path, args, message):
    """Two launched processes: the message once (rank 0), a failing exit status, and no
    tokenizer, corpus or output folder left behind."""
    proc = launch_in(tmp_path, *args)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert log.count(message) == 1, log[-3000:]
    assert log.count(": error:") == 1, log[-3000:]
    assert os.listdir(tmp_path) == []
