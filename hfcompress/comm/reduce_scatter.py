"""Quantized reduce-scatter as a 1-hop all-to-all (ZeRO++ B.3.1, Fig. 7).

``input`` is flat ``world * S`` values, logically ``[world, S]`` (row r goes to rank r);
``output`` gets this rank's S values. Each rank compresses the ``world`` rows (one
``compress_rows`` call for a stateless scheme), the uint8 payloads go through one
``all_to_all_single``, and the receiver sums what it got with ``compressor.reduce_rows``
(float32; a compressed-domain sum where the scheme has one; the riders too where the scheme
sums them, :func:`summed_riders`).
With ``compressor=None`` this is torch's ``reduce_scatter_single`` (``reduce_scatter_tensor``).
A group of one rank sends nothing and compresses nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..compressors.base import FLOAT_DTYPES, Compressor
from ..kernels.packing import flat_contiguous, split_tail
from ..kernels.post_op import write_post
from .hop import Exchange, compress_rows, reduce_scatter_single
from .one_rank import skips
from .riders import check_exact, rider_nbytes
from .streams import StreamOwner, Streams, stateless_only
from .topology import Topology
from .traffic import Phase, exchange, payload_bytes
from .wire_meter import WireMeter, peer_is_remote, rank_size


_SUM, _AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG     # singletons: identity is the fast test


def premul_factor(op: Any) -> Any:
    """The factor of ``ReduceOp.PREMUL_SUM(factor)`` (FSDP2's custom gradient divide factor
    f arrives as ``PREMUL_SUM(1 / f)``), else None. torch 2.13 has ``op.factor``; older
    releases give it only through the op's pickle state ``(PREMUL_SUM, factor)``."""
    if op is _SUM or op is _AVG or getattr(op, "op", op) != dist.ReduceOp.PREMUL_SUM:
        return None
    factor = getattr(op, "factor", None)
    return op.__getstate__()[1] if factor is None else factor


def check_op(op: Any) -> None:
    if op not in (_SUM, _AVG):
        raise ValueError(f"quantized reduce-scatter supports op ReduceOp.SUM or ReduceOp.AVG, "
                         f"got {op}")


def check_scatter_op(op: Any) -> None:
    """The reduce-scatters also take ``PREMUL_SUM(factor)`` (see :func:`write_result`)."""
    if premul_factor(op) is None:
        check_op(op)


def exact_op(input: torch.Tensor, op: Any, group: dist.ProcessGroup) -> tuple[torch.Tensor, Any]:
    """(input, op) for torch's reduce-scatter: ``PREMUL_SUM`` as a multiply and ``SUM`` on a
    backend without it (gloo; NCCL has it natively, same numbers: each input scaled, then
    summed)."""
    factor = premul_factor(op)
    if factor is None or dist.get_backend(group) == "nccl":
        return input, op
    return input * factor, dist.ReduceOp.SUM


def check_sizes(name: str, output: torch.Tensor, input: torch.Tensor, world: int) -> int:
    s = output.numel()
    if input.numel() != world * s:
        raise ValueError(f"{name}: input has {input.numel()} values, expected world size "
                         f"{world} x output {s} = {world * s}")
    return s


def post_of(op: Any, world: int) -> tuple[str, float] | None:
    """What ``op`` does to the float32 sum after it (``kernels/post_op.py``): nothing for
    SUM, a division by ``world`` for AVG, a multiplication by the factor for PREMUL_SUM
    (the compressed payloads carry the raw values)."""
    if op is _SUM:
        return None
    if op is _AVG:
        return ("div", world)
    factor = premul_factor(op)
    if factor is not None:
        return ("mul", factor)
    return ("div", world) if op == dist.ReduceOp.AVG else None


def write_result(output: torch.Tensor, total: torch.Tensor, op: Any, world: int) -> None:
    """``output <- total`` (float32 sum) under ``op`` (:func:`post_of`), in output's dtype,
    written straight into ``output`` (one pass, no temporary)."""
    write_post(total.reshape(output.shape), output, post_of(op, world))


def result_target(output: torch.Tensor, op: Any, world: int, spaced: bool = False
                  ) -> tuple[torch.Tensor | None, tuple[str, float] | None]:
    """``(output flat, post_of(op))`` where the decode-sum may write the result straight
    into ``output`` (contiguous, a float dtype; ``spaced``: the decode-sum writes runs of
    one length equally spaced too, ``output`` itself then, ``[count, length]``), ``op``'s
    last step in its epilogue (no float32 sum in between, no pass of :func:`write_result`);
    else ``(None, None)``, also for a PREMUL_SUM by a tensor (a kernel argument would read
    it on the host)."""
    post = post_of(op, world)
    if output.dtype not in FLOAT_DTYPES or post is not None and isinstance(post[1],
                                                                           torch.Tensor):
        return None, None
    if output.is_contiguous():
        return (output if output.dim() == 1 else output.view(-1)), post
    if spaced and output.dim() == 2 and output.stride(1) == 1:
        return output, post
    return None, None


def post_kwargs(post: tuple[str, float] | None) -> dict[str, Any]:
    """``reduce_rows``' keyword for ``post``: none for a SUM, so that a scheme's own
    ``reduce_rows`` written before ``post`` existed still serves SUM reduce-scatters."""
    return {} if post is None else {"post": post}


def summed_riders(compressor: Compressor, exact: tuple[torch.Tensor, torch.Tensor] | None,
                  op: Any, world: int) -> dict[str, Any]:
    """``reduce_rows``' keyword that has ``compressor``'s decode-sum also sum the riders
    (``exact``: ``(values [P, E], out [E])``, ``riders.py``) into ``out`` under ``op``, in
    the same kernel: ``{"riders": (out flat, values' dtype, post_of(op))}`` where the scheme
    sums riders (``Compressor.sums_riders``) and ``out`` takes a kernel's result
    (:func:`result_target`); else ``{}``: the receiver splits them off and calls
    :func:`final_sum`."""
    if exact is None or not compressor.sums_riders:
        return {}
    target, post = result_target(exact[1], op, world)
    return {} if target is None else {"riders": (target, exact[0].dtype, post)}


def sum_target(output: torch.Tensor, op: Any) -> torch.Tensor | None:
    """``output`` flat where the decode-sum may write the result straight into it (a SUM
    into a contiguous float32 output: :func:`write_result` would only copy), else None."""
    if (op is _SUM or (premul_factor(op) is None and op == _SUM)) \
            and output.dtype == torch.float32 and output.is_contiguous():
        return output if output.dim() == 1 else output.view(-1)
    return None


def final_sum(values: torch.Tensor, out: torch.Tensor, op: Any, world: int) -> None:
    """``out <- `` the float32 sum of the peers' rows under ``op`` (SUM, AVG over ``world``,
    PREMUL_SUM), in ``out``'s dtype; one op for a SUM into float32."""
    target = sum_target(out, op)
    if target is not None:
        torch.sum(values if values.dim() == 2 else values.reshape(values.shape[0], -1), 0,
                  dtype=torch.float32, out=target)
        return
    write_result(out, torch.sum(values, 0, dtype=torch.float32), op, world)


class QuantizedReduceScatter(StreamOwner):
    """1-hop all-to-all reduce-scatter through ``compressor`` (None: exact)."""

    #: the input is ``[world, S]`` rows (``TwoHopReduceScatter.spaced_input``: not runs)
    spaced_input = False

    def __init__(self, compressor: Compressor | None = None, topology: Topology | None = None,
                 meter: WireMeter | None = None, tag: str = "reduce_scatter") -> None:
        self.compressor = compressor
        self.streams = {"hop": Streams(compressor)} if compressor is not None else {}
        self.topology, self.meter, self.tag = topology, meter, tag

    def __call__(self, output: torch.Tensor, input: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                 group: dist.ProcessGroup | None = None,
                 exact: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``exact``: ``(values [world, E], out [E])``, columns reduced exactly in the same
        all-to-all (``riders.py``; a compressor's call only)."""
        if group is None:
            group = self.topology.group if self.topology else dist.group.WORLD
        me, world = rank_size(group)
        s = check_sizes("reduce_scatter", output, input, world)
        remote = peer_is_remote(group, self.topology)
        if self.compressor is None:
            if self.meter is not None:
                self.meter.record_sends(self.tag, s * input.element_size(), remote, me)
            flat, op = exact_op(flat_contiguous(input), op, group)
            reduce_scatter_single(output, flat, op=op, group=group)
            return
        check_scatter_op(op)
        check_exact(exact, world)
        values = exact[0] if exact is not None else None
        rows = input.reshape(world, s)
        if s == 0 or skips(world):
            write_result(output, rows[0].float(), op, world)
            if exact is not None:
                write_result(exact[1], values[0].float(), op, world)
            return
        streams = self.streams["hop"]
        streams.check_layout((world, s))
        send = compress_rows(streams, rows, lambda k: ("send", k), rider=values)
        got = Exchange(send, group, self.meter, self.tag, remote).wait()
        recv = streams["recv"]
        riders = summed_riders(recv, exact, op, world)
        got, received = split_tail(got, send.shape[1] - rider_nbytes(values),
                                   None if values is None or riders else values.dtype)
        target, post = result_target(output, op, world)
        total = recv.reduce_rows(got, (s,), input.dtype, out=target, **post_kwargs(post),
                                 **riders)
        if target is None:
            write_result(output, total, op, world)
        if received is not None:
            final_sum(received, exact[1], op, world)

    @staticmethod
    def traffic(numel: int, ranks_per_node: int, nodes: int, compressor: Compressor | None,
                itemsize: int, exact: int = 0) -> list[Phase]:
        """One call over the world, ``numel`` output values per rank (``traffic.py``);
        ``exact`` values per rank ride a compressor's all-to-all (``riders.py``)."""
        w = ranks_per_node * nodes
        if compressor is None:
            return [Phase("reduce_scatter", "world", w * numel * itemsize, numel * itemsize)]
        per_row = payload_bytes(compressor, numel, itemsize) + exact * itemsize
        return [exchange("world", w, per_row)] if w > 1 else []

    def check_saved_layout(self, layout: Any) -> None:
        """The saved layout is ``(world, S)``: the world size must match the topology's."""
        if self.topology is not None:
            self.refuse_layout({"world_size": layout[0]},
                               {"world_size": self.topology.world_size})


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, compressor: Compressor | None = None,
                   op: Any = dist.ReduceOp.SUM, group: dist.ProcessGroup | None = None,
                   topology: Topology | None = None, meter: WireMeter | None = None,
                   tag: str = "reduce_scatter") -> None:
    """One 1-hop reduce-scatter with a stateless compressor (see ``QuantizedReduceScatter``)."""
    stateless_only([compressor], "QuantizedReduceScatter")
    QuantizedReduceScatter(compressor, topology, meter, tag)(output, input, op, group)
