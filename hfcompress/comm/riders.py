"""Exact columns riding a compressed exchange (QSDP 5.1's full-precision parameters; the wire
layout is ours).

FSDP2 hands a module's gradients and weights to the collectives as one flat buffer whose
norm / bias columns travel exactly (``integrations/exact_params.py``). Sent through a
collective of their own they cost a second launch and a second latency per unit and
direction, a ring over the whole world for a few kilobytes. Here they ride the compressed
payload's own exchange: each wire row is the payload's bytes followed by the row's exact
values (their own dtype, as torch's collective would send them); the receiver sums them
(reduce-scatter, in float32 in peer order) or copies them (all-gather). The bytes on the
wire are the exact collective's; nothing about the payload changes. The sender writes each
row once: the quantize kernels write the payload into a row wide enough for the values,
which are copied after it (``compress_rows(x, tail)``, qWD's ``wire_slot``); where no kernel
writes the row, the payload's fields and the values go into one ``cat`` (``stack_payloads``).
"""

from __future__ import annotations

import torch


def rider_nbytes(values: torch.Tensor | None) -> int:
    """Bytes per wire row that ``values`` (``[rows, E]``) add."""
    return 0 if values is None else values.shape[1] * values.element_size()


def as_row(values: torch.Tensor) -> torch.Tensor:
    """``values`` as one ``[1, E]`` row: itself where it is one (no torch call)."""
    return values if values.dim() == 2 and values.shape[0] == 1 else values.reshape(1, -1)


def forwarded(values: torch.Tensor) -> torch.Tensor:
    """What an intermediate hop sends on: ``[k, Y, E]`` contributions -> ``[Y, E]``, the only
    one as it is, or their sum (float32 accumulation, peer order) rounded to their dtype, as
    a ring reduce-scatter's partial sums are; a 2-D ``[Y, E]`` is one contribution, itself."""
    if values.dim() == 2:
        return values
    return values[0] if values.shape[0] == 1 else torch.sum(values, 0)


def check_exact(exact: tuple[torch.Tensor, torch.Tensor] | None, world: int) -> None:
    """``exact`` is ``(values [world, E], out [E])``."""
    if exact is None:
        return
    values, out = exact
    if values.dim() != 2 or values.shape[0] != world or values.shape[1] != out.numel():
        raise ValueError(f"exact columns {tuple(values.shape)} do not match world size {world} "
                         f"x output {out.numel()}")


def put_values(out: torch.Tensor, values: torch.Tensor) -> None:
    """``out <- values`` (gathered exact values into the output's columns), nothing where
    ``values`` is ``out``'s memory already: FSDP2 all-gathers in place, a rank's input is
    its slot of the output, so its own exact values lie where they go."""
    if not (values.data_ptr() == out.data_ptr() and values.shape == out.shape
            and values.stride() == out.stride() and values.dtype == out.dtype):
        out.copy_(values)
