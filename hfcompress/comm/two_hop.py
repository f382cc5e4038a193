"""Quantized reduce-scatter as the 2-hop all-to-all (ZeRO++ B.3, E.3, F.1.2; SDP4Bit Alg. 3).

X ranks per node, Y nodes, rank ``n*X + l``. Row j of the ``[P, S]`` input goes to rank j.
The rows are ordered as ``[0, X, 2X, .., (Y-1)X, 1, X+1, ..]`` (ZeRO++ B.3.2, Eq. 2; taken
as strided views of the input, no reordered copy): local
rank l then receives, from every rank of its node, the Y rows ``{n*X + l}``, sums them (hop 1,
intra-node), and sends row ``n*X + l`` to rank ``n*X + l`` of node n (hop 2, inter-node),
where the final sum lands on its owner. Each hop has its own compressor (TLq: int8 intra,
int4 inter; None: the values in their own dtype). A hop over a group of one rank sends and
compresses nothing.

TLq-HS (SDP4Bit 3.3): when both hops are :class:`RotatedDomain` compressors of one size, each row is
rotated once, inside the first hop's compression (``compress_rows`` rotates in the quantize
kernel: the numbers of ``compress_rotated_rows(rotate_rows(.))``, no rotated copy of the
input), sums stay in the rotated domain (``reduce_rotated_rows``; the second hop sends them
with ``compress_rotated_rows``), and one inverse rotation follows the final sum (in one
chunk, fused into its decode-sum: ``reduce_rows``). A SUM into a float32 output is decoded
straight into it (no copy).

Memory: the intra-node hop sends row ``n*X + l`` to local rank l as the rows of an
``[X, Y * width]`` reordering of the input; over several nodes (Y > 1) that is a copy, built
and compressed in two halves of its rows (two calls, the numbers of one: row keys), so the
float32 transients of a call stay below ~1.5x its input (``tests/test_transients.py``),
whatever the world size; on one node it is a view of the input, compressed in one call that
writes the whole send buffer (no ``cat``). (With ``chunks`` > 1 TLq-HS rotates the whole
input first: one rotated copy more.)

``chunks`` > 1 splits the S columns into pipeline stages (ZeRO++ F.1.2, Alg. 2): the
inter-node hop of chunk c runs while the intra-node hop of chunk c+1 is in flight.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..compressors.base import Compressor, RotatedDomain, into
from ..kernels.launch_plans import LaunchPlans, signature
from ..kernels.packing import split_tail
from .hop import Exchange, RawCodec, compress_rows
from .one_rank import skips
from .reduce_scatter import (check_scatter_op, check_sizes, final_sum, post_kwargs, post_of,
                             result_target, summed_riders, write_result)
from .riders import check_exact, forwarded, rider_nbytes
from .streams import StreamOwner, Streams, stateless_only
from .topology import Topology
from .traffic import Phase, exchange, payload_bytes
from .wire_meter import WireMeter, peer_is_remote, rank_size

def slice_order(ranks_per_node: int, num_nodes: int) -> list[int]:
    """ZeRO++ B.3.2 Eq. 2: position ``l*Y + n`` holds row ``n*X + l``."""
    return [n * ranks_per_node + l for l in range(ranks_per_node) for n in range(num_nodes)]


def rotated_pair(intra: Compressor | None, inter: Compressor | None) -> bool:
    """Both hops quantize in one rotated domain (:class:`RotatedDomain` of the same
    ``hadamard_size``): the SDP4Bit 3.3 simplifications apply."""
    return isinstance(intra, RotatedDomain) and isinstance(inter, RotatedDomain) \
        and intra.hadamard_size == inter.hadamard_size


class TwoHopReduceScatter(StreamOwner):
    """Reduce-scatter over ``topology``'s world: intra-node hop, then inter-node hop."""

    #: the input may be ``[P, count, length]`` runs of one length equally spaced
    #: (``runs.view(spaced=True)``): read in place where a call is one hop whose scheme reads
    #: such rows (``Compressor.spaced_rows``), else copied to ``[P, S]`` rows first
    spaced_input = True

    def __init__(self, topology: Topology, intra: Compressor | None = None,
                 inter: Compressor | None = None, chunks: int = 1, meter: WireMeter | None = None,
                 tag: str = "reduce_scatter_2hop") -> None:
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks={chunks!r} must be a positive int (1: no pipelining)")
        self.topology, self.chunks, self.meter, self.tag = topology, chunks, meter, tag
        self.rotated = rotated_pair(intra, inter)
        self.streams = {"intra": Streams(intra or RawCodec()),
                        "inter": Streams(inter or RawCodec())}
        self.raw_inter = inter is None
        self._checked: dict = {}     # call signature -> its chunks' bounds (checked once)
        self._plans = LaunchPlans(self._plan)   # operand signatures -> :meth:`_plan`
        # the hops whose rows may be spaced runs (:attr:`spaced_input`): stateless schemes
        # that read them (``Compressor.spaced_rows``)
        self._spaced_hops = frozenset(hop for hop, s in self.streams.items()
                                      if not s.stateful and s.compressor.spaced_rows)
        # the hops whose one-hop calls are planned (:meth:`_plan`): stateless schemes;
        # plannable: the hop that may send alone (by the node layout) is one of them
        self._stateless_hops = frozenset(hop for hop, s in self.streams.items()
                                         if not s.stateful)
        self.plannable = ("intra" if topology.ranks_per_node > 1 else "inter") \
            in self._stateless_hops
        self._remote = {hop: peer_is_remote(g, topology) for hop, g in
                        (("intra", topology.intra_group), ("inter", topology.inter_group))
                        if g is not None}       # None: this rank alone, that hop never runs

    def __call__(self, output: torch.Tensor, input: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                 group: dist.ProcessGroup | None = None,
                 exact: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``group`` (optional, e.g. FSDP's) must span the topology's world. ``exact``:
        ``(values [P, E], out [E])``, columns reduced exactly on the same two hops (in the
        first pipeline chunk's exchanges, ``riders.py``)."""
        check_scatter_op(op)
        plan = self.planned(output, input, op, group, exact) if self.plannable else None
        if plan is not None:
            return plan(output, input, exact)
        p, x = self.topology.world_size, self.topology.ranks_per_node
        bounds = self._bounds(output, input, group, exact)
        s = output.numel()
        hop = self._one_hop(self._sending_hop(), len(bounds), s)
        spaced = input.dim() == 3 and hop in self._spaced_hops
        rows = input if spaced or input.shape == (p, s) else input.reshape(p, s)
        if hop is not None:
            return self._single(hop, output, rows, op, exact)
        # SDP4Bit 3.3: H once per row, in the first hop that compresses (the intra-node hop,
        # else the inter-node one); the sums stay in the rotated domain. Pipeline chunks cut
        # the rows: then the whole rows are rotated first, so that every Hadamard block is
        # the one the final inverse undoes.
        rotated_sums = self.rotated and (x > 1 or not skips(self.topology.num_nodes))
        if self.rotated and len(bounds) > 1:
            rows = self.streams["intra"].compressor.rotate_rows(rows)
        rotated_rows = self.rotated and len(bounds) > 1
        last, last1, riders = self._last_hop(output, op, exact, len(bounds), rotated_sums)
        riding = None if exact is None else exact[0]
        finish_exact = None if exact is None else \
            lambda values: final_sum(values, exact[1], op, p)
        hop1 = self._hop1(rows, bounds, 0, rotated_rows, riding, **last1) if bounds else None
        hop2, partial = [], None
        for c, (a, b) in enumerate(bounds):
            partial, riding = hop1()
            if c + 1 < len(bounds):
                hop1 = self._hop1(rows, bounds, c + 1, rotated_rows)
            hop2.append((a, b, self._hop2(partial, b - a, c, input.dtype,
                                          x > 1 or rotated_rows, riding=riding,
                                          finish_exact=finish_exact, riders=riders,
                                          **(dict(final=True) if last1 else last))))
        del rows, partial, hop1, riding   # the input's views: nothing of it is read from here
        if len(hop2) == 1:
            total = hop2[0][2]()
        else:
            total = torch.empty(s, dtype=torch.float32, device=input.device)
            for a, b, finish in hop2:
                total[a:b] = finish()
            if rotated_sums:  # one inverse after the final sum
                total = self.streams["inter"].compressor.rotate(total)
        if last.get("out") is None:
            write_result(output, total, op, p)

    def planned(self, output: torch.Tensor, input: torch.Tensor, op: Any,
                group: dist.ProcessGroup | None = None,
                exact: tuple[torch.Tensor, torch.Tensor] | None = None):
        """This call's plan (:meth:`_plan`), ``(output, input, exact) -> None`` for every call
        with operands of these signatures and ``op``'s step after the sum (``op`` checked
        by the caller: ``check_scatter_op``), or None (the call decides)."""
        alone = self._sending_hop()
        if alone not in self._stateless_hops:
            return None
        return self._plans((alone, signature(output), signature(input), group,
                            post_of(op, self.topology.world_size),
                            None if exact is None else (signature(exact[0]),
                                                        signature(exact[1]))),
                           alone, output, input, op, group, exact)

    def _bounds(self, output: torch.Tensor, input: torch.Tensor,
                group: dist.ProcessGroup | None,
                exact: tuple[torch.Tensor, torch.Tensor] | None) -> list[tuple[int, int]]:
        """The call's pipeline chunks' column bounds, its sizes checked once per signature."""
        key = (output.numel(), input.numel(), group,
               None if exact is None else (*exact[0].shape, exact[1].numel()))
        bounds = self._checked.get(key)
        if bounds is None:   # a new call signature: checked once
            bounds = self._checked[key] = self._check(output, input, group, exact)
        return bounds

    def _sending_hop(self) -> str | None:
        """The one hop that sends where only one does (``"intra"``: one node of several
        ranks; ``"inter"``: one rank per node, or a one-rank world run by ``one_rank.py``),
        else None."""
        x, alone = self.topology.ranks_per_node, self._alone()
        return "intra" if x > 1 and alone else "inter" if x == 1 and not alone else None

    def _one_hop(self, alone: str | None, chunks: int, s: int) -> str | None:
        """``alone`` (:meth:`_sending_hop`) where a call of ``chunks`` chunks of ``s`` values
        is that hop alone in one chunk, else None (two hops, pipeline chunks, or Hadamard
        blocks that straddle rows: the general path)."""
        if chunks != 1 or (self.rotated and s % self.streams["intra"].compressor.hadamard_size):
            return None
        return alone

    def _single(self, hop: str, output: torch.Tensor, rows: torch.Tensor, op: Any,
                exact: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The call as :meth:`_one_hop`'s hop alone, in straight-line code (the general
        path's numbers: its first hop rotates and compresses the rows, the decode-sum
        rotates back, divides for an AVG and writes the output; the riders ride and are
        summed there where the scheme can, else by ``final_sum``). ``rows``: ``[P, S]``, or
        spaced runs ``[P, count, length]`` where ``hop`` reads them."""
        p = self.topology.world_size
        target, post = result_target(output, op, p, hop in self._spaced_hops)
        streams = self.streams[hop]
        rider = None if exact is None else exact[0]
        send = compress_rows(streams, rows, _row_key, False, rider)
        group = self.topology.intra_group if hop == "intra" else self.topology.inter_group
        total, got = self._exchange(hop, send, 0, group, output.numel(), rows.dtype, target,
                                    self.rotated, rider, post,
                                    summed_riders(streams.compressor, exact, op, p))()
        if got is not None:
            final_sum(got, exact[1], op, p)
        if target is None:
            write_result(output, total, op, p)

    def _plan(self, hop: str, output: torch.Tensor, input: torch.Tensor, op: Any,
              group: dist.ProcessGroup | None,
              exact: tuple[torch.Tensor, torch.Tensor] | None):
        """A call that is ``hop`` alone (:meth:`_one_hop`) of a stateless scheme, for operands
        of these signatures, checked and decided once (a unit's host time):
        ``(output, input, exact) -> None`` running the compressor's planned row compression
        (``Compressor.planned_compress_rows``: its row keys and kernel launch), the
        exchange (``hop.Exchange``) and the planned decode-sum into the output (riders
        summed by it), :meth:`_single`'s numbers; None where the call decides more (pipeline
        chunks, blocks across rows, an output no kernel writes, riders summed after)."""
        p, s = self.topology.world_size, output.numel()
        if self._one_hop(hop, len(self._bounds(output, input, group, exact)), s) is None:
            return None
        c = self.streams[hop].compressor
        # rows as the call takes them (spaced runs where the hop reads them, else [P, S])
        reshape = not (input.dim() == 3 and hop in self._spaced_hops or input.shape == (p, s))
        rows = input.reshape(p, s) if reshape else input
        target, post = result_target(output, op, p, hop in self._spaced_hops)
        riders = summed_riders(c, exact, op, p)
        if target is None or (exact is not None and not riders):
            return None
        rider_sum = riders["riders"][1:] if riders else None
        encode = c.planned_compress_rows(rows, None if exact is None else exact[0])
        decode = c.planned_reduce_rows((output.numel(),), rows.dtype, target, post, rider_sum)
        # the kernels write the output (and the riders' output) flat, as result_target viewed it
        flat = target is not output
        flat_riders = bool(riders) and riders["riders"][0] is not exact[1]
        group = self.topology.intra_group if hop == "intra" else self.topology.inter_group
        remote = self._remote[hop]

        def run(output: torch.Tensor, input: torch.Tensor,
                exact: tuple[torch.Tensor, torch.Tensor] | None) -> None:
            send = encode(input.reshape(p, s) if reshape else input,
                          None if exact is None else exact[0])
            recv = Exchange(send, group, self.meter, self.tag, remote, async_op=True).take()
            decode(recv, output.view(-1) if flat else output, None if exact is None else
                   exact[1].view(-1) if flat_riders else exact[1])
        return run

    def _last_hop(self, output: torch.Tensor, op: Any,
                  exact: tuple[torch.Tensor, torch.Tensor] | None, chunks: int,
                  rotated_sums: bool) -> tuple[dict, dict, dict]:
        """What the last hop's decode-sum does, as keywords: of the inter-node hop (one
        chunk: its decode-sum is the result, rotated back in the same kernel, sum_i H g_i =
        H sum_i g_i, divided for an AVG, multiplied for a PREMUL_SUM, written straight into
        the output), of the intra-node hop (on one node it is the last one, likewise), and
        the inter-node hop's riders' sum (the exact values summed into their output by the
        decode-sum where its scheme can, :func:`reduce_scatter.summed_riders`; else
        ``final_sum``)."""
        p, x = self.topology.world_size, self.topology.ranks_per_node
        target, post = result_target(output, op, p)
        last = dict(out=target, inverse=rotated_sums, post=post) if chunks == 1 else {}
        if last and x > 1 and self._alone():
            return last, dict(last, riders=summed_riders(self.streams["intra"].compressor,
                                                         exact, op, p)), {}
        riders = {} if self._alone() else \
            summed_riders(self.streams["inter"].compressor, exact, op, p)
        return last, {}, riders

    def _check(self, output: torch.Tensor, input: torch.Tensor,
               group: dist.ProcessGroup | None,
               exact: tuple[torch.Tensor, torch.Tensor] | None) -> list[tuple[int, int]]:
        """The checks of a call signature (sizes, group, exact columns, the streams' layout);
        its pipeline chunks' column bounds."""
        p, x = self.topology.world_size, self.topology.ranks_per_node
        if group is not None and rank_size(group)[1] != p:
            raise ValueError(f"reduce_scatter_2hop runs over the topology's {p} ranks; got a "
                             f"group of {dist.get_world_size(group)}")
        s = check_sizes("reduce_scatter_2hop", output, input, p)
        check_exact(exact, p)
        bounds = _chunk_bounds(s, self.chunks)
        for name in self.streams:
            self.streams[name].check_layout((p, x, s, len(bounds)))
        return bounds

    @staticmethod
    def traffic(numel: int, ranks_per_node: int, nodes: int, intra: Compressor | None,
                inter: Compressor | None, itemsize: int, chunks: int = 1,
                exact: int = 0) -> list[Phase]:
        """One call, ``numel`` output values per rank (``traffic.py``): per chunk, the
        intra-node all-to-all of X rows of Y chunk widths, then the inter-node one of Y
        rows (None: the input's dtype); ``exact`` values per rank ride the first chunk's
        hops (``riders.py``)."""
        x, y = ranks_per_node, nodes
        phases = []
        for c, (a, b) in enumerate(_chunk_bounds(numel, chunks)):
            e = exact * itemsize if c == 0 else 0
            if x > 1:
                phases.append(exchange("intra", x,
                                       payload_bytes(intra, y * (b - a), itemsize) + y * e))
            if y > 1:
                phases.append(exchange("inter", y, payload_bytes(inter, b - a, itemsize) + e))
        return phases

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._checked.clear()    # the loaded streams' layout is checked at the next call

    def check_saved_layout(self, layout: Any) -> None:
        """The saved layout is ``(P, X, S, chunks)``: P and X must match the topology's."""
        self.refuse_layout({"world_size": layout[0], "ranks_per_node": layout[1]},
                           {"world_size": self.topology.world_size,
                            "ranks_per_node": self.topology.ranks_per_node})

    def _alone(self) -> bool:
        """One node: the inter-node hop sends nothing (one_rank.py runs it over a one-rank
        world)."""
        return skips(self.topology.num_nodes) or self.topology.inter_group is None

    def _hop1(self, rows: torch.Tensor, bounds: list[tuple[int, int]], c: int,
              rotated_rows: bool, exact: torch.Tensor | None = None,
              out: torch.Tensor | None = None, inverse: bool = False,
              post: tuple[str, float] | None = None, riders: dict | None = None):
        """Start the intra-node all-to-all of chunk c; returns a function giving the node's
        partial sums of this local rank's Y rows, flat ``(Y * width,)`` (rotated for TLq-HS;
        ``rotated_rows``: ``rows`` are rotated already; ``inverse``: rotated back in the
        decode-sum, on one node; ``out``: written there, ``post`` applied), and the
        ``[k, Y, E]`` exact values to sum for them (``exact``, ``[P, E]``, rides along; else
        None; with no intra-node hop ``exact`` itself, the one contribution ``[Y, E]``; None
        where ``riders``, :func:`reduce_scatter.summed_riders`' keyword, had the decode-sum
        sum them into the result).
        Local rank l gets rows ``l, X + l, ..`` (positions ``l*Y ..`` of
        :func:`slice_order`): row l of the ``[X, Y * width]`` reordering of the chunk's
        columns, over several nodes built half of its rows at a time (module docstring,
        "Memory")."""
        x, y = self.topology.ranks_per_node, self.topology.num_nodes
        a, b = bounds[c]
        if x == 1:   # no intra-node hop: this rank's rows as they are (not rotated yet)
            part = rows if (a, b) == (0, rows.shape[1]) else rows[:, a:b]
            return lambda: (part, exact)
        width = b - a
        order = rows[:, a:b].reshape(y, x, width).transpose(0, 1)   # a view, [X, Y, width]
        streams, half = self.streams["intra"], (x + 1) // 2
        # local rank l's exact values: rows l, X + l, .. side by side
        rider = None if exact is None else \
            exact.reshape(y, x, -1).transpose(0, 1).reshape(x, -1)

        def send(lo: int, hi: int) -> torch.Tensor:
            key = lambda k: (lo + k, c)   # noqa: E731
            part, tail = order[lo:hi], None if rider is None else rider[lo:hi]
            if rotated_rows:
                return compress_rows(streams, part.reshape(hi - lo, y * width), key, True, tail)
            if self.rotated and width % streams.compressor.hadamard_size:
                # Hadamard blocks must not straddle two input rows: rotate them as rows first
                part = streams.compressor.rotate_rows(part.reshape(-1, width))
                return compress_rows(streams, part.view(hi - lo, y * width), key, True, tail)
            return compress_rows(streams, part.reshape(hi - lo, y * width), key, False, tail)
        # one node: the reordering is a view (no float32 transient), one call writes the wire
        wire = send(0, x) if y == 1 else torch.cat([send(0, half), send(half, x)])
        finish = self._exchange("intra", wire, c, self.topology.intra_group, y * width,
                                rows.dtype, out, inverse, rider, post, riders)

        def partial() -> tuple[torch.Tensor, torch.Tensor | None]:
            total, got = finish()
            return total, None if got is None else got.view(x, y, -1)
        return partial

    def _hop2(self, partial: torch.Tensor, width: int, c: int, dtype: torch.dtype,
              rotated_partial: bool, out: torch.Tensor | None = None, inverse: bool = False,
              riding: torch.Tensor | None = None, finish_exact=None,
              post: tuple[str, float] | None = None, final: bool = False,
              riders: dict | None = None):
        """Start the inter-node all-to-all of chunk c; returns a function giving its sum.
        ``partial`` is the intra-node hop's float32 sum, or with no intra-node hop this
        rank's ``[Y, width]`` rows of the input; for TLq-HS ``rotated_partial`` says whether
        it is in the rotated domain already (else the quantize kernel rotates it).
        ``inverse``: the sum rotated back (TLq-HS's final H); ``out``: written there, ``post``
        applied (a reduce op's AVG / PREMUL_SUM, ``kernels/post_op.py``); ``final``: one
        node, ``partial`` is the result hop 1 wrote into the output (returned as it is).
        ``riding``: ``[k, Y, E]`` exact values, summed over k (and over the nodes once
        exchanged) and handed to ``finish_exact``, or summed by the decode-sum with
        ``riders`` (:func:`reduce_scatter.summed_riders`' keyword); 2-D ``[Y, E]``: one
        contribution."""
        if self.raw_inter:  # compression off sends the input's dtype, as torch's collective
            partial = partial.to(dtype)
        shape = (self.topology.num_nodes, width)
        parts = partial if partial.shape == shape else partial.reshape(shape)
        if self._alone():   # one node: nothing to send
            rotate = self.streams["inter"].compressor.rotate if inverse else \
                (lambda t: t) if final else torch.Tensor.float

            def alone() -> torch.Tensor:
                if riding is not None:
                    finish_exact(riding if riding.dim() == 2 else riding[:, 0])
                return into(rotate(parts[0]), out, post)
            return alone
        # TLq-HS: the sums are rotated already; rows of the input are rotated in the kernel
        rider = None if riding is None else forwarded(riding)
        send = compress_rows(self.streams["inter"], parts, lambda k: (k, c),
                             self.rotated and rotated_partial, rider)
        finish = self._exchange("inter", send, c, self.topology.inter_group, width,
                                parts.dtype, out, inverse, rider, post, riders)

        def total() -> torch.Tensor:
            result, got = finish()
            if got is not None:
                finish_exact(got)
            return result
        return total

    def _exchange(self, hop: str, send: torch.Tensor, c: int, group: dist.ProcessGroup,
                  width: int, dtype: torch.dtype, out: torch.Tensor | None = None,
                  inverse: bool = False, rider: torch.Tensor | None = None,
                  post: tuple[str, float] | None = None, riders: dict | None = None):
        """Row k of the uint8 ``send`` (one compressed part per peer, then row k of
        ``rider``, exact values, if given) to group rank k; returns a function giving the
        float32 sum of the ``width`` values received per row (in the rotated domain for
        TLq-HS unless ``inverse``), or ``out`` holding it with ``post`` applied (then in its
        dtype, the final result), and the received exact rows (or None: none rode, or
        ``riders`` (:func:`reduce_scatter.summed_riders`' keyword) had the decode-sum sum
        them)."""
        ex = Exchange(send, group, self.meter, self.tag, self._remote[hop], async_op=True)
        recv = self.streams[hop][("recv", c)]
        reduce = recv.reduce_rotated_rows if self.rotated and not inverse else recv.reduce_rows
        nbytes = send.shape[1] - rider_nbytes(rider)
        riders = riders if rider is not None and riders else {}
        rider_dtype = None if rider is None or riders else rider.dtype
        posted = post_kwargs(post)

        def finish() -> tuple[torch.Tensor, torch.Tensor | None]:
            got, values = split_tail(ex.take(), nbytes, rider_dtype)
            total = reduce(got, (width,), dtype, out=out, **posted, **riders)
            if out is not None:
                return total, values
            return (total if total.dim() == 1 else total.reshape(-1)).float(), values
        return finish


def _row_key(k: int) -> tuple[int, int]:
    """The stream key of row k of a one-chunk hop (stateful schemes: one per peer)."""
    return (k, 0)


def _chunk_bounds(s: int, chunks: int) -> list[tuple[int, int]]:
    """Column ranges of at most ``chunks`` non-empty, near-equal pipeline chunks."""
    n = min(chunks, s)
    edges = [s * i // n for i in range(n + 1)] if n else []
    return list(zip(edges[:-1], edges[1:]))


def reduce_scatter_2hop(output: torch.Tensor, input: torch.Tensor, topology: Topology,
                        intra: Compressor | None = None, inter: Compressor | None = None,
                        op: Any = dist.ReduceOp.SUM, chunks: int = 1,
                        meter: WireMeter | None = None, tag: str = "reduce_scatter_2hop") -> None:
    """One 2-hop reduce-scatter with stateless compressors (see ``TwoHopReduceScatter``)."""
    stateless_only([intra, inter], "TwoHopReduceScatter")
    TwoHopReduceScatter(topology, intra, inter, chunks, meter, tag)(output, input, op)
