"""Global-QSGD: all-reduce compatible quantization with one global scale (Global-QSGD 3-4).

Every peer quantizes with the same scale, the all-reduced MAX of the local norms
(ℓ∞, the paper's default, Global-QSGD 8), so payloads add up in the compressed domain.
``block_size`` (not in the paper; default None = one scale per tensor, the paper) gives
each block of ``block_size`` consecutive values its own global scale, so small-gradient
tensors sharing a DDP bucket with large ones keep their levels; the MAX all-reduce then
carries ``ceil(numel / block_size)`` floats. How a collective uses it (Alg. 1)::

    s = comp.local_scale(x)                  # max|x| per block; +Inf where Inf or NaN
    all_reduce(s, op=MAX)                    # the global scale(s)
    p = comp.compress(x, scale=s)
    # global_qsgd:     all_reduce(p.payload["codes"], op=SUM)  (exact, cannot overflow)
    # global_qsgd_exp: p = comp.combine(p, peer_p) along a tree of depth <= comp.headroom
    total = comp.decompress(p)               # the sum over peers (divide by n for the mean)

For the exponential all-reduce (4.3), whose chunk k goes to rank k, the ``*_rows`` methods
take the ``[peers, width]`` chunks at once: ``local_scale_rows``, ``quantize_rows`` (the codes
of one ``compress`` per row, row-keyed noise), ``combine_rows`` (the ``reduce_packed`` tree,
one kernel per tree level) and ``dequantize_rows``: the numbers of the per-row calls, with
launches that do not grow with the number of peers (per row only when blocks straddle rows).

``compress(x)`` without a scale uses the local one (single-process use). ``scale`` must be at
least ``local_scale(x)`` (the MAX guarantees it); values above it are clipped; one value
serves every block. Non-finite input makes its block's global scale Inf, and every peer then
decodes NaN/Inf in that block (the other blocks stay finite). Give each rank its own
``seed``: peers sharing noise get correlated rounding errors.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import kernels
from ..kernels import global_qsgd as _twin
from .base import (Compressor, Packed, check_choice, check_float_input, check_group_size,
                   pad_rows)
from .registry import register_compressor
from .rng import SeededRNG

_TRITON = "triton_global_qsgd"
_WIRE_DTYPES = {8: torch.int8, 16: torch.int16, 32: torch.int32}


def _check_positive_int(scheme: str, param: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{scheme}: {param}={value!r} must be a positive integer")


def _same_scale(scheme: str, packeds: Sequence[Packed]) -> None:
    """Payloads add up in the compressed domain only when quantized with one scale.

    Checked without a host sync: a scale tensor shared by the payloads (as the collectives
    pass it) needs no check; otherwise ``torch._assert_async`` compares the bits on the
    device (CPU: raises here; CUDA: a device-side assert, the process cannot go on with a
    corrupted sum anyway)."""
    if not packeds:
        raise ValueError(f"{scheme}: needs at least one payload")
    msg = (f"{scheme}: payloads must have the same shape and the same global scale "
           f"(compress(x, scale=all_reduce_max(local_scale(x))))")
    first = packeds[0].payload["scale"]
    for p in packeds[1:]:
        scale = p.payload["scale"]
        if p.numel != packeds[0].numel or scale.shape != first.shape:
            raise ValueError(msg)
        if scale.data_ptr() == first.data_ptr() and scale.stride() == first.stride():
            continue
        try:
            torch._assert_async((scale.view(torch.int32) == first.view(torch.int32)).all(), msg)
        except RuntimeError as err:
            raise ValueError(msg) from err


class _GlobalScaled(Compressor):
    """What both dithering schemes share: the global scale(s), the noise, the peer count."""

    unbiased = True

    def __init__(self, num_peers: int, bits: int, allowed_bits: tuple[int, ...], seed: int,
                 backend: str, block_size: int | None, **params: Any) -> None:
        _check_positive_int(self.name, "num_peers", num_peers)
        check_choice(self.name, "bits", bits, allowed_bits)
        check_choice(self.name, "backend", backend, kernels.dispatch.BACKENDS)
        if block_size is not None:
            check_group_size(self.name, block_size, 32, "block_size")
        super().__init__(num_peers=num_peers, bits=bits, seed=seed, backend=backend,
                         block_size=block_size, **params)
        self.num_peers, self.bits, self.backend = num_peers, bits, backend
        self.block_size = block_size
        self.rng = SeededRNG(seed)

    def num_scales(self, numel: int) -> int:
        """Scales for ``numel`` values: 1, or one per (last: partial) block."""
        return 1 if self.block_size is None else -(-numel // self.block_size)

    def _levels(self, levels: Any, most: int, why: str) -> int:
        if most < 1:
            raise ValueError(f"{self.name}: bits={self.bits} cannot hold {why}; use more bits "
                             f"or fewer num_peers")
        if levels == "auto":
            return most
        _check_positive_int(self.name, "levels", levels)
        if levels > most:
            raise ValueError(f"{self.name}: levels={levels} overflows {why}; the maximum for "
                             f"num_peers={self.num_peers} and bits={self.bits} is {most} "
                             f"(or levels='auto')")
        return levels

    def _impl(self, t: torch.Tensor):
        return kernels.dispatch.pick(t, self.backend, _twin, _TRITON)

    def local_scale(self, x: torch.Tensor) -> torch.Tensor:
        """This peer's ℓ∞ norm per block (the whole tensor: one element), float32, +Inf for
        a block holding Inf or NaN (on a GPU one pass over ``x``)."""
        check_float_input(self.name, x)
        flat = x.reshape(-1)
        return self._impl(flat).local_scale(flat, self.block_size)

    def local_scale_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """``local_scale`` of every row of 2-D ``rows``, concatenated (same numbers)."""
        check_float_input(self.name, rows)
        return self._impl(rows).local_scale(rows.reshape(-1), self.block_size, rows.shape[0])

    def _scale(self, x: torch.Tensor, scale: Any) -> torch.Tensor:
        if scale is None:
            return self.local_scale(x)
        s = torch.as_tensor(scale, dtype=torch.float32, device=x.device).detach().reshape(-1)
        k = self.num_scales(x.numel())
        if s.numel() not in (1, k):
            blocks = f" or one per block of {self.block_size} values ({k})" if k != 1 else ""
            raise ValueError(f"{self.name}: scale must hold one value{blocks}, got shape "
                             f"{tuple(s.shape)}")
        return s.expand(k).clone()

    def _check_peers(self, packeds: Sequence[Packed]) -> None:
        _same_scale(self.name, packeds)
        if len(packeds) > self.num_peers:
            raise ValueError(f"{self.name}: {len(packeds)} payloads but num_peers="
                             f"{self.num_peers}: the compressed sum could overflow")

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self.rng.load_state_dict(state["rng"])


@register_compressor("global_qsgd")
class GlobalQSGD(_GlobalScaled):
    """Linear dithering L_s (Global-QSGD 4.2): signed integer levels, summed by all_reduce(SUM).

    ``bits`` is the wire integer (8, 16, 32 -> int8/int16/int32). ``levels="auto"`` takes the
    most that cannot overflow when ``num_peers`` payloads are summed:
    ``(2**(bits-1) - 1) // num_peers`` (the paper's overflow argument, 4.2), at most 2**24.
    Defaults (bits 8, one peer): 127 levels; 4 peers: 31; 8 peers: 15. ``block_size``: one
    global scale per block of that many values (a multiple of 32), None = per tensor.
    Note: gloo and NCCL have no int16 SUM, so bits=16 cannot use a stock all_reduce.
    """

    def __init__(self, num_peers: int = 1, bits: int = 8, levels: Any = "auto", seed: int = 0,
                 backend: str = "auto", block_size: int | None = None) -> None:
        super().__init__(num_peers, bits, tuple(_WIRE_DTYPES), seed, backend, block_size,
                         levels=levels)
        most = min(((1 << (bits - 1)) - 1) // num_peers, _twin.MAX_LINEAR_LEVELS)
        self.levels = self._levels(levels, most, f"the sum of {num_peers} peers in int{bits}")
        self.wire_dtype = _WIRE_DTYPES[bits]

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"scale": (torch.float32, self.num_scales(numel)),
                "codes": (self.wire_dtype, numel)}

    def compress(self, x: torch.Tensor, scale: Any = None) -> Packed:
        check_float_input(self.name, x)
        s = self._scale(x, scale)
        flat = x.reshape(-1)
        codes = self._impl(flat).linear_quantize(flat, s, self.levels,
                                                 self.rng.next_keys(flat.device),
                                                 self.wire_dtype, self.block_size)
        return Packed({"scale": s, "codes": codes}, x.shape, x.dtype)

    def _decode(self, codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self._impl(codes).linear_dequantize(codes, scale, self.levels, dtype,
                                                   self.block_size)

    def decompress(self, packed: Packed) -> torch.Tensor:
        p = packed.payload
        return self._decode(p["codes"], p["scale"], packed.dtype).reshape(packed.shape)

    def reduce_packed(self, packeds: Sequence[Packed]) -> Packed:
        """The exact integer sum of at most ``num_peers`` payloads, in the wire integer."""
        self._check_peers(packeds)
        total = torch.stack([p.payload["codes"] for p in packeds]).sum(0, dtype=torch.int64)
        first = packeds[0]
        return Packed({"scale": first.payload["scale"].clone(), "codes": total.to(self.wire_dtype)},
                      first.shape, first.dtype)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        """Sum of the decompressions: exact integer sum, then one float multiply (float32)."""
        _same_scale(self.name, packeds)
        total = torch.stack([p.payload["codes"] for p in packeds]).sum(0, dtype=torch.int64)
        return self._decode(total, packeds[0].payload["scale"], torch.float32) \
            .reshape(packeds[0].shape)


@register_compressor("global_qsgd_exp")
class GlobalQSGDExp(_GlobalScaled):
    """Exponential dithering E_s with C_nat rounding and the exponent reduce (Global-QSGD 4.2-4.3).

    Levels ``1, 1/2, ..., 2**-(levels-1)`` and 0 relative to the global scale, unbiased
    rounding to the two neighbouring levels (variance <= 1/8 of x**2 above the last level:
    the 9/8 factor of C_nat). Wire code per value: sign bit + (bits-1)-bit exponent ``e``
    (``bits`` 8: one byte; 4: two per byte, low nibble first), plus the float32 scale.
    ``headroom`` (the paper's division by 2n, 4.3) shifts exponents so that a sum may double
    ``headroom`` times: ``"auto"`` = ceil(log2(num_peers)), enough for a tree reduce; a ring
    (a chain of num_peers - 1 combines) needs ``headroom = num_peers - 1``.
    ``levels="auto"`` = ``2**(bits-1) - 1 - headroom``: 8 bits, 1 peer -> 127; 8 peers -> 124;
    4 bits, 4 peers -> 5. ``block_size``: as for ``global_qsgd`` (the reduce is per value,
    each value's code relative to its block's scale).
    """

    def __init__(self, num_peers: int = 1, bits: int = 8, levels: Any = "auto",
                 headroom: Any = "auto", seed: int = 0, backend: str = "auto",
                 block_size: int | None = None) -> None:
        super().__init__(num_peers, bits, (4, 8), seed, backend, block_size, levels=levels,
                         headroom=headroom)
        need = (num_peers - 1).bit_length()
        if headroom == "auto":
            headroom = need
        elif not isinstance(headroom, int) or isinstance(headroom, bool) or headroom < need:
            raise ValueError(f"global_qsgd_exp: headroom={headroom!r} must be 'auto' or an integer "
                             f">= ceil(log2(num_peers)) = {need} (num_peers - 1 for a ring)")
        self.headroom = headroom
        emax = (1 << (bits - 1)) - 1
        self.levels = self._levels(levels, emax - headroom,
                                   f"exponents up to {emax} with headroom {headroom}")

    def _padded(self, numel: int) -> int:
        per_byte = 8 // self.bits
        return -(-numel // per_byte) * per_byte

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"scale": (torch.float32, self.num_scales(numel)),
                "codes": (torch.uint8, self._padded(numel) * self.bits // 8)}

    def compress(self, x: torch.Tensor, scale: Any = None) -> Packed:
        check_float_input(self.name, x)
        s = self._scale(x, scale)
        flat = x.reshape(-1)
        pad = self._padded(flat.numel()) - flat.numel()
        flat = torch.nn.functional.pad(flat, (0, pad)) if pad else flat
        codes = self._impl(flat).exp_quantize(flat, s, self.levels, self.headroom, self.bits,
                                              self.rng.next_keys(flat.device), self.block_size)
        return Packed({"scale": s, "codes": codes}, x.shape, x.dtype)

    def _decode(self, packed: Packed, dtype: torch.dtype) -> torch.Tensor:
        p = packed.payload
        out = self._impl(p["codes"]).exp_dequantize(p["codes"], p["scale"], self.headroom,
                                                    self.bits, dtype, self.block_size)
        return out[:packed.numel].reshape(packed.shape)

    def decompress(self, packed: Packed) -> torch.Tensor:
        return self._decode(packed, packed.dtype)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        """Sum of the decompressions in float32 (exact decoding, no compressed-domain rounding)."""
        if not packeds:
            raise ValueError(f"{self.name}: reduce() needs at least one payload")
        total = self._decode(packeds[0], torch.float32)
        for p in packeds[1:]:
            total = total + self._decode(p, torch.float32)
        return total

    def combine(self, a: Packed, b: Packed, noise: torch.Tensor | None = None) -> Packed:
        """C_nat(a + b) in the compressed domain (Alg. 2): one exponent reduce step.

        Unbiased, variance <= (a + b)**2 / 8 per value. ``noise`` (float32 U[0, 1), one per
        code, i.e. per padded value, or hash keys) defaults to this compressor's generator.
        """
        _same_scale(self.name, (a, b))
        ca, cb = a.payload["codes"], b.payload["codes"]
        if noise is None:
            noise = self.rng.next_keys(ca.device)
        codes = self._impl(ca).exp_combine(ca, cb, self.bits, noise)
        return Packed({"scale": a.payload["scale"].clone(), "codes": codes}, a.shape, a.dtype)

    def reduce_packed(self, packeds: Sequence[Packed]) -> Packed:
        """The compressed-domain sum of at most ``num_peers`` payloads: a pairwise tree of
        :meth:`combine` (depth ceil(log2 n) <= headroom, so it cannot overflow)."""
        self._check_peers(packeds)
        level = list(packeds)
        while len(level) > 1:
            nxt = [self.combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            level = nxt + level[len(level) - len(level) % 2:]
        return level[0]

    # -- the exponential all-reduce's chunks, all rows at once (same numbers) -------------
    def _rows_fuse(self, width: int) -> bool:
        """One kernel over the rows: no block straddles two rows."""
        return self.block_size is None or width % self.block_size == 0

    def quantize_rows(self, rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """uint8 ``[n, nbytes]``: row k the codes of ``compress(rows[k], scale=<row k's
        scales>)``, in one kernel (row keys: the noise of n successive calls). ``scale``:
        the one global scale, or the rows' block scales concatenated (``local_scale_rows``)."""
        check_float_input(self.name, rows)
        n, width = rows.shape
        s = scale.reshape(-1)
        if not self._rows_fuse(width):
            per = s.view(n, -1)
            return torch.stack([self.compress(r, scale=per[k]).payload["codes"]
                                for k, r in enumerate(rows)])
        flat = pad_rows(rows, 8 // self.bits)
        s = self._scale(flat, s) if self.block_size is not None else s.expand(1).clone()
        codes = self._impl(flat).exp_quantize(flat, s, self.levels, self.headroom, self.bits,
                                              self.rng.next_keys(flat.device, n),
                                              self.block_size)
        return codes.view(n, -1)

    def combine_rows(self, codes: torch.Tensor) -> torch.Tensor:
        """The codes of ``reduce_packed`` of the rows' payloads (one scale): the same pairwise
        tree, each level's combines in one kernel with their calls' row keys."""
        if codes.shape[0] > self.num_peers:
            raise ValueError(f"{self.name}: {codes.shape[0]} payloads but num_peers="
                             f"{self.num_peers}: the compressed sum could overflow")
        level = codes
        while level.shape[0] > 1:
            pairs = level.shape[0] // 2
            a, b = level[0:2 * pairs:2].reshape(-1), level[1:2 * pairs:2].reshape(-1)
            keys = self.rng.next_keys(level.device, pairs)
            merged = self._impl(a).exp_combine(a, b, self.bits, keys).view(pairs, -1)
            level = torch.cat([merged, level[2 * pairs:]]) if level.shape[0] % 2 else merged
        return level[0]

    def dequantize_rows(self, codes: torch.Tensor, scale: torch.Tensor,
                        width: int) -> torch.Tensor:
        """float32 ``[n, width]``: row k ``decompress`` of the codes in row k of ``codes``
        with its scales (as ``quantize_rows`` takes them), in one kernel."""
        n = codes.shape[0]
        s = scale.reshape(-1)
        if not self._rows_fuse(width):
            per = s.view(n, -1)
            return torch.stack([self.decompress(Packed({"scale": per[k], "codes": c},
                                                       torch.Size([width]), torch.float32))
                                for k, c in enumerate(codes)])
        out = self._impl(codes).exp_dequantize(codes.reshape(-1), s, self.headroom, self.bits,
                                               torch.float32, self.block_size)
        return out.view(n, -1)[:, :width]
