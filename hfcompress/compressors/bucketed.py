"""What the bucketed quantizers share: packed codes plus a few values per bucket of
``bucket_size`` values (QSDP 5.1 buckets; the groups of SDP4Bit 2.2 / ZeRO++ 3.2).

A subclass names its kernels (``twin`` module and ``triton_module``, both with
``quantize`` / ``dequantize`` / ``dequantize_sum``) and its per-bucket payload tensors
(``bucket_params``, float32 unless ``bucket_dtypes`` says otherwise, e.g. an MX-style
uint8 shared exponent), and its ``_quantize(flat, rows)`` (noise, shift or rounding: the
scheme) of one padded row or of ``rows`` padded rows side by side, drawing the randomness of
``rows`` successive calls. ``compress`` pads and quantizes one tensor, ``compress_rows`` every
row of a 2-D tensor in one kernel (a bucket never spans two rows, so the fields of row r are
a slice of each output). The parameter checks, the payload layout, ``decompress`` and
``reduce`` / ``reduce_rows`` (the peers stacked, one ``dequantize_sum``, trimmed to numel)
and the RNG state are here.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from ..kernels import dispatch
from ..kernels.packing import SUPPORTED_BITS, packed_nbytes, tail_bytes
from .base import (Compressor, Packed, aligned, check_choice, check_float_input, check_group_size,
                   into, pad_edge, pad_edge_rows, pad_rows, pad_to, summed)
from .rng import SeededRNG

BUCKET_MULTIPLE = 32


class BucketQuantizer(Compressor):
    """Codes and per-bucket payload; decode and peer sum by the scheme's kernels."""

    #: torch twin of the kernels and the name of the Triton module (same functions)
    twin: ClassVar[ModuleType]
    triton_module: ClassVar[str]
    #: payload tensors after ``codes``, one value per bucket, in kernel argument order
    bucket_params: ClassVar[tuple[str, ...]] = ("scales",)
    #: wire dtype of a bucket param when not float32 (e.g. ``{"scales": torch.uint8}``)
    bucket_dtypes: ClassVar[Mapping[str, torch.dtype]] = {}
    allowed_bits: ClassVar[Sequence[int]] = SUPPORTED_BITS
    #: the constructor's name for the bucket size
    size_param: ClassVar[str] = "bucket_size"
    codes_nbytes: ClassVar[Callable[[int, int], int]] = staticmethod(packed_nbytes)
    #: the last bucket is padded with zeros, or with its last value (keeping a min-max range)
    edge_padded: ClassVar[bool] = False
    #: the kernels' ``dequantize_sum`` takes ``out=`` (writes the sum in place)
    sums_into: ClassVar[bool] = False
    #: the kernels' ``dequantize_rows`` decode a wire's rows into ``out``'s rows in place
    decodes_rows_into: ClassVar[bool] = False

    def __init__(self, bits: int = 8, bucket_size: int = 1024, seed: int = 0,
                 backend: str = "auto") -> None:
        """Defaults: QSDP's W8G8, 8 bits and buckets of 1024 (QSDP 5.1, 6). A subclass with
        more arguments checks them and adds them to ``self.params``."""
        check_choice(self.name, "bits", bits, self.allowed_bits)
        check_group_size(self.name, bucket_size, BUCKET_MULTIPLE, self.size_param)
        check_choice(self.name, "backend", backend, dispatch.BACKENDS)
        super().__init__(bits=bits, **{self.size_param: bucket_size}, seed=seed, backend=backend)
        self.bits, self.backend, self._size = bits, backend, bucket_size
        setattr(self, self.size_param, bucket_size)  # .bucket_size (.group_size for ``int``)
        self.rng = SeededRNG(seed)
        self._specs: dict[int, dict[str, tuple[torch.dtype, int]]] = {}

    def _impl(self, t: torch.Tensor) -> ModuleType:
        return dispatch.pick(t, self.backend, self.twin, self.triton_module)

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        """Cached per ``numel`` (a unit's calls repeat a few; read-only to callers)."""
        spec = self._specs.get(numel)
        if spec is None:
            n = -(-numel // self._size) * self._size
            nb = n // self._size
            if len(self._specs) >= 256:
                self._specs.clear()
            spec = self._specs[numel] = {
                "codes": (torch.uint8, self.codes_nbytes(n, self.bits)),
                **{k: (self.bucket_dtypes.get(k, torch.float32), nb) for k in self.bucket_params}}
        return spec

    def _packed(self, x: torch.Tensor, tensors: Sequence[torch.Tensor]) -> Packed:
        """The kernel's outputs as x's payload (payload_spec's order)."""
        return Packed(dict(zip(self.payload_spec(0), tensors, strict=True)), x.shape, x.dtype)

    def _quantize(self, flat: torch.Tensor, rows: int | None) -> Sequence[torch.Tensor]:
        """The kernel's outputs for ``flat`` (padded to whole buckets): one tensor's values
        (``rows`` None), or ``rows`` equal rows side by side, each rounded with the
        randomness its own call would draw."""
        raise NotImplementedError

    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        flat = (pad_edge if self.edge_padded else pad_to)(x.detach(), self._size)
        return self._packed(x, self._quantize(flat, None))

    def compress_rows(self, x: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        """Every row in one ``quantize`` (see the module docstring), ``tail``'s rows after
        the fields in the same ``cat``; a stateful scheme row by row."""
        if self.stateful:
            return super().compress_rows(x, tail)
        check_float_input(self.name, x)
        rows = x.shape[0]
        flat = (pad_edge_rows if self.edge_padded else pad_rows)(x.detach(), self._size)
        fields = [t.reshape(rows, -1).view(torch.uint8) for t in self._quantize(flat, rows)]
        extra = tail_bytes(tail)
        return torch.cat(fields if extra is None else [*fields, extra], dim=1)

    def decompress(self, packed: Packed) -> torch.Tensor:
        p = [packed.payload[k] for k in self.payload_spec(0)]
        out = self._impl(p[0]).dequantize(*p, self.bits, self._size, packed.dtype)
        return out[:packed.numel].reshape(packed.shape)

    def decompress_slots(self, wire: torch.Tensor, numel: int, out: torch.Tensor,
                         riders: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """All rows in one ``dequantize``: a row is the codes and per-bucket values of
        ``numel`` values padded to whole buckets, so the rows' fields side by side are the
        payload of ``rows`` x that many values (a bucket never spans two rows). With
        ``decodes_rows_into`` the kernels read the fields in the wire and write ``out``'s rows.
        A payload with more than codes and bucket values (e.g. a codebook per payload)
        decodes row by row. ``riders``: ``(out [rows, E], values [rows, E])``, the exact
        values ending the rows, copied by the decode kernel with ``decodes_rows_into``
        (``Compressor.copies_riders``), else before it."""
        spec = self.payload_spec(numel)
        fields_only = list(spec) == ["codes", *self.bucket_params]
        if riders is not None and not (fields_only and self.decodes_rows_into):
            riders[0].copy_(riders[1])
        if not fields_only:
            return super().decompress_slots(wire, numel, out)
        if self.decodes_rows_into:
            fields = self.payload_rows(wire, numel)
            self._impl(fields[0]).dequantize_rows(*fields, self.bits, self._size, out,
                                                  **({} if riders is None else
                                                     {"riders": riders}))
            return None
        rows, fields, offset = wire.shape[0], [], 0
        for dt, n in spec.values():
            nbytes = dt.itemsize * n
            fields.append(aligned(wire[:, offset:offset + nbytes].reshape(-1)).view(dt))
            offset += nbytes
        padded = -(-numel // self._size) * self._size
        values = self._impl(fields[0]).dequantize(*fields, self.bits, self._size, out.dtype)
        out.copy_(values.view(rows, padded)[:, :numel])

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        if not packeds:
            raise ValueError("reduce() needs at least one payload")
        p = [torch.stack([q.payload[k] for q in packeds]) for k in self.payload_spec(0)]
        return self._sum(p, packeds[0].shape)

    def reduce_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                    dtype: torch.dtype, out: torch.Tensor | None = None,
                    post: tuple[str, float] | None = None) -> torch.Tensor:
        """``reduce`` of the rows' payloads: the fields are the wire's column ranges
        (``post``: applied as the sum is copied into ``out``)."""
        shape = torch.Size(shape)
        fields = self.payload_rows(wire, shape.numel())
        if post is not None:
            return into(self._sum(fields, shape), out, post)
        return self._sum(fields, shape, out)

    def _sum(self, fields: Sequence[torch.Tensor], shape: torch.Size,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """One ``dequantize_sum`` of the peers' stacked fields, trimmed to ``shape``; written
        into ``out`` by the kernel where it holds whole buckets (else copied)."""
        impl = self._impl(fields[0])

        def decode_sum(into_: torch.Tensor | None) -> torch.Tensor:   # ``out`` only where taken
            if into_ is None:
                return impl.dequantize_sum(*fields, self.bits, self._size)
            return impl.dequantize_sum(*fields, self.bits, self._size, out=into_)
        return summed(decode_sum, shape, out,
                      self.sums_into and shape.numel() % self._size == 0)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.load_state_dict(state["rng"])
