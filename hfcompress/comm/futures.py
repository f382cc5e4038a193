"""Asynchronous collectives: the stream contract of every ``async_op`` / future path.

A compressed collective is a few stages (compress, exchange, decode; Global-QSGD: MAX of
the scales, then the codes). How they run depends on the device, by one rule
(``docs/architecture.md``, "Stream contract"):

- **CPU (gloo)**: the host is what waits. Each exchange is launched with ``async_op=True``
  and the next stage is chained to its future (:func:`chain`, :func:`finish`): it runs on
  gloo's worker thread when the bytes arrive, while the caller's thread goes on computing.
  A stage only computes locally or launches the next collective; the streams of one hook
  state start one after another, so every rank launches the same collectives in the same
  order.
- **CUDA (NCCL)**: the host never waits for a collective (a blocking NCCL call only makes
  the current stream wait for NCCL's stream), but ``Future.then`` runs a callback on a
  fresh pool stream that waits only on events recorded for the tensors in the parent's
  value, and a future completed with ``None`` records none (``ATen/core/ivalue_inl.h``):
  a stage that returns nothing would be ordered after nothing. So on CUDA nothing is
  chained: every stage is enqueued at once, in program order, on one stream (:func:`chain`
  runs ``fn`` inline; :func:`finish` decodes at once), and an ``async_op`` caller gets that
  stream's work on a private **side stream** (:func:`side_stream_call`) that first waits on
  the caller's current stream; the result is a future completed *on the side stream* with
  the output tensor, so its ``wait()`` makes the waiting stream wait for an event recorded
  after the last stage, never the host. Buffers: the caller's tensors get
  ``record_stream(side)``; temporaries are allocated on the side stream and used only on
  it (NCCL keeps its own inputs alive until its stream is done with them).

``inline_on_cpu()`` runs the CUDA control flow on CPU (stages inline, in program order; gloo
collectives then block the host): the tests check with it that the CUDA path gives the
chained path's numbers and leaves no chain behind.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.futures import Future

from .exit_drain import add_callback

_INLINE_ON_CPU = False
_SIDE_STREAMS: dict[torch.device, Any] = {}


@contextlib.contextmanager
def inline_on_cpu() -> Iterator[None]:
    """Within the block, CPU collectives take the CUDA path's control flow (see above)."""
    global _INLINE_ON_CPU
    saved, _INLINE_ON_CPU = _INLINE_ON_CPU, True
    try:
        yield
    finally:
        _INLINE_ON_CPU = saved


def inline(device: torch.device) -> bool:
    """Whether stages on ``device`` run inline, in program order (CUDA; CPU in
    :func:`inline_on_cpu`), rather than chained to their futures (CPU)."""
    return device.type != "cpu" or _INLINE_ON_CPU


def devices_of(tensor: torch.Tensor) -> list[torch.device] | None:
    """The ``devices=`` of a future holding ``tensor``: its device where stages run inline
    (a CUDA future records an event for it on the current stream), else None."""
    return [tensor.device] if inline(tensor.device) else None


def completed(value: Any, devices: list[torch.device] | None = None) -> Future:
    """A future already holding ``value`` (on CUDA: with an event on the current stream for
    each tensor in ``value``; ``None`` records none)."""
    fut: Future = Future(devices=[d for d in devices or () if d.type == "cuda"] or None)
    fut.set_result(value)
    return fut


def chain(fut: Future, fn: Callable[[Any], Any],
          devices: list[torch.device] | None = None) -> Future:
    """A future of ``fn(fut's value)``; when ``fn`` returns a future (it launched the next
    asynchronous step), of that future's value. With ``devices`` (inline stages) ``fn`` runs
    now, after ``fut.wait()`` (on CUDA a stream wait on its events); else it is chained
    without waiting, and an exception in ``fn`` or either future completes the result."""
    if devices:
        nxt = fn(fut.wait())
        return nxt if isinstance(nxt, torch._C.Future) else completed(nxt, devices)
    out: Future = Future()

    def fail(err: BaseException) -> None:
        if not out.done():
            out.set_exception(err)

    def finish_with(nxt: Future) -> None:
        try:
            out.set_result(nxt.value())
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on ``out``
            fail(err)

    def start(done_: Future) -> None:
        try:
            nxt = fn(done_.value())
        except BaseException as err:  # noqa: BLE001
            fail(err)
            return
        if isinstance(nxt, torch._C.Future):
            add_callback(nxt, finish_with)
        else:
            out.set_result(nxt)

    add_callback(fut, start)
    return out


# -- collectives that end with local work (a decode, a copy) --------------------------------
def overlaps(device: torch.device, async_op: bool) -> bool:
    """Launch the exchange asynchronously and chain the decode (CPU); inline otherwise."""
    return async_op and not inline(device)


def check_not_inline(device: torch.device, async_op: bool) -> None:
    """``async_op`` on an inline device (CUDA) must come through :func:`side_stream_call`:
    a future completed here with None would order the waiting stream after nothing."""
    if async_op and inline(device):
        raise RuntimeError("hfcompress internal error: an async_op collective on "
                           f"{device} must run through futures.side_stream_call")


def finish(work: dist.Work | None, then: Callable[[], None] | None, async_op: bool,
           device: torch.device) -> Future | None:
    """End a collective on ``device``: ``then()`` (the decode) after ``work``.

    ``work`` is the asynchronous exchange (CPU with ``async_op``), else None (the exchange
    already ran or is enqueued on the current stream). Returns None without ``async_op``,
    else a future that completes when the exchange and ``then()`` are done (and raises
    their error); never for ``async_op`` on CUDA (:func:`check_not_inline`)."""
    check_not_inline(device, async_op)
    if work is None:
        if then is not None:
            then()
        return completed(None) if async_op else None

    def after(fut: Future) -> None:
        fut.wait()                       # re-raise the exchange's error
        if then is not None:
            then()
    return add_callback(work.get_future(), after)


def finish_all(futures: Sequence[Future | None], then: Callable[[], None], async_op: bool,
               device: torch.device) -> Future | None:
    """``then()`` after every future (None entries already done): one future, or None
    (never for ``async_op`` on CUDA: :func:`check_not_inline`)."""
    check_not_inline(device, async_op)
    pending = [f for f in futures if f is not None]
    if not pending or not overlaps(device, async_op):
        for f in pending:
            f.wait()
        then()
        return completed(None) if async_op else None

    def after(fut: Future) -> None:
        for f in fut.wait():
            f.wait()                     # re-raise the first error
        then()
    return add_callback(torch.futures.collect_all(pending), after)


# -- the side stream of asynchronous calls on CUDA ------------------------------------------
def side_stream(device: torch.device):
    """This process's private stream for ``async_op`` collectives on ``device`` (CUDA), of
    high priority as FSDP2's own communication streams (its kernels go ahead of queued
    compute). One stream: every rank enqueues its collectives in one order, as NCCL needs,
    and NCCL runs one communicator's collectives one after another anyway."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device, priority=-1)
    return _SIDE_STREAMS[device]


def side_stream_call(fn: Callable[[], Any], result: torch.Tensor,
                     keep: Sequence[torch.Tensor] = ()) -> Future:
    """``fn()`` (stages enqueued in order, nothing chained; ``async_op=True`` on an
    :func:`inline` device comes here) on the side stream of ``result``'s CUDA device, after
    everything already on the caller's current stream; a future completed on the side
    stream with ``result`` (its ``wait()`` makes the waiting stream wait for all of
    ``fn``'s work). ``result`` and ``keep`` (the caller's tensors
    that ``fn`` reads or writes) are kept alive for the side stream (``record_stream``)."""
    device = result.device
    if device.type != "cuda":    # inline_on_cpu: the same control flow, no streams
        fn()
        return completed(result)
    side = side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    for t in (result, *keep):
        t.record_stream(side)
    with torch.cuda.stream(side):
        fn()
        return completed(result, [device])


class FutureWork(dist.Work):
    """A ``dist.Work`` (what FSDP2 checks with ``isinstance`` and ``wait()``s) that
    completes with a future; ``wait()`` re-raises the future's error, passed through
    ``on_error`` (e.g. to name the collective), and on CUDA is a stream wait on the
    future's events. (``_create_work_from_future`` would swallow the error: its ``wait()``
    returns True.)"""

    def __init__(self, future: Future,
                 on_error: Callable[[BaseException], BaseException] | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.future, self.on_error = future, on_error
        # CUDA: the future is complete once enqueued; the work is done when the stream
        # that completed it (the current one here: side_stream_call's) has run this far
        self.done = torch.cuda.Event() if device is not None and device.type == "cuda" \
            else None
        if self.done is not None:
            self.done.record(side_stream(device))

    def wait(self, timeout=None) -> bool:
        try:
            self.future.wait()
        except RuntimeError as err:
            if self.on_error is None:
                raise
            raise self.on_error(err) from err
        return True

    def is_completed(self) -> bool:
        """Done (no host wait): the future, and on CUDA the side stream's event."""
        return self.future.done() and (self.done is None or self.done.query())

    def get_future(self) -> Future:
        return self.future
