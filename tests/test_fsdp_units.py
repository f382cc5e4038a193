"""The single-process parts of the FSDP2 integration: exact-column split/merge, the
settings comparison, per-stream seeds, decoder-layer discovery, hpZ's reshard value."""

import dataclasses
import pytest
import torch

import hfcompress
from hfcompress.compressors import get_compressor
from hfcompress.compressors.runs import take, view
from hfcompress.config import Scheme, get_config, is_exact
from hfcompress.integrations.consistency import differences, flatten, plain
from hfcompress.integrations.exact_params import Segment, SlotLayout
from hfcompress.compressors.registry import build_compressor as build, stream_seed
from hfcompress.cost.units import hpz_reshard
from hfcompress.integrations.fsdp import decoder_layers
from hfcompress.testing import llama


def test_is_exact_by_name_and_size():
    pats = ("norm", "bias")
    assert is_exact("model.layers.0.input_layernorm.weight", 4096, pats, 0)
    assert is_exact("fc.bias", 4096, pats, 0)
    assert not is_exact("fc.weight", 4096, pats, 0)
    assert is_exact("fc.weight", 1023, pats, 1024)        # QSDP: small tensors exact
    assert not is_exact("fc.weight", 1024, pats, 1024)


def test_slot_layout_split_merge_round_trip():
    segs = [Segment("a.weight", 5, False), Segment("a.norm", 3, True),
            Segment("b.weight", 4, False), Segment("b.bias", 2, True)]
    layout = SlotLayout(segs)
    assert layout.numel == 14 and layout.exact_numel == 5 and layout.mixed
    rows = torch.arange(3 * 14, dtype=torch.float32).reshape(3, 14)
    comp, exact = layout.split(rows)
    assert comp.shape == (3, 9) and exact.shape == (3, 5)
    assert torch.equal(exact[0], torch.tensor([5., 6., 7., 12., 13.]))
    assert torch.equal(comp[1], torch.tensor([14., 15., 16., 17., 18., 22., 23., 24., 25.]))
    out = torch.full_like(rows, float("nan"))
    layout.merge(out, comp, exact)
    assert torch.equal(out, rows)
    assert SlotLayout([Segment("n", 4, True)]).all_exact
    assert not SlotLayout([Segment("w", 4, False)]).mixed
    assert SlotLayout([]).numel == 0


@pytest.mark.parametrize("segs, spaced", [
    ([("q", 8, False), ("n", 4, True)], False),                    # a decoder layer (a cut)
    ([("e", 6, False), ("n", 2, True), ("h", 6, False)], True),      # a root unit: spaced
    ([("e", 6, False), ("n", 2, True), ("h", 6, False)], False),     # ... copied
    ([("w", 4, False), ("n", 2, True), ("v", 3, False), ("b", 1, True)], False)])  # 2 + 2 runs
def test_slot_layout_split_slot_is_split_of_one_row(segs, spaced):
    """An all-gather's slot split in one go: the values of ``split`` of its ``[1, S]`` row
    (compressed flat, or ``[count, length]`` spaced; exact one row), views where a set is
    one run, of a contiguous slot and of a strided one alike."""
    layout = SlotLayout([Segment(*s) for s in segs])
    base = torch.arange(2 * layout.numel, dtype=torch.float32)
    for slot in (base[layout.numel:], base.view(layout.numel, 2)[:, 0]):
        comp, exact = layout.split_slot(slot, spaced)
        ref_comp, ref_exact = layout.split(slot.reshape(1, -1), spaced)
        assert torch.equal(comp, ref_comp[0]) and torch.equal(exact, ref_exact)
        assert exact.shape == (1, layout.exact_numel)
        if slot.is_contiguous() and len(layout.exact_runs) == 1:
            assert exact.data_ptr() == slot[layout.exact_runs[0][0]:].data_ptr()
        if slot.is_contiguous() and (len(layout.compressed_runs) == 1 or spaced):
            assert comp.data_ptr() == slot.data_ptr()
    if spaced:
        assert comp.shape == (2, 6)


def test_slot_layout_adjacent_segments_form_one_run_split_as_views():
    # a decoder layer: projections first, norms last -> one compressed run, one exact run
    segs = [Segment("q", 4, False), Segment("k", 4, False), Segment("norm1", 2, True),
            Segment("norm2", 2, True), Segment("empty", 0, False)]
    layout = SlotLayout(segs)
    assert layout.compressed_runs == ((0, 8),) and layout.exact_runs == ((8, 12),)
    rows = torch.arange(2 * 12, dtype=torch.float32).reshape(2, 12)
    comp, exact = layout.split(rows)
    assert comp.data_ptr() == rows.data_ptr()            # a view, no copy
    assert torch.equal(comp, rows[:, :8]) and torch.equal(exact, rows[:, 8:])
    out = torch.zeros_like(rows)
    layout.merge(out, comp * 2, exact * 3)
    assert torch.equal(out, torch.cat([rows[:, :8] * 2, rows[:, 8:] * 3], dim=1))
    # one run of a 1-D buffer (a reduce-scatter's output): a slice of it; none where two
    flat = rows[0]
    for runs in (layout.compressed_runs, layout.exact_runs):
        got = view(flat, runs)
        assert got.data_ptr() == flat[runs[0][0]:].data_ptr()
        assert torch.equal(got, take(flat.view(1, -1), runs).view(-1))
    assert view(flat, ((0, 2), (8, 10))) is None and view(flat, ()).numel() == 0
    # views(): both sets of rows or of a flat buffer as writable views (one torch call)
    for t in (rows, flat):
        c, e = layout.views(t)
        assert c.data_ptr() == t.data_ptr() and torch.equal(c, t[..., :8])
        assert e.data_ptr() == t[..., 8:].data_ptr() and torch.equal(e, t[..., 8:])
    # exact columns first or between two compressed runs: views only for a one-run set
    split = SlotLayout([Segment("w", 4, False), Segment("n", 2, True), Segment("v", 3, False)])
    c, e = split.views(torch.zeros(2, 9))
    assert c is None and e.shape == (2, 2)
    first = SlotLayout([Segment("n", 2, True), Segment("w", 4, False)])
    t = torch.arange(6.)
    c, e = first.views(t)
    assert torch.equal(c, t[2:]) and torch.equal(e, t[:2])
    comp, exact = first.split(t.view(1, -1))
    assert torch.equal(comp, c.view(1, -1)) and torch.equal(exact, e.view(1, -1))


def test_differences_name_keys_and_ranks():
    a = get_config("sdp4bit").to_dict()
    b = dataclasses.replace(get_config("sdp4bit"), grad_inter=Scheme(
        "hadamard", {"bits": 8, "group_size": 128, "hadamard_size": 32})).to_dict()
    assert differences([a, a, a]) == []
    lines = differences([{"config": a, "x": 1}, {"config": b, "x": 1}, {"config": a, "x": 2}])
    assert lines == ["  config.grad_inter.params.bits: rank 0: 4, rank 1: 8, rank 2: 4",
                     "  x: rank 0: 1, rank 1: 1, rank 2: 2"]
    assert differences([{"k": 1}, {}]) == ["  k: rank 0: 1, rank 1: <missing>"]
    # compressor-valued parameters compare by their config, not by identity
    s1 = {"inner": get_compressor("int", bits=4)}
    s2 = {"inner": get_compressor("int", bits=4)}
    assert differences([s1, s2]) == []
    assert flatten(plain(s1))["inner.bits"] == 4


def test_stream_seeds_and_build():
    seeds = {stream_seed(0, r, m, d) for r in range(4) for m in range(3) for d in ("w", "g")}
    assert len(seeds) == 24 and all(0 <= s < 2 ** 63 for s in seeds)
    assert stream_seed(0, 1, 2, "w") == stream_seed(0, 1, 2, "w")
    g = Scheme("int", {"bits": 4, "group_size": 128, "rounding": "stochastic"})
    c1, c2 = build(g, 0, 0, 0, "grad"), build(g, 0, 1, 0, "grad")
    assert c1.params["seed"] != c2.params["seed"]
    x = torch.randn(4096)
    assert not torch.equal(c1.decompress(c1.compress(x)), c2.decompress(c2.compress(x)))
    # an explicit seed in the scheme is the base instead of the config's
    assert build(Scheme("int", {"seed": 7}), 0, 0, 0, "g").params["seed"] == \
        stream_seed(7, 0, 0, "g")
    assert build(Scheme("qwd"), 0, 0, 0, "w").name == "qwd"       # no seed parameter
    assert build(None, 0) is None


def test_decoder_layers_and_hpz_reshard():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP
    model = llama(None, vocab_size=64, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2)
    layers = decoder_layers(model)
    assert len(layers) == 3 and all(isinstance(m, LlamaDecoderLayer) for m in layers)
    assert len(decoder_layers(model, (LlamaMLP,))) == 3
    assert hpz_reshard(1, 4) is False and hpz_reshard(4, 4) is True and hpz_reshard(2, 8) == 2


def test_apply_needs_torch_distributed():
    with pytest.raises(RuntimeError, match="torch.distributed to be initialized"):
        hfcompress.apply(torch.nn.Linear(2, 2), "sdp4bit")
