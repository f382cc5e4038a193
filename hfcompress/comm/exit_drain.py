"""Python callbacks chained to gloo futures, drained before the interpreter exits.

On CPU the stages of a compressed collective are Python callbacks chained with
``Future.then`` (``futures.py``). gloo's worker thread runs each one, completes the next
future, then destroys the callback, which takes the GIL. The main thread, once it has seen
the last future complete, may already be finalizing the interpreter (the script ended);
a thread that takes the GIL during finalization is ended with ``pthread_exit``, and its
unwinding through the callback's destructor (``noexcept``) calls ``std::terminate``:
"terminate called without an active exception", SIGABRT after a run that finished.
Plain torch does the same with any Python callback on a gloo future (a 200-step
``all_reduce(...).get_future().then(...)`` script on 2 busy cores); plain FSDP2 / DDP chain
none, and NCCL runs hfcompress's stages inline (nothing is chained on CUDA).

Every callback chained through :func:`add_callback` is counted until it is destroyed, and an
``atexit`` hook (atexit runs before finalization, with the GIL still free to take) waits
until none is left, at most ``DRAIN_S`` seconds (a future that never completes keeps its
callback: the exit then goes ahead as before).
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, Callable

from torch.futures import Future

DRAIN_S = 5.0
_lock = threading.Lock()
_live = 0


class _Counted:
    """``fn``, counted from construction until gloo's thread (or whoever holds the last
    reference) destroys it."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Future], Any]) -> None:
        global _live
        self.fn = fn
        with _lock:
            _live += 1

    def __call__(self, fut: Future) -> Any:
        return self.fn(fut)

    def __del__(self) -> None:
        global _live
        self.fn = None          # what the callback holds goes first, then the count
        with _lock:
            _live -= 1


def add_callback(fut: Future, fn: Callable[[Future], Any]) -> Future:
    """``fut.then(fn)``, with ``fn`` counted until it is destroyed (module docstring)."""
    return fut.then(_Counted(fn))


def live() -> int:
    """Callbacks chained through :func:`add_callback` and not destroyed yet."""
    return _live


def drain(timeout: float = DRAIN_S) -> bool:
    """Wait (releasing the GIL) until every counted callback is destroyed, at most
    ``timeout`` seconds; True if none is left."""
    deadline = time.monotonic() + timeout
    while _live and time.monotonic() < deadline:
        time.sleep(0.001)
    return _live == 0


atexit.register(drain)     # returns at once when nothing was chained
