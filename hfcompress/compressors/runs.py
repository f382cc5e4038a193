"""Runs: ``(start, stop)`` ranges of a flat buffer's columns (or of a payload's bytes), in
increasing order, adjacent ones merged; and taking them out of ``[k, S]`` rows and back
(or viewing them in place, when they are one run)."""

from __future__ import annotations

import functools
import itertools
from typing import Iterable, Sequence

import torch

Runs = Sequence[tuple[int, int]]


def merged(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` ranges given in increasing order, empty ones dropped and adjacent
    ones merged."""
    out: list[list[int]] = []
    for a, b in ranges:
        if b > a:
            if out and out[-1][1] == a:
                out[-1][1] = b
            else:
                out.append([a, b])
    return tuple((a, b) for a, b in out)


def runs_of(flags: Sequence[tuple[int, bool]]) -> tuple[tuple[int, int], ...]:
    """The runs of the segments ``(numel, selected)``, laid end to end, that are selected."""
    starts = itertools.accumulate((n for n, _ in flags), initial=0)
    return merged((a, a + n) for (n, selected), a in zip(flags, starts) if selected)


def take(rows: torch.Tensor, runs: Runs) -> torch.Tensor:
    """The columns ``runs`` of ``[k, S]`` rows, side by side (a view for one run or none;
    one copy through a strided view for runs of one length equally spaced, e.g. a model's
    embedding and LM head around its final norm)."""
    if not runs:
        return rows[:, :0]
    if len(runs) == 1:
        return rows[:, runs[0][0]:runs[0][1]]
    spaced = _spaced_view(rows, runs)
    if spaced is not None:
        return spaced.reshape(rows.shape[0], -1)
    return torch.cat([rows[:, a:b] for a, b in runs], dim=1)


@functools.lru_cache(maxsize=256)
def _spacing(runs: tuple[tuple[int, int], ...]) -> tuple[int, int, int] | None:
    """``(count, length, period)`` of more than one run of one length equally spaced, else
    None."""
    length, period = runs[0][1] - runs[0][0], runs[1][0] - runs[0][0]
    if any(b - a != length or a - runs[0][0] != i * period for i, (a, b) in enumerate(runs)):
        return None
    return len(runs), length, period


def _spaced_view(t: torch.Tensor, runs: Runs) -> torch.Tensor | None:
    """The columns ``runs`` of ``t``'s last dim as one view ``[..., count, length]`` where
    they are runs of one length equally spaced (:func:`_spacing`), else None."""
    spacing = _spacing(tuple(runs))
    if spacing is None:
        return None
    count, length, period = spacing
    step = t.stride(-1)
    return t.as_strided((*t.shape[:-1], count, length), (*t.stride()[:-1], period * step, step),
                        t.storage_offset() + runs[0][0] * step)


def view(rows: torch.Tensor, runs: Runs, spaced: bool = False) -> torch.Tensor | None:
    """The columns ``runs`` of ``[k, S]`` rows (or of 1-D ``S`` values: one slice, no
    ``[1, S]`` views around it) as a writable view (one run or none), else None (they are
    not one strided range). ``spaced``: runs of one length equally spaced too, as the view
    ``[..., count, length]`` (what the kernels read and write in place:
    ``kernels/triton_tiles.spaced_runs``)."""
    if len(runs) > 1:
        return _spaced_view(rows, runs) if spaced else None
    if rows.dim() == 1:
        a, b = runs[0] if runs else (0, 0)
        return rows[a:b]
    return take(rows, runs)


def put(rows: torch.Tensor, runs: Runs, cols: torch.Tensor) -> None:
    """Inverse of :func:`take`: write ``cols`` into the columns ``runs`` of ``rows`` (the
    last dim; any leading dims, ``cols`` may be a strided view); one copy where they are
    runs of one length equally spaced."""
    spaced = _spaced_view(rows, runs) if len(runs) > 1 else None
    if spaced is not None:
        spaced.copy_(cols.reshape(spaced.shape))
        return
    offset = 0
    for a, b in runs:
        rows[..., a:b].copy_(cols[..., offset:offset + b - a])
        offset += b - a
