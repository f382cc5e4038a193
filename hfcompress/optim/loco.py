"""LoCo-integrated Adam-family optimizers (LoCo 4.2, Eq. 10).

LoCo leaves the Adam-family update itself unchanged: the moments and the pre-conditioner are
computed from the averaged low-bit gradient g~_k that the compressed collectives deliver
(Alg. 1 line 15). What the optimizer adds is LoCo's clock: Alg. 1 lines 9-10 zero the error
buffers every T_c *optimizer steps*, so each ``step()`` that really updates the weights calls
``compression.step()`` once (an FSDP2 handle from ``hfcompress.apply`` or a DDP hook state from
``register_ddp_hook``; both also close the wire meter's step)::

    handle = hfcompress.apply(model, "loco", shard=True)
    opt = LoCoAdamW(model.parameters(), compression=handle, lr=1e-4)

The optimizer sees only g~_k, the average of the decoded compensated gradients (Alg. 1 lines
15-16): its moments (Adam's m and v, Adafactor's factored v), any gradient clipping and
weight decay act on g~_k, never on the local g or on e, so the error buffers are the only
LoCo state and neither wrap changes the update rule. The clock advances only in a ``step()``
that reached the optimizer: a step a gradient scaler skips (non-finite gradients) compressed
without advancing it (its non-finite error entries were stored as zeros), so T_c counts the
optimizer's real updates on every rank alike.

``compression`` may be bound later (``opt.compression = handle``), e.g. when the optimizer is
built before the model is sharded, as ``hfcompress.Trainer`` does.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor, Replicate
from transformers.optimization import Adafactor


class LoCoOptimizer:
    """Mixin: after the wrapped optimizer's step, advance the compression handle's step."""

    compression: Any = None

    def step(self, closure: Callable[[], float] | None = None):
        loss = super().step(closure)
        if self.compression is not None:
            self.compression.step()
        return loss


class LoCoAdamW(LoCoOptimizer, torch.optim.AdamW):
    """``torch.optim.AdamW`` stepping LoCo's reset clock (LoCo 4.2)."""

    def __init__(self, params, compression: Any = None, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.compression = compression


class LoCoAdafactor(LoCoOptimizer, Adafactor):
    """``transformers.optimization.Adafactor`` stepping LoCo's reset clock (LoCo 4.2).

    Also runs on FSDP2's sharded (DTensor) parameters, where the stock Adafactor fails: its
    factored second-moment state is created as DTensors placed like the statistics it holds
    (row means sharded with the rows, column means of a dim-0-sharded matrix replicated), so
    the update is the unsharded Adafactor's."""

    def __init__(self, params, compression: Any = None, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.compression = compression

    def step(self, closure: Callable[[], float] | None = None):
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None and not self.state[p] and isinstance(p.grad, DTensor):
                        self._init_sharded_state(group, p)
        return super().step(closure)

    def _init_sharded_state(self, group: dict, p: torch.Tensor) -> None:
        """The state Adafactor's step would create, as DTensors."""
        grad = p.grad.float() if p.grad.dtype in (torch.float16, torch.bfloat16) else p.grad
        factored, use_first_moment = self._get_options(group, grad.shape)
        state = self.state[p]
        state["step"], state["RMS"] = 0, 0
        if use_first_moment:
            state["exp_avg"] = torch.zeros_like(grad)
        if factored:
            state["exp_avg_sq_row"] = _zeros_like_mean(grad, -1)
            state["exp_avg_sq_col"] = _zeros_like_mean(grad, -2)
        else:
            state["exp_avg_sq"] = torch.zeros_like(grad)


def _zeros_like_mean(x: DTensor, dim: int) -> DTensor:
    """Zeros shaped and placed like ``x.mean(dim)``, partial sums resolved to replicas."""
    m = x.mean(dim=dim)
    placements = [Replicate() if pl.is_partial() else pl for pl in m.placements]
    return torch.zeros_like(m.redistribute(m.device_mesh, placements))


SUPPORTED = {"adamw_torch": LoCoAdamW, "adamw_torch_fused": LoCoAdamW, "adafactor": LoCoAdafactor}


def loco_optimizer_class(cls: type, optim: str = "") -> type:
    """The LoCo wrapper of optimizer class ``cls`` (what ``TrainingArguments.optim`` chose)."""
    optim = getattr(optim, "value", optim)      # transformers' OptimizerNames enum
    if isinstance(cls, type) and issubclass(cls, LoCoOptimizer):
        return cls
    if isinstance(cls, type) and issubclass(cls, torch.optim.AdamW):
        return LoCoAdamW
    if isinstance(cls, type) and issubclass(cls, Adafactor):
        return LoCoAdafactor
    name = getattr(cls, "__name__", repr(cls))
    raise ValueError(f"LoCo error feedback (comm_compressor with loco) cannot wrap optimizer "
                     f"{name}{f' (optim={optim!r})' if optim else ''}. Supported: optim="
                     f"{', '.join(map(repr, SUPPORTED))}, or pass hfcompress.optim.LoCoAdamW / "
                     f"LoCoAdafactor yourself")
