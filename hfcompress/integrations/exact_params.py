"""Which values of an FSDP2 module's flat buffers are sent exactly (QSDP 5.1: norms, biases
and small tensors stay in full precision).

FSDP2 packs a module's parameters into one flat buffer per collective: a rank's all-gather
slot, and each row of the ``[world, S]`` reduce-scatter input, hold parameter after parameter
(the param group's ``fsdp_params`` order) that parameter's dim-0-padded shard of
``padded_sharded_param_size.numel()`` values (torch's ``_fsdp_collectives.foreach_all_gather``
and ``foreach_reduce_scatter_copy_in``). :class:`SlotLayout` names those ranges and splits a
slot into the columns sent exactly and the columns compressed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..compressors.runs import put, runs_of, take, view
from ..config import is_exact
from . import _fsdp2


@dataclass(frozen=True)
class Segment:
    """One parameter's range of a slot: its name, values per slot, and whether it is exact."""

    name: str
    numel: int
    exact: bool


class SlotLayout:
    """The parameter segments of one slot, as contiguous runs of compressed / exact columns."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = tuple(segments)
        self.numel = sum(s.numel for s in self.segments)
        self.compressed_runs = runs_of([(s.numel, not s.exact) for s in self.segments])
        self.exact_runs = runs_of([(s.numel, s.exact) for s in self.segments])
        self.exact_numel = sum(stop - start for start, stop in self.exact_runs)
        # the compressed columns one run, then the exact ones to the end (norms last): both
        # column sets of a tensor are the two parts of one ``tensor_split`` (one torch call)
        self._cut = (self.compressed_runs[0][1],) if (
            len(self.compressed_runs) == 1 and self.compressed_runs[0][0] == 0
            and self.exact_runs == ((self.compressed_runs[0][1], self.numel),)) else None

    @property
    def mixed(self) -> bool:
        """Both exact and compressed columns: the collective must be split."""
        return 0 < self.exact_numel < self.numel

    @property
    def all_exact(self) -> bool:
        return self.exact_numel == self.numel

    def split(self, rows: torch.Tensor, spaced: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[k, S]`` -> (compressed columns ``[k, S_c]``, exact columns ``[k, S_e]``): column
        slices, views where a set is one run (norms usually come last in a module);
        ``spaced``: compressed runs of one length equally spaced as the view ``[k, count,
        length]`` (``runs.view``), not a copy."""
        if self._cut is not None:
            return rows.tensor_split(self._cut, 1)
        comp = view(rows, self.compressed_runs, spaced) if spaced else None
        return take(rows, self.compressed_runs) if comp is None else comp, \
            take(rows, self.exact_runs)

    def split_slot(self, slot: torch.Tensor, spaced: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """A rank's slot ``[S]`` -> (its compressed values ``[S_c]``, its exact values as one
        row ``[1, S_e]``): views where a set is one run (``spaced``: compressed runs of one
        length equally spaced as the view ``[count, length]``), else copies. What an
        all-gather sends: two torch calls on a contiguous slot, where :meth:`split` of
        ``[1, S]`` and a row of each set took four."""
        if not slot.is_contiguous():
            comp, exact = self.split(slot.reshape(1, -1), spaced)
            return comp[0] if comp.dim() == 3 else comp.reshape(-1), exact
        runs = self.exact_runs
        if self._cut is not None:
            return slot[:self._cut[0]], _row(slot, *runs[0])
        comp = view(slot, self.compressed_runs, spaced)
        if comp is None:
            comp = take(slot.view(1, -1), self.compressed_runs).view(-1)
        return comp, _row(slot, *runs[0]) if len(runs) == 1 else take(slot.view(1, -1), runs)

    def views(self, t: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The compressed and the exact columns of ``t`` (``[k, S]`` rows or 1-D ``S``
        values) as writable views, None for a set that is not one run
        (:func:`runs.view`)."""
        if self._cut is not None:
            return t.tensor_split(self._cut, t.dim() - 1)
        return view(t, self.compressed_runs), view(t, self.exact_runs)

    def merge(self, rows: torch.Tensor, compressed: torch.Tensor, exact: torch.Tensor) -> None:
        """Write the two column sets back into ``rows`` (``[k, S]``, in place)."""
        put(rows, self.compressed_runs, compressed)
        put(rows, self.exact_runs, exact)

    def __repr__(self) -> str:
        return (f"SlotLayout({len(self.segments)} params, {self.numel} values per slot, "
                f"{self.exact_numel} exact)")


def _row(slot: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """The values ``[start, stop)`` of a contiguous slot as one row ``[1, stop - start]`` (one
    torch call)."""
    return slot.as_strided((1, stop - start), (stop - start, 1), slot.storage_offset() + start)


def param_names(model: nn.Module, param_group) -> list[str]:
    """Fully qualified names (from ``model``) of an FSDP param group's parameters, in order."""
    module_names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    names = []
    for fp in _fsdp2.fsdp_params(param_group):
        module, name = _fsdp2.param_owner(fp)
        prefix = module_names.get(id(module), "?")
        names.append(f"{prefix}.{name}" if prefix else name)
    return names


class GroupLayouts:
    """The slot layouts of one FSDP param group.

    The all-gather slot holds every parameter. The reduce-scatter rows hold only the
    parameters that got a gradient; when that is not all of them, the layout of the
    parameters that require gradients now (unfreezing changes it) is tried, and ``None``
    (no known layout) is returned when neither matches the buffer size.
    """

    def __init__(self, model: nn.Module, param_group, patterns: Sequence[str],
                 min_numel: int) -> None:
        self.param_group = param_group
        self.names = param_names(model, param_group)
        self.params = _fsdp2.fsdp_params(param_group)
        self.segments = [Segment(n, _fsdp2.padded_shard_numel(fp),
                                 is_exact(n, _fsdp2.orig_numel(fp), patterns, min_numel))
                         for n, fp in zip(self.names, self.params)]
        self.full = SlotLayout(self.segments)
        self._trainable: tuple[tuple[bool, ...], SlotLayout] | None = None

    @property
    def trainable(self) -> SlotLayout:
        """The layout of the parameters that require gradients now."""
        flags = tuple(_fsdp2.requires_grad(fp) for fp in self.params)
        if self._trainable is None or self._trainable[0] != flags:
            self._trainable = (flags, SlotLayout([s for s, t in zip(self.segments, flags) if t]))
        return self._trainable[1]

    def for_numel(self, numel: int) -> SlotLayout | None:
        if self.full.numel == numel:      # every parameter got a gradient: no flags read
            return self.full
        trainable = self.trainable
        return trainable if trainable.numel == numel else None
