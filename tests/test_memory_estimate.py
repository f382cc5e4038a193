"""``comm/memory.py``: the per-rank state estimate and the CUDA free-memory check."""

import pytest
import torch

from hfcompress.comm import memory


def test_estimate_follows_the_layout():
    shards = [1000, 3000]                       # compressed values per rank of two units
    bf16 = torch.bfloat16
    # qWD: Y = world / ranks_per_node slots per unit, bf16
    est = memory.estimate_state_bytes("sdp4bit", shards, 8, 2, bf16)
    assert est == {"references": 4 * 4000 * 2, "errors": 0, "buffers": 0}
    assert memory.estimate_state_bytes("sdp4bit", shards, 8, 2, bf16, shard_references=False) \
        ["references"] == 8 * 4000 * 2
    assert memory.estimate_state_bytes("qwd", shards, 8, 1, bf16)["references"] == 8 * 4000 * 2
    # LoCo 1-hop: every row of 1000 / 3000 values padded to 128, + a float32 scale per 128
    loco = memory.estimate_state_bytes("loco", shards, 4, 2, bf16)
    assert loco["errors"] == 4 * (1024 + 32) + 4 * (3072 + 96) and loco["references"] == 0
    # LoCo on the 2-hop intra hop: X parts of Y * s values
    lz = memory.estimate_state_bytes("loco_zeropp", [1000], 4, 2, bf16)
    assert lz["errors"] == 2 * (2048 + 64)
    for lean in memory.LEAN_PRESETS:
        assert sum(memory.estimate_state_bytes(lean, shards, 8, 2, bf16).values()) == 0


def test_cuda_check_names_presets_that_fit(monkeypatch):
    free = 10 * 2 ** 20
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 8 * free))
    cuda = torch.device("cuda", 0)
    small = memory.check_fits("sdp4bit", [1000], 8, 8, torch.bfloat16, cuda)
    assert small["references"] == 2000
    with pytest.raises(ValueError, match=r"(?s)preset 'sdp4bit' keeps .* GiB .* only 0.01 GiB "
                                         r"is free on cuda:0.*'zeropp', 'tlq_hs'"):
        memory.check_fits("sdp4bit", [2 ** 24], 8, 1, torch.bfloat16, cuda)
    # on CPU nothing is checked
    memory.check_fits("sdp4bit", [2 ** 40], 8, 1, torch.bfloat16, torch.device("cpu"))
