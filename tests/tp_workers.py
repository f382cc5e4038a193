"""Worker functions of the FSDP2 x TP test (``tests/test_fsdp_tp.py``): 4 gloo ranks as 2
emulated nodes of 2, a ``(dp, tp)`` = (2, 2) device mesh with TP innermost (inside a node: TP
groups {0, 1}, {2, 3}; DP groups {0, 2}, {1, 3}: one DP rank per node).

The tiny LLaMA's MLPs are tensor-parallel (``parallelize_module`` on ``mesh["tp"]``:
gate / up column-wise, down row-wise), then every decoder layer and the root are
``fully_shard``-ed over ``mesh["dp"]`` with bf16 parameters and fp32 reduction. The ranks of
a DP group draw their own batches; the TP ranks of one DP rank share it.
"""

from __future__ import annotations

import copy
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import hfcompress
from hfcompress import testing
from hfcompress.comm import WireMeter
from hfcompress.comm.all_gather import QuantizedAllGather
from hfcompress.comm.reduce_scatter import QuantizedReduceScatter
from hfcompress.comm.topology import Topology
from hfcompress.comm.traffic import sent
from hfcompress.comm.two_hop import TwoHopReduceScatter
from hfcompress.compressors.registry import build_compressor
from hfcompress.config import get_config
from hfcompress.integrations import fsdp as fsdp_integration
from fsdp_workers import LR, MP, global_mean, setup, tiny_llama, train_step

RANKS_PER_NODE = 2
PLAN = {"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel()}
COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
               "all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all")


def mesh_2d():
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


def tp_model(mesh, shard: bool = True):
    """The tiny LLaMA with tensor-parallel MLPs, every layer and the root sharded over dp
    (``shard=False``: not sharded yet)."""
    model = tiny_llama()
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], PLAN)
    if not shard:
        return model
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"], mp_policy=MP)
    fully_shard(model, mesh=mesh["dp"], mp_policy=MP)
    return model


# -- which groups hfcompress's collectives run on ---------------------------------------------
class GroupSpy:
    """Records the ranks of every group a torch.distributed collective is called on from
    hfcompress code (a frame of the package on the stack; not the launcher's)."""

    def __init__(self) -> None:
        self.groups: set[tuple[int, ...]] = set()
        self._undo = []
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._patch(dist, name)
        for mod in [m for n, m in sys.modules.items() if n.startswith("hfcompress")]:
            for name in ("all_gather_single", "reduce_scatter_single"):
                if hasattr(mod, name):
                    self._patch(mod, name)

    def _patch(self, owner, name) -> None:
        fn = getattr(owner, name)

        def spy(*args, group=None, **kwargs):
            f = sys._getframe(1)
            while f is not None:
                path = f.f_code.co_filename.replace("\\", "/")
                if "/hfcompress/" in path and not path.endswith("/hfcompress/testing.py"):
                    self.groups.add(tuple(dist.get_process_group_ranks(
                        group if group is not None else dist.group.WORLD)))
                    break
                f = f.f_back
            return fn(*args, group=group, **kwargs)
        setattr(owner, name, spy)
        self._undo.append((owner, name, fn))

    def remove(self) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)


# -- training ---------------------------------------------------------------------------------
def dp_rank(mesh) -> int:
    return mesh["dp"].get_local_rank()


def train_steps(model, opt, handle, dp_index: int, first: int, count: int) -> list[float]:
    """Steps ``first`` .. ``first + count - 1`` on the batches of DP rank ``dp_index`` (the TP
    ranks of one DP rank share them): optimizer step, ``handle.step()`` (None: no
    hfcompress), the global mean loss of each."""
    losses = []
    for step in range(first, first + count):
        loss = train_step(model, step, dp_index)
        opt.step()
        opt.zero_grad()
        if handle is not None:
            handle.step()
        losses.append(global_mean(loss))
    return losses


def train(preset, steps: int, shard: bool = False) -> dict:
    """``steps`` steps of the TP x FSDP2 model (``preset=None``: no hfcompress; ``shard``:
    ``apply(..., shard=True, mesh=mesh["dp"])`` shards it, hpZ included)."""
    mesh = mesh_2d()
    model = tp_model(mesh, shard=not shard)
    if shard:
        h = hfcompress.apply(model, preset, ranks_per_node=RANKS_PER_NODE, shard=True,
                             mesh=mesh["dp"], mp_policy=MP)
    else:
        h = None if preset is None else hfcompress.apply(model, preset,
                                                         ranks_per_node=RANKS_PER_NODE)
    spy = GroupSpy()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    t0 = time.perf_counter()
    out = {"loss": train_steps(model, opt, h, dp_rank(mesh), 0, steps)}
    spy.remove()
    out["seconds"] = time.perf_counter() - t0
    out["groups"] = sorted(spy.groups)
    out["params"] = {n: p.detach().to_local().clone() for n, p in model.named_parameters()}
    if h is not None:
        topo = h.topology
        out["topology"] = {"ranks": list(topo.ranks), "x": topo.ranks_per_node,
                           "y": topo.num_nodes, "size": topo.world_size,
                           "groups_per_node": topo.groups_per_node}
        out["meter"] = h.meter.history
        out["declared"] = declared_step(model, h)
        out["node_traffic"] = h.node_traffic()      # collective: every rank, same point
        h.remove()
    return out


def hsdp_tp(preset, steps: int = 3) -> dict:
    """Native HSDP beside TP: a (dp_replicate 2, dp_shard 1, tp 2) mesh (TP inside a node, the
    replicas across the nodes: 4 ranks allow no shard dim larger than 1), every layer and the
    root ``fully_shard``-ed over ``mesh["dp_replicate", "dp_shard"]`` (``preset=None``: no
    hfcompress): the losses, the final shards and what was installed."""
    mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    model = tiny_llama()
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], PLAN)
    dp = mesh["dp_replicate", "dp_shard"]
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp, mp_policy=MP)
    fully_shard(model, mesh=dp, mp_policy=MP)
    h = None if preset is None else hfcompress.apply(model, preset, ranks_per_node=RANKS_PER_NODE)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out = {"loss": train_steps(model, opt, h, mesh["dp_replicate"].get_local_rank(), 0, steps),
           "params": {n: p.detach().to_local().clone() for n, p in model.named_parameters()}}
    if h is not None:
        out["describe"] = h.installed_parts.describe()
        out["inter_bytes"] = h.meter.summary()["total"]["inter_bytes"]
        out["uncompressed_inter_bytes"] = h.meter.summary()["total"]["uncompressed_inter_bytes"]
        h.remove()
    return out


def resume(preset: str = "sdp4bit", k: int = 2, r: int = 2) -> dict:
    """dp x tp: train k steps, keep this rank's model / optimizer / compressor state (the
    shards of its (DP, TP) coordinate: qWD references of its DP group), train r steps;
    restore all three and train the same r steps again."""
    mesh = mesh_2d()
    model = tp_model(mesh)
    h = hfcompress.apply(model, preset, ranks_per_node=RANKS_PER_NODE)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def run(first: int, count: int) -> list[float]:
        return train_steps(model, opt, h, dp_rank(mesh), first, count)

    run(0, k)
    params = [p.detach().to_local().clone() for p in model.parameters()]
    opt_state, comp_state = copy.deepcopy(opt.state_dict()), copy.deepcopy(h.state_dict())
    first = run(k, r)
    with torch.no_grad():
        for p, saved in zip(model.parameters(), params):
            p.to_local().copy_(saved)
    opt.load_state_dict(opt_state)
    h.load_state_dict(comp_state)
    again = run(k, r)
    h.remove()
    return {"first": first, "again": again}


def declared_step(model, h) -> dict[str, tuple[float, float]]:
    """(intra, inter) bytes per rank of one steady training step, per collective tag, from the
    collectives' ``traffic`` declarations on the handle's topology (its x and y)."""
    config, topo = h.config, h.topology
    x, y = topo.ranks_per_node, topo.num_nodes
    modules = fsdp_integration.fsdp_modules(model)
    units, wdt, gdt, _ = fsdp_integration.fsdp_units(model, modules, config.exact_patterns,
                                                     config.min_numel)
    wb, gb = torch.tensor([], dtype=wdt).element_size(), torch.tensor([], dtype=gdt).element_size()
    weights = build_compressor(config.weights, 0, 0, 0, "weights")
    intra = build_compressor(config.grad_intra, 0, 0, 0, "grad_intra")
    inter = build_compressor(config.grad_inter, 0, 0, 0, "grad_inter")
    out = {"all_gather": [], "all_gather_bwd": [], "reduce_scatter": []}
    for u in units:
        s, e = u.numel, u.exact_numel
        out["all_gather"] += QuantizedAllGather.traffic(e, x, y, None, wb) + \
            QuantizedAllGather.traffic(s, x, y, weights, wb)
        if u.backward_gather:
            out["all_gather_bwd"] += QuantizedAllGather.traffic(e, x, y, None, wb, True) + \
                QuantizedAllGather.traffic(s, x, y, weights, wb, True)
        out["reduce_scatter"] += QuantizedReduceScatter.traffic(e, x, y, None, gb)
        out["reduce_scatter"] += TwoHopReduceScatter.traffic(s, x, y, intra, inter, gb) \
            if config.two_hop else QuantizedReduceScatter.traffic(s, x, y, inter, gb)
    return {k: sent(v, x, y) for k, v in out.items() if v}


def topology_counting_groups(per_node: int, group) -> tuple[Topology, list]:
    """``Topology(per_node, group=group)`` and the ranks of every ``new_group`` it called."""
    made, new_group = [], dist.new_group

    def counted(ranks, **kwargs):
        made.append(tuple(ranks))
        return new_group(ranks, **kwargs)
    dist.new_group = counted
    try:
        return Topology(per_node, group=group), made
    finally:
        dist.new_group = new_group


def traffic_cases() -> tuple[list, dict]:
    """``test_traffic``'s collectives on the DP group's topology: (label, declared, recorded),
    with 2 nodes of 2 (the DP group: x = 1 on y = 2 nodes) and with one node of 4 (x = 2,
    y = 1: the intra-node hop and node-sharded references inside a sub-group); and per
    layout the subgroups the topology built, and whether its intra / inter group is None."""
    from test_traffic import _cases, _measure
    mesh = mesh_2d()
    out, subgroups = [], {}
    for per_node in (RANKS_PER_NODE, 4):
        topo, made = topology_counting_groups(per_node, mesh["dp"].get_group())
        subgroups[per_node] = (made, topo.intra_group is None, topo.inter_group is None)
        x, w = topo.ranks_per_node, topo.world_size
        for label, phases, call in _cases(topo.rank, w, x, topo):
            meter = WireMeter()
            out.append((f"{label} x={x} y={w // x}", sent(phases, x, w // x),
                        _measure(meter, lambda: call(meter))))
        dist.barrier()
    return out, subgroups


def refusals() -> dict:
    """What is refused, with which message (every rank raises the same)."""
    out = {}
    uneven = dist.new_group([0, 1, 3])        # 2 ranks on node 0, 1 on node 1
    try:
        Topology(RANKS_PER_NODE, group=uneven if dist.get_rank() != 2 else None)
    except ValueError as err:
        out["uneven"] = str(err)
    hsdp = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("replicate", "shard", "tp"))
    try:
        hfcompress.apply(tiny_llama(), "global_qsgd", ranks_per_node=RANKS_PER_NODE, shard=True,
                         mesh=hsdp["replicate", "shard"])
    except ValueError as err:
        out["hsdp_tp"] = str(err)
    stage = testing.tiny_llama(num_hidden_layers=1 + dist.get_rank() // 2)   # two "stages"
    try:
        hfcompress.apply(stage, "sdp4bit", ranks_per_node=RANKS_PER_NODE, shard=True)
    except ValueError as err:
        out["pipeline"] = str(err)
    return out


def ddp_subgroup(steps: int = 3) -> dict:
    """DDP over the dp group of the mesh (a replicated block beside TP): the compressed
    all-reduce hook on that group; its topology is the group's (x = 1, y = 2)."""
    from torch.nn.parallel import DistributedDataParallel
    mesh = mesh_2d()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    ddp = DistributedDataParallel(net, process_group=mesh["dp"].get_group())
    h = hfcompress.apply(ddp, "global_qsgd", ranks_per_node=RANKS_PER_NODE)
    spy = GroupSpy()
    g = torch.Generator().manual_seed(dp_rank(mesh))
    for _ in range(steps):
        ddp(torch.randn(16, 64, generator=g)).square().mean().backward()
        h.step()
    spy.remove()
    grads = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    everyone = [torch.empty_like(grads) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, grads)
    peer = [r for r in dist.get_process_group_ranks(mesh["dp"].get_group())
            if r != dist.get_rank()][0]
    out = {"x": h.topology.ranks_per_node, "y": h.topology.num_nodes,
           "groups": sorted(spy.groups), "same_as_dp_peer": torch.equal(everyone[peer], grads),
           "meter": h.meter.history}
    h.remove()
    return out


def worker(rank: int, world: int, steps: int) -> dict:
    setup()
    out = {"train": {p: train(p, steps) for p in (None, "none", "sdp4bit")}}
    out["train"]["zeropp"] = train("zeropp", steps, shard=True)   # hpZ: x = 1, no secondary
    out["resume"] = resume()
    out["hsdp_tp"] = {p: hsdp_tp(p) for p in (None, "none", "sdp4bit")}
    out["traffic"], out["subgroups"] = traffic_cases()
    out["ddp"] = ddp_subgroup()
    # last: after new_group([0, 1, 3]) (the uneven layout), a later use_local_synchronization
    # new_group of ranks 0 and 2 (DDP's hook group) hangs on gloo (torch, not hfcompress)
    out["refusals"] = refusals()
    return out
