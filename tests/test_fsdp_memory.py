"""Compressor state at sharded-training memory, FSDP2 on 4 gloo ranks as 2 nodes x 2.

- node-sharded qWD references give bit for bit the losses of SDP4Bit's full references;
- per-rank compressor state = the estimate (``cost/state.py``), and <= 0.8 x the model's
  (bf16, gathered) parameter bytes for sdp4bit; the backward all-gather stays in the node;
- each rank's checkpoint state holds its own references only; a state from another node
  layout is refused, naming both;
- the compressed all-gather makes no host sync (``.item()``, ``torch.equal``, ``.tolist()``,
  tensor truthiness) in steady-state steps.
"""

import contextlib

import torch

from dist_utils import run_distributed
from fsdp_workers import MP, LR, global_mean, setup, tiny_llama, train_step

import hfcompress
from hfcompress.comm.streams import add_state_bytes
from hfcompress.integrations import fsdp as fsdp_integration

STEPS = 3
GUARDED = (1, 2)         # steady-state steps run with host syncs forbidden in the all-gather


class HostSync(RuntimeError):
    pass


@contextlib.contextmanager
def no_host_sync_in_all_gather():
    """Inside hfcompress's FSDP all-gather, ``Tensor.item / tolist / __bool__`` and
    ``torch.equal`` raise; elsewhere (model, optimizer, loss logging) they work."""
    inside = [False]
    saved = {(torch.Tensor, "item"): torch.Tensor.item, (torch.Tensor, "tolist"): torch.Tensor.tolist,
             (torch.Tensor, "__bool__"): torch.Tensor.__bool__, (torch, "equal"): torch.equal}

    def guard(owner, name, fn):
        def wrapped(*args, **kwargs):
            if inside[0]:
                raise HostSync(f"{name} called in the all-gather")
            return fn(*args, **kwargs)
        setattr(owner, name, wrapped)

    call = fsdp_integration.FSDPAllGather.__call__

    def traced(self, *args, **kwargs):
        inside[0] = True
        try:
            return call(self, *args, **kwargs)
        finally:
            inside[0] = False

    for (owner, name), fn in saved.items():
        guard(owner, name, fn)
    fsdp_integration.FSDPAllGather.__call__ = traced
    try:
        yield inside
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)
        fsdp_integration.FSDPAllGather.__call__ = call


def tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def run(preset, shard_references=True, guard=False, steps=STEPS):
    model = tiny_llama()
    h = hfcompress.apply(model, preset, ranks_per_node=2, shard=True, mp_policy=MP)
    if not shard_references:
        for m in h.comms.values():
            m.all_gather.references.shard = False
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        ctx = no_host_sync_in_all_gather() if guard and step in GUARDED else \
            contextlib.nullcontext()
        with ctx:
            loss = train_step(model, step)
        opt.step()
        opt.zero_grad()
        h.step()
        losses.append(global_mean(loss))
    state = add_state_bytes(c.state_bytes() for m in h.comms.values()
                            for c in m.collectives().values())
    return model, h, losses, state


def worker(rank, world):
    setup()
    out = {}
    with no_host_sync_in_all_gather() as inside:      # the guard itself works
        inside[0] = True
        for call in (lambda: torch.ones(2).sum().item(), lambda: torch.ones(1).tolist(),
                     lambda: bool(torch.ones(1)), lambda: torch.equal(torch.ones(1),
                                                                      torch.ones(1))):
            try:
                call()
                out.setdefault("unguarded", []).append(call)
            except HostSync:
                pass
        inside[0] = False
    out["unguarded"] = len(out.get("unguarded", []))
    model, h, out["losses"], out["state"] = run("sdp4bit", guard=True)
    _, full, out["losses_full"], out["state_full"] = run("sdp4bit", shard_references=False)
    out["estimate"] = h.state_estimate
    out["full_param_bytes"] = sum(p.numel() for p in model.parameters()) * 2     # bf16
    out["sharded_param_bytes"] = sum(p.to_local().numel() * p.to_local().element_size()
                                     for p in model.parameters())
    saved = h.state_dict()
    out["state_dict_bytes"] = tensor_bytes(saved)
    out["state_dict_full_bytes"] = tensor_bytes(full.state_dict())
    # the backward all-gather: compressed columns inside the node, norms exactly over all
    last = h.meter.history[-1]["collectives"]["all_gather_bwd"]
    layers = [m for name, m in h.comms.items() if name]
    norms = sum(m.layouts.full.exact_numel for m in layers) * 2        # bf16, per rank
    compressed = sum(m.layouts.full.numel - m.layouts.full.exact_numel for m in layers) * 2
    out["bwd"] = (last["intra_bytes"], last["inter_bytes"], norms, compressed)
    # a checkpoint from another node layout (4 nodes x 1) is refused
    other = hfcompress.apply(tiny_llama(), "sdp4bit", ranks_per_node=1, shard=True,
                             mp_policy=MP)
    try:
        other.load_state_dict(saved)
        out["refused"] = None
    except ValueError as err:
        out["refused"] = str(err)
    _, loco, _, out["loco_state"] = run("loco", steps=2)   # the error is reset after step 0
    out["loco_estimate"] = loco.state_estimate
    return out


def nonzero(d):
    return {k: v for k, v in d.items() if v}


def test_fsdp_state_memory_2_nodes_x_2():
    results = run_distributed(worker, 4)
    r0 = results[0]
    for r in results:
        # numbers unchanged: node-sharded references == full references, bit for bit
        assert r["losses"] == r["losses_full"] == r0["losses"], (r["losses"], r["losses_full"])
        # per-rank state: the estimate exactly; half of the full layout's (2 ranks per node)
        assert r["state"] == nonzero(r["estimate"]), (r["state"], r["estimate"])
        assert r["state"]["references"] * 2 == r["state_full"]["references"]
        full = r["full_param_bytes"]
        print(f"rank state {r['state']} = {sum(r['state'].values()) / full:.3f} x full bf16 "
              f"params ({full} B); full layout {r['state_full']}; sharded params "
              f"{r['sharded_param_bytes']} B")
        assert sum(r["state"].values()) <= 0.8 * full
        assert sum(r["state_full"].values()) > 0.8 * full
        # the checkpoint holds this rank's references (and the config): no full copy
        assert r["state_dict_bytes"] == r["state"]["references"], r["state_dict_bytes"]
        assert r["state_dict_full_bytes"] == r["state_full"]["references"]
        intra, inter, norms, compressed = r["bwd"]
        # per rank: the 2 compressed slots it holds (one per node) to its 1 node peer, the
        # norms to 3 peers, 2 of them on the other node
        assert (intra, inter) == (2 * compressed + norms, 2 * norms), r["bwd"]
        assert r["unguarded"] == 0
        msg = r["refused"]
        assert msg and "saved with world_size=4, ranks_per_node=2" in msg and \
            "this run has world_size=4, ranks_per_node=1" in msg, msg
        # LoCo (2 hops at X = 2: errors of every row this rank sends on hop 1 and of the node's
        # partial sums on hop 2, 8-bit + a scale per 128: 0.5 (1 + 1/X) of the bf16 size)
        loco = r["loco_state"]
        assert set(loco) == {"errors"} and 0.75 * full <= loco["errors"] <= 0.83 * full, loco
        assert loco == nonzero(r["loco_estimate"]), (loco, r["loco_estimate"])
