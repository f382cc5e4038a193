"""Runs: ``(start, stop)`` ranges of a flat buffer's columns (or of a payload's bytes), in
increasing order, adjacent ones merged; and taking them out of ``[k, S]`` rows and back
(or viewing them in place, when they are one run)."""

from __future__ import annotations

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
    """The columns ``runs`` of ``[k, S]`` rows, side by side (a view for one run or none)."""
    if not runs:
        return rows[:, :0]
    if len(runs) == 1:
        return rows[:, runs[0][0]:runs[0][1]]
    return torch.cat([rows[:, a:b] for a, b in runs], dim=1)


def view(rows: torch.Tensor, runs: Runs) -> torch.Tensor | None:
    """The columns ``runs`` of ``[k, S]`` rows (or of 1-D ``S`` values: one slice, no
    ``[1, S]`` views around it) as a writable view (one run or none), else None (they are
    not one strided range)."""
    if len(runs) > 1:
        return None
    if rows.dim() == 1:
        a, b = runs[0] if runs else (0, 0)
        return rows[a:b]
    return take(rows, runs)


def put(rows: torch.Tensor, runs: Runs, cols: torch.Tensor) -> None:
    """Inverse of :func:`take`: write ``cols`` into the columns ``runs`` of ``rows`` (the
    last dim; any leading dims, ``cols`` may be a strided view)."""
    offset = 0
    for a, b in runs:
        rows[..., a:b].copy_(cols[..., offset:offset + b - a])
        offset += b - a
