"""``hfcompress.config``: every configuration value is immutable (a preset edited in a notebook
must not change the next run's), editing is ``dataclasses.replace``, and dicts written before
configs froze still read."""

import copy
import dataclasses
import pickle

import pytest

from hfcompress.config import (PRESETS, AutoSettings, CompressionConfig, LoCoSettings, Scheme,
                               get_config, list_presets, request_dict, resolve, upgrade_dict)


def _schemes(cfg):
    return [s for s in (cfg.weights, cfg.grad_intra, cfg.grad_inter, cfg.all_reduce)
            if s is not None]


@pytest.mark.parametrize("name", list_presets())
def test_no_preset_can_be_edited_in_place(name):
    cfg = get_config(name)
    before = get_config(name).to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 5
    for s in _schemes(cfg):
        with pytest.raises(TypeError):
            s.params["bits"] = 3               # read-only mapping
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.name = "int"
    if cfg.loco is not None:
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.loco.beta = 0.5
        with pytest.raises(TypeError):
            cfg.loco["beta"] = 0.5             # the dict edit of the bug report
    with pytest.raises(TypeError):
        PRESETS[name]["seed"] = 5
    assert get_config(name).to_dict() == before


def test_issue_examples_affect_only_their_copy():
    """The edits of the bug report, done the supported way: only that copy changes."""
    loco = dataclasses.replace(get_config("loco"), loco=LoCoSettings(beta=0.5))
    assert loco.loco.beta == 0.5
    assert get_config("loco").loco.beta == 0.2 and get_config("loco_zeropp").loco.beta == 0.2
    sdp = get_config("sdp4bit")
    hs2 = Scheme(sdp.grad_inter.name, {**sdp.grad_inter.params, "bits": 2})
    edited = dataclasses.replace(sdp, grad_inter=hs2)
    assert edited.grad_inter.params["bits"] == 2
    assert get_config("sdp4bit").grad_inter.params["bits"] == 4
    assert get_config("tlq_hs").grad_inter.params["bits"] == 4
    auto = AutoSettings(pins={"weights": "qwd"})
    with pytest.raises(TypeError):
        auto.pins["grad_inter"] = "hs4"
    assert dict(auto.pins) == {"weights": "qwd"}


def test_a_mutable_argument_is_copied_not_shared():
    params = {"bits": 4, "group_size": 128}
    s = Scheme("int", params)
    params["bits"] = 8
    assert s.params["bits"] == 4
    pins = {"weights": "qwd"}
    a = AutoSettings(pins=pins)
    pins["weights"] = "exact"
    assert a.pins["weights"] == "qwd"


def test_exact_patterns_must_be_a_sequence_of_names():
    with pytest.raises(TypeError, match=r"exact_patterns=\('norm',\)"):
        CompressionConfig(exact_patterns="norm")
    with pytest.raises(TypeError, match="strings"):
        CompressionConfig(exact_patterns=("norm", 3))
    assert CompressionConfig(exact_patterns=["norm"]).exact_patterns == ("norm",)


def test_values_compare_hash_pickle_and_copy():
    for name in list_presets():
        cfg = get_config(name)
        assert cfg == get_config(name) and hash(cfg) == hash(get_config(name))
        assert pickle.loads(pickle.dumps(cfg)) == cfg      # spawn arguments pickle
        assert copy.deepcopy(cfg) == cfg
    a = AutoSettings(pins={"weights": "qwd"}, reprobe_every=2)
    assert pickle.loads(pickle.dumps(a)) == a and hash(a) == hash(copy.deepcopy(a))
    assert Scheme("int", {"bits": 4}) != Scheme("int", {"bits": 8})


def test_to_dict_round_trips_and_old_dicts_read():
    for name in list_presets():
        cfg = get_config(name)
        d = cfg.to_dict()
        assert CompressionConfig.from_dict(d) == cfg
        # the dict of a checkpoint saved before configs froze carried "auto": None
        assert upgrade_dict({**d, "auto": None}) == d
        assert CompressionConfig.from_dict({**d, "auto": None}) == cfg
    loco = get_config("loco").to_dict()
    assert loco["loco"] == {"beta": 0.2, "reset_every": 512, "error_scale": "group"}
    assert loco["grad_inter"]["params"]["bits"] == 4
    # an old "auto" request: the defaults' fields plus the AutoSettings
    old_auto = {**CompressionConfig(name="auto").to_dict(), "auto": AutoSettings().to_dict()}
    assert upgrade_dict(old_auto) == request_dict(AutoSettings())
    assert CompressionConfig(loco={"beta": 0.3}).loco == LoCoSettings(beta=0.3)


def test_loco_wraps_every_gradient_hop_that_runs():
    """``loco`` is 2-hop (int4 nearest on both hops): with one rank per node only its
    inter-node hop runs, LoCo-wrapped (the former 1-hop preset); with several, LoCo wraps the
    intra-node hop and the inter-node one (LoCo-Zero++, 5.2). An exact first hop is refused."""
    loco = get_config("loco")
    assert loco.two_hop and loco.grad_intra == loco.grad_inter
    assert loco.grad_inter.params["rounding"] == "nearest"
    assert loco.loco_hops(1) == ("grad_inter",)
    assert loco.loco_hops(8) == get_config("loco_zeropp").loco_hops(2) == \
        ("grad_intra", "grad_inter")
    one_hop = dataclasses.replace(loco, grad_intra=None, two_hop=False)
    assert one_hop.loco_hops(8) == ("grad_inter",)
    built = {k: getattr(loco, k).build() for k in ("grad_intra", "grad_inter")}
    assert {k: c.name for k, c in loco.with_loco(built, 1).items()} == \
        {"grad_intra": "int", "grad_inter": "loco"}
    assert {k: c.name for k, c in loco.with_loco(built, 2).items()} == \
        {"grad_intra": "loco", "grad_inter": "loco"}
    assert loco.with_loco({**built, "grad_inter": None}, 2)["grad_inter"] is None
    assert get_config("ulq").with_loco(built, 2) == built           # no LoCo: as built
    with pytest.raises(ValueError, match="intra-node hop"):
        loco.with_loco({**built, "grad_intra": None}, 2)


def test_resolve_tells_a_config_from_the_auto_request():
    assert resolve("sdp4bit") == get_config("sdp4bit")
    cfg = get_config("qwd")
    assert resolve(cfg) is cfg
    assert resolve("auto") == AutoSettings()
    with pytest.raises(ValueError, match="Did you mean 'sdp4bit'"):
        resolve("sdp4bitt")


@pytest.mark.parametrize("field, value, error", [
    ("two_hop", "false", TypeError), ("hpz", 1, TypeError), ("min_numel", 1.5, TypeError),
    ("min_numel", -1, ValueError), ("seed", "0", TypeError), ("seed", True, TypeError),
    ("name", 3, TypeError)])
def test_loosely_typed_fields_are_refused(field, value, error):
    with pytest.raises(error, match=f"CompressionConfig.{field}"):
        CompressionConfig(**{field: value})


def test_integral_fields_take_any_int_and_store_an_int():
    import numpy as np
    c = CompressionConfig(min_numel=np.int64(4), seed=np.int32(7))
    assert type(c.min_numel) is int and c.min_numel == 4 and type(c.seed) is int
