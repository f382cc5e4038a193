"""Single-process parts of hfcompress.comm: layout errors, slice order, wire meter, streams."""

import pytest
import torch

from hfcompress import get_compressor
from hfcompress.comm import WireMeter, resolve_ranks_per_node, slice_order
from hfcompress.comm.hop import RawCodec
from hfcompress.comm.streams import Streams
from hfcompress.comm.two_hop import _chunk_bounds, rotated_pair


def test_ranks_per_node_resolution(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert resolve_ranks_per_node(8) == 8            # no launcher info: one node
    assert resolve_ranks_per_node(8, 4) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert resolve_ranks_per_node(8) == 2
    assert resolve_ranks_per_node(8, 8) == 8          # explicit beats the environment


@pytest.mark.parametrize("world,rpn", [(6, 4), (4, 3), (8, 0), (8, -2), (8, 2.0), (8, True)])
def test_bad_layout_says_what_would_work(monkeypatch, world, rpn):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError) as e:
        resolve_ranks_per_node(world, rpn)
    divs = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
    assert f"world size {world}" in str(e.value) and repr(rpn) in str(e.value)
    assert divs in str(e.value)


def test_bad_local_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"world size 4 .*LOCAL_WORLD_SIZE=3.*1, 2, 4"):
        resolve_ranks_per_node(4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='two' is not an integer"):
        resolve_ranks_per_node(4)


def test_slice_order_zeropp_eq2():
    # ZeRO++ B.3.2: 2 nodes x 2 GPUs swaps slices 1 and 2 (Fig. 9)
    assert slice_order(2, 2) == [0, 2, 1, 3]
    assert slice_order(4, 2) == [0, 4, 1, 5, 2, 6, 3, 7]
    assert slice_order(2, 3) == [0, 2, 4, 1, 3, 5]
    assert slice_order(3, 1) == [0, 1, 2] and slice_order(1, 3) == [0, 1, 2]
    for x, y in [(2, 2), (4, 2), (2, 3), (3, 4)]:
        order = slice_order(x, y)
        assert sorted(order) == list(range(x * y))
        # the Y slices that local rank l receives are exactly the shards of ranks {n*X + l}
        for l in range(x):
            assert order[l * y:(l + 1) * y] == [n * x + l for n in range(y)]


def test_chunk_bounds_cover_uneven_sizes():
    assert _chunk_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert _chunk_bounds(2, 4) == [(0, 1), (1, 2)]      # never an empty chunk
    assert _chunk_bounds(0, 4) == []
    assert _chunk_bounds(7, 1) == [(0, 7)]


def test_wire_meter_steps_and_summary():
    m = WireMeter()
    m.record("ag", 100, 40)
    m.record("ag", 100, 40)
    m.record_sends("rs", [5, 7, 11, 13], remote=[False, False, True, True], me=1)
    cur = m.current()
    assert cur["collectives"]["ag"] == {"intra_bytes": 200, "inter_bytes": 80, "calls": 2}
    assert cur["collectives"]["rs"] == {"intra_bytes": 5, "inter_bytes": 24, "calls": 1}
    assert (cur["intra_bytes"], cur["inter_bytes"]) == (205, 104)
    done = m.step()
    assert done == cur and m.current()["intra_bytes"] == 0
    m.record("ag", 1, 2)
    s = m.summary()
    assert s["steps"] == 1 and s["last_step"] == done
    assert s["total"]["collectives"]["ag"] == {"intra_bytes": 201, "inter_bytes": 82, "calls": 3}
    assert (s["total"]["intra_bytes"], s["total"]["inter_bytes"]) == (206, 106)
    m.reset()
    assert m.summary()["steps"] == 0 and m.summary()["total"]["intra_bytes"] == 0


def test_wire_meter_keeps_recent_steps_counts_all_and_discards_current():
    m = WireMeter(keep=3)
    for i in range(5):
        m.record("ag", i, 10 * i)
        m.step()
    assert m.steps == 5 and [h["intra_bytes"] for h in m.history] == [2, 3, 4]
    m.record("eval", 1000, 1000)
    m.discard()                                     # evaluation traffic: not a step
    s = m.summary()
    assert s["steps"] == 5 and s["last_step"]["intra_bytes"] == 4
    assert s["total"]["intra_bytes"] == 10 and s["total"]["inter_bytes"] == 100
    assert s["total"]["collectives"] == {"ag": {"intra_bytes": 10, "inter_bytes": 100,
                                                "calls": 5}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_raw_codec_is_exact(dtype):
    raw = RawCodec()
    x = torch.randn(37).to(dtype)
    p = raw.compress(x)
    q = raw.unflatten(p.flat(), x.shape, dtype)
    assert p.nbytes() == 37 * x.element_size() and torch.equal(raw.decompress(q), x)
    assert torch.equal(raw.reduce([q, q]), 2 * x.float())


def test_streams_keep_one_instance_per_key_for_stateful_schemes():
    qwd = get_compressor("qwd")
    s = Streams(qwd)
    assert s[0] is s[0] and s[0] is not s[1] and s[0] is not qwd
    s.check_layout((2, 10))
    with pytest.raises(ValueError, match="layout"):
        s.check_layout((4, 5))
    s[0].decompress(s[0].compress(torch.ones(10)))
    state = s.state_dict()
    t = Streams(qwd)
    t.load_state_dict(state)
    assert torch.equal(t[0].reference, torch.ones(10)) and t[1].reference is None
    stateless = Streams(get_compressor("int", rounding="stochastic", backend="torch"))
    assert stateless[0] is stateless[1] is stateless.compressor
    # a shared stateless compressor's own state (its RNG) is checkpointed too
    stateless[0].compress(torch.randn(300))
    state = stateless.state_dict()
    a = stateless[0].compress(torch.randn(300, generator=torch.Generator().manual_seed(1)))
    stateless.load_state_dict(state)
    b = stateless[0].compress(torch.randn(300, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(a.payload["codes"], b.payload["codes"])


def test_rotated_pair_needs_two_hadamard_hops_of_one_size():
    h8 = get_compressor("hadamard", bits=8, group_size=128, hadamard_size=32)
    h4 = get_compressor("hadamard", bits=4, group_size=128, hadamard_size=32)
    assert rotated_pair(h8, h4)
    assert not rotated_pair(h8, get_compressor("hadamard", bits=4, hadamard_size=16))
    assert not rotated_pair(get_compressor("int", bits=8), h4)
    assert not rotated_pair(None, h4)
