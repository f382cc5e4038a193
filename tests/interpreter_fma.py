"""Whether this Triton's interpreter rounds ``tl.fma`` once, as a GPU does (Triton 3.6's
computes ``x * y + z`` in float32, two roundings; newer ones fuse it): tests of kernels whose
twin is a fused multiply-add (LoCo's lerp, as torch's) can only match where it does."""

from __future__ import annotations

import functools


@functools.cache
def interpreter_fuses_fma() -> bool:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def fma(x_ptr, out_ptr):
        x = tl.load(x_ptr)
        tl.store(out_ptr, tl.fma(x, x, -1.0))

    x = torch.tensor([1 + 2.0 ** -12])     # x * x = 1 + 2**-11 + 2**-24: the last bit rounds
    out = torch.empty(1)
    fma[(1,)](x, out)
    return out.item() == 2.0 ** -11 + 2.0 ** -24
