"""QSGD stochastic quantization, QSDP's gradient quantizer (QSDP 3.2, 5.1, D.3).

``qsgd``: per bucket of ``bucket_size`` values (default 1024, QSDP 5.1; a multiple of 32) the
max norm ``max |x|`` (QSDP 3.2 scales values "to the range [-1, 1]"; QSGD's l2 norm is not
used), and each ``|x| / norm`` stochastically rounded onto ``s = 2**(bits-1) - 1`` uniform
levels, sign kept (bits 2/4/6/8, default 8: QSDP's G8). Unbiased, per-value variance at most
``(norm/s)**2 / 4`` and ``(norm/s) |x|``. Wire: packed codes and one float32 scale per bucket;
the zero padding of the last bucket is counted. Kernels: ``kernels/qsgd.py`` and
``kernels/triton_qsgd.py``.
"""

from __future__ import annotations

import torch

from ..kernels import qsgd as _twin
from .bucketed import BucketQuantizer
from .registry import register_compressor


@register_compressor("qsgd")
class QSGD(BucketQuantizer):
    """QSGD with max-norm buckets and stochastic rounding (QSDP's gradient quantizer)."""

    unbiased = True
    twin, triton_module = _twin, "triton_qsgd"

    def _quantize(self, flat: torch.Tensor, rows: int | None) -> tuple[torch.Tensor, ...]:
        noise = self.rng.next_keys(flat.device, rows)  # the kernel expands them (noise.py)
        return self._impl(flat).quantize(flat, self.bits, self.bucket_size, noise)
