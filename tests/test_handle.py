"""The one handle of ``hfcompress.apply`` (FSDP2 and DDP), its memory report, the declared
compressor capabilities, and the FSDP2 internals kept in ``integrations/_fsdp2.py``."""

import ast
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_distributed, run_jobs
from hfcompress.compressors import get_compressor, register_compressor
from hfcompress.compressors.base import (ErrorFeedback, GloballyScaled, ReferenceCoded,
                                         RotatedDomain, TreeCombined)
from hfcompress.compressors.group_quant import GroupQuantizer
from hfcompress.config import CompressionConfig, Scheme
from hfcompress.testing import tiny_llama

PACKAGE = Path(__file__).resolve().parent.parent / "hfcompress"
STATE_KINDS = ("references", "errors", "buffers")


@register_compressor("test_remembering_int")
class RememberingInt(GroupQuantizer):
    """``int`` that keeps its last payload: a stateful scheme with known state bytes."""

    stateful = True

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.last: torch.Tensor | None = None

    def compress(self, x):
        packed = super().compress(x)
        self.last = packed.flat().clone()
        return packed

    def state_bytes(self):
        return {} if self.last is None else {"buffers": self.last.numel()}


REMEMBERING = CompressionConfig(name="remembering", all_reduce=Scheme(
    "test_remembering_int", {"bits": 8, "group_size": 128, "rounding": "stochastic"}))


def batch(rank):
    return torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(rank))


def steps(model, opt, handle, rank, n):
    for _ in range(n):
        x = batch(rank)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
        handle.step()


def compressor_sum(handle) -> dict:
    out = dict.fromkeys(STATE_KINDS, 0)
    for c in handle.compressors():
        for kind, n in c.state_bytes().items():
            out[kind] += n
    return out


def ddp_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hfcompress
    from hfcompress.integrations import Compression
    from hfcompress.integrations.fsdp import FSDPInstall
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    out = {}
    model = DDP(tiny_llama(), bucket_cap_mb=0.1)
    h = hfcompress.apply(model, REMEMBERING, ranks_per_node=1)
    out["type"], out["kind"] = type(h).__name__, h.kind
    out["is_handle"] = isinstance(h, Compression) and not isinstance(h.installed_parts,
                                                                      FSDPInstall)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps(model, opt, h, rank, 3)
    out["meter"] = h.meter.history
    out["report"] = h.memory_report()
    out["sum"] = compressor_sum(h)
    out["streams"] = len(h.all_reduce.streams)
    saved = h.state_dict()
    out["saved_streams"] = len(saved["streams"])
    # restore into a fresh handle on a fresh model: the same compressor state
    model2 = DDP(tiny_llama(), bucket_cap_mb=0.1)
    h2 = hfcompress.apply(model2, REMEMBERING, ranks_per_node=1)
    h2.load_state_dict(saved)
    out["restored_same"] = len(h2.compressors()) == len(h.compressors()) > 0 and all(
        torch.equal(a.rng.state_dict()["states"][k], b.rng.state_dict()["states"][k])
        for a, b in zip(h.compressors(), h2.compressors())
        for k in a.rng.state_dict()["states"])
    # remove(): DDP's exact average; the meter records nothing more
    h.remove()
    before = h.meter.current()
    x = batch(rank)
    model(input_ids=x, labels=x).loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    both = [torch.empty_like(grads) for _ in range(world)]
    dist.all_gather(both, grads)
    out["removed_identical"] = all(torch.equal(b, grads) for b in both)
    out["removed_unmetered"] = h.meter.current() == before
    with pytest.raises(ValueError, match="compresses only FSDP's collectives"):
        hfcompress.apply(DDP(tiny_llama()), "qwd", ranks_per_node=1)
    return out


def fsdp_worker(rank, world):
    import hfcompress
    from hfcompress.integrations import Compression
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    model = tiny_llama(num_key_value_heads=2)
    h = hfcompress.apply(model, "loco_zeropp", ranks_per_node=1, shard=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps(model, opt, h, rank, 2)
    full = sum(p.numel() * p.element_size()
               for p in tiny_llama(num_key_value_heads=2).parameters())
    return {"type": type(h).__name__, "kind": h.kind, "is_handle": isinstance(h, Compression),
            "report": h.memory_report(), "sum": compressor_sum(h), "full": full,
            "loco": sum(isinstance(c, ErrorFeedback) for c in h.compressors())}


def hsdp_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    import hfcompress
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = tiny_llama()
    h = hfcompress.apply(model, "global_qsgd", ranks_per_node=2, shard=True, mesh=mesh)
    steps(model, torch.optim.AdamW(model.parameters(), lr=3e-3), h, rank, 2)
    return {"type": type(h).__name__, "kind": h.kind, "meter": h.meter.history,
            "report": h.memory_report(), "streams": len(h.all_reduce.streams)}


@pytest.fixture(scope="module")
def two():
    """The DDP and FSDP2 workers in one 2-rank launch."""
    ddp, fsdp = run_jobs(2, (ddp_worker,), (fsdp_worker,))
    return {"ddp": ddp, "fsdp": fsdp}


def test_apply_on_hsdp_returns_the_handle():
    for r in run_distributed(hsdp_worker, 4):
        assert r["type"] == "Compression" and r["kind"] == "hsdp" and r["streams"] == 3
        for s in r["meter"]:       # replicas on different emulated nodes: int8 codes vs fp32
            assert s["intra_bytes"] == 0 and s["uncompressed_intra_bytes"] == 0
            assert 3 * s["inter_bytes"] < s["uncompressed_inter_bytes"] < 4 * s["inter_bytes"]
        rep = r["report"]
        assert abs(rep["sharded_param_bytes"] - rep["full_param_bytes"] / 2) \
            <= 0.01 * rep["full_param_bytes"]


def test_apply_on_ddp_returns_the_handle_with_meter_state_and_remove(two):
    for r in two["ddp"]:
        assert r["type"] == "Compression" and r["kind"] == "ddp" and r["is_handle"]
        assert len(r["meter"]) == 3
        for s in r["meter"]:       # 2 ranks, one per node: everything crosses nodes
            assert s["inter_bytes"] > 0 and s["uncompressed_inter_bytes"] > 2 * s["inter_bytes"]
        assert r["saved_streams"] == r["streams"] >= 3 and r["restored_same"]
        assert r["removed_identical"] and r["removed_unmetered"]


def test_memory_report_sums_the_compressors_state(two):
    ddp, fsdp = two["ddp"], two["fsdp"]
    for r in ddp + fsdp:
        rep = r["report"]
        assert set(rep) == {*STATE_KINDS, "total", "sharded_param_bytes", "full_param_bytes"}
        assert {k: rep[k] for k in STATE_KINDS} == r["sum"]
        assert rep["total"] == sum(r["sum"].values())
    for r in ddp:              # the last payload of every stream: int8 codes + scales
        assert r["report"]["buffers"] > 0
        assert r["report"]["sharded_param_bytes"] == r["report"]["full_param_bytes"]
    for r in fsdp:
        assert r["type"] == "Compression" and r["kind"] == "fsdp2" and r["is_handle"]
        assert r["loco"] > 0 and r["report"]["full_param_bytes"] == r["full"]
        # dim-0 shards of 2 ranks: about half of every parameter
        assert abs(r["report"]["sharded_param_bytes"] - r["full"] / 2) <= 0.01 * r["full"]


# -- capabilities ----------------------------------------------------------------------------
def test_capabilities_are_declared_by_the_schemes():
    caps = (RotatedDomain, ReferenceCoded, GloballyScaled, TreeCombined, ErrorFeedback)
    have = {name: {P.__name__ for P in caps if isinstance(get_compressor(name), P)}
            for name in ("hadamard", "qwd", "global_qsgd", "global_qsgd_exp", "loco", "int",
                         "qsgd", "random_shift", "learned")}
    assert have == {"hadamard": {"RotatedDomain"}, "qwd": {"ReferenceCoded"},
                    "global_qsgd": {"GloballyScaled"},
                    "global_qsgd_exp": {"GloballyScaled", "TreeCombined"},
                    "loco": {"ErrorFeedback"}, "int": set(), "qsgd": set(),
                    "random_shift": set(), "learned": set()}


def test_bucket_payload_takes_a_uint8_scale():
    """An MX-style shared exponent (one uint8 per bucket) fits the bucketed payload."""
    class ExponentScaled(GroupQuantizer):
        bucket_dtypes = {"scales": torch.uint8}

    c = ExponentScaled(bits=4, group_size=32)
    spec = c.payload_spec(100)
    assert spec == {"codes": (torch.uint8, 64), "scales": (torch.uint8, 4)}
    packed = c.unflatten(torch.zeros(68, dtype=torch.uint8), (100,), torch.float32)
    assert packed.payload["scales"].dtype == torch.uint8 and packed.payload["scales"].numel() == 4


def _scheme_name_uses(path: Path, names: set[str], classes: set[str]) -> list[str]:
    """Where ``path`` compares a scheme or preset name (``==``, ``in``, ``startswith``),
    lists names, or names a concrete compressor class."""
    tree = ast.parse(path.read_text())
    where = path.relative_to(PACKAGE) if PACKAGE in path.parents else path.name
    found = []

    def flag(node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and node.value in names:
            found.append(f"{where}:{node.lineno}: {node.value!r}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                flag(operand)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith"):
            for arg in node.args:
                flag(arg)
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            for elt in node.elts:
                flag(elt)
        elif isinstance(node, (ast.Name, ast.Attribute)):
            ident = node.id if isinstance(node, ast.Name) else node.attr
            if ident in classes:
                found.append(f"{where}:{node.lineno}: {ident}")
    return found


def test_layers_above_the_schemes_do_not_name_them():
    """comm/, integrations/, auto/, config.py and the registry ask the schemes (capabilities,
    ``steady()``, ``state_bytes_for()``): no scheme or preset name compared or listed, no
    concrete compressor class (issue 22)."""
    from hfcompress.compressors.base import COMPRESSORS
    from hfcompress.config import list_presets

    names = set(COMPRESSORS) | set(list_presets())
    classes = {c.__name__ for c in COMPRESSORS.values()}
    files = [p for d in ("comm", "integrations", "auto") for p in sorted((PACKAGE / d).rglob(
        "*.py"))] + [PACKAGE / "config.py", PACKAGE / "compressors" / "registry.py"]
    found = [hit for p in files for hit in _scheme_name_uses(p, names, classes)]
    assert not found, "\n".join(found)



def test_the_scheme_name_check_sees_what_it_refuses(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('if s.name == "qwd" or s.name.startswith("global_qsgd"):\n'
                   '    LEAN = ("zeropp", "tlq_hs")\n'
                   'ok = {"qwd": 1}\n'
                   'isinstance(c, WeightDifferenceQuantizer)\n')
    hits = _scheme_name_uses(bad, {"qwd", "global_qsgd", "zeropp", "tlq_hs"},
                             {"WeightDifferenceQuantizer"})
    assert [h.split(":", 1)[1] for h in hits] == [
        "1: 'qwd'", "1: 'global_qsgd'", "2: 'zeropp'", "2: 'tlq_hs'",
        "4: WeightDifferenceQuantizer"], hits


# -- FSDP2 internals -------------------------------------------------------------------------
def test_nothing_outside_fsdp2_module_touches_fsdp2_internals():
    private = re.compile(r"torch\.distributed\.fsdp\._|_fully_shard\b|_get_fsdp_state|"
                         r"_fsdp_param_groups?\b(?!\.py)|_training_state|_is_hsdp|_module_info|"
                         r"_all_gather_comm|_reduce_scatter_comm|_orig_size")
    offenders = [f"{p.relative_to(PACKAGE)}:{i + 1}: {line.strip()}"
                 for p in sorted(PACKAGE.rglob("*.py")) if p.name != "_fsdp2.py"
                 for i, line in enumerate(p.read_text().splitlines()) if private.search(line)]
    assert not offenders, "\n".join(offenders)


def test_fsdp2_internals_that_moved_raise_a_clear_error(monkeypatch):
    from torch.distributed.fsdp import FSDPModule

    from hfcompress.integrations import _fsdp2
    assert _fsdp2.check_internals()["AllGather"].__name__ == "AllGather"   # this torch: fine
    monkeypatch.delattr(FSDPModule, "set_all_reduce_hook")
    with pytest.raises(_fsdp2.FSDP2InternalsError) as err:
        _fsdp2.check_internals("9.1.0")
    msg = str(err.value)
    assert "FSDPModule.set_all_reduce_hook" in msg and "torch 9.1.0" in msg
    assert "checked against torch 2.9, 2.10, 2.11, 2.12, 2.13" in msg and isinstance(err.value, ImportError)
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp._fully_shard._fsdp_api", None)
    with pytest.raises(_fsdp2.FSDP2InternalsError, match="module/name"):
        _fsdp2.check_internals("9.1.0")
    with pytest.raises(_fsdp2.FSDP2InternalsError, match="_training_state"):
        _fsdp2.in_backward(object())       # an attribute renamed at run time
    _fsdp2.require()                       # this torch: nothing moved
    monkeypatch.setattr(_fsdp2, "_problem", _fsdp2._moved("FSDPParamGroup.x", "9.1.0"))
    with pytest.raises(_fsdp2.FSDP2InternalsError, match="FSDPParamGroup.x"):
        _fsdp2.require()                   # what apply() calls before touching FSDP2


@pytest.mark.parametrize("layout", ["_fsdp_param_groups", "_fsdp_param_group"])
def test_param_groups_read_either_torch_layout(monkeypatch, layout):
    """torch 2.13 keeps a list of param groups per FSDPState, 2.11 one group or None: both
    are read; a state with neither attribute fails at import time, not at the first apply."""
    import types

    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    from hfcompress.integrations import _fsdp2
    group = object()

    def module(value):
        state = types.SimpleNamespace(**{layout: value})
        return types.SimpleNamespace(_get_fsdp_state=lambda: state)

    one, none = ([group], []) if layout == "_fsdp_param_groups" else (group, None)
    assert _fsdp2.param_groups(module(one)) == [group]
    assert _fsdp2.param_groups(module(none)) == []

    monkeypatch.setattr(FSDPState, "__init__", lambda self: None)
    if hasattr(FSDPState, "_fsdp_param_group"):          # 2.13: a class-level property
        monkeypatch.delattr(FSDPState, "_fsdp_param_group")
    with pytest.raises(_fsdp2.FSDP2InternalsError, match="FSDPState._fsdp_param_groups"):
        _fsdp2.check_internals("9.1.0")
