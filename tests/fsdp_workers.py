"""Worker functions of the spawned FSDP2 tests (``dist_utils.run_distributed`` runs them).

A tiny ``LlamaForCausalLM`` (vocab 256, hidden 64, 2 layers, built from a config) is sharded
by ``hfcompress.apply(..., shard=True)`` with bf16 parameters and fp32 gradient reduction
(``MixedPrecisionPolicy``) and trained with AdamW on arithmetic sequences
``(a + b t) mod 256``: every rank draws its own batch, so the gradients differ across ranks.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

import hfcompress
from hfcompress.comm.hop import all_gather_single
from hfcompress.config import Scheme, get_config
from hfcompress.integrations import CommunicationError, _fsdp2, shard_model
from hfcompress.testing import tiny_llama as _tiny_llama

MP = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
LR = 3e-3


def setup() -> None:
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    # eager kernels: compiling them in every worker costs more than the training
    os.environ["HFCOMPRESS_COMPILE"] = "0"


def tiny_llama():
    return _tiny_llama(num_key_value_heads=2)


def batch(step: int, rank: int, n: int = 8, length: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    a = torch.randint(0, 256, (n, 1), generator=g)
    b = torch.tensor([1, 2, 3, 5, 7])[torch.randint(0, 5, (n, 1), generator=g)]
    return (a + b * torch.arange(length)) % 256


def train_step(model, step: int, rank: int | None = None) -> torch.Tensor:
    """Forward and backward on the batch of ``step`` and data-parallel ``rank`` (default:
    this rank of the world); the loss."""
    ids = batch(step, dist.get_rank() if rank is None else rank)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach()


def global_mean(x: torch.Tensor) -> float:
    x = x.detach().float().reshape(1).clone()
    dist.all_reduce(x)
    return x.item() / dist.get_world_size()


def local_grads(model) -> torch.Tensor:
    return torch.cat([p.grad.to_local().float().reshape(-1) for p in model.parameters()])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two sharded vectors (this rank holds a shard of each)."""
    s = torch.stack([(a * b).sum(), (a * a).sum(), (b * b).sum()]).double()
    dist.all_reduce(s)
    return (s[0] / (s[1].sqrt() * s[2].sqrt())).item()


def same_on_all_ranks(t: torch.Tensor) -> bool:
    b = t.contiguous().view(torch.uint8).reshape(-1)
    everyone = torch.empty(dist.get_world_size() * b.numel(), dtype=torch.uint8)
    all_gather_single(everyone, b)
    return all(torch.equal(c, b) for c in everyone.chunk(dist.get_world_size()))


def gathered_weights_identical(model) -> bool:
    """All-gather every FSDP module (through the installed comms) and compare the unsharded
    weights byte for byte across ranks."""
    ok = True
    for m in model.modules():
        if not isinstance(m, FSDPModule) or not _fsdp2.param_groups(m):
            continue
        m.unshard()
        pg = _fsdp2.param_groups(m)[0]
        flat = torch.cat([fp.unsharded_param.detach().reshape(-1) for fp in pg.fsdp_params])
        ok &= same_on_all_ranks(flat)
        m.reshard()
    return ok


def exact_names(h) -> set[str]:
    """Names of the parameters the handle sends exactly."""
    return {s.name for m in h.comms.values() for s in m.layouts.segments if s.exact}


def forward_and_main(model) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per parameter: (the all-gathered, unsharded weights a forward pass computes with, the
    main weights cast to their dtype); every FSDP module is all-gathered through the
    installed comms once."""
    out = {}
    for m in model.modules():
        if not isinstance(m, FSDPModule) or not _fsdp2.param_groups(m):
            continue
        pg = _fsdp2.param_groups(m)[0]
        mains = [fp.sharded_param.full_tensor() for fp in pg.fsdp_params]
        m.unshard()
        for fp, main in zip(pg.fsdp_params, mains):
            got = fp.unsharded_param.detach().clone()
            out[fp._param_fqn] = (got, main.to(got.dtype))
        m.reshard()
    return out


def weights_match_main(model) -> dict[str, bool]:
    """Per parameter: do the all-gathered (unsharded) weights equal the main weights cast to
    the parameter dtype, bit for bit?"""
    return {n: torch.equal(got, main) for n, (got, main) in forward_and_main(model).items()}


def train(preset, ranks_per_node: int, steps: int, probes=()) -> dict:
    """Train ``steps`` steps (``preset=None``: plain FSDP2, no hfcompress). At the ``probes``
    steps, also run the same batch with FSDP's exact collectives (same main weights): the
    gradient cosine, and whether the exactly-sent parameters got bit-identical gradients."""
    model = tiny_llama()
    if preset is None:
        h = None
        shard_model(model, ranks_per_node, False, mp_policy=MP)
    else:
        h = hfcompress.apply(model, preset, ranks_per_node=ranks_per_node, shard=True,
                             mp_policy=MP)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    named = dict(model.named_parameters())
    out = {"loss": [], "cos": {}, "exact_grads_equal": {}, "other_grads_equal": {}}
    t0 = time.perf_counter()
    for step in range(steps):
        loss = train_step(model, step)
        if h is not None and step in probes:
            compressed = {n: p.grad for n, p in named.items()}
            g_c = local_grads(model)
            opt.zero_grad()
            with h.disabled():
                train_step(model, step)
            out["cos"][step] = cosine(g_c, local_grads(model))
            same = {n: torch.equal(compressed[n].to_local(), p.grad.to_local())
                    for n, p in named.items()}
            exact = exact_names(h)
            out["exact_grads_equal"][step] = all(v for n, v in same.items() if n in exact)
            out["other_grads_equal"][step] = any(v for n, v in same.items() if n not in exact)
            for n, p in named.items():
                p.grad = compressed[n]
        opt.step()
        opt.zero_grad()
        if h is not None:
            h.step()
        out["loss"].append(global_mean(loss))
    out["seconds"] = time.perf_counter() - t0
    out["identical"] = gathered_weights_identical(model)
    out["weights_match_main"] = weights_match_main(model)
    out["params"] = {n: p.numel() for n, p in named.items()}
    if h is not None:
        out["meter"] = h.meter.history
        out["exact"] = sorted(exact_names(h))
        h.remove()
    return out


def resume(preset, ranks_per_node: int, k: int = 4, r: int = 3) -> dict:
    """Train k steps, save model / optimizer / compression state, train r steps; restore and
    train the same r steps again: with the compression state restored the losses repeat
    bit for bit; with only model and optimizer restored they do not (stateful schemes)."""
    model = tiny_llama()
    h = hfcompress.apply(model, preset, ranks_per_node=ranks_per_node, shard=True, mp_policy=MP)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def run(first, count):
        losses = []
        for step in range(first, first + count):
            losses.append(train_step(model, step).item())
            opt.step()
            opt.zero_grad()
            h.step()
        return losses

    run(0, k)
    params = [p.to_local().clone() for p in model.parameters()]
    opt_state = copy.deepcopy(opt.state_dict())
    comp_state = copy.deepcopy(h.state_dict())

    def restore(with_compression):
        with torch.no_grad():
            for p, saved in zip(model.parameters(), params):
                p.to_local().copy_(saved)
        opt.load_state_dict(copy.deepcopy(opt_state))
        if with_compression:
            h.load_state_dict(copy.deepcopy(comp_state))

    first = run(k, r)
    restore(True)
    again = run(k, r)
    restore(False)
    without = run(k, r)
    other = copy.deepcopy(comp_state)
    other["config"]["min_numel"] = 7
    try:
        h.load_state_dict(other)
        refused = None
    except ValueError as err:
        refused = str(err)
    return {"first": first, "again": again, "without": without, "refused": refused}


def api_checks() -> dict:
    """``apply`` on a model the user sharded (shard=False), ``remove()``, and the refusals:
    hpZ config on layers sharded without hpZ, no FSDP modules, an all-reduce-only preset."""
    out = {}
    model = tiny_llama()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=MP)
    fully_shard(model, mp_policy=MP)
    h = hfcompress.apply(model, "qwd", ranks_per_node=1)
    pgs = [c.param_group for c in h.comms.values()]
    out["installed"] = [type(pg._all_gather_comm).__name__ for pg in pgs]
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    # the weights q_proj computes with in forward and in backward (qWD: the backward
    # all-gather, with no optimizer step since the forward one, sends zero differences)
    seen = []
    q = model.model.layers[0].self_attn.q_proj
    q.register_forward_pre_hook(lambda m, a: seen.append(("fwd", m.weight.detach().clone())))
    q.register_full_backward_pre_hook(
        lambda m, g: seen.append(("bwd", m.weight.detach().clone())))
    losses = []
    for step in range(3):
        losses.append(train_step(model, step).item())
        opt.step()
        opt.zero_grad()
        h.step()
    out["losses"] = losses
    kinds = [k for k, _ in seen]
    ws = [w for _, w in seen]
    out["fwd_bwd_same"] = kinds == ["fwd", "bwd"] * 3 and all(
        torch.equal(ws[i], ws[i + 1]) for i in (0, 2, 4))
    out["steps_differ"] = not torch.equal(ws[0], ws[2]) and not torch.equal(ws[2], ws[4])
    out["calls"] = {k: v["calls"] for k, v in h.meter.history[-1]["collectives"].items()}
    h.remove()
    out["removed"] = [type(pg._all_gather_comm).__name__ for pg in pgs] + \
        [type(pg._reduce_scatter_comm).__name__ for pg in pgs]
    errors = []
    for preset, sharded in (("zeropp", model), ("sdp4bit", tiny_llama()),
                            ("global_qsgd", model)):
        try:
            hfcompress.apply(sharded, preset, ranks_per_node=1)
        except ValueError as err:
            errors.append(str(err))
    out["errors"] = errors
    return out


def presets_worker(rank, world, presets, ranks_per_node, steps, probes, resume_presets=(),
                   api=False):
    """Every check of one spawned job: ``train`` per preset (``None``: plain FSDP2),
    ``resume`` per stateful preset, and (``api``) the mismatched-config and API checks."""
    setup()
    results = {"mismatch": mismatch_checks(rank) if api else None,
               "api": api_checks() if api else None}
    results["train"] = {p: train(p, ranks_per_node, steps, probes) for p in presets}
    results["resume"] = {p: resume(p, ranks_per_node) for p in resume_presets}
    return results


def mismatch_checks(rank):
    """Different configurations on different ranks are refused at apply time, by every rank,
    naming the key and each rank's value; nothing is sharded."""
    messages = []
    cfg = get_config("sdp4bit")
    if rank == 1:
        cfg = dataclasses.replace(cfg, grad_inter=Scheme(
            "hadamard", {"bits": 8, "group_size": 128, "hadamard_size": 32}))
    # a different scheme parameter; a different node layout; a bad preset name on rank 1 only
    # (rank 0 must not wait for it until the timeout)
    bad = "sdp4bit" if rank == 0 else "sdp4bitt"
    for preset, x in ((cfg, 1), ("sdp4bit", 1 + rank), (bad, 1)):
        model = tiny_llama()
        try:
            hfcompress.apply(model, preset, ranks_per_node=x, shard=True, mp_policy=MP)
        except ValueError as err:
            messages.append(str(err))
        assert not any(isinstance(m, FSDPModule) for m in model.modules())
    return messages


def failure_worker(rank, world, mode, timeout_s):
    """Rank 1 dies (``mode="dead"``: exits without a word) or stalls for longer than the
    timeout (``"stall"``) at step 2. Rank 0 checks that its next collective raises a
    CommunicationError naming the collective and the timeout (instead of hanging: the
    launcher's own timeout fails a hang; no duration is asserted, a loaded machine only
    makes it later). FSDP runs on a group with that timeout."""
    setup()
    group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=timeout_s))
    mesh = DeviceMesh.from_group(group, "cpu")
    model = tiny_llama()
    hfcompress.apply(model, "sdp4bit", ranks_per_node=1, shard=True, mp_policy=MP, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(4):
        if step == 2 and rank == 1:
            if mode == "dead":
                os._exit(0)
            time.sleep(timeout_s + 1.5)
            return None
        t0 = time.perf_counter()
        try:
            train_step(model, step)
        except CommunicationError as err:
            seconds = time.perf_counter() - t0
            assert step == 2, (step, str(err))
            msg = str(err)
            assert "all-gather of FSDP module" in msg and f"timeout {timeout_s:g} s" in msg, msg
            return {"seconds": seconds, "error": msg}
        opt.step()
        opt.zero_grad()
    raise AssertionError(f"rank 1 {mode}, but rank 0 trained on without an error")


# -- parameters frozen at apply that change later (issue 29, F1) ------------------------------
#: frozen at apply, unfrozen after step 2 and trained: a projection (qWD) and a norm (exact)
UNFROZEN = ("model.layers.0.mlp.down_proj.weight", "model.layers.0.post_attention_layernorm.weight")
#: frozen throughout, written in place after step 5 (a merge, weight surgery)
WRITTEN = ("model.layers.1.mlp.up_proj.weight", "model.layers.1.input_layernorm.weight")
#: frozen throughout, never written
KEPT = ("model.layers.1.mlp.gate_proj.weight", "model.embed_tokens.weight")
#: trainable throughout, also written in place after step 5
TRAINED_WRITTEN = "model.layers.1.self_attn.o_proj.weight"


def frozen_updates(preset: str, ranks_per_node: int) -> dict:
    """8 AdamW steps (``foreach=True``: its updates of a DTensor move no version counter) of
    the tiny LLaMA with the ``UNFROZEN``, ``WRITTEN`` and ``KEPT`` parameters frozen when
    ``apply`` runs; ``UNFROZEN`` unfrozen after step 2; ``WRITTEN`` and ``TRAINED_WRITTEN``
    written in place after step 5. Then, per parameter, the largest gap between the
    forward weights and the main ones (0: bit-identical), how far the main weights moved
    since apply, whether the gathered weights are identical on every rank, and the
    wire meter's inter-node bytes per step."""
    model = tiny_llama()
    for name, p in model.named_parameters():
        if name in UNFROZEN + WRITTEN + KEPT:
            p.requires_grad_(False)
    h = hfcompress.apply(model, preset, ranks_per_node=ranks_per_node, shard=True,
                         mp_policy=MP)
    named = dict(model.named_parameters())
    start = {n: p.full_tensor() for n, p in named.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    for step in range(8):
        if step == 2:
            for n in UNFROZEN:
                named[n].requires_grad_(True)
        if step == 6:
            with torch.no_grad():
                for n in WRITTEN:
                    named[n].mul_(1.5).add_(0.01)
                named[TRAINED_WRITTEN].add_(0.05)
        train_step(model, step)
        opt.step()
        opt.zero_grad()
        h.step()
    inter = [s["inter_bytes"] for s in h.meter.history]
    weights = forward_and_main(model)
    gap = {n: (got.float() - main.float()).abs().max().item()
           for n, (got, main) in weights.items()}
    moved = {n: (p.full_tensor() - start[n]).abs().max().item() for n, p in named.items()}
    return {"gap": gap, "moved": moved, "identical": gathered_weights_identical(model),
            "inter": inter}


def frozen_updates_worker(rank, world, runs):
    setup()
    return {(preset, x): frozen_updates(preset, x) for preset, x in runs}
