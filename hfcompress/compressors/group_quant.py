"""Symmetric absmax group quantization (SDP4Bit 2.2; ZeRO++ 3.2 qwZ / qgZ).

``int`` with ``bits`` in 2/4/6/8, ``group_size`` a multiple of 32, ``rounding`` nearest
(biased, for weights) or stochastic (unbiased, for gradients). Any numel works: the tensor
is zero-padded to whole groups; padding is counted in ``wire_bits``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..kernels import group_quant as _twin
from .base import Packed, check_choice, check_float_input, pad_rows, summed
from .bucketed import BUCKET_MULTIPLE, BucketQuantizer
from .registry import register_compressor

GROUP_MULTIPLE = BUCKET_MULTIPLE
ROUNDINGS = ("nearest", "stochastic")


@register_compressor("int")
class GroupQuantizer(BucketQuantizer):
    """Symmetric absmax quantization per group of ``group_size`` values."""

    twin, triton_module = _twin, "triton_group_quant"
    size_param = "group_size"
    sums_into = decodes_rows_into = sums_riders = copies_riders = spaced_rows = True

    def __init__(self, bits: int = 4, group_size: int = 128, rounding: str = "nearest",
                 seed: int = 0, backend: str = "auto") -> None:
        super().__init__(bits, group_size, seed, backend)
        check_choice(self.name, "rounding", rounding, ROUNDINGS)
        self.rounding = self.params["rounding"] = rounding

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        return self.rounding == "stochastic"

    def _keys(self, device: torch.device, rows: int | None = None) -> torch.Tensor | None:
        """The next call's noise keys (``rows`` calls' row keys) when rounding stochastically."""
        return self.rng.next_keys(device, rows) if self.rounding == "stochastic" else None

    def _quantize(self, flat: torch.Tensor, rows: int | None) -> tuple[torch.Tensor, ...]:
        noise = self._keys(flat.device, rows)
        return self._impl(flat).quantize(flat, self.bits, self.group_size, noise)

    def compress_rows(self, x: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        """Every row in one kernel that writes the ``[rows, nbytes]`` wire itself (no ``cat``
        of the fields on a GPU; ``tail``'s rows copied after them): the numbers of one
        ``compress`` per row (``x`` may be spaced runs: ``spaced_rows``)."""
        check_float_input(self.name, x)
        rows, x = x.shape[0], x.detach()
        # padded and flattened unless whole groups (the Triton kernel reads strided rows)
        if (x.numel() // rows) % self.group_size:
            x = pad_rows(x.reshape(rows, -1), self.group_size)
        noise = self._keys(x.device, rows)
        return self._impl(x).quantize_rows(x, rows, self.bits, self.group_size, noise, tail)

    def reduce_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                    dtype: torch.dtype, out: torch.Tensor | None = None,
                    post: tuple[str, float] | None = None,
                    riders: tuple | None = None) -> torch.Tensor:
        """``reduce`` of the rows' payloads, their fields read where they lie in the wire's
        rows (no view per field); ``post`` applied by the decode-sum kernel as it writes
        ``out``; ``riders`` summed by it too (``Compressor.sums_riders``)."""
        shape = torch.Size(shape)
        spec, impl = self.payload_spec(shape.numel()), self._impl(wire)
        return summed(lambda into_: impl.dequantize_sum_wire(
            wire, spec["codes"][1], spec["scales"][1], self.bits, self.group_size, out=into_,
            post=None if into_ is None else post, riders=riders),
            shape, out, shape.numel() % self.group_size == 0, post)

    def compress_difference(self, x: torch.Tensor, ref: torch.Tensor) -> Packed:
        """``compress(x - ref)``, the subtraction and padding fused into the kernel."""
        check_float_input(self.name, x)
        noise = self._keys(x.device)
        codes, scales = self._impl(x).quantize_difference(x, ref, self.bits, self.group_size,
                                                          noise)
        return Packed({"codes": codes, "scales": scales}, x.shape, torch.float32)

    def compress_difference_row(self, x: torch.Tensor, ref: torch.Tensor,
                                tail: torch.Tensor | None = None) -> torch.Tensor:
        """``compress_difference(x, ref).flat()`` followed by the bytes of ``tail``
        (``[1, E]``), one uint8 row ``[1, nbytes + E]`` the kernel writes (no ``cat``)."""
        check_float_input(self.name, x)
        noise = self._keys(x.device)
        return self._impl(x).quantize_difference_row(x, ref, self.bits, self.group_size,
                                                     noise, tail)

    def planned_compress_difference_row(self, x: torch.Tensor,
                                        tail: torch.Tensor | None = None):
        """:meth:`compress_difference_row` as ``(x, ref, tail) -> wire`` for operands of
        these signatures (``Compressor.planned_compress_rows``): where the kernel plans its
        launch (Triton's ``planned_quantize_difference_row``), the noise keys drawn and the
        bound launch, nothing else per call."""
        planned = getattr(self._impl(x), "planned_quantize_difference_row", None)
        if planned is None:
            return self.compress_difference_row
        check_float_input(self.name, x)       # the dtype is the signature's: checked once
        quantize, keys, device = planned(self.bits, self.group_size), self._keys, x.device
        return lambda x, ref, tail: quantize(x, ref, keys(device), tail)

    def decompress_add(self, packed: Packed, ref: torch.Tensor) -> torch.Tensor:
        """``ref + decompress(packed)`` rounded to ref's dtype, fused into the kernel."""
        codes, scales = packed.payload["codes"], packed.payload["scales"]
        return self._impl(codes).dequantize_add(codes, scales, self.bits, self.group_size,
                                                ref.reshape(packed.shape))

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() if self.rounding == "stochastic" else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            super().load_state_dict(state)
