"""LoCo-integrated Adam-family optimizers (LoCo 4.2, Eq. 10).

LoCo leaves the Adam-family update itself unchanged: the moments and the pre-conditioner are
computed from the averaged low-bit gradient g~_k that the compressed collectives deliver
(Alg. 1 line 15). What the optimizer adds is LoCo's clock: Alg. 1 lines 9-10 zero the error
buffers every T_c *optimizer steps*, so each ``step()`` that really updates the weights calls
``compression.step()`` once (an FSDP2 handle from ``hfcompress.apply`` or a DDP hook state from
``register_ddp_hook``; both also close the wire meter's step)::

    handle = hfcompress.apply(model, "loco", shard=True)
    opt = LoCoAdamW(model.parameters(), compression=handle, lr=1e-4)

``compression`` may be bound later (``opt.compression = handle``), e.g. when the optimizer is
built before the model is sharded, as ``hfcompress.Trainer`` does.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
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
    """``transformers.optimization.Adafactor`` stepping LoCo's reset clock (LoCo 4.2)."""

    def __init__(self, params, compression: Any = None, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.compression = compression


SUPPORTED = {"adamw_torch": LoCoAdamW, "adamw_torch_fused": LoCoAdamW, "adafactor": LoCoAdafactor}


def loco_optimizer_class(cls: type, optim: str = "") -> type:
    """The LoCo wrapper of optimizer class ``cls`` (what ``TrainingArguments.optim`` chose)."""
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
