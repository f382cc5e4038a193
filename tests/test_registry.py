"""Compressor registry (registry.py) and compressor state (``state_dict`` round trips)."""

import copy

import pytest
import torch

from hfcompress import Compressor, get_compressor, list_compressors, register_compressor
from hfcompress.compressors import registry


@pytest.fixture
def scratch_names():
    """Names registered by a test, removed afterwards (the registry is global)."""
    names = []
    yield names
    for n in names:
        registry._REGISTRY.pop(n, None)


def test_list_and_get():
    names = list_compressors()
    assert "int" in names and names == sorted(names)
    c = get_compressor("int", bits=8, group_size=64)
    assert c.name == "int" and c.bits == 8 and c.config()["group_size"] == 64


def test_unknown_name_lists_valid_names_and_suggests_close_ones():
    with pytest.raises(ValueError) as err:
        get_compressor("itn")
    msg = str(err.value)
    assert "unknown compressor 'itn'" in msg
    assert "Did you mean 'int'" in msg
    assert "Valid names: " + ", ".join(list_compressors()) in msg
    with pytest.raises(ValueError) as err:
        get_compressor("zzzzzzzz")
    assert "Did you mean" not in str(err.value) and "'int'" not in str(err.value)
    assert "int" in str(err.value).split("Valid names: ")[1]


def test_register_and_duplicate_errors(scratch_names):
    @register_compressor("test_identity")
    class Identity(Compressor):
        pass

    scratch_names.append("test_identity")
    assert Identity.name == "test_identity"
    assert isinstance(get_compressor("test_identity"), Identity)
    assert register_compressor("test_identity", Identity) is Identity  # same class: no-op

    class Other(Compressor):
        pass

    with pytest.raises(ValueError, match="already registered to Identity"):
        register_compressor("test_identity", Other)
    with pytest.raises(TypeError, match="not a Compressor subclass"):
        register_compressor("test_not_a_compressor", dict)
    assert "test_not_a_compressor" not in list_compressors()


def test_stochastic_state_dict_restores_the_rng():
    """A compressor loaded from another's state_dict draws the same noise next."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    a = get_compressor("int", bits=4, rounding="stochastic", seed=3)
    a.compress(x)  # advance the generator
    state = copy.deepcopy(a.state_dict())
    expected = a.compress(x)
    b = get_compressor("int", bits=4, rounding="stochastic", seed=99)
    b.compress(x)
    b.load_state_dict(state)
    got = b.compress(x)
    assert torch.equal(got.payload["codes"], expected.payload["codes"])
    assert torch.equal(got.payload["scales"], expected.payload["scales"])
    # ... and differs from a fresh compressor's first draw (the state matters)
    fresh = a.fresh().compress(x)
    assert not torch.equal(fresh.payload["codes"], expected.payload["codes"])


def test_nearest_is_stateless():
    c = get_compressor("int", bits=4)
    assert c.state_dict() == {}
    c.load_state_dict({})


@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("Off", False),
                                       ("no", False), ("1", True), ("TRUE", True),
                                       ("", True)])
def test_compile_switch_reads_the_usual_spellings(monkeypatch, value, on):
    from hfcompress.kernels import dispatch
    monkeypatch.setenv("HFCOMPRESS_COMPILE", value)
    assert dispatch.compile_enabled() is on


def test_compile_switch_refuses_a_value_it_cannot_read(monkeypatch):
    from hfcompress.kernels import dispatch
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "nope")
    with pytest.raises(ValueError, match="HFCOMPRESS_COMPILE='nope'.*false"):
        dispatch.compile_enabled()
