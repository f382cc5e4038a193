"""Chaining asynchronous collectives without blocking the host (``torch.futures``).

A multi-stage scheme (Global-QSGD: MAX of the scales, then the codes) cannot be one
``fut.then(...)``: the next stage launches another asynchronous collective, and waiting for
it inside the callback would block the thread that runs the callback (the caller's thread
when the future is already complete: always on NCCL, whose futures complete at enqueue).
:func:`chain` flattens instead: ``fn``'s future completes the returned one.

A callback runs inline when its future is already complete, else on the thread completing
it (gloo: a worker thread of the process group). On CUDA the futures carry the device
(``devices=``): ``then`` runs each callback on streams synchronized with the previous stage,
and ``wait()`` makes the caller's stream wait, never the host.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.futures import Future


def devices_of(tensor: torch.Tensor) -> list[torch.device] | None:
    """The ``devices=`` of a future holding ``tensor`` (CUDA only; None on CPU)."""
    return [tensor.device] if tensor.is_cuda else None


def completed(value: Any, devices: list[torch.device] | None = None) -> Future:
    """A future already holding ``value``."""
    fut: Future = Future(devices=devices)
    fut.set_result(value)
    return fut


def chain(fut: Future, fn: Callable[[Any], Any],
          devices: list[torch.device] | None = None) -> Future:
    """A future of ``fn(fut's value)``; when ``fn`` returns a future (it launched the next
    asynchronous step), of that future's value, without waiting for it. An exception in
    ``fn`` or in either future completes the result with it."""
    out: Future = Future(devices=devices)

    def fail(err: BaseException) -> None:
        if not out.done():
            out.set_exception(err)

    def finish(nxt: Future) -> None:
        try:
            out.set_result(nxt.value())
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on ``out``
            fail(err)

    def start(done: Future) -> None:
        try:
            nxt = fn(done.value())
        except BaseException as err:  # noqa: BLE001
            fail(err)
            return
        if isinstance(nxt, torch._C.Future):
            nxt.then(finish)
        else:
            out.set_result(nxt)

    fut.then(start)
    return out
