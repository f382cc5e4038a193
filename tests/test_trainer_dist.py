"""``hfcompress.Trainer`` across 2 gloo processes: the real Hugging Face Trainer with FSDP2 and
DDP (workers in ``trainer_workers.py``, all in one launch: the ranks import torch,
transformers and accelerate once)."""

from __future__ import annotations

import math

import pytest

import trainer_workers as tw
from dist_utils import run_jobs

PRESETS = ["none", "sdp4bit", "tlq_hs", "zeropp", "loco"]
STEPS = 10


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Rank 0's results of every worker, one launch of 2 ranks."""
    def d(name):
        return str(tmp_path_factory.mktemp(name))
    keys = ("presets", "resume", "loco", "auto")
    out = run_jobs(2, (tw.presets_worker, d("presets"), PRESETS), (tw.resume_worker, d("resume")),
                   (tw.loco_models_worker, d("loco")), (tw.auto_worker, d("auto")), timeout=1200)
    return {k: ranks[0] for k, ranks in zip(keys, out)}


@pytest.fixture(scope="module")
def presets(runs):
    return runs["presets"]


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_presets_train_near_uncompressed(presets, kind):
    """Every preset trains the tiny LLaMA like the exact run. Over 10 steps the loss falls by
    ~1.0 (5.57 -> 4.53); the compressed runs stay within 0.05 of the exact run at every step
    (observed: <= 0.025; the compressors' errors are 4-8 bit, so a larger gap is a bug)."""
    exact = presets[kind, "none"]["losses"]
    assert len(exact) == STEPS and exact[STEPS] < exact[1] - 0.8, exact
    for preset in PRESETS[1:]:
        got = presets[kind, preset]["losses"]
        gap = max(abs(got[s] - exact[s]) for s in exact)
        assert gap < 0.05, (kind, preset, gap)
        assert gap > 1e-4, f"{kind} {preset}: losses equal the exact run, nothing compressed?"
        assert presets[kind, preset]["sharded"] == ("FSDPLlamaForCausalLM" if kind == "fsdp"
                                                    else "DistributedDataParallel")


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_logged_bytes_match_the_wire_meter(presets, kind):
    """What reaches on_log (TensorBoard / W&B see the same dict) equals the wire meters summed
    over the ranks, step by step, to the byte; 'none' compresses nothing (ratio exactly 1)."""
    for preset in PRESETS:
        run = presets[kind, preset]
        assert len(run["comm"]) == len(run["meter"]) == STEPS, (kind, preset)
        for logged, (intra, inter) in zip(run["comm"], run["meter"]):
            assert logged["comm/intra_node_bytes"] == intra
            assert logged["comm/inter_node_bytes"] == inter
            assert logged["comm/time_s"] > 0       # measured (never asserted as a bound)
        final = run["final"]
        assert final["comm/total_bytes"] == sum(a + b for a, b in run["meter"])
        ratios = [c["comm/compression_ratio"] for c in run["comm"]]
        if preset == "none":
            assert all(r == 1.0 for r in ratios)
            assert final["comm/total_bytes_saved"] == 0
        else:
            assert final["comm/total_bytes_saved"] > 0
    # FSDP on 2 emulated nodes: everything crosses nodes; DDP on one node: nothing does
    busy, idle = ("comm/inter_node_bytes", "comm/intra_node_bytes") if kind == "fsdp" else \
        ("comm/intra_node_bytes", "comm/inter_node_bytes")
    assert all(c[busy] > 0 and c[idle] == 0 for p in PRESETS for c in presets[kind, p]["comm"])


def test_compression_ratios(presets):
    """Steady-state ratios against the uncompressed collectives (fp32 model, no mixed
    precision). DDP: 4-bit gradients + one fp32 scale per 128 values, ~32 / 4.3 = 7.4.
    FSDP gradient-only presets: two exact weight all-gathers per step (forward, backward) and
    a 4-bit reduce-scatter, (64 + 32) / (64 + 4.3) = 1.41. sdp4bit: qWD 4-bit weights (group
    2048) forward and only a flag backward, at most 96 / (4.02 + 4.25) = 11.6 (norms exact:
    a little less); zeropp: int8 weights, hpZ keeps the gathered weights for backward."""
    last = {key: run["comm"][-1]["comm/compression_ratio"] for key, run in presets.items()}
    for preset in PRESETS[1:]:
        assert 7.0 < last["ddp", preset] < 7.6, (preset, last["ddp", preset])
    for preset in ("tlq_hs", "loco"):
        assert 1.35 < last["fsdp", preset] < 1.5, (preset, last["fsdp", preset])
    assert 10.0 < last["fsdp", "sdp4bit"] < 11.6
    assert 4.5 < last["fsdp", "zeropp"] < 6.0


def test_loco_uses_the_loco_optimizer(presets):
    """comm_compressor='loco' trains with LoCoAdamW, which advanced every LoCo stream's reset
    clock once per optimizer step; other presets keep torch's AdamW."""
    for kind in ("fsdp", "ddp"):
        assert presets[kind, "loco"]["optimizer"] == "LoCoAdamW"
        assert presets[kind, "loco"]["loco_steps"] == [STEPS]
        assert presets[kind, "sdp4bit"]["optimizer"] == "AdamW"


def test_resume_continues_the_same_trajectory(runs):
    """Save at step 3, resume, compare steps 4-6 with the uninterrupted run: equal to 1e-6
    (FSDP2 + sdp4bit: qWD references and stochastic-rounding RNG; DDP + LoCo with DDP's bucket
    rebuild: LoCo errors). Without the compressor files (comm_state_mismatch='reset', which
    warns) the trajectory moves by > 2e-5: the restored state is what makes them equal.
    Another compressor's checkpoint is a clear error naming what differs."""
    out = runs["resume"]
    for kind, preset in (("fsdp", "sdp4bit"), ("ddp", "loco")):
        assert out[kind, "files"] == ["hfcompress_rank0.pt", "hfcompress_rank1.pt"]
        full, resumed, reset = out[kind, "full"], out[kind, "resumed"], out[kind, "reset"]
        for step in (4, 5, 6):
            assert math.isclose(resumed[step], full[step], rel_tol=0, abs_tol=1e-6), \
                (kind, step, resumed[step], full[step])
        assert max(abs(reset[s] - full[s]) for s in (4, 5, 6)) > 2e-5, (kind, reset, full)
        # the run totals travel in the checkpoint: the resumed run's cover steps 1-6, byte
        # for byte the uninterrupted run's (the restored qWD references send differences)
        t_full, t_resumed = out[kind, "totals"]
        assert t_full["comm/total_steps"] == t_resumed["comm/total_steps"] == 6
        for key in ("bytes", "inter_node_bytes", "uncompressed_bytes"):
            assert t_resumed[f"comm/total_{key}"] == t_full[f"comm/total_{key}"] > 0, key
        assert t_resumed["comm/total_warmup_steps"] == 4     # each process start warms up
        assert any("comm_state_mismatch='reset'" in w and "no hfcompress compressor state" in w
                   for w in out[kind, "reset_warnings"]), out[kind, "reset_warnings"]
        other = out[kind, "other"]
        assert f"config.name: checkpoint {preset!r}, this run 'tlq_hs'" in other, other
        assert "comm_state_mismatch='reset'" in other


def test_resume_true_skips_a_checkpoint_cut_short_while_saving(runs):
    """With compressor state, ``resume_from_checkpoint=True`` skips a newest checkpoint that a
    run stopped while saving left without ``trainer_state.json`` (HF's True takes it and
    fails), with a warning, and continues checkpoint-3's trajectory; a checkpoint whose
    ``trainer_state.json`` is of another step is taken, and refused for its compressor state
    of step 6 (not called incomplete)."""
    out = runs["resume"]
    true, full = out["true"], out["fsdp", "full"]
    for step in (4, 5, 6):
        assert math.isclose(true["losses"][step], full[step], rel_tol=0, abs_tol=1e-6), step
    assert len(true["skipped"]) == 1 and "checkpoint-6: it has no trainer_state.json" in \
        true["skipped"][0], true["skipped"]
    refused = true["refused"]
    assert "hfcompress_rank0.pt was saved at global step 6, but training resumes at step 3" \
        in refused and "incomplete" not in refused, refused


def test_loco_optimizers_train_llama_and_mixtral(runs):
    """LoCo + AdamW / Adafactor under FSDP2 train both tiny models (loss falls by > 0.6 in 12
    steps; the LoCo clock advanced 12 times). Mixtral's fused 3-D experts
    (``experts.gate_up_proj`` / ``experts.down_proj``) are compressed: not exact in the layout,
    and their reduce-scattered gradients differ from the exact ones by a relative L2 error in
    (0.03, 0.4) (int4 absmax groups of 128 alone give ~0.11 for Gaussian-like values; LoCo adds
    the carried error; 0 would mean skipped). LoCoAdafactor on DTensors equals the unsharded
    Adafactor (FSDP2 vs DDP, exact collectives: 1e-5), and LoCo stays within 0.05 of it. A
    2-node preset on one node warns what it falls back to."""
    out = runs["loco"]
    for model in ("llama", "mixtral"):
        for optim, cls in (("adamw_torch", "LoCoAdamW"), ("adafactor", "LoCoAdafactor")):
            run = out[model, optim]
            assert run["optimizer"] == cls and run["loco_steps"] == [12]
            assert run["losses"][12] < run["losses"][1] - 0.6, (model, optim, run["losses"])
    experts = out["mixtral", "experts"]
    assert sorted(experts) == [f"model.layers.{i}.mlp.experts.{p}" for i in (0, 1)
                               for p in ("down_proj", "gate_up_proj")]
    assert not any(experts.values()), experts
    for name, err in out["mixtral", "grad_error"].items():
        assert 0.03 < err < 0.4, (name, err)
    fsdp, ddp = out["adafactor_none", "fsdp"], out["adafactor_none", "ddp"]
    assert all(abs(fsdp[s] - ddp[s]) < 1e-5 for s in ddp), (fsdp, ddp)
    loco = out["llama", "adafactor"]["losses"]
    assert max(abs(loco[s] - ddp[s]) for s in ddp) < 0.05
    warned = out["one_node_warnings"]
    assert len(warned) == 1 and "'tlq_hs' is built for several nodes" in warned[0]
    assert "gradients are sent hadamard 8-bit" in warned[0]


def test_auto_trains_and_resumes_its_saved_plan(runs):
    """``comm_compressor="auto"`` through the HF Trainer (FSDP2, 2 emulated nodes), plan
    pinned to qWD + 4-bit gradients; resumed from step 3 without the pin, the handle switches
    from its own probe's plan to the checkpoint's and steps 4-6 equal the uninterrupted
    run's (the qWD references and rounding streams were restored with it)."""
    out = runs["auto"]
    assert out["plans"] == ["weights=qwd grad_inter=hs4"] * 2, out["plans"]
    assert out["config"] == "auto: weights=qwd grad_inter=hs4"
    for step in (4, 5, 6):
        assert math.isclose(out["resumed"][step], out["full"][step], rel_tol=0, abs_tol=1e-6), \
            (step, out["resumed"], out["full"])
    assert {"chosen", "table", "links", "codecs", "history"} <= set(out["summary_keys"])
