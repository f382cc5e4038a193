"""Learned quantization levels (QSDP 5.2, Alg. 2, Appendix C).

``learned``: per bucket of ``bucket_size`` values (default 1024; a multiple of 32) the values
are min-max normalized to [0, 1] (QSDP 5.1) and coded as the NEAREST of 2**bits levels (bits 2
to 8; QSDP uses 5 for weights, 4 for gradients), as Alg. 2 does (``find_closest``): the paper
rounds to the nearest learned level, so this scheme is biased (``unbiased = False``).

The levels start uniform (``linspace(0, 1, 2**bits)``: the min-max uniform quantizer) and are
learned by Alg. 2's SGD on observed normalized values: each value moves its nearest level
``q <- q - lr (q - v)``. ``update_levels(x)`` applies that step to the values of x as one batch:
a level that c values chose takes c such steps toward their mean,
``q <- q + (1 - (1 - lr)**c) (mean - q)`` (exactly Alg. 2 when those values are equal; stable
for any lr in (0, 1]). ``fit(samples)`` runs ``fit_steps`` steps on random batches of
``batch_size`` values (App. C: lr 0.01, batch 1024). App. C finds one fit at the start of
training enough: a fresh compressor codes its first ``fit_after`` tensors with uniform levels,
then fits once on the next tensor with finite values (``fit_steps=0`` disables that: call
``fit`` or ``update_levels`` yourself).

The codebook travels on the wire with every payload (2**bits float32, counted in
``wire_bits``), next to the packed codes and two float32 per bucket (lo, range): every rank
learns levels from its own shard of weights or gradients, so sending them needs no extra
synchronisation and decoding never depends on a peer's state. The levels are also this rank's
state (``state_dict``) so a resumed run codes the same way.
Kernels: ``kernels/learned_levels.py`` and ``kernels/triton_learned_levels.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels import learned_levels as _twin
from .base import Packed, check_float_input
from .bucketed import BucketQuantizer
from .base import pad_edge
from .registry import register_compressor


def uniform_levels(bits: int) -> torch.Tensor:
    """The 2**bits evenly spaced levels of [0, 1] (float32, CPU)."""
    return torch.linspace(0.0, 1.0, 1 << bits, dtype=torch.float32)


def _check_int(scheme: str, param: str, value: Any, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{scheme}: {param}={value!r} must be an integer >= {least}")


@register_compressor("learned")
class LearnedLevels(BucketQuantizer):
    """Nearest rounding onto a learned codebook per min-max bucket (QSDP 5.2)."""

    stateful = True
    twin, triton_module = _twin, "triton_learned_levels"
    bucket_params = ("lo", "range")
    allowed_bits = _twin.ALL_BITS
    codes_nbytes = staticmethod(_twin.packed_nbytes)

    def __init__(self, bits: int = 5, bucket_size: int = 1024, fit_steps: int = 500,
                 fit_after: int = 0, lr: float = 0.01, batch_size: int = 1024, seed: int = 0,
                 backend: str = "auto") -> None:
        super().__init__(bits, bucket_size, seed, backend)
        _check_int(self.name, "fit_steps", fit_steps, 0)
        _check_int(self.name, "fit_after", fit_after, 0)
        _check_int(self.name, "batch_size", batch_size, 1)
        self._check_lr(lr)
        self.params.update(fit_steps=fit_steps, fit_after=fit_after, lr=lr, batch_size=batch_size)
        self.fit_steps, self.fit_after = fit_steps, fit_after
        self.lr, self.batch_size = lr, batch_size
        self.levels = uniform_levels(bits)  # the state (CPU); see levels_on
        self._on_device: dict[torch.device, tuple[torch.Tensor, int, torch.Tensor,
                                              torch.Tensor]] = {}
        self.fitted = False
        self.calls = 0

    def _check_lr(self, lr: Any) -> None:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr <= 1:
            raise ValueError(f"{self.name}: lr={lr!r} must be a number in (0, 1]")

    def levels_on(self, device: torch.device) -> torch.Tensor:
        """``self.levels`` on ``device``, copied once per change of the levels (a new tensor
        or an in-place edit), so a steady-state compress makes no host-to-device copy. The
        copy is never edited in place: payloads carry it as their codebook."""
        return self._codebook(device)[0]

    def _codebook(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(levels, their midpoints) on ``device``, made once per change of the levels."""
        lv = self.levels
        cached = self._on_device.get(device)
        if cached is None or cached[0] is not lv or cached[1] != lv._version:
            on = lv.to(device, copy=True)
            cached = self._on_device[device] = (lv, lv._version, on, _twin.midpoints(on))
        return cached[2], cached[3]

    # -- learning (Alg. 2) ------------------------------------------------------------------
    def _normalized(self, x: torch.Tensor) -> torch.Tensor:
        """The finite buckets' normalized values of x, 1-D float32."""
        v, _, rng = _twin.normalize(pad_edge(x.detach(), self.bucket_size), self.bucket_size)
        return v[~torch.isnan(rng)].reshape(-1)

    @staticmethod
    def _step(levels: torch.Tensor, v: torch.Tensor, lr: float) -> torch.Tensor:
        """One batched Alg. 2 step of the sorted ``levels`` on normalized values ``v``."""
        code = torch.bucketize(v, _twin.midpoints(levels))
        count = torch.bincount(code, minlength=levels.numel()).to(levels.dtype)
        mean = torch.zeros_like(levels).index_add_(0, code, v) / count.clamp(min=1)
        moved = levels + (1 - (1 - lr) ** count) * (mean - levels)
        return torch.sort(moved).values

    def update_levels(self, x: torch.Tensor, lr: float | None = None) -> None:
        """One online Alg. 2 step on all of x's values (one batch)."""
        lr = self.lr if lr is None else lr
        self._check_lr(lr)
        v = self._normalized(x)
        if v.numel():
            self.levels = self._step(self.levels.to(v.device), v, lr).cpu()
            self.fitted = True

    def fit(self, samples: torch.Tensor, steps: int | None = None, lr: float | None = None,
            batch_size: int | None = None) -> None:
        """``steps`` Alg. 2 steps on random batches of ``batch_size`` normalized samples
        (buckets holding Inf or NaN are left out; no finite sample: levels unchanged)."""
        steps = self.fit_steps if steps is None else steps
        lr = self.lr if lr is None else lr
        batch_size = self.batch_size if batch_size is None else batch_size
        _check_int(self.name, "steps", steps, 0)
        _check_int(self.name, "batch_size", batch_size, 1)
        self._check_lr(lr)
        v = self._normalized(samples)
        if v.numel():
            gen = self.rng.generator(v.device)
            levels = self.levels.to(v.device)
            for _ in range(steps):
                pick = torch.randint(v.numel(), (batch_size,), generator=gen, device=v.device)
                levels = self._step(levels, v[pick], lr)
            self.levels = levels.cpu()
            self.fitted = True

    # -- the contract -----------------------------------------------------------------------
    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        """Codes, lo and range per bucket, then the codebook (2**bits float32)."""
        return {**super().payload_spec(numel), "levels": (torch.float32, 1 << self.bits)}

    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        if not self.fitted and self.fit_steps and self.calls >= self.fit_after:
            self.fit(x)
        self.calls += 1
        flat = x.detach().reshape(-1)  # the kernel pads the last bucket with the last value
        levels, mids = self._codebook(flat.device)
        codes, lo, rng = self._impl(flat).quantize(flat, levels, self.bits, self.bucket_size,
                                                   mids)
        return self._packed(x, (codes, lo, rng, levels))

    def decompress_slots(self, wire: torch.Tensor, numel: int, out: torch.Tensor) -> None:
        """Every row (its own codebook) decoded into ``out`` by one ``dequantize_rows``."""
        if out.stride(-1) != 1:
            return super().decompress_slots(wire, numel, out)
        fields = self.payload_rows(wire, numel)
        self._impl(fields[0]).dequantize_rows(*fields, self.bits, self.bucket_size, out)

    def state_dict(self) -> dict[str, Any]:
        return {"levels": self.levels.clone(), "fitted": self.fitted, "calls": self.calls,
                **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        levels = torch.as_tensor(state["levels"], dtype=torch.float32).cpu()
        if (levels.shape != (1 << self.bits,) or not torch.isfinite(levels).all()
                or not torch.equal(levels, torch.sort(levels).values)):
            raise ValueError(f"{self.name}: levels must be {1 << self.bits} sorted finite "
                             f"float32 values (bits={self.bits}), got {tuple(levels.shape)}")
        self.levels = levels.clone()
        self.fitted = bool(state["fitted"])
        self.calls = int(state["calls"])
        super().load_state_dict(state)
