"""``comm_compressor="auto"`` over a sub-mesh: FSDP2 x TP (``fully_shard(mesh=mesh["dp"])``
of a (dp, tp) = (2, 2) mesh) and native HSDP (a 2-D FSDP mesh ("dp_replicate", "dp_shard")).

Every rank probes its own DP group's links, all groups at once (world barriers), the
measurements are agreed over the world and world rank 0's plan runs on every group; native
HSDP prices and chooses the replica all-reduce too (``auto.choose.hsdp_cost``). One 4-rank
gloo launch (2 emulated nodes of 2 ranks: TP groups {0, 1}, {2, 3}; DP groups {0, 2}, {1, 3});
the unit tests check the replica all-reduce's pricing and config without processes.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_jobs
from hfcompress.auto import Plan, candidates
from hfcompress.auto.choose import hsdp_cost, replica_config
from hfcompress.auto.cost_model import GroupLayout, ddp_cost, fsdp_cost
from hfcompress.cost.units import Unit
from hfcompress.auto.probe import CodecSeconds, Fit, ProbedLinks
from hfcompress.config import PRESETS, AutoSettings
from hfcompress.integrations.ddp import all_reduce_compressor

RANKS_PER_NODE = 2
HSDP_PIN = "all_reduce=global_qsgd_exp"      # the compressed replica all-reduce, chosen by pin


# -- without processes: the replica all-reduce under auto --------------------------------------
def links(bandwidth: float) -> ProbedLinks:
    return ProbedLinks({f"{p}@{g}": Fit(1e-5, bandwidth)
                  for p in ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")
                  for g in ("world", "intra", "inter")})


def test_hsdp_cost_adds_the_replica_all_reduce_per_unit():
    """Native HSDP's cost is the shard group's FSDP2 cost plus one replica all-reduce per
    unit (its exact values in an exact one); on a slow replica link the compressed
    all-reduce wins, so auto compresses the inter-node traffic HSDP puts on the replicas."""
    units = [Unit(f"l{i}", 750_000, exact_numel=128) for i in range(4)]
    shard, replica = GroupLayout(2, 2), GroupLayout(2, 1)
    codecs = {k: CodecSeconds(1e-9, 1e-9) for k in ("qwd", "hs8", "hs4", "global_qsgd_exp",
                                                  "global_qsgd_block")}
    fast, slow = links(1e10), links(125e6)
    plan = Plan(weights="qwd", all_reduce="global_qsgd_exp")
    got = hsdp_cost(plan, units, shard, fast, replica, slow, codecs, {})
    alone = fsdp_cost(plan, units, shard, fast, codecs)
    extra = [ddp_cost(p, n, replica, slow, codecs, bucket_bytes=4 * n)
             for u in units for n, p in ((u.numel, plan), (u.exact_numel, Plan()))]
    assert math.isclose(got.wire, alone.wire + sum(c.wire for c in extra), rel_tol=1e-12)
    assert math.isclose(got.codec, alone.codec + sum(c.codec for c in extra), rel_tol=1e-12)
    assert got.parts["all_reduce"][0] > 0
    price = {a: hsdp_cost(Plan(all_reduce=a), units, shard, fast, replica, slow, codecs,
                          {}).exposed() for a in ("exact", "global_qsgd_exp")}
    assert price["global_qsgd_exp"] < price["exact"], price


def test_replica_all_reduce_runs_the_plans_option_alone():
    """Under auto the replica all-reduce runs the plan's ``all_reduce`` option: ``exact`` is
    exact even when the plan compresses the shard group's inter-node hop (a preset's
    all-reduce would fall back to that ``grad_inter`` scheme)."""
    hs4 = Plan(weights="qwd", grad_intra="hs8", grad_inter="hs4").config()
    assert all_reduce_compressor(hs4, 2) is not None          # what a preset would run
    assert all_reduce_compressor(replica_config(hs4), 2) is None
    both = replica_config(Plan(grad_inter="hs4", all_reduce="global_qsgd_exp").config())
    assert both.all_reduce == PRESETS["global_qsgd_exp"]["all_reduce"]
    assert both.grad_inter is None and not both.two_hop and both.name == \
        "auto: grad_inter=hs4 all_reduce=global_qsgd_exp"


# -- the ranks' jobs -----------------------------------------------------------------------------
class BarrierSpy:
    """The ranks of every group ``auto/probe.py`` calls ``dist.barrier`` on."""

    def __init__(self) -> None:
        self.groups: set[tuple[int, ...]] = set()
        self._barrier = dist.barrier

        def spy(*args, group=None, **kwargs):
            if sys._getframe(1).f_code.co_filename.replace("\\", "/").endswith(
                    "hfcompress/auto/probe.py"):
                self.groups.add(tuple(dist.get_process_group_ranks(
                    group if group is not None else dist.group.WORLD)))
            return self._barrier(*args, group=group, **kwargs)
        dist.barrier = spy

    def remove(self) -> None:
        dist.barrier = self._barrier


def _train(model, handle, rank_of_batch: int, steps: int) -> list[float]:
    from fsdp_workers import LR
    from tp_workers import train_steps
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    return train_steps(model, opt, handle, rank_of_batch, 0, steps)


def _result(handle, losses: list[float]) -> dict:
    auto = handle.auto
    out = {"losses": losses, "config": handle.config.name}
    if auto is not None:
        s = auto.summary()
        out.update(label=auto.choice.plan.label, kind=s["kind"], table=s["table"],
                   links=sorted(s["links"]), layout=s["layout"], history=s["history"])
    return out


def tp_job(rank: int, world: int, request: str, steps: int) -> dict:
    """dp 2 x tp 2: ``apply(model, request, ranks_per_node=2)`` on the model FSDP2-sharded
    over mesh["dp"] (unpinned), the groups hfcompress's collectives and the probe's
    barriers ran on during ``apply``, and ``steps`` training steps."""
    from fsdp_workers import setup
    from tp_workers import GroupSpy, dp_rank, mesh_2d, tp_model
    import hfcompress
    setup()
    os.environ.pop("HFCOMPRESS_AUTO", None)
    mesh = mesh_2d()
    model = tp_model(mesh)
    spy, barriers = GroupSpy(), BarrierSpy()
    handle = hfcompress.apply(model, request, ranks_per_node=RANKS_PER_NODE)
    spy.remove()
    barriers.remove()
    out = _result(handle, _train(model, handle, dp_rank(mesh), steps))
    out.update(groups=sorted(spy.groups), barriers=sorted(barriers.groups),
               dp=dist.get_process_group_ranks(mesh["dp"].get_group()),
               tp=dist.get_process_group_ranks(mesh["tp"].get_group()),
               topology=(list(handle.topology.ranks), handle.topology.ranks_per_node,
                         handle.topology.num_nodes))
    handle.remove()
    return out


def hsdp_job(rank: int, world: int, request, pin: str | None, steps: int) -> dict:
    """Native HSDP on a 2 x 2 ("dp_replicate", "dp_shard") mesh: every layer and the root
    ``fully_shard``-ed over the 2-D mesh, then ``apply(model, request)``; the replica
    all-reduce's scheme as installed."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from fsdp_workers import MP, setup, tiny_llama
    import hfcompress
    setup()
    if pin is None:
        os.environ.pop("HFCOMPRESS_AUTO", None)
    else:
        os.environ["HFCOMPRESS_AUTO"] = pin
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    model = tiny_llama()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp_replicate", "dp_shard"], mp_policy=MP)
    fully_shard(model, mesh=mesh["dp_replicate", "dp_shard"], mp_policy=MP)
    handle = hfcompress.apply(model, request, ranks_per_node=RANKS_PER_NODE)
    out = _result(handle, _train(model, handle, dist.get_rank(), steps))
    replica = handle.installed_parts.replica
    out.update(parts=type(handle.installed_parts).__name__, replica_size=replica.size,
               replica_scheme=None if replica.config.all_reduce is None
               else replica.config.all_reduce.name, replica_grad_inter=replica.config.grad_inter)
    os.environ.pop("HFCOMPRESS_AUTO", None)
    handle.remove()
    return out


@pytest.fixture(scope="module")
def runs():
    """Every 4-rank job in one launch."""
    keys = ("tp_none", "tp_auto", "hsdp_none", "hsdp_auto")
    return dict(zip(keys, run_jobs(
        4, (tp_job, "none", 3), (tp_job, "auto", 3), (hsdp_job, "none", None, 3),
        (hsdp_job, AutoSettings(reps=1, reprobe_every=2), HSDP_PIN, 3), timeout=240)))


def test_tp_auto_probes_the_dp_groups_at_once_and_agrees_on_one_plan(runs):
    """dp 2 x tp 2, unpinned: every rank (both DP groups) installs the same plan; the table
    holds the DP group's candidates (x = 1 per node, y = 2 nodes: no intra-node hop); the
    probe's collectives ran on the DP groups and the world (agreement), never on a TP
    group, and every timed run began with a world barrier (the two DP groups of a node
    time together, sharing its link)."""
    res = runs["tp_auto"]
    assert len({r["label"] for r in res}) == 1
    assert len({str(r["table"]) for r in res}) == 1          # rank 0's table, broadcast
    everyone = tuple(range(4))
    for r in res:
        assert r["topology"] == (r["dp"], 1, 2) and r["dp"] != r["tp"]
        # one DP rank per node: hpZ (keep the forward's weights) is a candidate on CPU
        assert {row["plan"] for row in r["table"]} == {
            p.label for p in candidates("fsdp2", 1, 2, hpz=True)}
        assert r["layout"]["world"] == 2 and r["layout"]["ranks_per_node"] == 1
        assert {"all_gather@world", "reduce_scatter@world"} <= set(r["links"])
        assert tuple(r["dp"]) in r["groups"] and tuple(r["tp"]) not in r["groups"]
        assert set(r["groups"]) <= {tuple(r["dp"]), everyone}, r["groups"]
        assert r["barriers"] == [everyone]
        assert r["config"] == f"auto: {r['label']}"


def test_tp_auto_trains_like_none(runs):
    """3 steps: finite losses within 0.05 of preset ``none``'s (every candidate keeps the
    loss)."""
    none = runs["tp_none"][0]["losses"]
    for r in runs["tp_auto"]:
        assert all(math.isfinite(x) for x in r["losses"])
        assert max(abs(a - b) for a, b in zip(r["losses"], none)) < 0.05, (r["losses"], none)


def test_native_hsdp_auto_chooses_the_replica_all_reduce_too(runs):
    """Native HSDP (shard groups {0, 1}, {2, 3} inside a node; replicas {0, 2}, {1, 3}
    across): the plans are the shard group's options x the all-reduce options (pinned to
    Global-QSGD exponential here, the others chosen), the same plan on every rank, the
    replica all-reduce runs the plan's scheme (not a gradient hop's), the replica links were
    probed, the re-probe after step 3 is agreed everywhere, and the loss stays near
    ``none``'s."""
    res, none = runs["hsdp_auto"], runs["hsdp_none"][0]["losses"]
    assert len({r["label"] for r in res}) == 1
    assert len({str(r["history"]) for r in res}) == 1
    for r in res:
        assert r["parts"] == "NativeHSDP" and r["kind"] == "hsdp" and r["replica_size"] == 2
        shard = candidates("fsdp2", 2, 1)
        assert {row["plan"] for row in r["table"]} == {
            Plan(p.weights, p.grad_intra, p.grad_inter, "global_qsgd_exp").label for p in shard}
        assert "all_reduce=global_qsgd_exp" in r["label"]
        assert r["replica_scheme"] == "global_qsgd_exp" and r["replica_grad_inter"] is None
        assert "replica:all_reduce@world" in r["links"]
        assert r["layout"]["replicas"]["world"] == 2 and r["layout"]["replicas"]["nodes"] == 2
        [h] = r["history"]
        assert h["step"] == 3 and h["measured_step_s"] > 0
        assert all(math.isfinite(x) for x in r["losses"])
        assert max(abs(a - b) for a, b in zip(r["losses"], none)) < 0.05, (r["losses"], none)
