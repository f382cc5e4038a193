"""The per-rank state estimate (``cost/state.py``: each scheme declares its state) and the
CUDA free-memory check (``integrations/memory.py``), which every rank passes or refuses
together."""

import pytest
import torch

from dist_utils import run_distributed
from hfcompress.cost import state
from hfcompress.integrations import memory


def test_estimate_follows_the_layout():
    shards = [1000, 3000]                       # compressed values per rank of two units
    bf16 = torch.bfloat16
    # qWD: Y = world / ranks_per_node slots per unit, bf16
    est = state.estimate_state_bytes("sdp4bit", shards, 8, 2, bf16)
    assert est == {"references": 4 * 4000 * 2, "errors": 0, "buffers": 0}
    assert state.estimate_state_bytes("sdp4bit", shards, 8, 2, bf16, shard_references=False) \
        ["references"] == 8 * 4000 * 2
    assert state.estimate_state_bytes("qwd", shards, 8, 1, bf16)["references"] == 8 * 4000 * 2
    # LoCo with one rank per node (1 hop): every row of 1000 / 3000 values padded to 128,
    # + a float32 scale per 128
    loco = state.estimate_state_bytes("loco", shards, 4, 1, bf16)
    assert loco["errors"] == 4 * (1024 + 32) + 4 * (3072 + 96) and loco["references"] == 0
    # LoCo on both 2-hop hops: X parts of Y * s values, then Y partial sums of s
    intra, inter = 2 * (2048 + 64) + 2 * (6016 + 188), 2 * (1024 + 32) + 2 * (3072 + 96)
    assert state.estimate_state_bytes("loco", shards, 4, 2, bf16)["errors"] == intra + inter
    lz = state.estimate_state_bytes("loco_zeropp", [1000], 4, 2, bf16)
    assert lz["errors"] == 2 * (2048 + 64) + 2 * (1024 + 32)
    for lean in ("zeropp", "tlq_hs"):
        assert sum(state.estimate_state_bytes(lean, shards, 8, 2, bf16).values()) == 0


def test_frozen_values_keep_references_but_no_error_feedback():
    """LoRA: the frozen base weights are referenced (qWD gathers them) but send no gradient,
    so LoCo keeps errors for the trainable values only."""
    shards, bf16 = [1000, 3000], torch.bfloat16
    lora = state.estimate_state_bytes("loco", shards, 4, 2, bf16, grad_numels=[0, 128])
    assert lora["errors"] == 2 * (256 + 8) + 2 * (128 + 4) and lora["references"] == 0
    assert state.estimate_state_bytes("sdp4bit", shards, 8, 2, bf16, grad_numels=[0, 0]) == \
        state.estimate_state_bytes("sdp4bit", shards, 8, 2, bf16)


def test_cuda_check_names_presets_that_fit(monkeypatch):
    free = 10 * 2 ** 20
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 8 * free))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * 2 ** 20)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 ** 20)
    cuda = torch.device("cuda", 0)
    small = memory.check_fits("sdp4bit", [1000], 8, 8, torch.bfloat16, cuda)
    assert small["references"] == 2000
    # cached-but-free blocks count: 10 MiB free + 2 MiB cached = 0.01 GiB
    with pytest.raises(ValueError, match=r"(?s)preset 'sdp4bit' keeps .* GiB .* only 0.01 GiB "
                                         r"is free on cuda .*not allocated yet.*'tlq_hs'"):
        memory.check_fits("sdp4bit", [2 ** 24], 8, 1, torch.bfloat16, cuda)
    # the optimizer's headroom alone can tip it: 11.5 MiB of state fits in 12 MiB, not with
    # Adam's 2 x fp32 for 2**17 values (1 MiB) on top (8 slots x 753664 bf16 values)
    fits = memory.check_fits("qwd", [753664], 8, 1, torch.bfloat16, cuda)
    assert state.total(fits) < 12 * 2 ** 20
    with pytest.raises(ValueError, match="optimizer state"):
        memory.check_fits("qwd", [753664], 8, 1, torch.bfloat16, cuda,
                          param_numel=2 ** 17)
    # on CPU nothing is checked
    memory.check_fits("sdp4bit", [2 ** 40], 8, 1, torch.bfloat16, torch.device("cpu"))


def refusal_on_one_rank(rank: int, world: int) -> str | None:
    """Rank 1 alone lacks memory (injected ``available``): every rank must raise the same
    error, none may go on to the collectives the others would wait in."""
    available = 2 ** 40 if rank == 0 else 2 ** 10
    try:
        memory.check_fits("sdp4bit", [2 ** 20], world, 1, torch.bfloat16, torch.device("cpu"),
                          available=available)
    except ValueError as err:
        return str(err)
    return None


def test_refusal_is_agreed_by_every_rank():
    msgs = run_distributed(refusal_on_one_rank, 2)
    assert msgs[0] is not None and msgs[0] == msgs[1], msgs
    assert "0.00 GiB is free" in msgs[0]
