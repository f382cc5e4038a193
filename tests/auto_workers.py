"""Worker functions of the ``comm_compressor="auto"`` tests (``dist_utils.run_distributed``):
a tiny LLaMA under FSDP2 (bf16 parameters, fp32 reduction) or DDP, ``hfcompress.apply(model,
"auto")`` and a few AdamW steps; each returns what the test checks."""

from __future__ import annotations

import os

import torch
from torch.nn.parallel import DistributedDataParallel

import hfcompress
from hfcompress.config import AutoSettings, get_config

from fsdp_workers import MP, global_mean, setup, tiny_llama, train_step


def pin(env: str | None) -> None:
    """Set HFCOMPRESS_AUTO (None: unset it; the jobs of one launch share the environment)."""
    if env is None:
        os.environ.pop("HFCOMPRESS_AUTO", None)
    else:
        os.environ["HFCOMPRESS_AUTO"] = env


def train(model, handle, steps: int, after=None) -> list[float]:
    """``steps`` AdamW steps; ``after(step)`` runs after each step's ``handle.step()``."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        loss = train_step(model, step)
        opt.step()
        opt.zero_grad()
        handle.step()
        losses.append(global_mean(loss))
        if after is not None:
            after(step)
    return losses


def fsdp_auto(rank: int, world: int, ranks_per_node: int, settings: dict | None,
              pin_env: str | None, steps: int) -> dict:
    """apply("auto") (or AutoSettings(**settings)); the choice, the config that runs, the
    losses, and the state round trip."""
    setup()
    pin(pin_env)
    model = tiny_llama()
    auto = "auto" if settings is None else AutoSettings(**settings)
    handle = hfcompress.apply(model, auto, ranks_per_node=ranks_per_node, shard=True,
                              mp_policy=MP)
    first = handle.auto.choice.plan.label
    losses = train(model, handle, steps)
    state = handle.state_dict()
    handle.load_state_dict(state)         # the saved plan is the running one: loads as is
    return {"first": first, "chosen": handle.auto.choice.plan.label,
            "config": handle.config.to_dict(), "summary": handle.auto.summary(),
            "losses": losses, "auto_plan": state["auto_plan"],
            "installed": type(handle.installed_parts).__name__}


def fsdp_restore(rank: int, world: int, pin_save: str, pin_allows: str,
                 pin_excludes: str) -> dict:
    """Save a handle's state under one pinned plan; load it into an auto handle whose pin
    allows that plan but chose another (``margin`` huge: the fewest compressed kinds): the
    handle switches to the saved plan and its qWD references load. Load it into one whose
    pin excludes the plan (``HFCOMPRESS_AUTO`` changed before the resume): the pin wins,
    nothing is loaded, and the pinned plan trains."""
    setup()
    results = {}
    states = {}
    for name, pin in (("save", pin_save), ("allows", pin_allows), ("excludes", pin_excludes)):
        os.environ["HFCOMPRESS_AUTO"] = pin
        torch.manual_seed(0)
        model = tiny_llama()
        handle = hfcompress.apply(model, AutoSettings(margin=1e9), ranks_per_node=1,
                                  shard=True, mp_policy=MP)
        if name == "save":
            train(model, handle, 2)
            states[name] = handle.state_dict()
            continue
        before = handle.auto.choice.plan.label
        handle.load_state_dict(states["save"])
        results[name] = {"before": before, "after": handle.auto.choice.plan.label,
                         "config": handle.config.name,
                         "references": handle.memory_report()["references"],
                         "losses": train(model, handle, 2)}
    os.environ.pop("HFCOMPRESS_AUTO", None)
    return results


def ddp_auto(rank: int, world: int, pin_env: str | None) -> dict:
    setup()
    pin(pin_env)
    torch.manual_seed(0)
    model = DistributedDataParallel(tiny_llama())
    handle = hfcompress.apply(model, "auto", ranks_per_node=1)
    losses = train(model, handle, 3)
    return {"chosen": handle.auto.choice.plan.label, "config": handle.config.to_dict(),
            "losses": losses, "table": handle.auto.choice.table}


def reprobe_switch(rank: int, world: int) -> dict:
    """reprobe_every=2 with the first choice pinned by the environment, then released: the
    re-probe chooses freely, and the history records the measured step and compute."""
    setup()
    os.environ["HFCOMPRESS_AUTO"] = "weights=qwd,grad_inter=hs4"
    model = tiny_llama()
    handle = hfcompress.apply(model, AutoSettings(reprobe_every=2), ranks_per_node=1,
                              shard=True, mp_policy=MP)
    first = handle.auto.choice.plan.label
    os.environ["HFCOMPRESS_AUTO"] = "weights=exact,grad_inter=exact"
    losses = train(model, handle, 5)
    return {"first": first, "chosen": handle.auto.choice.plan.label,
            "history": handle.auto.choice.history, "losses": losses,
            "config": handle.config.name}


def exact_losses(rank: int, world: int, steps: int) -> list[float]:
    """The same training with exact collectives (preset none)."""
    setup()
    model = tiny_llama()
    handle = hfcompress.apply(model, get_config("none"), ranks_per_node=1, shard=True,
                              mp_policy=MP)
    return train(model, handle, steps)


def hpz_switch(rank: int, world: int) -> dict:
    """hpZ chosen by auto on 2 nodes x 1 (pinned ``weights=qwz_hpz``): the layers keep their
    forward weights (no backward all-gather); the re-probe after step 3, pinned to
    ``weights=qwz``, switches hpZ off again (the layers reshard after forward as sharded)."""
    from hfcompress.integrations import _fsdp2
    from hfcompress.integrations.fsdp import fsdp_modules

    setup()
    os.environ["HFCOMPRESS_AUTO"] = "weights=qwz_hpz,grad_inter=exact"
    model = tiny_llama()
    handle = hfcompress.apply(model, AutoSettings(reprobe_every=2), ranks_per_node=1,
                              shard=True, mp_policy=MP)

    def reshard() -> list:
        return [_fsdp2.post_forward_shard_size(_fsdp2.param_groups(m)[0])
                for name, m in fsdp_modules(model) if name]

    def backward_gathered() -> int:
        sent = handle.meter.history[-1]["collectives"].get("all_gather_bwd", {})
        return sent.get("inter_bytes", 0) + sent.get("intra_bytes", 0)

    out = {"first": handle.auto.choice.plan.label, "config": handle.config.to_dict(),
           "hpz_fact": handle.auto.choice.layout["hpz"], "reshard_on": reshard()}
    os.environ["HFCOMPRESS_AUTO"] = "weights=qwz,grad_inter=exact"
    def hpz_on_step(step: int) -> None:
        if step == 1:
            out["bwd_bytes_on"] = backward_gathered()

    losses = train(model, handle, 5, after=hpz_on_step)   # the re-probe after step 3 switches
    out.update(chosen=handle.auto.choice.plan.label, reshard_off=reshard(),
               bwd_bytes_off=backward_gathered(), losses=losses)
    os.environ.pop("HFCOMPRESS_AUTO", None)
    return out


def ddp_reprobe(rank: int, world: int) -> dict:
    """DDP with reprobe_every=2: the first choice pinned to Global-QSGD's exponential
    all-reduce, then the pin moved to exact: the re-probe after step 3 switches the
    registered hook's config (its streams fresh) and training goes on."""
    setup()
    os.environ["HFCOMPRESS_AUTO"] = "all_reduce=global_qsgd_exp"
    torch.manual_seed(0)
    model = DistributedDataParallel(tiny_llama())
    handle = hfcompress.apply(model, AutoSettings(reprobe_every=2), ranks_per_node=1)
    first = handle.auto.choice.plan.label
    os.environ["HFCOMPRESS_AUTO"] = "all_reduce=exact"
    losses = train(model, handle, 5)
    os.environ.pop("HFCOMPRESS_AUTO", None)
    return {"first": first, "chosen": handle.auto.choice.plan.label,
            "history": handle.auto.choice.history, "losses": losses,
            "streams": len(handle.all_reduce.compressors()),
            "cover_share": handle.auto.choice.cover_share,
            "sent": handle.meter.history[-1]["collectives"]}
