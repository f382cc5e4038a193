"""A reduce op's last step on a float32 sum (a reduce-scatter's AVG or PREMUL_SUM, applied
after the sum as torch's collectives apply it to what they summed), written into the
output in its dtype with one rounding. The decode-sum kernel does the same in its epilogue
(``triton_dequantize_sum``: ``POST``); its torch twins, the compressors and
``comm/reduce_scatter.write_result`` call :func:`write_post` (through :func:`written`
where the sum may also be returned as it is). :func:`sum_riders` is the twin of the same
kernel's sum of the riders (the exact values ending the peers' wire rows).

``post``: None (SUM), ``("div", d)`` (AVG over ``d`` ranks: an IEEE division, as torch's on
the CPU) or ``("mul", f)`` (``PREMUL_SUM(f)``: ``f`` as a float32, times the sum)."""

from __future__ import annotations

import torch

from .packing import split_tail

KINDS = {"div": 1, "mul": 2}


def launch_args(post: tuple[str, float] | None) -> tuple[float, int]:
    """``post`` as the kernel's ``(post, POST)``: its value and 0 (none), 1 (div), 2 (mul)."""
    if post is None:
        return 0.0, 0
    if post[0] not in KINDS:
        raise ValueError(f"post must be None, ('div', d) or ('mul', f), got {post!r}")
    return float(post[1]), KINDS[post[0]]


def write_post(total: torch.Tensor, out: torch.Tensor, post: tuple[str, float] | None
               ) -> torch.Tensor:
    """``out <- total`` (float32, ``out``'s number of values) divided or multiplied by
    ``post``'s value first, computed in float32 and rounded once to ``out``'s dtype;
    returns ``out``."""
    total = total if total.shape == out.shape else total.view(out.shape)
    kind = launch_args(post)[1]
    if kind == 0:
        return out.copy_(total)
    op = torch.div if kind == KINDS["div"] else torch.mul
    return op(total, post[1], out=out)


def written(total: torch.Tensor, out: torch.Tensor | None,
            post: tuple[str, float] | None) -> torch.Tensor:
    """A float32 sum as a decode-sum hands it over: ``total`` itself, or :func:`write_post`
    into ``out`` (a fresh float32 buffer where None and ``post`` is given)."""
    if out is None and post is None:
        return total
    return write_post(total, torch.empty_like(total) if out is None else out, post)


def sum_riders(wire: torch.Tensor, riders: tuple[torch.Tensor, torch.dtype, tuple | None]
               ) -> torch.Tensor:
    """The riders (exact values ending the peers' uint8 wire rows ``[P, width]``,
    ``comm/riders.py``) as the decode-sum kernel sums them: ``riders`` ``(out [E], dtype,
    post)``, the E values of ``dtype`` at the end of each row summed in float32 in row order
    0..P-1, ``post`` applied (:func:`write_post`), into ``out``; returns ``out``."""
    out, dtype, post = riders
    rows = split_tail(wire, wire.shape[1] - out.numel() * dtype.itemsize, dtype)[1].unbind(0)
    total = rows[0].to(torch.float32, copy=True)
    for row in rows[1:]:
        total += row
    return write_post(total, out, post)
