"""LoCo error feedback around a gradient compressor (LoCo Alg. 1, sections 3.1-3.3).

Per compress of a gradient g (on the sending rank), audited against Alg. 1 line by line::

    h  = g + deq8(e)                         # Alg. 1 line 4, Eq. (2)
    send inner(h)                            # line 5, Eq. (3)
    d  = deq(inner(h))                       # line 7 (what every receiver decodes)
    e~ = (1 - beta) deq8(e) + beta (h - d)   # line 8, Eq. (5): moving average of the error
    e  = Q8(e~)                              # line 12, Eq. (7): only the 8-bit e is stored

``step()`` (once per optimizer step) zeroes e after every iteration k with k % T_c == 0
(lines 9-10, Eq. (7)), i.e. after iterations 0, T_c, 2 T_c, ...

What each term of the paper is here:

- Compensated (Eq. (2)): the float32 gradient this instance sends plus the dequantized
  stored error; nothing else (no learning rate, no optimizer state: LoCo 4.2, Eq. (10)).
- beta (Eq. (5)): weights the *new* error h - d; 1 - beta weights the previous average.
  beta = 1 is Eq. (4), plain error feedback (EFC); beta = 0 never updates e. Since
  h - d = g + deq8(e) - d, Eq. (5) is e~ = deq8(e) + beta (g - d): the sent sum lags the
  true sum by e~ / beta, so a smaller beta damps the error's fluctuation (Sec. 3.2) at the
  price of a longer memory. The default 0.2 is the authors' DeepSpeed setting
  (``loco_swizzled_quant_kernel``: ``err = err_beta * err + (1 - err_beta) * new_err``,
  ``err_beta=0.8``, i.e. beta = 1 - err_beta); the paper gives no value.
- The previous average e~_k of line 8 is ``deq8(e_k)``: Alg. 1 read literally keeps a
  full-precision e~ beside the 8-bit e and resets only e (line 10), which would keep the
  "out of date" history the reset is there to drop (Sec. 3.2) and store 4 more bytes per
  value than the 8-bit e that Sec. 3.2 / Table 8 account for. Only e is kept, as in the
  authors' DeepSpeed code (``p.intra_ef_buf`` / ``p.inter_ef_buf``), so a reset also
  restarts the average (e~_{k+1} = 0).
- 8-bit error (Eq. (7)): ``error_scale="group"`` (default) stores uint8 codes with an absmax
  scale per group of 128 (the DeepSpeed code's symmetric 8-bit groups): the round trip is
  within half a step, absmax / 254, of e~ (``tests/test_loco_audit.py``); a float s_e
  stores int8 ``clamp(round(e~ * s_e), -127, 127)`` as Eq. (1) (s_e = 4s..6s, i.e. about
  2^19..2^21 for the paper's s; values beyond 127 / s_e saturate); None keeps e~ in float32
  (Table 9, LoCo4: no error compression).
- Reset (Eq. (7)): counted in ``step()`` calls, i.e. optimizer steps, on every instance
  of every rank (``Compression.step`` steps all of them), so all ranks reset after the
  same step; ``steps`` is in ``state_dict()``, so a resumed run resets at the same steps.
  An instance first used after step 0 (a stream that appears later) counts from its own
  first step. ``reset_every=None`` never resets (Table 9, LoCo2 / LoCo3).
- Gradient accumulation: Alg. 1's iteration is one compress. FSDP2 reduce-scatters each
  micro-batch's gradient unless ``set_requires_gradient_sync(False)`` (then the summed
  gradient once per step); DDP's hook runs once per step under ``no_sync``. Either way e
  belongs to the gradient this instance compressed, and the sum sent over the k
  iterations lags the sum compressed by e~ / beta (the Eq. (6) bound). T_c counts
  optimizer steps, i.e. T_c x (micro-batches per step) compresses without ``no_sync``.
- FSDP2 sharded gradients (Sec. 3.3): the reduce-scatter input is the unsharded gradient of
  one FSDP unit on this rank; one instance per destination row (1-hop) or per hop part
  (2-hop, ``comm/two_hop.py``: key (row, chunk)), so each e is the error of the values it
  sends, over the whole local gradient, before any sum: the error of a node's partial sum
  on the inter-node hop is that hop's own instance's (the authors' LoCo-Zero++ inter-node
  buffer). The receivers hold no state.

Choices the paper leaves open:

- inner: the paper uses a fixed scale s (2^17..2^19) and round-to-nearest into [-8, 7]. The
  default here is ``int`` 4 bit, absmax per group of 128, nearest rounding: no per-model scale
  to tune, an outlier only coarsens its own group, and error feedback is meant for biased
  (deterministic) compressors, so stochastic rounding would only add variance. Measured at
  small scale (BENCHMARKS.md, "LoCo ablation"): this inner alone loses 0.15% or less, and
  feedback does not help there (-0.11% to +0.32%); with groups of 2048 it recovers 71-73% of
  the loss the quantizer alone loses.
- Non-finite gradient entries make the payload non-finite (as the inner does) but store a zero
  error there, so one overflow step cannot poison e until the next reset.

On a GPU, with a group-quantizing inner of groups of 128 (the error's; the ``loco`` and
``loco_zeropp`` presets) and the 8-bit group error, one compress is one Triton kernel
(``kernels/triton_loco.py``): it reads g in its dtype and the stored error once and writes the
payload and the new error, the numbers of the torch ops of :meth:`LoCo.compress` (its twin,
bit for bit: every step one IEEE rounding, the lerp one fused multiply-add as torch's), with no
float32 transient of g. A hop's destination rows, one instance each, go through one such
launch together (:meth:`LoCo.compress_streams`: each error read and rewritten in place through
a device table of their addresses), so the launches of a reduce-scatter do not grow with the
world size. Other settings run those torch ops around the inner's kernels, row by row.

Memory (``state_bytes()``): e covers every value this instance sends. In the reduce-scatter
one instance serves one destination row (1-hop) or one intra-node part (2-hop); together
they hold the error of the rank's whole local gradient, i.e. 1 uint8 code per value plus a
float32 scale per 128 (~1.03 bytes per parameter per rank, ~0.52 x the bf16 model, at any
world size): the 8-bit floor of LoCo 3.2. On a 2-hop layout with X ranks per node the
inter-node hop's instances (one per node row of partial sums, as in the authors'
LoCo-Zero++) add 1/X of that. Per instance only the padding of its last group (< 128
values) comes on top. Measured: ``benchmarks/bench_memory.py``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from .. import kernels
from ..kernels import dispatch
from ..kernels.packing import payload_buffers
from .base import Compressor, Packed, check_float_input, pad_to, resolve_inner
from .group_quant import GroupQuantizer
from .registry import register_compressor

ERROR_GROUP = 128
ERROR_BITS = 8
ERROR_QMAX = 127


@register_compressor("loco")
class LoCo(Compressor):
    """Error feedback: ``compress`` sends ``inner(g + deq8(e))`` and updates e (LoCo Alg. 1).

    Decompress and reduce are the inner's (the receiver needs no state). Call ``step()`` once
    per optimizer step on every LoCo instance (one instance per gradient stream, ``fresh()``).
    """

    stateful = True

    def __init__(self, inner: Compressor | str | None = None, beta: float = 0.2,
                 reset_every: int | None = 512,
                 error_scale: str | float | None = "group") -> None:
        inner = resolve_inner("loco", inner, GroupQuantizer(bits=4, group_size=128,
                                                            rounding="nearest"))
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
            raise ValueError(f"loco: beta={beta!r} must be a number in [0, 1] (e.g. 0.2)")
        if reset_every is not None and (isinstance(reset_every, bool)
                                        or not isinstance(reset_every, int) or reset_every <= 0):
            raise ValueError(f"loco: reset_every={reset_every!r} must be a positive int "
                             f"(e.g. 512 or 1024) or None (never)")
        check_error_scale(error_scale)
        super().__init__(inner=inner, beta=beta, reset_every=reset_every, error_scale=error_scale)
        self.inner, self.beta, self.reset_every = inner, float(beta), reset_every
        self.error_scale = error_scale
        self.steps = 0
        self.numel: int | None = None
        self.error_codes: torch.Tensor | None = None
        self.error_scales: torch.Tensor | None = None
        #: the device tables of ``compress_streams``, per instance set (their signature)
        self._tables: dict[tuple[int, ...], tuple[tuple, torch.Tensor, torch.Tensor]] = {}

    # -- wire format: the inner's ---------------------------------------------------------
    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        return self.inner.payload_spec(numel)

    def decompress(self, packed: Packed) -> torch.Tensor:
        return self.inner.decompress(packed)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        return self.inner.reduce(packeds)

    def reduce_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                    dtype: torch.dtype, out: torch.Tensor | None = None,
                    post: tuple[str, float] | None = None, **riders: Any) -> torch.Tensor:
        """The inner's: the receiver sums the rows' fields in place (no state); ``riders``
        where the inner sums them (``sums_riders``)."""
        return self.inner.reduce_rows(wire, shape, dtype, out, post, **riders)

    @property
    def sums_riders(self) -> bool:  # type: ignore[override]
        return self.inner.sums_riders

    # -- error feedback -------------------------------------------------------------------
    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        self._check_numel(x.numel())
        if self._fused(x):
            return self._compress_fused(x)
        g = x.detach().reshape(-1).float()
        e = self._error(g)
        h = g + e
        packed = self.inner.compress(h.view(x.shape))
        d = self.inner.decompress(Packed(packed.payload, x.shape, torch.float32, packed.meta))
        # Eq. (5), (1 - beta) e + beta (h - d), as one lerp: e + beta ((h - d) - e)
        e_avg = torch.lerp(e, h - d.reshape(-1), self.beta)
        # a zero error where e_avg is not finite (one kernel: finite values as they are)
        self._store(e_avg.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0))
        return Packed(packed.payload, x.shape, x.dtype, packed.meta)

    def _check_numel(self, numel: int) -> None:
        if self.numel is not None and self.numel != numel:
            raise ValueError(f"loco: got {numel} values but the error buffer holds "
                             f"{self.numel}; use one instance per tensor (fresh())")

    def _fused(self, x: torch.Tensor) -> bool:
        """``compress`` runs as one Triton kernel (``kernels/triton_loco.py``, the numbers of
        the torch ops below): :meth:`_kernel_runs`, the error stored whole-word aligned."""
        return self._kernel_runs(x) and self._error_at(4)

    def _kernel_runs(self, x: torch.Tensor) -> bool:
        """A group-quantizing inner of groups of 128 (the error's), the 8-bit group error,
        Triton chosen for ``x``."""
        inner = self.inner
        return (self.error_scale == "group" and isinstance(inner, GroupQuantizer)
                and inner.group_size == ERROR_GROUP and dispatch.use_triton(x, inner.backend))

    def _error_at(self, align: int) -> bool:
        """No stored error, or contiguous codes and scales starting at multiples of ``align``
        bytes (the kernels read them as int32 words, in place)."""
        codes, scales = self.error_codes, self.error_scales
        return codes is None or (codes.is_contiguous() and scales.is_contiguous()
                                 and codes.data_ptr() % align == 0
                                 and scales.data_ptr() % align == 0)

    def _compress_fused(self, x: torch.Tensor) -> Packed:
        """:meth:`compress` in one launch: reads x and the stored error once, writes the
        payload and the new error (no float32 transient of x)."""
        from ..kernels import triton_loco
        inner = self.inner
        codes, scales, self.error_codes, self.error_scales = triton_loco.feedback(
            x.detach().contiguous(), self.error_codes, self.error_scales, self.beta, inner.bits,
            inner.group_size, inner._keys(x.device))
        self.numel = x.numel()
        return Packed({"codes": codes, "scales": scales}, x.shape, x.dtype)

    def compress_streams(self, instances: Sequence[LoCo], x: torch.Tensor,
                         tail: torch.Tensor | None = None) -> torch.Tensor | None:
        """Row r of ``x`` through ``instances[r]`` (its own error), every row in one launch
        that writes the wire and rewrites each stored error in place
        (``kernels/triton_loco.feedback_rows``): the numbers of :meth:`compress` row by row.
        None (row by row) where the one-tensor kernel would not run (:meth:`_kernel_runs`; the
        instances are this one's fresh copies), a stored error is not 16-byte aligned, or the
        wire's rows are not whole int32 words."""
        check_float_input(self.name, x)
        inner = self.inner
        if (x.dim() != 2 or x.stride(1) != 1 or not self._kernel_runs(x)
                or inner.bits not in (2, 4, 8)
                or (tail is not None and tail.shape[1] * tail.element_size() % 4)
                or not all(i._error_at(16) for i in instances)):
            return None
        for i in instances:
            i._check_numel(x.shape[1])
        from ..kernels import triton_loco
        errors = self._error_table(instances, x)
        keys = None if inner.rounding != "stochastic" else \
            _stacked([i.inner._keys(x.device) for i in instances])
        wire = triton_loco.feedback_rows(x.detach(), errors, keys, self.beta, inner.bits,
                                         inner.group_size, tail)
        for i in instances:
            i.numel = x.shape[1]
        return wire

    def _error_table(self, instances: Sequence[LoCo], x: torch.Tensor) -> torch.Tensor:
        """The ``[rows, 3]`` int64 table ``feedback_rows`` reads the instances' errors through
        (codes' and scales' addresses, 1 where there is an error): buffers allocated for
        those without one (the kernel writes them), the table made on ``x``'s device only
        when an address or a flag changed since the last call (the first calls, a reset, a
        load), so a step copies nothing from the host (and then without a host sync)."""
        n_groups = -(-x.shape[1] // ERROR_GROUP)
        rows = []
        for i in instances:
            has = i.error_codes is not None
            if not has:
                i.error_codes, i.error_scales = payload_buffers(n_groups * ERROR_GROUP, n_groups,
                                                                x.device)
            rows.append((i.error_codes.data_ptr(), i.error_scales.data_ptr(), int(has)))
        key, sig = tuple(map(id, instances)), tuple(rows)
        cached = self._tables.get(key)
        if cached is None or cached[0] != sig:
            if len(self._tables) >= 16:     # instances replaced (a load): drop the old tables
                self._tables.clear()
            host = torch.tensor(rows, dtype=torch.int64)
            if x.is_cuda:   # an asynchronous copy (no host sync); its pinned source kept
                host = host.pin_memory()
            cached = self._tables[key] = (sig, host.to(x.device, non_blocking=True), host)
        return cached[1]

    def step(self) -> None:
        """End of optimizer step k: zero e (and so the average e~, module docstring) if
        k % T_c == 0 (Alg. 1 lines 9-10, Eq. (7)); never with ``reset_every=None``."""
        if self.reset_every is not None and self.steps % self.reset_every == 0:
            self.error_codes = self.error_scales = None
        self.steps += 1

    def _error(self, like: torch.Tensor) -> torch.Tensor:
        """deq8(e) (Eq. (2)) as float32 of ``like``'s numel (zeros before the first compress
        and after a reset); e~ itself with ``error_scale=None``."""
        if self.error_codes is None:
            return torch.zeros_like(like)
        if self.error_scale is None:
            return self.error_codes
        if self.error_scales is None:
            return self.error_codes.float() / self.error_scale
        out = kernels.dequantize_groups(self.error_codes, self.error_scales, ERROR_BITS,
                                        ERROR_GROUP, torch.float32)
        return out[:like.numel()]

    def _store(self, e: torch.Tensor) -> None:
        """e = Q8(e~) (Eq. (7), "otherwise" branch): see ``error_scale``."""
        self.numel = e.numel()
        if self.error_scale is None:
            self.error_codes = e
        elif self.error_scale == "group":
            self.error_codes, self.error_scales = kernels.quantize_groups(
                pad_to(e, ERROR_GROUP), ERROR_BITS, ERROR_GROUP)
        else:
            self.error_codes = torch.round(e * self.error_scale).clamp_(
                -ERROR_QMAX, ERROR_QMAX).to(torch.int8)

    # -- state ----------------------------------------------------------------------------
    def state_bytes_for(self, numel: int, dtype: torch.dtype) -> dict[str, int]:
        """The stored error of ``numel`` sent values, as :meth:`state_bytes` will count it."""
        if self.error_scale is None:
            return {"errors": 4 * numel}
        if self.error_scale != "group":
            return {"errors": numel}
        groups = -(-numel // ERROR_GROUP)
        return {"errors": groups * ERROR_GROUP + 4 * groups}

    def state_bytes(self) -> dict[str, int]:
        """Bytes of the stored error e (kind "errors"): with ``error_scale="group"`` one uint8
        code per value (padded to groups of 128) plus a float32 scale per group, i.e.
        ~1.03 bytes per gradient value this instance sends (LoCo 3.2's 8-bit floor); int8
        codes only with a fixed scale; float32 with ``error_scale=None``. Zero before the
        first compress and after a reset."""
        return {"errors": sum(t.numel() * t.element_size()
                              for t in (self.error_codes, self.error_scales) if t is not None)}

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"steps": self.steps, "inner": self.inner.state_dict()}
        if self.numel is not None:
            state["numel"] = self.numel
        if self.error_codes is not None:
            state["error_codes"] = self.error_codes.clone()
        if self.error_scales is not None:
            state["error_scales"] = self.error_scales.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"steps", "inner", "numel", "error_codes", "error_scales"}
        if unknown:
            raise ValueError(f"loco: unexpected state keys {sorted(unknown)}")
        codes = state.get("error_codes")
        if codes is not None and stored_kind(codes, "error_scales" in state) != \
                stored_kind_of(self.error_scale):
            raise ValueError(f"loco: state was saved with a different error_scale than "
                             f"{self.error_scale!r}")
        self.inner.load_state_dict(state.get("inner", {}))
        self.steps = int(state.get("steps", 0))
        self.numel = state.get("numel")
        scales = state.get("error_scales")
        self.error_codes = None if codes is None else codes.clone()
        self.error_scales = None if scales is None else scales.clone()


def _stacked(keys: list[torch.Tensor]) -> torch.Tensor:
    """The rows' ``(k1, k2)`` keys as ``(rows, 2)``: one row's a view (no kernel)."""
    return keys[0].unsqueeze(0) if len(keys) == 1 else torch.stack(keys)


def check_error_scale(error_scale: Any) -> None:
    """``"group"``, a positive finite float s_e, or None (float32, no error compression)."""
    fixed = isinstance(error_scale, (int, float)) and not isinstance(error_scale, bool)
    if error_scale not in ("group", None) and not (fixed and math.isfinite(error_scale)
                                                   and error_scale > 0):
        raise ValueError(f"loco: error_scale={error_scale!r}; allowed: 'group', a positive "
                         f"float fixed scale such as 2**19, or None (float32 error)")


def stored_kind_of(error_scale: str | float | None) -> str:
    """How ``error_scale`` stores e: "group", "fixed" or "float32"."""
    return "float32" if error_scale is None else "group" if error_scale == "group" else "fixed"


def stored_kind(codes: torch.Tensor, has_scales: bool) -> str:
    """How a saved e was stored (see :func:`stored_kind_of`)."""
    return "group" if has_scales else "float32" if codes.is_floating_point() else "fixed"
