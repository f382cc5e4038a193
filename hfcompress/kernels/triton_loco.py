"""LoCo's error feedback in one kernel (LoCo Alg. 1 lines 4-8 and 12, Eqs. (2), (3), (5), (7)).

Per group of ``group_size`` gradient values: read ``g`` (any float dtype) and the stored 8-bit
error (codes and a float32 scale per group of 128), then

    e  = deq8(e_codes)                          # 0 before the first call / after a reset
    h  = g + e                                  # Eq. (2)
    q  = Q(h)  -> the inner's codes and scales  # Eq. (3): absmax group quantization
    d  = deq(q)
    e~ = lerp(e, h - d, beta)                   # Eq. (5), torch.lerp's single rounding (FMA)
    e' = Q8(nan_to_num(e~, 0, 0, 0))            # Eq. (7)

and write the payload and the new error. What ``compressors/loco.py`` computes with torch ops
(its torch twin: six to eight kernels and float32 transients of the whole tensor per call, per
destination row of a reduce-scatter), here one launch that reads ``g`` and ``e`` once and writes
the codes: bit-identical by construction. The steps are ``triton_group_quant``'s tile
(``_levels`` / ``_store_levels`` / ``_decode_tile``: the same IEEE divisions, ``floor``
rounding, hashed noise for stochastic rounding), the lerp is ``fma(w, end - e, e)`` for
``w < 0.5`` and ``fma(w - 1, end - e, end)`` otherwise (torch's ``lerp`` on CPU and CUDA), every
other step one rounding (``enable_fp_fusion=False``). The inner's group size must be the
error's (128): one tile serves both quantizations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .packing import payload_buffers, packed_nbytes
from .triton_group_quant import (NUM_WARPS, _block, _decode_tile, _levels, _per_thread,
                                 _store_levels, _tile, _tile_consts)
from .triton_noise import noise_operand
from .triton_tiles import cdiv

#: the stored error: 8-bit codes, one float32 scale per group of 128 (LoCo 3.2)
ERROR_BITS, ERROR_GROUP = 8, 128


@triton.jit
def _feedback_kernel(x_ptr, ecode_ptr, escale_ptr, noise_ptr, noise_row, packed_ptr, scale_ptr,
                     ecode_out_ptr, escale_out_ptr, n_groups, numel, beta,
                     GS: tl.constexpr, BLOCK_G: tl.constexpr, L: tl.constexpr,
                     LOG2V: tl.constexpr, VEC: tl.constexpr, BITS: tl.constexpr,
                     CPU: tl.constexpr, BPU: tl.constexpr, STOCHASTIC: tl.constexpr,
                     HASH: tl.constexpr, HAS_ERROR: tl.constexpr, SMALL: tl.constexpr):
    """One tile of whole groups: the payload of ``h = g + deq8(e)`` and the new 8-bit error
    (module docstring). Values past ``numel`` are the padding: ``h`` and the new error 0."""
    pid = tl.program_id(0)
    V: tl.constexpr = 1 << LOG2V
    base, off, mask = _tile(pid, n_groups, GS, BLOCK_G, L, V // VEC, VEC)
    # the padding of the last group (numel % GS) reads nothing and stays 0
    valid = _per_thread(mask & (off < tl.minimum(numel - base, BLOCK_G * GS).to(tl.int32)))
    g = _per_thread(tl.load(x_ptr + base + off, mask=mask & (off < numel - base),
                            other=0.0).to(tl.float32))
    if HAS_ERROR:
        e = tl.where(valid, _decode_tile(ecode_ptr, escale_ptr, pid, n_groups, GS, BLOCK_G, L,
                                         V, 8, 4, 4), 0.0)
    else:
        e = tl.zeros(g.shape, tl.float32)
    h = tl.where(valid, g + e, 0.0)
    q, scale = _levels(h, pid, base, n_groups, noise_ptr, noise_row, GS, BLOCK_G, L, LOG2V,
                       BITS, STOCHASTIC, HASH)
    _store_levels(q, scale, pid, n_groups, packed_ptr, scale_ptr, GS, BLOCK_G, L, LOG2V, BITS,
                  CPU, BPU)
    end = h - q.to(tl.float32) * scale[:, None, None]
    if SMALL:
        avg = tl.fma(tl.full(end.shape, beta, tl.float32), end - e, e)
    else:
        avg = tl.fma(tl.full(end.shape, beta - 1.0, tl.float32), end - e, end)
    avg = tl.where(valid & (tl.abs(avg) < float("inf")), avg, 0.0)   # NaN, +-Inf -> 0
    qe, escale = _levels(avg, pid, 0, n_groups, noise_ptr, noise_row, GS, BLOCK_G, L, LOG2V,
                         8, False, 0)
    _store_levels(qe, escale, pid, n_groups, ecode_out_ptr, escale_out_ptr, GS, BLOCK_G, L,
                  LOG2V, 8, 4, 4)


def feedback(x: torch.Tensor, error_codes: torch.Tensor | None,
             error_scales: torch.Tensor | None, beta: float, bits: int, group_size: int,
             noise: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (any shape, any float dtype; contiguous) and the stored error (uint8 codes of
    ``x.numel()`` padded to groups of 128, float32 scales; None: zero) -> (the payload's packed
    codes and float32 scales, the new error's codes and scales): ``loco.py``'s compress in one
    launch. ``noise``: the inner's keys (stochastic rounding)."""
    if group_size != ERROR_GROUP:
        raise ValueError(f"loco feedback kernel: group_size={group_size}, needs {ERROR_GROUP} "
                         f"(the error's groups)")
    x = x.reshape(-1)
    numel = x.numel()
    n_groups = -(-numel // group_size)
    padded = n_groups * group_size
    if error_codes is not None and (error_codes.numel() != padded or error_scales is None
                                    or error_scales.numel() != n_groups):
        raise ValueError(f"loco feedback kernel: a stored error of {error_codes.numel()} codes "
                         f"for {numel} values, expected {padded} codes and {n_groups} scales")
    k = _tile_consts(bits, group_size, _block(x), x.element_size())
    if _tile_consts(ERROR_BITS, group_size, _block(x), x.element_size())["LOG2V"] != k["LOG2V"]:
        raise ValueError(f"loco feedback kernel: {bits}-bit codes need another tile than the "
                         f"8-bit error")
    packed, scale = payload_buffers(packed_nbytes(padded, bits), n_groups, x.device)
    ecodes, escales = payload_buffers(packed_nbytes(padded, ERROR_BITS), n_groups, x.device)
    if n_groups:
        has_error = error_codes is not None
        u, hashed, row = noise_operand(noise, padded, x, group_size)
        _feedback_kernel[(cdiv(n_groups, k["BLOCK_G"]),)](
            x, error_codes.view(torch.int32) if has_error else ecodes,
            error_scales if has_error else escales, u, row,
            packed.view(torch.int32) if k["BPU"] == 4 else packed, scale,
            ecodes.view(torch.int32), escales, n_groups, numel, float(beta), GS=group_size,
            BITS=bits, STOCHASTIC=noise is not None, HASH=hashed, HAS_ERROR=has_error,
            SMALL=abs(beta) < 0.5, **k, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return packed, scale, ecodes, escales
