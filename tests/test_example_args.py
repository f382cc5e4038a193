"""trainer_examples argument handling: default output folders per model / preset / engine /
mesh, the mesh flags as Accelerate's ``ParallelismConfig`` / transformers'
``DistributedConfig``, and mistakes caught before any work (one message on rank 0, nothing
written)."""

import os
import subprocess
import warnings
import sys

import pytest

from hfcompress.testing import free_port
from test_examples import ROOT

sys.path.insert(0, os.path.join(ROOT, "trainer_examples"))
import clm  # noqa: E402
import mesh_args  # noqa: E402
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
    (4, False, ["--dp_replicate_size", "2", "--comm_compressor", "sdp4bit"],
     "runs/llama-sdp4bit-hsdp2"),
    (4, False, ["--tp_size=2", "--comm_compressor", "none"], "runs/llama-none-tp2"),
    (4, False, ["--dp_shard_size", "4"], "runs/llama-plain"),     # FSDP2 over the 4
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


def parse_on(world: int, monkeypatch, *argv: str):
    """:func:`parse` as if ``world`` processes were launched (this process stays alone)."""
    monkeypatch.setattr(clm, "launched_world_size", lambda: world)
    return parse(*argv)


def test_mesh_flags_become_parallelism_config(monkeypatch):
    """HSDP: Accelerate's ParallelismConfig with FSDP2 turned on; TP: the same sizes as the
    DistributedConfig the model is loaded with (transformers shards it, no --fsdp);
    --dp_shard_size alone: FSDP2 over the world; no flags: no mesh."""
    _, _, targs = parse_on(4, monkeypatch, "--dp_replicate_size", "2", "--dp_shard_size", "2",
                           "--comm_compressor", "sdp4bit", "--ranks_per_node", "2")
    pc = targs.parallelism_config
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.tp_size) == (2, 2, 1)
    assert targs.fsdp and targs.fsdp_config["version"] == 2
    assert mesh_args.distributed_config(pc) is None
    assert mesh_args.mesh_shape(pc) == {"dp_replicate": 2, "dp_shard": 2}
    _, _, targs = parse_on(4, monkeypatch, "--dp_replicate_size", "2")   # shards: the rest
    assert targs.parallelism_config.dp_shard_size == 2
    margs, _, targs = parse_on(4, monkeypatch, "--tp_size", "2", "--model_name_or_path",
                               "org/tiny-llama", "--comm_compressor", "sdp4bit")
    pc = targs.parallelism_config
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.tp_size) == (1, 2, 2)
    assert not targs.fsdp
    dc = mesh_args.distributed_config(pc)
    assert (dc.tp_size, dc.fsdp_size, dc.dp_replicate_size) == (2, 2, 1)
    assert mesh_args.mesh_shape(pc) == {"dp_shard": 2, "tp": 2}
    _, _, targs = parse_on(4, monkeypatch, "--tp_size", "2", "--model_name_or_path", "org/m",
                           "--save_strategy", "steps", "--save_only_model")   # weights only
    assert targs.save_only_model
    _, _, targs = parse_on(4, monkeypatch, "--dp_shard_size", "4")
    assert targs.parallelism_config is None and targs.fsdp
    _, _, targs = parse_on(4, monkeypatch)
    assert targs.parallelism_config is None and not targs.fsdp


@pytest.mark.parametrize("world, argv, message", [
    (4, ["--dp_replicate_size", "3"], r"3 x 1 x 1 = 3, but 4 process\(es\) were launched"),
    (1, ["--dp_replicate_size", "2", "--dp_shard_size", "2"], r"but 1 process\(es\)"),
    (8, ["--dp_replicate_size", "2", "--tp_size", "2", "--model_name_or_path", "org/m"],
     r"HSDP beside TP\) is not supported"),
    (4, ["--tp_size", "2"], r"--tp_size needs --model_name_or_path"),
    (4, ["--tp_size", "2", "--model_name_or_path", "smollm2-135m"], r"not a \.gguf file"),
    (4, ["--tp_size", "2", "--model_name_or_path", "org/m", "--fsdp"], r"drop --fsdp"),
    (4, ["--dp_replicate_size", "4"], r"leaves dp_shard_size 1.*replicas alone are DDP"),
    (4, ["--tp_size", "4", "--model_name_or_path", "org/m"], r"TP alone has no data-parallel"),
    (4, ["--tp_size", "0"], r"must be >= 1"),
    (4, ["--tp_size", "2", "--model_name_or_path", "org/m", "--save_strategy", "steps"],
     r"cannot save a TP model's optimizer state; add --save_only_model"),
    (4, ["--tp_size", "2", "--model_name_or_path", "org/m", "--resume_from_checkpoint",
         "latest"], r"cannot resume a TP model's optimizer state"),
])
def test_mesh_mistakes_raise_one_clear_error(monkeypatch, world, argv, message):
    with pytest.raises(clm.ArgumentError, match=message):
        parse_on(world, monkeypatch, *argv)


def test_tp_size_must_divide_the_heads():
    from transformers import LlamaConfig

    config = LlamaConfig(num_attention_heads=4, num_key_value_heads=1)
    mesh_args.check_tp_heads(config, 1)
    with pytest.raises(ValueError, match=r"--tp_size 2 does not divide the model's "
                       r"num_key_value_heads = 1 \(each TP rank holds whole heads\)"):
        mesh_args.check_tp_heads(config, 2)


def test_tp_view_warnings_silenced_for_audited_models_only():
    """The three TP units' warnings (the messages FSDP2 gives in a dp_shard 2 x tp 2 run of
    finetune_llama.py) go quiet for LLaMA; a decoder layer's, or any unit of a model type
    nobody checked, still warns."""
    from transformers import GPT2Config, LlamaConfig

    text = ("FSDP2-wrapped module ({}) returned a view tensor. An in-place op on this view "
            "(e.g., `x += y`) will silently drop the pre-backward hook")
    units = ["FSDPEmbedding", "FSDPLlamaRMSNorm, FSDPLinear", "FSDPLlamaForCausalLM"]

    def heard(config, unit):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mesh_args.quiet_tp_view_warnings(config)
            warnings.warn(text.format(unit), UserWarning)
        return len(caught)

    assert [heard(LlamaConfig(), u) for u in units] == [0, 0, 0]
    assert heard(LlamaConfig(), "FSDPLlamaDecoderLayer") == 1
    assert [heard(GPT2Config(), u) for u in units] == [1, 1, 1]
