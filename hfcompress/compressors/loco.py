"""LoCo error feedback around a gradient compressor (LoCo Alg. 1, sections 3.1-3.3).

Per compress of a gradient g (on the sending rank)::

    h  = g + deq8(e)                         # Alg. 1 line 4, Eq. (2)
    send inner(h)                            # line 5, Eq. (3)
    d  = deq(inner(h))                       # line 7
    e~ = (1 - beta) deq8(e) + beta (h - d)   # line 8, Eq. (5): moving average of the error
    e  = Q8(e~)                              # line 12, Eq. (7): only the 8-bit e is stored

``step()`` (once per optimizer step) zeroes e after every iteration k with k % T_c == 0
(lines 9-10), i.e. after iterations 0, T_c, 2 T_c, ...

Choices the paper leaves open:

- Since only the 8-bit e is kept (Sec. 3.2), the previous average e~_k of line 8 is
  ``deq8(e_k)``, as in the authors' LoCo-ZeRO++ kernel in DeepSpeed.
- beta: the paper gives no value; the default 0.2 is the authors' DeepSpeed setting
  (``err_beta=0.8`` weights the old error there, i.e. beta = 1 - 0.8 for the new one).
- inner: the paper uses a fixed scale s (2^17..2^19) and round-to-nearest into [-8, 7]. The
  default here is ``int`` 4 bit, absmax per group of 128, nearest rounding: no per-model scale
  to tune, an outlier only coarsens its own group, and error feedback is meant for biased
  (deterministic) compressors, so stochastic rounding would only add variance.
- error_scale: ``"group"`` (default) stores e as uint8 codes with an absmax scale per group
  of 128; a float s_e stores int8 ``clamp(round(e * s_e), -127, 127)`` like the paper
  (s_e = 4s..6s, i.e. about 2^19..2^21 for the paper's s); values beyond 127 / s_e saturate.
- Non-finite gradient entries make the payload non-finite (as the inner does) but store a zero
  error there, so one overflow step cannot poison e until the next reset.

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
                 reset_every: int = 512, error_scale: str | float = "group") -> None:
        inner = resolve_inner("loco", inner, GroupQuantizer(bits=4, group_size=128,
                                                            rounding="nearest"))
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
            raise ValueError(f"loco: beta={beta!r} must be a number in [0, 1] (e.g. 0.2)")
        if isinstance(reset_every, bool) or not isinstance(reset_every, int) or reset_every <= 0:
            raise ValueError(f"loco: reset_every={reset_every!r} must be a positive int "
                             f"(e.g. 512 or 1024)")
        fixed = isinstance(error_scale, (int, float)) and not isinstance(error_scale, bool)
        if error_scale != "group" and not (fixed and math.isfinite(error_scale)
                                           and error_scale > 0):
            raise ValueError(f"loco: error_scale={error_scale!r}; allowed: 'group' or a positive "
                             f"float fixed scale such as 2**19")
        super().__init__(inner=inner, beta=beta, reset_every=reset_every, error_scale=error_scale)
        self.inner, self.beta, self.reset_every = inner, float(beta), reset_every
        self.error_scale = error_scale
        self.steps = 0
        self.numel: int | None = None
        self.error_codes: torch.Tensor | None = None
        self.error_scales: torch.Tensor | None = None

    # -- wire format: the inner's ---------------------------------------------------------
    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        return self.inner.payload_spec(numel)

    def decompress(self, packed: Packed) -> torch.Tensor:
        return self.inner.decompress(packed)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        return self.inner.reduce(packeds)

    def reduce_rows(self, wire: torch.Tensor, shape: torch.Size | Sequence[int],
                    dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """The inner's: the receiver sums the rows' fields in place (no state)."""
        return self.inner.reduce_rows(wire, shape, dtype, out)

    # -- error feedback -------------------------------------------------------------------
    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        g = x.detach().reshape(-1).float()
        if self.numel is not None and self.numel != g.numel():
            raise ValueError(f"loco: got {g.numel()} values but the error buffer holds "
                             f"{self.numel}; use one instance per tensor (fresh())")
        e = self._error(g)
        h = g + e
        packed = self.inner.compress(h.view(x.shape))
        d = self.inner.decompress(Packed(packed.payload, x.shape, torch.float32, packed.meta))
        e_avg = (1.0 - self.beta) * e + self.beta * (h - d.reshape(-1))
        # a zero error where e_avg is not finite (one kernel: finite values as they are)
        self._store(e_avg.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0))
        return Packed(packed.payload, x.shape, x.dtype, packed.meta)

    def step(self) -> None:
        """End of optimizer step k: zero e if k % reset_every == 0 (Alg. 1 lines 9-10)."""
        if self.steps % self.reset_every == 0:
            self.error_codes = self.error_scales = None
        self.steps += 1

    def _error(self, like: torch.Tensor) -> torch.Tensor:
        """deq8(e) as float32 of ``like``'s numel (zeros before the first compress and after
        a reset)."""
        if self.error_codes is None:
            return torch.zeros_like(like)
        if self.error_scales is None:
            return self.error_codes.float() / self.error_scale
        out = kernels.dequantize_groups(self.error_codes, self.error_scales, ERROR_BITS,
                                        ERROR_GROUP, torch.float32)
        return out[:like.numel()]

    def _store(self, e: torch.Tensor) -> None:
        self.numel = e.numel()
        if self.error_scale == "group":
            self.error_codes, self.error_scales = kernels.quantize_groups(
                pad_to(e, ERROR_GROUP), ERROR_BITS, ERROR_GROUP)
        else:
            self.error_codes = torch.round(e * self.error_scale).clamp_(
                -ERROR_QMAX, ERROR_QMAX).to(torch.int8)

    # -- state ----------------------------------------------------------------------------
    def state_bytes_for(self, numel: int, dtype: torch.dtype) -> dict[str, int]:
        """The stored error of ``numel`` sent values, as :meth:`state_bytes` will count it."""
        if self.error_scale != "group":
            return {"errors": numel}
        groups = -(-numel // ERROR_GROUP)
        return {"errors": groups * ERROR_GROUP + 4 * groups}

    def state_bytes(self) -> dict[str, int]:
        """Bytes of the stored error e (kind "errors"): with ``error_scale="group"`` one uint8
        code per value (padded to groups of 128) plus a float32 scale per group, i.e.
        ~1.03 bytes per gradient value this instance sends (LoCo 3.2's 8-bit floor); int8
        codes only with a fixed scale. Zero before the first compress and after a reset."""
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
        grouped = "error_scales" in state
        if "error_codes" in state and grouped != (self.error_scale == "group"):
            raise ValueError(f"loco: state was saved with a different error_scale than "
                             f"{self.error_scale!r}")
        self.inner.load_state_dict(state.get("inner", {}))
        self.steps = int(state.get("steps", 0))
        self.numel = state.get("numel")
        codes, scales = state.get("error_codes"), state.get("error_scales")
        self.error_codes = None if codes is None else codes.clone()
        self.error_scales = None if scales is None else scales.clone()
