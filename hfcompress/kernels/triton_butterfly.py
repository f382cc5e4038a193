"""The normalized Walsh-Hadamard butterflies of the Triton kernels (SDP4Bit 3.3), shared by
``triton_hadamard`` (rotate, rotate + quantize) and ``triton_dequantize_sum`` (the inverse after
a sum): the twin's stages in its order (``hadamard._fwht_rows``: pairs ``i, i + h`` for h = 1,
2, .., n / 2, added and subtracted, then one multiply by ``1 / sqrt(n)``), so every kernel is
bit-identical to it.

``fwht`` runs on a ``(rows, n)`` tile. ``fwht_runs`` runs on a ``(J, G, R, K)`` tile of runs,
each a thread's ``J * K`` consecutive values (its ``J`` vectors of ``K``), where an n-block lies
inside a run: each stage's pair axis is split off the run's own axes, which stay in the thread's
registers. Triton 3.9 keeps either in registers; Triton 3.6 (torch 2.10-2.12, the GPU image)
lays the ``(rows, n)`` reshape over lanes and moves the values across them at every stage.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fwht(x, ROWS: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr, SCALE: tl.constexpr):
    """Normalized Walsh-Hadamard transform of every row of a float32 (ROWS, N) tile."""
    for s in tl.static_range(LOG2N):  # pairs (i, i + h), h = 1 << s
        y = tl.permute(tl.reshape(x, (ROWS, N >> (s + 1), 2, 1 << s)), (0, 1, 3, 2))
        a, b = tl.split(y)
        y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        x = tl.reshape(y, (ROWS, N))
    return x * SCALE


@triton.jit
def _stage(y, LO: tl.constexpr, H: tl.constexpr, HI: tl.constexpr, G: tl.constexpr,
           R: tl.constexpr, K: tl.constexpr, AXIS_J: tl.constexpr):
    """One butterfly stage (pairs ``i, i + h``) on a (HI = J, G, R, K) tile of runs, the
    run's value ``j * K + k``: the J axis (``AXIS_J``, h >= K) or the K axis split as
    ``(LO, 2, H)``, the pair axis moved last, added and subtracted, moved back."""
    if AXIS_J:
        t = tl.permute(tl.reshape(y, (LO, 2, H, G, R, K)), (0, 2, 3, 4, 5, 1))
        a, b = tl.split(t)
        t = tl.permute(tl.join(a + b, a - b), (0, 5, 1, 2, 3, 4))
    else:
        t = tl.permute(tl.reshape(y, (HI, G, R, LO, 2, H)), (0, 1, 2, 3, 5, 4))
        a, b = tl.split(t)
        t = tl.permute(tl.join(a + b, a - b), (0, 1, 2, 3, 5, 4))
    return tl.reshape(t, (HI, G, R, K))


@triton.jit
def fwht_runs(y, J: tl.constexpr, G: tl.constexpr, R: tl.constexpr, K: tl.constexpr,
              LOG2N: tl.constexpr, SCALE: tl.constexpr):
    """:func:`fwht` of every n-block of a (J, G, R, K) tile of runs of ``J * K`` values, ``n``
    dividing the run, reshaped along the run's axes only (module docstring)."""
    for s in tl.static_range(LOG2N):
        if (1 << s) < K:
            y = _stage(y, K >> (s + 1), 1 << s, J, G, R, K, False)
        else:
            y = _stage(y, (J * K) >> (s + 1), (1 << s) // K, J, G, R, K, True)
    return y * SCALE
