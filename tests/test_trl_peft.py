"""TRL's ``SFTTrainer`` with ``hfcompress.CompressionMixin`` on 2 gloo processes under FSDP2
(workers in ``trl_peft_workers.py``, both in one launch)."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("trl")

import trl_peft_workers as tw  # noqa: E402
from dist_utils import run_jobs  # noqa: E402

HAS_PEFT = importlib.util.find_spec("peft") is not None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Rank 0's results: the SFT worker, and the LoRA worker if peft is installed."""
    jobs = [(tw.sft_worker, str(tmp_path_factory.mktemp("sft")))]
    if HAS_PEFT:
        jobs.append((tw.lora_worker,))
    return [ranks[0] for ranks in run_jobs(2, *jobs, timeout=800)]


def test_sft_trainer_with_the_mixin(runs):
    """``class X(hfcompress.CompressionMixin, SFTTrainer)`` with ``SFTConfig`` and
    ``comm_compressor="sdp4bit"``: FSDP2-sharded, trains like the exact run (losses within
    0.05 at every step, as hfcompress.Trainer's presets; not equal: it compressed), the logged
    bytes are the wire meters' and ~10x fewer than the uncompressed collectives'. A model
    already sharded by ``hfcompress.apply`` is refused, naming what to do."""
    out = runs[0]
    exact, got = out["none"]["losses"], out["sdp4bit"]["losses"]
    assert len(exact) == 8 and exact[8] < exact[1] - 0.5, exact
    gap = max(abs(got[s] - exact[s]) for s in exact)
    assert 1e-4 < gap < 0.05, (gap, exact, got)
    for preset in ("none", "sdp4bit"):
        run = out[preset]
        assert run["sharded"] == "FSDPLlamaForCausalLM" and run["trainer"] == "CompressionMixin"
        assert len(run["comm"]) == len(run["meter"]) == 8
        for logged, (intra, inter) in zip(run["comm"], run["meter"]):
            assert logged["comm/inter_node_bytes"] == inter > 0 and intra == 0
    ratios = [c["comm/compression_ratio"] for c in out["sdp4bit"]["comm"]]
    assert all(r == 1.0 for r in (c["comm/compression_ratio"] for c in out["none"]["comm"]))
    assert ratios[-1] > 5, ratios
    assert "already fully_shard-ed" in out["applied"] and \
        "pass the unsharded model" in out["applied"], out["applied"]


def test_lora_frozen_weights_cost_no_inter_node_bytes(runs):
    """LoRA (peft, r=8 on q/v) under sdp4bit, FSDP2 on 2 emulated nodes: after the exact
    first all-gather, the frozen base weights' differences are not sent. Inter-node bytes of
    steps 2-4 (weights and gradients, all ranks) <= 5% of the path that sends them, and the
    losses are bit-identical (the same computation: the unsent bytes are rebuilt exactly), also
    with asynchronous all-gathers and node-sharded references."""
    if not HAS_PEFT:
        pytest.skip("needs peft")
    out = runs[1]
    frozen, today = out["frozen"], out["today"]
    assert frozen["losses"] == today["losses"], (frozen["losses"], today["losses"])
    # also with asynchronous prefetched all-gathers, and with node-sharded references (one
    # node of 2 ranks: the rebuilt slots gathered inside the node)
    assert out["frozen_async"] == today["losses"]
    assert out["frozen_one_node"] == out["today_one_node"]
    # step 1: exact gathers (the frozen norms, in the references now, skip the backward one)
    assert 0.99 * today["inter"][0] < frozen["inter"][0] <= today["inter"][0]
    for new, old in zip(frozen["inter"][1:], today["inter"][1:]):
        assert 0 < new <= 0.05 * old, (new, old, new / old)
    print(f"LoRA sdp4bit inter-node bytes per step: {frozen['inter']} (frozen path), "
          f"{today['inter']} (sending them); trainable {frozen['trainable']} of "
          f"{frozen['params']} parameters")
