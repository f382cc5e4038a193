"""Launch plans of the hot kernel wrappers, cached per call signature (a step's host time).

A wrapper's decisions (the tile constants, the grid, the noise mode, which operands a kernel
reads in place, the wire's width) depend only on its operands' shapes, strides, dtypes,
devices and pointer alignment and on its scalar arguments. Those repeat call after call for
one FSDP unit, so each wrapper builds its plan once per signature (:func:`signature` of each
tensor with the scalars) and a call only makes its buffers and launches: ~20 us of Python
less per launch than deciding again (``benchmarks/host_ab.py``). A plan holds no tensor.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

from .packing import flat_contiguous


def signature(t: torch.Tensor | None) -> tuple | None:
    """What a plan may depend on of ``t``: shape, strides, dtype, whether on a GPU (the
    tile, ``triton_tiles.per_program``) and its start's alignment to 16 bytes (the JIT's
    specialization, read-in-place decisions); None for None."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.is_cuda, t.data_ptr() % 16


class LaunchPlans:
    """``key -> plan`` of one wrapper, ``build(*args)`` at a key's first call; at most
    ``limit`` plans (all dropped when full: a model's units repeat a few signatures)."""

    def __init__(self, build: Callable[..., Any], limit: int = 1024) -> None:
        self._build, self._plans, self.limit = build, {}, limit

    def __call__(self, key: Hashable, *args: Any) -> Any:
        plan = self._plans.get(key, self)
        if plan is self:
            if len(self._plans) >= self.limit:
                self._plans.clear()
            plan = self._plans[key] = self._build(*args)
        return plan


def rows_operands(x: torch.Tensor, flat: bool, rows: int, width: int,
                  noise: torch.Tensor | None, noise_flat: bool, tail: torch.Tensor | None
                  ) -> tuple[torch.Tensor, ...]:
    """A planned quantize-rows launch's tensors: ``x`` (flat where the plan reads it so),
    the uint8 wire ``[rows, width]`` it writes and its int32 words, the noise operand (float
    values flat, keys as they are) and the riders (unit column stride); ``x`` stands for
    an absent one (``triton_noise.noise_operand`` / ``tail_operand``)."""
    if flat:
        x = flat_contiguous(x)
    wire = torch.empty(rows, width, dtype=torch.uint8, device=x.device)
    u = x if noise is None else flat_contiguous(noise) if noise_flat else noise.contiguous()
    t = x if tail is None else tail if tail.stride(-1) == 1 else tail.contiguous()
    return x, wire, wire.view(torch.int32), u, t
