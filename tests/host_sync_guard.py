"""Catch host-device syncs made by hfcompress code (a test tool).

On a GPU each of these calls makes the host wait for every queued kernel, which serializes
communication and compute; on CPU they cost nothing, so only a guard like this shows them::

    from host_sync_guard import HostSyncError, count_host_syncs, no_host_sync

    with no_host_sync():                  # the first sync from hfcompress code raises
        comp.compress(x)                  # HostSyncError: "torch.equal at hfcompress/...:45"

    with count_host_syncs() as syncs:     # or count them (a Counter, filled on exit too)
        step()
    assert not syncs, syncs               # {"Tensor.item at hfcompress/comm/x.py:12": 3}

Watched (patched while a guard is active): ``Tensor.item``, ``Tensor.tolist``,
``Tensor.cpu``, ``Tensor.numpy``, ``Tensor.__bool__`` (tensor truthiness, ``if t:``),
``Tensor.__int__``, ``Tensor.__float__``, ``Tensor.__index__``, ``torch.equal`` /
``Tensor.equal``, ``torch.allclose`` / ``Tensor.allclose``, ``torch.is_nonzero``.
A call counts when the nearest calling frame outside torch is hfcompress code (so a torch
function called from hfcompress that syncs inside is attributed to the hfcompress line); calls
from tests or other libraries are ignored. Not observable on CPU and not watched: a
device-to-host ``.to("cpu")`` and pageable host-to-device copies (every tensor is on the host).
Guards are process-wide (all threads); they may nest.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import threading
from typing import Callable, Iterator

import torch

import hfcompress

__all__ = ["HostSyncError", "no_host_sync", "count_host_syncs", "WATCHED"]

_PKG = os.path.dirname(os.path.abspath(hfcompress.__file__)) + os.sep
_ROOT = os.path.dirname(_PKG.rstrip(os.sep)) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HERE = os.path.abspath(__file__)

#: (owner, attribute, name shown in reports)
WATCHED = (
    (torch.Tensor, "item", "Tensor.item"),
    (torch.Tensor, "tolist", "Tensor.tolist"),
    (torch.Tensor, "cpu", "Tensor.cpu"),
    (torch.Tensor, "numpy", "Tensor.numpy"),
    (torch.Tensor, "__bool__", "Tensor.__bool__"),
    (torch.Tensor, "__int__", "Tensor.__int__"),
    (torch.Tensor, "__float__", "Tensor.__float__"),
    (torch.Tensor, "__index__", "Tensor.__index__"),
    (torch.Tensor, "equal", "Tensor.equal"),
    (torch.Tensor, "allclose", "Tensor.allclose"),
    (torch, "equal", "torch.equal"),
    (torch, "allclose", "torch.allclose"),
    (torch, "is_nonzero", "torch.is_nonzero"),
)


class HostSyncError(RuntimeError):
    """A host-device sync from hfcompress code while :func:`no_host_sync` is active."""


_lock = threading.Lock()
_local = threading.local()  # .busy: inside a watched call (nested ones are not counted)
_sinks: list[Callable[[str], None]] = []  # one per active guard, innermost last
_originals: dict[tuple[int, str], object] = {}  # attributes the owner defined itself


def _call_site() -> str | None:
    """``path:line`` of the nearest frame outside torch and this file, if it is in hfcompress."""
    f = sys._getframe(2)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not (path.startswith(_TORCH) or path == _HERE):
            if path.startswith(_PKG):
                return f"{os.path.relpath(path, _ROOT)}:{f.f_lineno}"
            return None
        f = f.f_back
    return None


def _watch(original: Callable, name: str) -> Callable:
    @functools.wraps(original)
    def watched(*args, **kwargs):
        if getattr(_local, "busy", False):
            return original(*args, **kwargs)
        site = _call_site()
        if site is not None:
            for sink in list(_sinks):
                sink(f"{name} at {site}")
        _local.busy = True
        try:
            return original(*args, **kwargs)
        finally:
            _local.busy = False
    return watched


def _install() -> None:
    for owner, attr, name in WATCHED:
        if attr in vars(owner):
            _originals[(id(owner), attr)] = vars(owner)[attr]
        setattr(owner, attr, _watch(getattr(owner, attr), name))


def _uninstall() -> None:
    for owner, attr, _ in WATCHED:
        if (id(owner), attr) in _originals:
            setattr(owner, attr, _originals.pop((id(owner), attr)))
        else:  # inherited (e.g. from torch._C.TensorBase): drop the patch
            delattr(owner, attr)


@contextlib.contextmanager
def _guard(sink: Callable[[str], None]) -> Iterator[None]:
    with _lock:
        if not _sinks:
            _install()
        _sinks.append(sink)
    try:
        yield
    finally:
        with _lock:
            _sinks.remove(sink)
            if not _sinks:
                _uninstall()


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Raise :class:`HostSyncError` at the first host sync made from hfcompress code."""
    def fail(what: str) -> None:
        raise HostSyncError(f"host-device sync from hfcompress code: {what}")
    with _guard(fail):
        yield


@contextlib.contextmanager
def count_host_syncs() -> Iterator[collections.Counter]:
    """Count host syncs from hfcompress code: yields a Counter ``{"<call> at <file>:<line>":
    n}`` filled while the block runs (empty when there were none)."""
    counts: collections.Counter = collections.Counter()
    with _guard(lambda what: counts.update((what,))):
        yield counts
