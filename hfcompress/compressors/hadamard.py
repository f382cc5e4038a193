"""Hadamard-smoothed group quantization: the TLq-HS building block (SDP4Bit 3.2.2, 3.3, Alg. 3).

``hadamard`` rotates every block of ``hadamard_size`` values by the normalized Walsh-Hadamard
matrix H (H = H^T, H H = I), spreading an outlier over its block, then quantizes the rotated
values per group like ``int`` (``hadamard_size`` divides ``group_size``, so the transform and
the quantization fuse in one kernel, SDP4Bit 3.3). ``decompress`` applies H again; ``reduce``
sums the peers in the rotated domain and applies H once (sum_i H g_i = H sum_i g_i).

For the 2-hop all-to-all of TLq-HS (SDP4Bit 3.3): ``rotate`` once before the 8-bit hop,
``compress_rotated`` / ``reduce_rotated`` for both hops (no inverse/forward pair between them),
``rotate`` once after the final sum.

The transform on any numel: whole blocks are rotated, an incomplete last block of
``numel % hadamard_size`` values is left as is (identity), so ``rotate`` keeps the shape and
stays self-inverse, and ``compress(x)`` equals ``compress_rotated(rotate(x))`` for every numel.

``compress_rows`` / ``compress_rotated_rows`` quantize every row of a 2-D tensor in one kernel
(row keys: each row rounds as its own call would) and ``reduce_rows`` /
``reduce_rotated_rows`` sum the peers' rows of a received wire tensor in one kernel.

Rounding defaults to stochastic: SDP4Bit's convergence result for gradients assumes an unbiased
gradient compressor (Remark 4.2), and the rotation is linear, so stochastic rounding in the
rotated domain keeps ``E[decompress(compress(g))] = g``.

Range: a rotated value can be sqrt(hadamard_size) times its block's largest (all of a
block's values alike), so float32 inputs above about 3.4e38 / sqrt(32) = 6e37 can rotate past
float32's range. Such a block decodes non-finite (visible, as an Inf or NaN gradient is); a
lone outlier of that size decodes non-finite in its own place only (its group's other values
are lost under its scale, as with any absmax group); other groups are unaffected
(``tests/test_hadamard_range.py``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..kernels import hadamard as _twin
from ..kernels.dispatch import BACKENDS, pick
from ..kernels.packing import SUPPORTED_BITS
from .base import (Compressor, Packed, check_choice, check_float_input, check_group_size,
                   into, pad_rows, pad_to, summed)
from .group_quant import GROUP_MULTIPLE, ROUNDINGS, GroupQuantizer
from .registry import register_compressor


@register_compressor("hadamard")
class HadamardQuantizer(Compressor):
    """Group quantization of Hadamard-rotated values, fused with the transform."""

    sums_riders = spaced_rows = True

    def __init__(self, bits: int = 4, group_size: int = 128, hadamard_size: int = 32,
                 rounding: str = "stochastic", seed: int = 0, backend: str = "auto") -> None:
        check_choice("hadamard", "bits", bits, SUPPORTED_BITS)
        check_group_size("hadamard", group_size, GROUP_MULTIPLE)
        n = hadamard_size
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 2 and n & (n - 1) == 0
                and group_size % n == 0):
            raise ValueError(f"hadamard: hadamard_size={n!r} must be a power of two >= 2 "
                             f"dividing group_size={group_size} (e.g. 32)")
        check_choice("hadamard", "rounding", rounding, ROUNDINGS)
        check_choice("hadamard", "backend", backend, BACKENDS)
        super().__init__(bits=bits, group_size=group_size, hadamard_size=hadamard_size,
                         rounding=rounding, seed=seed, backend=backend)
        # the plain group quantizer of the rotated values: payload layout, RNG, state
        self._q = GroupQuantizer(bits, group_size, rounding, seed, backend)
        self.bits, self.group_size, self.hadamard_size = bits, group_size, hadamard_size
        self.rounding, self.backend = rounding, backend

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        return self.rounding == "stochastic"

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        return self._q.payload_spec(numel)

    def _impl(self, t: torch.Tensor):
        return pick(t, self.backend, _twin, "triton_hadamard")

    def _fused(self, numel: int) -> bool:
        """The fused kernels apply H to whole blocks only (see the module docstring)."""
        return numel % self.hadamard_size == 0

    # -- the transform --------------------------------------------------------------------
    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """H on every whole block of ``x`` (flattened), identity on an incomplete last block;
        float32 of ``x``'s shape. Self-inverse: ``rotate(rotate(x)) == x`` up to rounding."""
        flat = x.reshape(-1)
        whole = flat.numel() - flat.numel() % self.hadamard_size
        out = self._impl(flat).rotate(flat[:whole], self.hadamard_size)
        if whole < flat.numel():
            out = torch.cat([out, flat[whole:].float()])
        return out.reshape(x.shape)

    def rotate_rows(self, x: torch.Tensor) -> torch.Tensor:
        """``rotate`` of every row of 2-D ``x`` (blocks never cross a row end), one call."""
        rows, n = x.shape
        whole = n - n % self.hadamard_size
        head = x[:, :whole].reshape(-1)
        out = self._impl(head).rotate(head, self.hadamard_size).view(rows, whole)
        return torch.cat([out, x[:, whole:].float()], dim=1) if whole < n else out

    # -- Compressor contract --------------------------------------------------------------
    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        if not self._fused(x.numel()):
            return self._quantize(self.rotate(x), 1, x.shape, x.dtype)
        return self._quantize(x, self.hadamard_size, x.shape, x.dtype)

    def decompress(self, packed: Packed) -> torch.Tensor:
        if not self._fused(packed.numel):
            return self.rotate(self._dequantize(packed, False, torch.float32)).to(packed.dtype)
        return self._dequantize(packed, True, packed.dtype)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        """float32 sum of the peers: summed in the rotated domain, then one inverse."""
        if not packeds:
            raise ValueError("reduce() needs at least one payload")
        if not self._fused(packeds[0].numel):
            return self.rotate(self._sum(packeds, False))
        return self._sum(packeds, True)

    def compress_rows(self, x: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        """Every row of 2-D x compressed in one kernel, the numbers of one ``compress`` per row
        (``tail``'s rows after them: ``Compressor.compress_rows``; ``x`` may be spaced runs:
        ``spaced_rows``)."""
        check_float_input(self.name, x)
        if not self._fused(x.numel() // x.shape[0]):
            return self._quantize_rows(self.rotate_rows(x.reshape(x.shape[0], -1)), 1, tail)
        return self._quantize_rows(x, self.hadamard_size, tail)

    def reduce_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                    dtype: torch.dtype, out: torch.Tensor | None = None,
                    post: tuple[str, float] | None = None,
                    riders: tuple | None = None) -> torch.Tensor:
        """``reduce`` of the payloads in the rows of ``wire`` (fields: its column ranges),
        into ``out`` if given, ``post`` applied after the inverse rotation; ``riders``
        summed by the same decode-sum (``Compressor.sums_riders``)."""
        shape = torch.Size(shape)
        if not self._fused(shape.numel()):
            return into(self.rotate(self._sum_rows(wire, shape, False, riders=riders)), out,
                        post)
        return self._sum_rows(wire, shape, True, out, post, riders)

    def planned_compress_rows(self, x: torch.Tensor, tail: torch.Tensor | None = None):
        """``compress_rows`` for operands of these signatures (``Compressor``): where the
        kernel reads the rows as they are (whole groups, whole Hadamard blocks) and plans
        its launch (``planned_quantize_rows``: Triton), the row keys drawn and the bound
        launch, nothing else per call."""
        rows = x.shape[0]
        n = x.numel() // rows if rows else 0
        planned = getattr(self._impl(x), "planned_quantize_rows", None)
        if planned is None or not n or n % self.group_size or not self._fused(n):
            return self.compress_rows
        check_float_input(self.name, x)       # the dtype is the signature's: checked once
        quantize, keys = planned(rows, self.bits, self.group_size, self.hadamard_size), \
            self._q._keys
        device = x.device
        return lambda x, tail: quantize(x, keys(device, rows), tail)

    def planned_reduce_rows(self, shape, dtype, out, post=None, rider_sum=None):
        """``reduce_rows`` for operands of these signatures (``Compressor``): where the
        decode-sum writes ``out`` itself (whole groups, whole Hadamard blocks; Triton's
        ``planned_sum_wire``), the bound launch, nothing else per call."""
        n = torch.Size(shape).numel()
        planned = getattr(self._impl(out), "planned_sum_wire", None)
        if planned is None or not n or n % self.group_size or not self._fused(n):
            return super().planned_reduce_rows(shape, dtype, out, post, rider_sum)
        spec = self.payload_spec(n)
        return planned(spec["codes"][1], spec["scales"][1], self.bits, self.group_size,
                       self.hadamard_size, True, out.dtype, post, rider_sum)

    # -- rotated-domain steps of the 2-hop all-to-all (SDP4Bit 3.3) -----------------------
    def compress_rotated(self, y: torch.Tensor) -> Packed:
        """Quantize values already in the Hadamard domain (no transform)."""
        check_float_input(self.name, y)
        return self._quantize(y, 1, y.shape, y.dtype)

    def decompress_rotated(self, packed: Packed) -> torch.Tensor:
        """Dequantize without the inverse transform (stays in the Hadamard domain)."""
        return self._dequantize(packed, False, packed.dtype)

    def reduce_rotated(self, packeds: Sequence[Packed]) -> torch.Tensor:
        """float32 sum of the peers in the Hadamard domain (no inverse)."""
        if not packeds:
            raise ValueError("reduce_rotated() needs at least one payload")
        return self._sum(packeds, False)

    def compress_rotated_rows(self, y: torch.Tensor,
                              tail: torch.Tensor | None = None) -> torch.Tensor:
        """``compress_rotated`` of every row of 2-D y in one kernel (see ``compress_rows``)."""
        check_float_input(self.name, y)
        return self._quantize_rows(y, 1, tail)

    def reduce_rotated_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                            dtype: torch.dtype, out: torch.Tensor | None = None,
                            post: tuple[str, float] | None = None,
                            riders: tuple | None = None) -> torch.Tensor:
        """``reduce_rotated`` of the payloads in the rows of ``wire``, into ``out`` if given
        (``post`` applied; ``riders`` summed)."""
        return self._sum_rows(wire, torch.Size(shape), False, out, post, riders)

    # -- kernels --------------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, hadamard_size: int, shape: torch.Size,
                  dtype: torch.dtype) -> Packed:
        """``hadamard_size=1`` is the 1x1 Hadamard matrix: plain group quantization."""
        flat = pad_to(x, self.group_size)
        noise = self._q._keys(flat.device)
        codes, scales = self._impl(flat).quantize(flat, self.bits, self.group_size,
                                                  hadamard_size, noise)
        return Packed({"codes": codes, "scales": scales}, shape, dtype)

    def _quantize_rows(self, x: torch.Tensor, hadamard_size: int,
                       tail: torch.Tensor | None) -> torch.Tensor:
        """Every row of 2-D x padded to whole groups (flattened; rows of whole groups stay
        as they are: the Triton kernel reads strided rows in place) and quantized in one
        kernel, each row with its own call's noise keys, written as the uint8 ``[rows,
        nbytes]`` wire (row r its ``Packed.flat()``, then row r of ``tail``) by the kernel
        itself on a GPU."""
        rows = x.shape[0]
        if (x.numel() // rows) % self.group_size:
            x = pad_rows(x.reshape(rows, -1), self.group_size)
        noise = self._q._keys(x.device, rows)
        return self._impl(x).quantize_rows(x, rows, self.bits, self.group_size,
                                           hadamard_size, noise, tail)

    def _dequantize(self, packed: Packed, inverse: bool, dtype: torch.dtype) -> torch.Tensor:
        codes, scales = packed.payload["codes"], packed.payload["scales"]
        out = self._impl(codes).dequantize(codes, scales, self.bits, self.group_size,
                                           self.hadamard_size, dtype, inverse)
        return out[:packed.numel].reshape(packed.shape)

    def _sum(self, packeds: Sequence[Packed], inverse: bool) -> torch.Tensor:
        codes = torch.stack([p.payload["codes"] for p in packeds])
        scales = torch.stack([p.payload["scales"] for p in packeds])
        impl = self._impl(codes)
        return summed(lambda into_: impl.dequantize_sum(
            codes, scales, self.bits, self.group_size, self.hadamard_size, inverse,
            out=into_), packeds[0].shape, None, False)

    def _sum_rows(self, wire: torch.Tensor, shape: torch.Size, inverse: bool,
                  out: torch.Tensor | None = None,
                  post: tuple[str, float] | None = None,
                  riders: tuple | None = None) -> torch.Tensor:
        """The fields read where they lie in the wire's rows (no view per field); ``post``
        applied by the decode-sum kernel as it writes ``out``; ``riders`` summed by it."""
        spec, impl = self.payload_spec(shape.numel()), self._impl(wire)
        return summed(lambda into_: impl.dequantize_sum_wire(
            wire, spec["codes"][1], spec["scales"][1], self.bits, self.group_size,
            self.hadamard_size, inverse, out=into_, post=None if into_ is None else post,
            riders=riders),
            shape, out, shape.numel() % self.group_size == 0, post)

    def state_dict(self) -> dict[str, Any]:
        return self._q.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._q.load_state_dict(state)
