"""The compressor contract shared by every scheme (docs/architecture.md, "The compressor
contract").

A compressor turns a tensor into a :class:`Packed` payload (the exact tensors that go on
the wire), turns it back, and sums several peers' payloads. Compressors know nothing about
process groups: the collectives in ``hfcompress.comm`` move ``Packed.flat()`` buffers and
rebuild them with :meth:`Compressor.unflatten`.

What a collective may do beyond the contract is declared by the capability protocols below
(:class:`RotatedDomain`, :class:`ReferenceCoded`, :class:`GloballyScaled`,
:class:`TreeCombined`, :class:`ErrorFeedback`): ``comm/`` and ``integrations/`` test
``isinstance(c, Capability)`` and never name a concrete scheme.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

import torch

from ..kernels.post_op import written

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Packed:
    """A compressed tensor: ``payload`` holds every tensor that goes on the wire.

    ``shape`` and ``dtype`` describe the original tensor; they are known to the receiver
    (same shapes on every rank), so they are not counted as wire bytes.
    """

    payload: dict[str, torch.Tensor]
    shape: torch.Size
    dtype: torch.dtype
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.payload.values())

    def wire_bits(self) -> int:
        """Bits this payload occupies on the wire (the sum of its tensors' bytes x 8)."""
        return 8 * self.nbytes()

    def flat(self) -> torch.Tensor:
        """All payload tensors as one contiguous uint8 buffer (in ``payload`` order): a view
        when they already lie back to back in one allocation (the Triton quantizers write
        codes and scales so: no copy), else their concatenation."""
        parts = [t.contiguous().reshape(-1).view(torch.uint8) for t in self.payload.values()]
        if not parts:
            return torch.empty(0, dtype=torch.uint8)
        if len(parts) > 1 and back_to_back(parts):
            return parts[0].as_strided((sum(p.numel() for p in parts),), (1,))
        return torch.cat(parts)


class Compressor:
    """Base class of every scheme. Subclasses implement the four abstract methods.

    - ``compress(x) -> Packed`` and ``decompress(packed) -> Tensor`` (shape and dtype of x);
    - ``payload_spec(numel)``: ``{name: (dtype, count)}`` of the payload ``compress`` makes
      for ``numel`` values, in the same order; ``wire_bits`` and ``unflatten`` derive from it;
    - ``reduce(packeds)``: the float32 sum of several peers' payloads. The default
      dequantizes and sums; schemes with a compressed-domain sum override it.
    - ``state_dict``/``load_state_dict`` for stateful schemes (default: no state);
    - ``state_bytes()``: bytes of persistent state by kind (default: none);
    - ``compress_rows(x)`` / ``reduce_rows(wire, shape, dtype)``: a hop's sends and receives
      as one ``[rows, nbytes]`` uint8 tensor, the numbers of one call per row (defaults loop
      over the rows; stateless schemes with row kernels override them).
    """

    name: ClassVar[str] = ""
    #: True when E[decompress(compress(x))] == x (stochastic rounding schemes).
    unbiased: ClassVar[bool] = False
    #: True when the scheme keeps state between calls (references, error buffers, levels).
    stateful: ClassVar[bool] = False
    #: True when ``reduce_rows`` takes ``riders=(out, dtype, post)``: the exact values that
    #: end each wire row (``comm/riders.py``) summed into ``out`` by its decode-sum.
    sums_riders: ClassVar[bool] = False
    #: True when ``decompress_slots`` takes ``riders=(out, values)``: the exact values that
    #: end each gathered wire row copied into ``out`` by its decode (``comm/riders.py``).
    copies_riders: ClassVar[bool] = False
    #: True when ``compress_rows`` also takes ``[rows, count, length]`` runs of one length
    #: equally spaced (``runs.view(spaced=True)``: a root unit's compressed gradient
    #: columns) as the rows of their values in order, read in place by its kernel.
    spaced_rows: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        self.params = dict(params)

    # -- abstract -------------------------------------------------------------------------
    def compress(self, x: torch.Tensor) -> Packed:
        raise NotImplementedError

    def decompress(self, packed: Packed) -> torch.Tensor:
        raise NotImplementedError

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        raise NotImplementedError

    # -- derived --------------------------------------------------------------------------
    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        """Sum of the peers' decompressed payloads, in float32 (the original shape)."""
        if not packeds:
            raise ValueError("reduce() needs at least one payload")
        total = self.decompress(packeds[0]).float()
        for p in packeds[1:]:
            total = total + self.decompress(p).float()
        return total

    def compress_rows(self, x: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        """Every row of 2-D ``x`` compressed: a uint8 ``[rows, nbytes]`` tensor whose row r is
        ``compress(x[r]).flat()``, the numbers of ``rows`` successive ``compress`` calls (the
        RNG advances as they would), followed by the bytes of row r of ``tail`` (``[rows,
        E]``, exact values riding along: ``comm/riders.py``). This default calls
        ``compress`` per row; a stateless scheme overrides it with one kernel over all rows
        (launches independent of the number of peers a collective sends to)."""
        return stack_payloads([self.compress(r) for r in x], tail)

    def compress_streams(self, instances: Sequence["Compressor"], x: torch.Tensor,
                         tail: torch.Tensor | None = None) -> torch.Tensor | None:
        """What :meth:`compress_rows` is for a stateful scheme with one instance per row
        (``comm/streams.py``): row r of 2-D ``x`` compressed by ``instances[r]`` (fresh copies
        of this one), the ``[rows, nbytes]`` wire with ``tail``'s rows after the payloads, in
        one call where the scheme can; None: compress row by row."""
        return None

    def reduce_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                    dtype: torch.dtype, out: torch.Tensor | None = None,
                    post: tuple[str, float] | None = None) -> torch.Tensor:
        """``reduce`` of the payloads in the rows of ``wire`` (uint8 ``[rows, nbytes]``, each
        row a ``Packed.flat()`` of a ``shape`` / ``dtype`` tensor): float32, ``shape``; into
        ``out`` (``shape``'s numel, any float dtype) if given, ``post`` applied first (a
        reduce op's AVG / PREMUL_SUM, ``kernels/post_op.py``; needs ``out``). This default
        rebuilds each row's payload; schemes whose ``reduce`` stacks the payloads' fields
        override it (the fields are the wire's column ranges, same numbers; their kernels
        write ``out``)."""
        return into(self.reduce([self.unflatten(w, shape, dtype) for w in wire]), out, post)

    # -- a hop's calls planned per operand signature (``comm/two_hop``'s one-hop plans) ----
    def planned_compress_rows(self, x: torch.Tensor, tail: torch.Tensor | None = None
                              ) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        """:meth:`compress_rows` as ``(x, tail) -> wire`` for operands of the signatures of
        ``x`` and ``tail`` (``kernels/launch_plans.signature``; the caller keys its plans by
        them), its decisions made once where the scheme can (its kernel's plan bound: no
        checks or lookups per call). This default: :meth:`compress_rows` itself."""
        return self.compress_rows

    def planned_reduce_rows(self, shape: torch.Size | Sequence[int], dtype: torch.dtype,
                            out: torch.Tensor, post: tuple[str, float] | None = None,
                            rider_sum: tuple | None = None
                            ) -> Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]:
        """:meth:`reduce_rows` into an ``out`` of ``out``'s signature as ``(wire, out,
        riders_out) -> result`` (``riders_out`` summed into where ``rider_sum``, the riders'
        ``(dtype, post)``, is given: ``sums_riders`` schemes), for wires of one signature,
        decided once where the scheme can. This default: :meth:`reduce_rows` itself."""
        reduce, size = self.reduce_rows, torch.Size(shape)
        posted = {} if post is None else {"post": post}
        if rider_sum is None:
            return lambda wire, out, _: reduce(wire, size, dtype, out=out, **posted)
        return lambda wire, out, riders_out: reduce(wire, size, dtype, out=out, **posted,
                                                    riders=(riders_out, *rider_sum))

    def payload_rows(self, wire: torch.Tensor, numel: int) -> list[torch.Tensor]:
        """The payload fields of every row of ``wire`` (uint8 ``[rows, nbytes]``, rows made by
        :meth:`Packed.flat` for ``numel`` values), each ``[rows, count]`` of its dtype, in
        ``payload_spec`` order: what ``reduce`` would stack from the unflattened rows. Views
        of the wire's columns (the decoders read strided rows: no copy per receive) where
        a field's start and the row stride are multiples of its dtype's size, else copies."""
        base, stride = wire.storage_offset(), wire.stride(0) if wire.shape[0] > 1 else 0
        fields, offset = [], 0
        for dt, n in self.payload_spec(numel).values():
            nbytes, size = dt.itemsize * n, dt.itemsize
            col = wire[:, offset:offset + nbytes]
            if (base + offset) % size or stride % size or wire.stride(-1) != 1:
                col = aligned(col.contiguous())
            fields.append(col if dt == col.dtype else col.view(dt))
            offset += nbytes
        return fields

    def compress_difference(self, x: torch.Tensor, ref: torch.Tensor) -> Packed:
        """``compress`` of the float32 difference ``x - ref`` (qWD's sender step, SDP4Bit
        3.1); a scheme may fuse the subtraction into its kernel (same numbers)."""
        return self.compress(x.float() - ref.float())

    def decompress_add(self, packed: Packed, ref: torch.Tensor) -> torch.Tensor:
        """``ref + decompress(packed)`` in float32, rounded to ref's dtype (qWD's update
        ``w~ + deq(C(w - w~))``, SDP4Bit Alg. 2); a scheme may fuse it (same numbers)."""
        diff = self.decompress(Packed(packed.payload, packed.shape, torch.float32, packed.meta))
        return (ref.float().reshape(packed.shape) + diff).to(ref.dtype)

    def decompress_slots(self, wire: torch.Tensor, numel: int, out: torch.Tensor) -> None:
        """``out[r] <- decompress`` of row r of ``wire`` (``[rows, n]`` uint8, each row a
        ``compress`` of ``numel`` values flattened by :meth:`Packed.flat`); ``out`` is
        ``[rows, numel]`` in the values' dtype. This default decodes row by row; a scheme
        whose rows concatenate into one payload decodes them in one call (same numbers)."""
        for r in range(wire.shape[0]):
            out[r].copy_(self.decompress(self.unflatten(aligned(wire[r]), (numel,), out.dtype)))

    def wire_bits(self, numel: int) -> int:
        """Bits that ``compress`` puts on the wire for ``numel`` values."""
        return 8 * sum(dt.itemsize * n for dt, n in self.payload_spec(numel).values())

    def bits_per_value(self, numel: int = 1 << 20) -> float:
        return self.wire_bits(numel) / max(numel, 1)

    def unflatten(self, buf: torch.Tensor, shape: torch.Size | Sequence[int], dtype: torch.dtype) -> Packed:
        """Rebuild a :class:`Packed` from a buffer made by :meth:`Packed.flat` (zero-copy views)."""
        shape = torch.Size(shape)
        spec = self.payload_spec(math.prod(shape))
        need = sum(dt.itemsize * n for dt, n in spec.values())
        if buf.dtype != torch.uint8 or buf.numel() != need:
            raise ValueError(f"{self.name}: expected a uint8 buffer of {need} bytes for shape "
                             f"{tuple(shape)}, got {buf.dtype} with {buf.numel()} elements")
        payload, offset = {}, 0
        for key, (dt, n) in spec.items():
            nbytes = dt.itemsize * n
            payload[key] = buf[offset:offset + nbytes].view(dt)
            offset += nbytes
        return Packed(payload, shape, dtype)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.name} is stateless but got state keys {sorted(state)}")

    def state_bytes(self) -> dict[str, int]:
        """Bytes of persistent state this instance holds, by kind: ``"references"`` (qWD's
        w~), ``"errors"`` (LoCo's error buffer), ``"buffers"`` (anything else kept between
        calls). Kinds with no state may be left out; the default holds nothing."""
        return {}

    def steady(self) -> "Compressor":
        """The compressor whose payload and codec work every send but the first has (a cost
        model's input): this one, unless the scheme's first send differs (qWD: an exact
        first send, then its ``inner`` code of the differences, SDP4Bit Alg. 4)."""
        return self

    def steady_bits_per_value(self, numel: int = 1 << 20) -> float:
        """Bits per value of every send but a stateful scheme's first."""
        return self.steady().bits_per_value(numel)

    def state_bytes_for(self, numel: int, dtype: torch.dtype) -> dict[str, int]:
        """The persistent state (kinds as :meth:`state_bytes`) this scheme will keep for a
        stream of ``numel`` values of ``dtype``, known before any is allocated (a memory
        check's input); the default keeps none."""
        return {}

    def config(self) -> dict[str, Any]:
        """Name and parameters: equal on every rank of a job (checked by the collectives)."""
        return {"name": self.name, **{k: _plain(v) for k, v in sorted(self.params.items())}}

    def fresh(self) -> "Compressor":
        """A new instance with the same parameters and empty state (one per tensor stream).

        Compressor-valued parameters (e.g. the inner compressor of a wrapper) are renewed too.
        """
        return type(self)(**{k: v.fresh() if isinstance(v, Compressor) else v
                             for k, v in self.params.items()})

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))
        return f"{type(self).__name__}({args})"


def _plain(v: Any) -> Any:
    return v.config() if isinstance(v, Compressor) else v


def check_float_input(name: str, x: torch.Tensor) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected a float32, bfloat16 or float16 tensor, got {x.dtype}")


def check_choice(scheme: str, param: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ValueError(f"{scheme}: {param}={value!r} is not supported; allowed: "
                         f"{', '.join(map(repr, allowed))}")


def check_group_size(scheme: str, group_size: Any, multiple: int, param: str = "group_size") -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0 \
            or group_size % multiple:
        raise ValueError(f"{scheme}: {param}={group_size!r} must be a positive multiple of "
                         f"{multiple} (e.g. {multiple}, {4 * multiple}, 2048)")


def stack_payloads(packeds: Sequence[Packed], tails: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """The ``Packed.flat()`` buffers of several payloads as the rows of one uint8 tensor
    (one ``cat`` of every payload's tensors), each followed by the bytes of its row of
    ``tails`` (``[rows, E]``, any dtype: exact values riding along, ``comm/riders.py``)."""
    if len(packeds) > 1:
        sizes = [p.nbytes() for p in packeds]
        if any(n != sizes[0] for n in sizes):
            raise RuntimeError(f"payload sizes differ between parts: {sizes}")
    extra = [()] * len(packeds) if tails is None else [(t,) for t in tails]
    parts = [t.contiguous().reshape(-1).view(torch.uint8)
             for p, tail in zip(packeds, extra) for t in (*p.payload.values(), *tail)]
    if not parts:
        return torch.empty(len(packeds), 0, dtype=torch.uint8)
    return torch.cat(parts).view(len(packeds), -1)


def back_to_back(parts: Sequence[torch.Tensor]) -> bool:
    """Whether the 1-D uint8 ``parts`` are consecutive byte ranges of one storage, in order."""
    storage = parts[0].untyped_storage().data_ptr()
    end = parts[0].data_ptr() + parts[0].numel()
    for p in parts[1:]:
        if p.untyped_storage().data_ptr() != storage or p.data_ptr() != end:
            return False
        end += p.numel()
    return True


def into(total: torch.Tensor, out: torch.Tensor | None,
         post: tuple[str, float] | None = None) -> torch.Tensor:
    """``total``, or ``out`` holding it (viewed in total's shape where contiguous; else
    written through its strides, e.g. spaced runs) if given, ``post`` applied first
    (``kernels/post_op.written``)."""
    return written(total, out if out is None or not out.is_contiguous()
                   else out.view(total.shape), post)


def summed(decode_sum: Callable[[torch.Tensor | None], torch.Tensor], shape: torch.Size,
           out: torch.Tensor | None, whole: bool,
           post: tuple[str, float] | None = None) -> torch.Tensor:
    """One decode-sum of the peers (``decode_sum(flat out or None)``, which applies ``post``
    where it is given ``out``), trimmed to ``shape``: written into ``out`` by the kernel
    where the payloads are ``whole`` groups (no padding to trim), else into a buffer and
    copied (``post`` applied then). An ``out`` of spaced runs (``comm/reduce_scatter.
    result_target``) is handed over, and returned, as it is."""
    if out is not None and whole:
        if not out.is_contiguous():
            return decode_sum(out)
        flat = decode_sum(out if out.dim() == 1 else out.view(-1))
        return flat if flat.shape == shape else flat.view(shape)
    return into(decode_sum(None)[:shape.numel()].reshape(shape), out, post)


def pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Every row of 2-D ``x`` zero-padded to a multiple of ``multiple`` values (as
    :func:`pad_to` does to one row), flattened."""
    pad = (-x.shape[1]) % multiple
    return (torch.nn.functional.pad(x, (0, pad)) if pad else x).reshape(-1)


def pad_edge_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Every row of 2-D ``x`` padded as :func:`pad_edge` pads one row, flattened."""
    pad = (-x.shape[1]) % multiple
    return (torch.cat([x, x[:, -1:].expand(x.shape[0], pad)], dim=1) if pad else x).reshape(-1)


def aligned(buf: torch.Tensor, align: int = 16) -> torch.Tensor:
    """``buf`` (uint8), copied if its start is not ``align``-byte aligned (a payload field
    can only be viewed as a wider dtype at a multiple of its size)."""
    return buf if buf.storage_offset() % align == 0 else buf.clone()


def pad_to(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Flatten ``x`` and zero-pad it to a multiple of ``multiple`` values."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % multiple
    return torch.nn.functional.pad(flat, (0, pad)) if pad else flat


def pad_edge(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Flatten ``x`` and pad it to a multiple of ``multiple`` values by repeating its last
    value, so the last min-max bucket keeps its range."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % multiple
    return torch.cat([flat, flat[-1:].expand(pad)]) if pad else flat


#: registered name -> class; filled by ``registry.register_compressor``
COMPRESSORS: dict[str, type[Compressor]] = {}


def resolve_inner(scheme: str, inner: Compressor | str | None, default: Compressor) -> Compressor:
    """``inner`` of a wrapper scheme as a Compressor instance: a registered name gets its
    default parameters, None gets ``default``."""
    if inner is None:
        return default
    if isinstance(inner, str):
        if inner not in COMPRESSORS:
            raise ValueError(f"{scheme}: unknown compressor {inner!r} for inner; valid names: "
                             f"{', '.join(sorted(COMPRESSORS))}")
        return COMPRESSORS[inner]()
    if isinstance(inner, Compressor):
        return inner
    raise ValueError(f"{scheme}: inner={inner!r} must be a Compressor instance or a registered "
                     f"compressor name: {', '.join(sorted(COMPRESSORS))}")


# -- capabilities: what a collective may rely on beyond the contract -----------------------
@runtime_checkable
class RotatedDomain(Protocol):
    """Quantizes in an orthogonal rotated domain (SDP4Bit 3.3, TLq-HS): a 2-hop reduce-scatter
    whose two hops share ``hadamard_size`` rotates each row once, compresses and sums in the
    rotated domain, and applies one inverse ``rotate`` after the final sum (``*_rows``: every
    row of a 2-D tensor in one call, as ``Compressor.compress_rows`` / ``reduce_rows``)."""

    hadamard_size: int

    def rotate(self, x: torch.Tensor) -> torch.Tensor: ...

    def rotate_rows(self, x: torch.Tensor) -> torch.Tensor: ...

    def compress_rotated(self, y: torch.Tensor) -> Packed: ...

    def reduce_rotated(self, packeds: Sequence[Packed]) -> torch.Tensor: ...

    def compress_rotated_rows(self, y: torch.Tensor,
                              tail: torch.Tensor | None = None) -> torch.Tensor: ...

    def reduce_rotated_rows(self, wire: torch.Tensor, shape: Sequence[int],
                            dtype: torch.dtype, out: torch.Tensor | None = None,
                            post: tuple[str, float] | None = None) -> torch.Tensor: ...


@runtime_checkable
class ReferenceCoded(Protocol):
    """Codes against a reference every holder of a slot keeps identical (qWD, SDP4Bit 3.1,
    Alg. 2): ``compress_slot`` codes row ``row`` of ``rows`` held slots against its
    reference (zero difference when the host knows the input ``unchanged``), ``wire_slot``
    as the uint8 wire row an all-gather sends (with a tail of exact values);
    ``decompress_rows`` decodes every held row's payload at once and updates the
    references, so an all-gather keeps only the rows it owns (node-sharded references).
    ``reset_reference`` forgets the references (the next send is exact, Alg. 4 line 2);
    ``zero_difference`` is the payload of all-zero differences and ``difference_byte_runs``
    the bytes of a payload that carry given values (None: all), so values known unchanged
    (frozen parameters) need not be sent."""

    reference: torch.Tensor | None

    def compress_slot(self, x: torch.Tensor, row: int, rows: int,
                      unchanged: bool = False) -> Packed: ...

    def wire_slot(self, x: torch.Tensor, row: int, rows: int,
                  tail: torch.Tensor | None = None) -> torch.Tensor: ...

    def decompress_rows(self, wire: torch.Tensor, numel: int,
                        dtype: torch.dtype) -> torch.Tensor: ...

    def reset_reference(self) -> None: ...

    def zero_difference(self, shape: Sequence[int], device: torch.device) -> Packed: ...

    def difference_byte_runs(self, numel: int, runs: Sequence[tuple[int, int]]
                             ) -> Sequence[tuple[int, int]] | None: ...


@runtime_checkable
class GloballyScaled(Protocol):
    """All-reduce-compatible codes (Global-QSGD 3-4): every peer quantizes with the MAX of the
    ``local_scale`` s, so ``num_peers`` payloads add up in the compressed domain. Without
    :class:`TreeCombined` the integer codes sum exactly by a stock ``all_reduce(SUM)`` of
    ``bits``-wide integers."""

    num_peers: int
    bits: int
    block_size: int | None

    def local_scale(self, x: torch.Tensor) -> torch.Tensor: ...

    def compress(self, x: torch.Tensor, scale: Any = None) -> Packed: ...

    def reduce_packed(self, packeds: Sequence[Packed]) -> Packed: ...


@runtime_checkable
class TreeCombined(GloballyScaled, Protocol):
    """Globally scaled codes that no stock all-reduce sums (Global-QSGD 4.3, exponential
    dithering): peers' payloads are merged pairwise by ``combine`` along a tree. The
    ``*_rows`` methods do a chunked all-reduce's per-chunk steps over all chunks at once."""

    def combine(self, a: Packed, b: Packed, noise: torch.Tensor | None = None) -> Packed: ...

    def local_scale_rows(self, rows: torch.Tensor) -> torch.Tensor: ...

    def quantize_rows(self, rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor: ...

    def combine_rows(self, codes: torch.Tensor) -> torch.Tensor: ...

    def dequantize_rows(self, codes: torch.Tensor, scale: torch.Tensor,
                        width: int) -> torch.Tensor: ...


@runtime_checkable
class ErrorFeedback(Protocol):
    """Wraps ``inner`` with error feedback (LoCo Alg. 1): ``step()`` once per optimizer step
    on every instance (the error reset schedule)."""

    inner: Compressor

    def step(self) -> None: ...
