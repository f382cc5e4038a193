"""Symmetric absmax group quantization (SDP4Bit 2.2; ZeRO++ 3.2 qwZ / qgZ).

``int`` with ``bits`` in 2/4/6/8, ``group_size`` a multiple of 32, ``rounding`` nearest
(biased, for weights) or stochastic (unbiased, for gradients). Any numel works: the tensor
is zero-padded to whole groups; padding is counted in ``wire_bits``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import kernels
from ..kernels.packing import SUPPORTED_BITS, packed_nbytes
from .base import Compressor, Packed, check_choice, check_float_input, check_group_size
from .registry import register_compressor
from .rng import SeededRNG

GROUP_MULTIPLE = 32
ROUNDINGS = ("nearest", "stochastic")


def pad_to(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Flatten ``x`` and zero-pad it to a multiple of ``multiple`` values."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % multiple
    return torch.nn.functional.pad(flat, (0, pad)) if pad else flat


@register_compressor("int")
class GroupQuantizer(Compressor):
    """Symmetric absmax quantization per group of ``group_size`` values."""

    def __init__(self, bits: int = 4, group_size: int = 128, rounding: str = "nearest",
                 seed: int = 0, backend: str = "auto") -> None:
        check_choice("int", "bits", bits, SUPPORTED_BITS)
        check_group_size("int", group_size, GROUP_MULTIPLE)
        check_choice("int", "rounding", rounding, ROUNDINGS)
        check_choice("int", "backend", backend, kernels.dispatch.BACKENDS)
        super().__init__(bits=bits, group_size=group_size, rounding=rounding, seed=seed,
                         backend=backend)
        self.bits, self.group_size, self.rounding, self.backend = bits, group_size, rounding, backend
        self.rng = SeededRNG(seed)

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        return self.rounding == "stochastic"

    def _padded(self, numel: int) -> int:
        return -(-numel // self.group_size) * self.group_size

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        n = self._padded(numel)
        return {"codes": (torch.uint8, packed_nbytes(n, self.bits)),
                "scales": (torch.float32, n // self.group_size)}

    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        flat = pad_to(x, self.group_size)
        noise = self.rng.uniform_like(flat) if self.rounding == "stochastic" else None
        codes, scales = kernels.quantize_groups(flat, self.bits, self.group_size, noise,
                                                backend=self.backend)
        return Packed({"codes": codes, "scales": scales}, x.shape, x.dtype)

    def decompress(self, packed: Packed) -> torch.Tensor:
        out = kernels.dequantize_groups(packed.payload["codes"], packed.payload["scales"],
                                        self.bits, self.group_size, packed.dtype,
                                        backend=self.backend)
        return out[:packed.numel].reshape(packed.shape)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        if not packeds:
            raise ValueError("reduce() needs at least one payload")
        codes = torch.stack([p.payload["codes"] for p in packeds])
        scales = torch.stack([p.payload["scales"] for p in packeds])
        total = kernels.dequantize_sum_groups(codes, scales, self.bits, self.group_size,
                                              backend=self.backend)
        return total[:packeds[0].numel].reshape(packeds[0].shape)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.state_dict()} if self.rounding == "stochastic" else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self.rng.load_state_dict(state["rng"])
