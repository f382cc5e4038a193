"""Launch plans of the hot kernel wrappers, cached per call signature (a step's host time).

A wrapper's decisions (the tile constants, the grid, the noise mode, which operands a kernel
reads in place, the wire's width) depend only on its operands' shapes, strides, dtypes,
devices and pointer alignment and on its scalar arguments. Those repeat call after call for
one FSDP unit, so each wrapper builds its plan once per signature (:func:`signature` of each
tensor with the scalars) and a call only makes its buffers and launches: ~20 us of Python
less per launch than deciding again (``benchmarks/host_ab.py``). A plan holds no tensor.
A caller that keys its own plans by its operands' signatures (``comm/two_hop``) takes a
wrapper's ``planned_*`` form instead (:func:`planned_once`): its plan built at the first call,
no lookup after.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch


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


_UNBUILT = object()


def planned_once(build: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    """``run(plan, *args)`` with the plan ``build(*args)`` made at the first call: a wrapper
    for a caller whose every call passes operands of one :func:`signature` each (its promise,
    e.g. plans of its own keyed by them), so the wrapper decides once and looks nothing up."""
    plan = _UNBUILT

    def call(*args: Any) -> Any:
        nonlocal plan
        if plan is _UNBUILT:
            plan = build(*args)
        return run(plan, *args)
    return call
