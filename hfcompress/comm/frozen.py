"""Frozen parameters under qWD: zero inter-node bytes after an exact all-gather.

qWD (SDP4Bit Alg. 2) sends ``Q(w - w~)``; a frozen parameter (``requires_grad=False``: a LoRA
base model, frozen embeddings) does not change, so once an exact all-gather has made every
holder's reference equal to it, its differences are zero. They are still quantized, but not
sent:

- :class:`SentBytes`: the bytes of one rank's difference payload that carry the trainable
  values (``ReferenceCoded.difference_byte_runs``; qWD's: the quantizer groups touching
  them). Only those cross the network; each receiver puts them into the payload of all-zero
  differences, which is byte for byte what the frozen groups would have sent, so the
  decoded references, hence the losses, are bit-identical to sending everything. The wire
  meter counts the bytes actually sent.
- :class:`FrozenColumns`: for one set of frozen parameters, the columns of a flat all-gather
  slot (FSDP2's: parameter after parameter) split into the ones qWD carries (the compressed
  parameters, then the frozen parameters that are otherwise sent exactly: norms, biases;
  appended after the compressed ones, so the quantizer groups of those stay as they were,
  the frozen ones only fill the last group's zero padding with zero differences) and the
  trainable exact ones (an exact all-gather of their own).
- :class:`FrozenParams`: which parameters are frozen *now*, read on the host at every
  all-gather (no device sync, no bytes): the ``requires_grad`` flags, and the frozen
  parameters' own version counters, which in-place writes through them move (``copy_``,
  ``add_``, ``load_state_dict``: a LoRA merge, weight surgery). A new frozen set (gradual
  unfreezing, freezing) or a write to a frozen parameter restarts the slot's qWD stream: that
  all-gather is exact (SDP4Bit Alg. 4 line 2), so every reference equals the weights again,
  and the columns are split for the new set. Writes no version counter sees (through
  ``.data``) need ``Compression.reset_references()``. Optimizer steps need nothing: they
  update trainable parameters only, whose differences are always sent (FSDP2's DTensor
  parameters move no version counter under ``foreach`` / ``fused`` optimizers).

Other weight schemes (``qw``, ``zeropp``, QSDP) keep no references: frozen weights are
compressed and sent every step like the others; gradient-only presets gather them exactly.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ..compressors.base import ReferenceCoded
from ..compressors.runs import Runs, put, runs_of, take
from .all_gather import QuantizedAllGather
from .futures import finish_all


class SentBytes:
    """Which bytes of a qWD difference payload for ``numel`` values are sent when only the
    values in ``runs`` can have changed (module docstring)."""

    def __init__(self, qwd: ReferenceCoded, numel: int, runs: Runs) -> None:
        self.qwd, self.numel = qwd, numel
        self.byte_runs = qwd.difference_byte_runs(numel, runs)
        self.count = None if self.byte_runs is None else sum(b - a for a, b in self.byte_runs)
        self._zero: dict[torch.device, torch.Tensor] = {}

    @property
    def active(self) -> bool:
        """False if the scheme cannot leave bytes out (then everything is sent)."""
        return self.byte_runs is not None

    def select(self, payload: torch.Tensor) -> torch.Tensor:
        """This rank's flat payload -> the bytes to send."""
        return take(payload.view(1, -1), self.byte_runs).reshape(-1)

    def expand(self, rows: torch.Tensor) -> torch.Tensor:
        """``[rows, count]`` received bytes -> ``[rows, nbytes]`` full payloads (the other
        bytes those of all-zero differences)."""
        zero = self._zero.get(rows.device)
        if zero is None:
            zero = self._zero[rows.device] = self.qwd.zero_difference(
                (self.numel,), rows.device).flat()
        full = zero.expand(rows.shape[0], -1).clone()
        put(full, self.byte_runs, rows)
        return full


class FrozenColumns:
    """The all-gather of a flat slot holding frozen parameters, under qWD (module docstring).

    ``segments``: per parameter of the slot, in order, ``(numel, exact, trainable)``;
    ``qwd``: the slot's qWD all-gather."""

    def __init__(self, segments: Sequence[tuple[int, bool, bool]], qwd: QuantizedAllGather
                 ) -> None:
        self.qwd_runs = runs_of([(n, not e) for n, e, _ in segments]) + \
            runs_of([(n, e and not t) for n, e, t in segments])
        self.exact_runs = runs_of([(n, e and t) for n, e, t in segments])
        self.qwd_numel = sum(b - a for a, b in self.qwd_runs)
        self.exact_numel = sum(b - a for a, b in self.exact_runs)
        # the trainable compressed columns, in the qWD slot (compressed columns come first)
        trainable = runs_of([(n, t) for n, e, t in segments if not e])
        self.qwd = qwd
        self.sent = SentBytes(qwd.references.qwd, self.qwd_numel, trainable)

    def __call__(self, exact: QuantizedAllGather, output: torch.Tensor, input: torch.Tensor,
                 group: dist.ProcessGroup, unchanged: bool, async_op: bool):
        """The slot's all-gather: qWD on its columns (differences of trainable groups only,
        after the exact first one), the trainable exact columns exactly."""
        world, device = group.size(), input.device
        rows = input.reshape(1, -1)
        qwd_out = torch.empty(world * self.qwd_numel, dtype=input.dtype, device=device)
        sent = self.sent if self.sent.active else None
        qwd = self.qwd
        futures = [qwd.references(qwd_out, take(rows, self.qwd_runs).reshape(-1), group,
                                  unchanged, qwd.meter, qwd.tag, async_op, sent=sent)]
        exact_out = None
        if self.exact_numel:
            exact_out = torch.empty(world * self.exact_numel, dtype=input.dtype, device=device)
            futures.append(exact(exact_out, take(rows, self.exact_runs).reshape(-1), group,
                                 async_op=async_op))

        def merge() -> None:
            out = output.view(world, -1)
            put(out, self.qwd_runs, qwd_out.view(world, -1))
            if exact_out is not None:
                put(out, self.exact_runs, exact_out.view(world, -1))
        return finish_all(futures, merge, async_op, device)


class FrozenParams:
    """The frozen parameters of a flat slot under qWD as they are now (module docstring).

    ``segments``: per parameter of the slot, in order, ``(numel, exact)``; ``qwd``: the
    slot's qWD all-gather."""

    def __init__(self, segments: Sequence[tuple[int, bool]], qwd: QuantizedAllGather) -> None:
        self.segments, self.qwd = tuple(segments), qwd
        self.columns: FrozenColumns | None = None
        self._seen: tuple | None = None
        self._states: Sequence | None = None      # the last call's, as given

    def current(self, states: Sequence[tuple[int, int, bool]]) -> FrozenColumns | None:
        """The split for the parameters frozen now (None: none is), before an all-gather of
        the slot; every rank calls it at the same all-gathers, with the same parameters
        frozen and written. Restarts the qWD stream when the frozen set changed or a frozen
        parameter was written since the last call. ``states``: the slot's parameters, in
        order, as ``all_gather.VersionWatch.read`` gives them (their version counters and
        ``requires_grad`` flags)."""
        if states == self._states:
            return self.columns
        seen = tuple((rg, None if rg else version) for _, version, rg in states)
        self._states = states
        if seen == self._seen:
            return self.columns
        trainable = [t for t, _ in seen]
        columns = None if all(trainable) else FrozenColumns(
            [(n, e, t) for (n, e), t in zip(self.segments, trainable)], self.qwd)
        numel = self.qwd.references.numel
        if self._seen is not None or (numel is not None and numel != self._numel(columns)):
            self.qwd.references.restart()
        self.columns, self._seen = columns, seen
        return columns

    def rebase(self) -> None:
        """References loaded from a checkpoint: the next call takes the parameters as they
        are as its baseline (their writes were before the references were saved)."""
        self._seen = self._states = None

    def _numel(self, columns: FrozenColumns | None) -> int:
        """Values per rank the qWD stream codes with ``columns`` (None: the compressed
        parameters, ``integrations/fsdp.py``'s path without frozen parameters)."""
        if columns is not None:
            return columns.qwd_numel
        return sum(n for n, e in self.segments if not e)
