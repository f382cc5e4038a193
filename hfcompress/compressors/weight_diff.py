"""Quantization on weight differences, qWD (SDP4Bit 3.1, Alg. 2 and Alg. 4).

Every replica keeps the model weights w~ (the last all-gather output). The sender transmits
``C(w - w~)`` of its main weights w; every replica, the sender included, sets
``w~ <- w~ + deq(C(w - w~))``, so all copies of w~ stay bit-identical and the model computes
with w~. Weight differences are small and near-uniform, so a biased 4-bit quantizer is
accurate on them (SDP4Bit Fig. 4) and converges where quantizing w itself stalls
(SDP4Bit Counterexample 4.1).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..kernels import group_quant as _twin
from ..kernels.packing import tail_nbytes, take_tail
from .base import Compressor, Packed, check_float_input, resolve_inner, stack_payloads
from .group_quant import GroupQuantizer
from .registry import register_compressor
from .runs import Runs, merged

_EXACT = "exact"


@register_compressor("qwd")
class WeightDifferenceQuantizer(Compressor):
    """qWD: send ``inner(w - w~)``; decompress adds it to the reference w~ (SDP4Bit Alg. 2).

    ``inner`` (a Compressor or registered name; default ``int`` 4 bit, group 2048, nearest)
    compresses the difference. One instance per weight stream (``fresh()``); its only state
    is the reference w~ (in the weights' dtype).

    Protocol (all replicas hold equal state and see the same payloads):

    - The first ``compress`` (no reference yet) sends the values exactly, in their own dtype,
      and decompress sets w~ = w_0 exactly (Alg. 4 line 2). Later ones send ``inner(w - w~)``
      (Alg. 4 line 7).
    - ``payload_spec(numel)`` is the inner's: the format of every payload after the first.
      The first is ``numel`` values of the weights' dtype; ``unflatten`` rebuilds either,
      from the reference's state (it only changes in ``decompress``).
    - ``decompress`` is stateful: it returns w~ + deq(payload) and stores it as the new w~
      (Alg. 4 line 8). Call it exactly once per payload on every replica, the sender included.
    - ``compress(x, unchanged=True)``: the caller knows (a host-side fact, e.g. no optimizer
      step since the last all-gather: FSDP's backward all-gather) that x is the input of the
      previous compress; zero differences are sent, so decompress returns w~ unchanged. No
      tensor comparison and no copy of the input are made. A collective that knows it on
      every rank can skip the exchange and use ``reference`` as is (same result).

    All-gather recipe (one reference of ``rows`` equal slots, rank-major; each rank sends
    the row it owns, every holder decodes all rows at once)::

        packed = qwd.compress_slot(shard, row, rows)            # vs w~[row]
        qwd.decompress_rows(gathered.view(rows, -1), shard.numel(), shard.dtype)
        qwd.reference                                           # flat (rows * shard.numel(),)

    ``apply(ref, packed)`` is the pure update ``ref + deq(packed)`` for callers that keep the
    reference themselves.
    """

    stateful = True

    def __init__(self, inner: Compressor | str | None = None) -> None:
        inner = resolve_inner("qwd", inner, GroupQuantizer(bits=4, group_size=2048,
                                                           rounding="nearest"))
        super().__init__(inner=inner)
        self.inner = inner
        self.reference: torch.Tensor | None = None

    # -- wire format ----------------------------------------------------------------------
    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        """The inner's format (every payload after the first, exact one)."""
        return self.inner.payload_spec(numel)

    def unflatten(self, buf: torch.Tensor, shape, dtype: torch.dtype) -> Packed:
        """The exact first payload (``dtype`` values) while uninitialised, else the inner's."""
        if self.reference is not None:
            return super().unflatten(buf, shape, dtype)
        shape = torch.Size(shape)
        need = math.prod(shape) * dtype.itemsize
        if buf.dtype != torch.uint8 or buf.numel() != need:
            raise ValueError(f"qwd: expected the exact first payload, a uint8 buffer of {need} "
                             f"bytes for shape {tuple(shape)} of {dtype}, got {buf.dtype} with "
                             f"{buf.numel()} elements")
        return Packed({_EXACT: buf.view(dtype)}, shape, dtype)

    # -- sender ---------------------------------------------------------------------------
    def compress(self, x: torch.Tensor, unchanged: bool = False) -> Packed:
        """``inner(x - w~)``; exact x on the first call; zero differences if ``unchanged``."""
        return self._encode(x, self.reference, unchanged)

    def compress_slot(self, x: torch.Tensor, row: int, rows: int,
                      unchanged: bool = False) -> Packed:
        """Like ``compress`` with row ``row`` of ``rows`` equal rows of w~ as reference."""
        ref = None if self.reference is None else self._rows(rows, x.numel())[row].view(x.shape)
        return self._encode(x, ref, unchanged)

    def wire_slot(self, x: torch.Tensor, row: int, rows: int,
                  tail: torch.Tensor | None = None) -> torch.Tensor:
        """``compress_slot(x, row, rows).flat()`` followed by the bytes of ``tail`` (``[1, E]``,
        exact values riding along, ``comm/riders.py``): the uint8 wire row ``[1, nbytes +
        E]``, written by the inner's kernel where it is a ``GroupQuantizer`` (no ``cat``),
        which reads ``x`` as it lies (its values in order; e.g. equally spaced runs)."""
        if self.reference is None or not isinstance(self.inner, GroupQuantizer):
            x = x if x.dim() == 1 else x.reshape(-1)
            return stack_payloads([self.compress_slot(x, row, rows)], tail)
        n = x.numel()
        self._check_rows(rows, n)   # the row sliced flat: one torch call, not three
        ref = self.reference if rows == 1 else self.reference[row * n:(row + 1) * n]
        return self.inner.compress_difference_row(
            x.detach() if x.requires_grad else x, ref if x.dim() == 1 else ref.view(x.shape),
            tail)

    def _encode(self, x: torch.Tensor, ref: torch.Tensor | None, unchanged: bool) -> Packed:
        check_float_input(self.name, x)
        x = x.detach()
        if ref is None:
            return Packed({_EXACT: x.reshape(-1)}, x.shape, x.dtype)
        if ref.shape != x.shape:
            raise ValueError(f"qwd: input shape {tuple(x.shape)} does not match the reference "
                             f"{tuple(ref.shape)}; use one instance per tensor (fresh())")
        packed = (self.zero_difference(x.shape, x.device) if unchanged
                  else self.inner.compress_difference(x, ref))
        return Packed(packed.payload, x.shape, x.dtype, packed.meta)

    def zero_difference(self, shape: Sequence[int], device: torch.device) -> Packed:
        """The inner code of all-zero differences of ``shape``: what ``compress(x,
        unchanged=True)`` sends."""
        return self.inner.compress(torch.zeros(shape, dtype=torch.float32, device=device))

    # -- every replica --------------------------------------------------------------------
    def apply(self, ref: torch.Tensor | None, packed: Packed) -> torch.Tensor:
        """Pure update: ``ref + deq(packed)`` in ``packed.dtype`` (the exact values if the
        payload is exact). Does not touch the stored reference."""
        if _EXACT in packed.payload:
            return packed.payload[_EXACT].to(packed.dtype).reshape(packed.shape)
        if ref is None:
            raise ValueError("qwd: a difference payload needs a reference (none initialised)")
        if ref.dtype != packed.dtype:  # the float32 sum, rounded once to packed.dtype
            ref = ref.float()
        return self.inner.decompress_add(packed, ref).to(packed.dtype)

    def decompress(self, packed: Packed) -> torch.Tensor:
        """New w~ = w~ + deq(packed) (or the exact values): returned, and kept as a copy."""
        if self.reference is not None and self.reference.numel() != packed.numel:
            raise ValueError(f"qwd: payload of {packed.numel} values does not match the "
                             f"reference of {self.reference.numel()}")
        out = self.apply(self.reference, packed)
        self._store(out)
        return out

    def decompress_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype,
                        also: torch.Tensor | None = None,
                        riders: torch.Tensor | None = None) -> torch.Tensor:
        """Every row's payload at once -> the new flat w~ (``rows * numel`` values): ``wire``
        is ``(rows, nbytes)`` uint8, row r the flat payload of slot r. The exact first
        payloads become w~; later, one batched decode (``GroupQuantizer`` inner: one
        dequantize-add over all rows, reading their codes and scales in place in the wire
        where aligned, whose output becomes w~: no copy) adds every row's
        difference, bit-identical to ``decompress`` row by row (another inner: w~ updated in
        place, row by row). ``also`` (``[rows, numel]``, e.g. the all-gather's output
        columns): the new w~ written there too, by the decode kernel where it can.
        ``riders`` (``[rows, E]``): each row ends with E exact values (``comm/riders.py``),
        copied there (by the decode kernel where it can)."""
        rows = wire.shape[0]
        fused = isinstance(self.inner, GroupQuantizer) and self.reference is not None and \
            self.reference.dtype == dtype
        if riders is not None and not fused:
            take_tail(wire, riders)
            wire = wire[:, :wire.shape[1] - tail_nbytes(riders)]
        if self.reference is None:
            self.reference = wire.contiguous().view(dtype).reshape(-1).clone()
            if self.reference.numel() != rows * numel:
                raise ValueError(f"qwd: exact payloads of {self.reference.numel()} values, "
                                 f"expected {rows} x {numel}")
            return _twin.also_into(self.reference, also)
        if fused:
            ncodes, inner = self._check_wire(wire, numel, riders), self.inner
            # the fields read where they lie in the wire's rows (no view per field)
            self._replace(inner._impl(wire).dequantize_add_wire(
                wire, ncodes, inner.bits, inner.group_size, self.reference, also, riders))
            return self.reference
        ref = self._rows(rows, numel)
        for r in range(rows):  # another inner: its own decode per row
            packed = self.inner.unflatten(wire[r], (numel,), torch.float32)
            ref[r].copy_(self.apply(ref[r], Packed(packed.payload, torch.Size((numel,)), dtype,
                                                   packed.meta)))
        return _twin.also_into(self.reference, also)

    def difference_byte_runs(self, numel: int, runs: Runs) -> Runs | None:
        """The ``(start, stop)`` bytes of a difference payload for ``numel`` values that
        carry the value ranges ``runs``: when every value outside ``runs`` has a zero
        difference, the payload is those bytes with the others taken from the payload of
        all-zero differences (``compress(x, unchanged=True)``'s), byte for byte.
        ``GroupQuantizer`` inner with nearest rounding (groups are quantized independently):
        every group touching a run, its codes and its scale; another inner: None (send the
        whole payload)."""
        if not isinstance(self.inner, GroupQuantizer) or self.inner.rounding != "nearest":
            return None
        g, bits = self.inner.group_size, self.inner.bits
        spec = self.inner.payload_spec(numel)
        groups = sorted({k for a, b in runs if b > a for k in range(a // g, (b - 1) // g + 1)})
        fields = ((0, g * bits // 8), (spec["codes"][1], 4))       # codes, scales
        return merged((offset + k * width, offset + (k + 1) * width)
                      for offset, width in fields for k in groups)

    def _check_wire(self, wire: torch.Tensor, numel: int, riders: torch.Tensor | None) -> int:
        """The fused decode's checks of the ``[rows, width]`` wire of ``numel`` values a row
        (and ``riders``' bytes); returns the codes' bytes a row."""
        self._check_rows(wire.shape[0], numel)
        spec = self.inner.payload_spec(numel)
        (_, ncodes), (_, ngroups) = spec["codes"], spec["scales"]
        if wire.shape[1] != ncodes + 4 * ngroups + tail_nbytes(riders):
            raise ValueError(f"qwd: payload rows of {wire.shape[1]} bytes, expected "
                             f"{ncodes + 4 * ngroups} for {numel} values and "
                             f"{tail_nbytes(riders)} of riders")
        return ncodes

    # -- one slot's calls planned per operand signature (``comm/reference_gather``) -------
    def planned_wire_slot(self, x: torch.Tensor, row: int, rows: int,
                          tail: torch.Tensor | None = None):
        """:meth:`wire_slot` of ``row`` of ``rows`` as ``(x, tail) -> wire row`` for operands
        of the signatures of ``x``, ``tail`` and the reference (the caller keys its plans
        by them), the inner's difference row planned (a ``GroupQuantizer``:
        ``planned_compress_difference_row``)."""
        if self.reference is None or not isinstance(self.inner, GroupQuantizer):
            return lambda x, tail: self.wire_slot(x, row, rows, tail)
        n, shape = x.numel(), None if x.dim() == 1 else x.shape
        self._check_rows(rows, n)
        compress = self.inner.planned_compress_difference_row(x, tail)

        def wire_slot(x: torch.Tensor, tail: torch.Tensor | None) -> torch.Tensor:
            ref = self.reference if rows == 1 else self.reference[row * n:(row + 1) * n]
            return compress(x.detach() if x.requires_grad else x,
                            ref if shape is None else ref.view(shape), tail)
        return wire_slot

    def planned_decompress_rows(self, numel: int, dtype: torch.dtype):
        """:meth:`decompress_rows` as ``(wire, also, riders) -> w~`` for operands of one
        signature each (the reference's too), the fused decode (a ``GroupQuantizer`` inner,
        a reference of ``dtype``) checked at the first call and its launch bound
        (``planned_dequantize_add_wire``: Triton)."""
        ref, inner = self.reference, self.inner
        planned = None if ref is None or not isinstance(inner, GroupQuantizer) or \
            ref.dtype != dtype else getattr(inner._impl(ref), "planned_dequantize_add_wire",
                                            None)
        if planned is None:
            return lambda wire, also, riders: self.decompress_rows(wire, numel, dtype, also,
                                                                   riders)
        add, checked = planned(inner.payload_spec(numel)["codes"][1], inner.bits,
                               inner.group_size), False

        def decompress_rows(wire: torch.Tensor, also: torch.Tensor | None,
                            riders: torch.Tensor | None) -> torch.Tensor:
            nonlocal checked
            if not checked:
                self._check_wire(wire, numel, riders)
                checked = True
            self._replace(add(wire, self.reference, also, riders))
            return self.reference
        return decompress_rows

    def _rows(self, rows: int, numel: int) -> torch.Tensor:
        self._check_rows(rows, numel)
        return self.reference.view(rows, numel)

    def _check_rows(self, rows: int, numel: int) -> None:
        if self.reference.numel() != rows * numel:
            raise ValueError(f"qwd: {rows} rows of {numel} values do not match the reference "
                             f"of {self.reference.numel()} values")

    def _replace(self, new: torch.Tensor) -> None:
        """w~ <- ``new``, a fresh tensor the decode made (no copy into the old w~). On CUDA the
        old w~ is marked in use by the current stream, whose queued decode still reads it."""
        old = self.reference
        if old is not None and old.is_cuda:
            old.record_stream(torch.cuda.current_stream(old.device))
        self.reference = new if new.dim() == 1 else new.reshape(-1)

    def _store(self, out: torch.Tensor) -> None:
        if self.reference is None or self.reference.dtype != out.dtype \
                or self.reference.shape != out.shape:
            self.reference = out.clone()
        else:
            self.reference.copy_(out)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        raise NotImplementedError("qwd compresses weights for all-gather; it has no reduce "
                                  "(payloads are differences against a stateful reference)")

    def reset_reference(self) -> None:
        """Forget w~: the next ``compress`` sends the values exactly and every replica sets
        w~ to them (Alg. 4 line 2). For finite weights restored over a non-finite w~ (NaN
        minus anything stays NaN, so differences alone never recover). Call on every replica
        at the same point (a host-side decision: the payload format changes)."""
        self.reference = None

    # -- state ----------------------------------------------------------------------------
    def steady(self) -> Compressor:
        """Every send after the exact first one is the inner code of the differences."""
        return self.inner

    def state_bytes_for(self, numel: int, dtype: torch.dtype) -> dict[str, int]:
        """The reference w~ of ``numel`` values, in the weights' dtype."""
        return {"references": numel * dtype.itemsize}

    def state_bytes(self) -> dict[str, int]:
        """Bytes of state held: the reference w~ (kind "references")."""
        ref = self.reference
        return {"references": 0 if ref is None else ref.numel() * ref.element_size()}

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (copy) of the reference: later all-gathers update it in place."""
        state: dict[str, Any] = {"inner": self.inner.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"inner", "reference"}
        if unknown:
            raise ValueError(f"qwd: unexpected state keys {sorted(unknown)}")
        self.inner.load_state_dict(state.get("inner", {}))
        ref = state.get("reference")
        self.reference = None if ref is None else ref.clone()
