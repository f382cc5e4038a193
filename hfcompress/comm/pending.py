"""Collectives that end with local work (a decode, a copy), run with ``async_op``.

A compressed collective is "exchange, then decode into the output". With ``async_op=True``
it returns a ``torch.futures.Future`` that completes when both are done:

- CPU (gloo): the exchange is launched with ``async_op=True`` and the decode is chained with
  ``work.get_future().then(...)``: it runs on gloo's thread when the bytes arrive, while the
  caller's thread goes on computing (real overlap). The callback only computes locally; a
  collective is always launched from the caller's thread, in program order, so every rank
  issues its collectives in the same order.
- CUDA (NCCL): the host never waits anyway (a blocking NCCL call only makes the current
  stream wait), so exchange and decode are enqueued in order on the caller's current stream
  (FSDP2's all-gather stream) and the future is completed with an event recorded on that
  stream after the decode: its ``wait()`` makes the waiting stream wait for that event,
  no host sync. No other stream touches the buffers, so no ``record_stream`` is needed.

Temporaries (send / receive buffers) are held by the callback's closure until it has run.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from .futures import completed


def overlaps(device: torch.device, async_op: bool) -> bool:
    """Launch the exchange asynchronously and chain the decode (CPU); on CUDA, enqueue."""
    return async_op and device.type == "cpu"


def finish(work: dist.Work | None, then: Callable[[], None] | None, async_op: bool,
           device: torch.device) -> torch.futures.Future | None:
    """End a collective: ``then()`` (the decode) after ``work``.

    ``work`` is the asynchronous exchange (CPU with ``async_op``), else None (the exchange
    already ran or is enqueued). Returns None without ``async_op``, else a future that
    completes when the exchange and ``then()`` are done (and raises their error)."""
    if work is None:
        if then is not None:
            then()
        return done(device) if async_op else None

    def after(fut: torch.futures.Future) -> None:
        fut.wait()                       # re-raise the exchange's error
        if then is not None:
            then()
    return work.get_future().then(after)


def finish_all(futures: Sequence[torch.futures.Future | None], then: Callable[[], None],
               async_op: bool, device: torch.device) -> torch.futures.Future | None:
    """``then()`` after every future (None entries already done): one future, or None."""
    pending = [f for f in futures if f is not None]
    if not pending or not overlaps(device, async_op):
        for f in pending:
            f.wait()
        then()
        return done(device) if async_op else None

    def after(fut: torch.futures.Future) -> None:
        for f in fut.wait():
            f.wait()                     # re-raise the first error
        then()
    return torch.futures.collect_all(pending).then(after)


def done(device: torch.device) -> torch.futures.Future:
    """A completed future; on CUDA, completed by an event on the current stream (what
    ``wait()`` makes the waiting stream wait for)."""
    return completed(None, [device] if device.type == "cuda" else None)


class FutureWork(dist.Work):
    """A ``dist.Work`` (what FSDP2 checks with ``isinstance`` and ``wait()``s) that
    completes with a future; ``wait()`` re-raises the future's error, passed through
    ``on_error`` (e.g. to name the collective). (``_create_work_from_future`` would
    swallow the error: its ``wait()`` returns True.)"""

    def __init__(self, future: torch.futures.Future,
                 on_error: Callable[[BaseException], BaseException] | None = None) -> None:
        super().__init__()
        self.future, self.on_error = future, on_error

    def wait(self, timeout=None) -> bool:
        try:
            self.future.wait()
        except RuntimeError as err:
            if self.on_error is None:
                raise
            raise self.on_error(err) from err
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def get_future(self) -> torch.futures.Future:
        return self.future
