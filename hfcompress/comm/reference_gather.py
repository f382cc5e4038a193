"""qWD all-gather with node-sharded references (SDP4Bit Alg. 2; the memory layout is ours).

SDP4Bit keeps the reference w~ (the last gathered weights) of the whole tensor on every rank,
which Megatron holds anyway (SDP4Bit 3.3, "Optimizing Memory Efficiency for Weight
Differences Computation"); under FSDP2 / ZeRO-3 it would be a full copy of every unit per
rank. Here, with X ranks per node and Y nodes (rank ``n*X + l``), rank (n, l) keeps the
references of the Y slots ``m*X + l`` only (its inter-node group's shards: 1/X of each unit):

1. inter-node all-gather, among the ranks with local index l, of the compressed differences
   ``inner(w - w~)`` of their own shards (the first call: the exact values, in their dtype);
2. every rank rebuilds its Y slots with one batched decode (``decompress_rows``): the same
   bytes and the same arithmetic on every holder, so all copies stay bit-identical, and each
   slot equals what the full-reference design computes;
3. intra-node all-gather of the rebuilt slots in the weights' dtype (the fast links) into
   FSDP's rank-major output.

Per rank: references of ``1/X`` of the unit (instead of all of it), plus transient buffers of
the output's size. X = 1 (one rank per node, or ``shard_references=False``) is SDP4Bit's
layout: every rank holds every slot and step 3 is a local copy. The node-sharded layout is
used when the all-gather group is the topology's group (the world, or a data-parallel
sub-group beside TP: then X is that group's ranks per node, and X = 1 holds every slot);
another group (e.g. hpZ's) falls back to the full layout over that group.

``unchanged=True`` (a host-side fact every rank agrees on: no optimizer step since the last
all-gather, FSDP's backward all-gather) skips steps 1-2: what zero differences would rebuild
is the reference itself (Alg. 2 with no step in between). Only step 3 runs: no inter-node
traffic.

``async_op=True`` (``futures.py``): on CPU with X > 1, steps 1-2 run before the call returns
(step 3 gathers their result, and every collective is launched from the caller's thread);
step 3's intra-node all-gather and the copy into the output complete in the returned
future. With X = 1 (step 3 is a copy) and for the backward all-gather (``unchanged``: step 3
alone) all of it completes in the future.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..compressors.base import ReferenceCoded
from ..compressors.runs import Runs, put, view
from ..kernels.launch_plans import LaunchPlans, signature
from ..kernels.packing import split_tail
from .hop import all_gather_single
from .futures import finish, overlaps
from .one_rank import skips
from .riders import as_row, put_values, rider_nbytes
from .topology import Topology
from .traffic import Phase, gather, payload_bytes
from .wire_meter import WireMeter, peer_is_remote, sends

if TYPE_CHECKING:
    from .frozen import SentBytes


def place_slots(out: torch.Tensor, columns: Runs | None, slots: torch.Tensor) -> None:
    """``out <- slots`` (the same values; ``out`` may be shaped otherwise, e.g. the frozen
    path's flat buffer), or into the ``columns`` runs of ``out``'s last dim."""
    if columns is None:
        out.copy_(slots.view(out.shape) if slots.is_contiguous() else slots)
    else:
        put(out, columns, slots)


def _placed_view(out: torch.Tensor, columns: Runs | None, y: int, s: int
                 ) -> torch.Tensor | None:
    """Where :func:`place_slots` would write the ``[y, s]`` slots, as a view of ``out`` (its
    ``columns`` one run, or runs of one length equally spaced: ``[y, count, length]``,
    which the decode kernel writes in place), else None."""
    if columns is None:
        return out.view(y, s) if out.is_contiguous() and out.numel() == y * s else None
    return view(out, columns, spaced=True) if columns else None


def _slot_rows(out: torch.Tensor, columns: Runs | None, s: int, y: int, x: int,
               exact: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor | None:
    """``out`` as its ``[x, W]`` rank rows where a rank's step-3 slot (its ``s`` rebuilt
    reference values, then the exact values riding, ``exact[1]`` the output's columns
    after them) is exactly its row: one node (``y == 1``), a contiguous output whose
    compressed columns come first. Else None (the slots are gathered, then placed)."""
    if y != 1 or not out.is_contiguous() or columns not in (None, ((0, s),)):
        return None
    rows = out.view(x, -1)
    if exact is None:
        return rows if rows.shape[1] == s else None
    tail, target = rows[:, s:], exact[1]
    same = (target.shape == tail.shape and target.stride() == tail.stride()
            and target.data_ptr() == tail.data_ptr())
    return rows if same else None


def _row_targets(mine: torch.Tensor | None, s: int,
                 exact: tuple[torch.Tensor, torch.Tensor] | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Where the step-1 decode writes the rebuilt references and the exact values riding,
    besides the references: this rank's row of the output where it is its step-3 slot
    (``mine``, :func:`_slot_rows`' row; no copy of them after), else nowhere."""
    if mine is None:
        return None, None
    return mine[:s].view(1, s), None if exact is None else mine[s:].view(1, -1)


@dataclass(frozen=True)
class Route:
    """How one all-gather group is served: ``rows`` slots held per rank (the ranks of
    ``inter``), shared with ``ranks_per_node`` ranks over ``intra`` (None: nobody)."""

    world: int
    ranks_per_node: int
    rows: int
    row: int                    # this rank's index in ``inter`` (= its node when sharded)
    local: int                  # this rank's index in ``intra``
    inter: dist.ProcessGroup | None       # None: one node (this rank alone holds its slots)
    intra: dist.ProcessGroup | None
    inter_remote: tuple[bool, ...]
    intra_remote: tuple[bool, ...]

    def slots(self) -> list[int]:
        """The output slots (= group ranks) whose references this rank holds."""
        return [m * self.ranks_per_node + self.local for m in range(self.rows)]

    def describe(self) -> str:
        return f"world_size={self.world}, ranks_per_node={self.ranks_per_node}"


class ShardedReferences:
    """The qWD stream of one all-gather: the references of this rank's slots."""

    def __init__(self, compressor: ReferenceCoded, topology: Topology | None,
                 shard: bool = True) -> None:
        self.qwd = compressor.fresh()
        self.topology, self.shard = topology, shard
        self.layout: tuple[int, int, int] | None = None      # (world, ranks_per_node, numel)
        self._routes: dict[Any, Route] = {}
        self._used: Route | None = None
        self._plans = LaunchPlans(self._plan)   # operand signatures -> :meth:`_plan`

    # -- routing --------------------------------------------------------------------------
    def route(self, group: dist.ProcessGroup) -> Route:
        r = self._routes.get(group)
        if r is None:
            r = self._routes[group] = self._make_route(group)
        return r

    def _make_route(self, group: dist.ProcessGroup) -> Route:
        topo = self.topology
        world, me = dist.get_world_size(group), dist.get_rank(group)
        full_world = topo is not None and \
            tuple(dist.get_process_group_ranks(group)) == tuple(topo.ranks)
        if self.shard and full_world and topo.ranks_per_node > 1:
            inter = topo.inter_group        # None on one node: step 1 sends nothing
            return Route(world, topo.ranks_per_node, topo.num_nodes, topo.node, topo.local_rank,
                         inter, topo.intra_group,
                         tuple(peer_is_remote(inter, topo)) if inter is not None else (False,),
                         tuple(peer_is_remote(topo.intra_group, topo)))
        return Route(world, 1, world, me, 0, group, None,
                     tuple(peer_is_remote(group, topo)), (False,))

    # -- the collective -------------------------------------------------------------------
    def sends_differences(self, unchanged: bool) -> bool:
        """Whether a call (without ``sent``) runs step 1: exact columns can ride it."""
        return self.qwd.reference is None or not unchanged

    def __call__(self, out: torch.Tensor, slot: torch.Tensor, group: dist.ProcessGroup,
                 unchanged: bool, meter: WireMeter | None, tag: str,
                 async_op: bool = False, sent: SentBytes | None = None,
                 exact: tuple[torch.Tensor, torch.Tensor] | None = None,
                 columns: Runs | None = None) -> torch.futures.Future | None:
        """``slot``: this rank's S values (flat, or equally spaced runs read in place); ``sent``:
        only those payload bytes cross nodes (``frozen.py``); ``exact``: ``(values [E], out
        [world, E])``, gathered exactly in steps 1 and 3 (where :meth:`sends_differences`);
        ``columns``: ``out`` is ``[world, S]`` rows of a larger buffer, slots to these runs."""
        plan = None if sent is not None or unchanged else \
            self.planned(out, slot, group, async_op, exact, columns)
        if plan is not None:
            return plan(out, slot, meter, tag, exact)
        return self._gather(out, slot, group, unchanged, meter, tag, async_op, sent, exact,
                            columns)

    def planned(self, out: torch.Tensor, slot: torch.Tensor, group: dist.ProcessGroup,
                async_op: bool = False,
                exact: tuple[torch.Tensor, torch.Tensor] | None = None,
                columns: Runs | None = None):
        """The plan (:meth:`_plan`) of a call that sends differences (``unchanged`` False, no
        ``sent``: the caller's) with operands of these signatures, ``(out, slot, meter, tag,
        exact) -> None`` for every such call while the reference keeps its signature; None
        (the call decides)."""
        if self.qwd.reference is None:    # the first, exact, gather
            return None
        return self._plans((signature(out), signature(slot), group, columns,
                            None if exact is None else (signature(exact[0]),
                                                        signature(exact[1])),
                            signature(self.qwd.reference), async_op,
                            skips(1)),     # the one-rank switch (one_rank.py)
                           out, slot, group, async_op, exact, columns)

    def _gather(self, out: torch.Tensor, slot: torch.Tensor, group: dist.ProcessGroup,
                unchanged: bool, meter: WireMeter | None, tag: str, async_op: bool,
                sent: SentBytes | None, exact: tuple[torch.Tensor, torch.Tensor] | None,
                columns: Runs | None) -> torch.futures.Future | None:
        """:meth:`__call__` deciding at the call (steps 1-3 as the call needs them)."""
        route = self._used = self.route(group)
        s, y, x = slot.numel(), route.rows, route.ranks_per_node
        self._check_layout((route.world, x, s))
        intra_bytes = inter_bytes = 0
        launch, work, rebuild, values = overlaps(out.device, async_op) and x == 1, None, None, None
        sent = None if self.qwd.reference is None else sent    # the first gather is exact
        if self._step1(unchanged, sent, exact):
            riding = None if exact is None else as_row(exact[0])
            exchanged = y > 1 or not skips(y)   # then the values ride the row the kernel writes
            row = self.qwd.wire_slot(slot, route.row, y, riding if exchanged else None)
            if sent is not None:
                row = sent.select(row.view(-1)).view(1, -1)
            n = row.shape[1] - rider_nbytes(riding if exchanged else None)
            if exchanged:
                wire = torch.empty(y, row.shape[1], dtype=torch.uint8, device=row.device)
                work = all_gather_single(wire, row, group=route.inter, async_op=launch)
            else:   # this rank alone holds its slot: nothing to send
                wire = row

            def rebuild(also: torch.Tensor | None = None,
                        riders: torch.Tensor | None = None) -> None:
                nonlocal values   # ``riders``: where the decode copies the exact values
                rows = wire
                if not exchanged or riding is None:
                    values, riders = riding, None
                elif riders is None:
                    rows, values = split_tail(wire, n, riding.dtype)
                self.qwd.decompress_rows(rows if sent is None else sent.expand(rows), s,
                                         slot.dtype, also, riders)
            intra_bytes, inter_bytes = sends(row.shape[1], route.inter_remote, route.row)

        def record(intra: int, inter: int) -> None:    # step 1's bytes and step 3's, one call
            if meter is not None:
                meter.record(tag, intra_bytes + intra, inter_bytes + inter)
        if x == 1:   # no intra-node step: the rebuilt references are the output
            record(0, 0)
            slots = _placed_view(out, columns, y, s)

            def rebuild_and_copy() -> None:
                if rebuild is not None:   # the decode writes the output's slots too
                    rebuild(slots, None if exact is None else exact[1])
                if rebuild is None or slots is None:
                    place_slots(out, columns, self.qwd.reference.view(y, s))
                if values is not None:
                    put_values(exact[1], values)
            return finish(work, rebuild_and_copy, async_op, out.device)
        rows = _slot_rows(out, columns, s, y, x, exact)
        mine = rows[route.local] if rebuild is not None and rows is not None else None
        if rebuild is not None:   # step 3 gathers the rebuilt references: rebuild first
            rebuild(*_row_targets(mine, s, exact))
        return self._in_node(route, out, s, values, exact, columns, async_op, record, rows, mine)

    def _plan(self, out: torch.Tensor, slot: torch.Tensor, group: dist.ProcessGroup,
              async_op: bool, exact: tuple[torch.Tensor, torch.Tensor] | None,
              columns: Runs | None):
        """A call that sends differences (a reference held, nothing unchanged, no frozen
        columns, not ``async_op``) for operands of these signatures, decided once (a unit's
        host time): ``(out, slot, meter, tag, exact) -> None`` running qWD's planned wire
        row (``planned_wire_slot``: its noise keys and kernel launch, the exact values
        riding), the all-gather, the meter's record and the planned decode into the
        output's slots (``planned_decompress_rows``: riders copied by it). None where
        :meth:`_gather` decides more: several ranks per node (step 3), this rank alone
        (nothing sent), ``async_op`` (a future to make, or an error: ``futures.finish``),
        slots that are not one view of the output."""
        route = self.route(group)
        s, y = slot.numel(), route.rows
        self._check_layout((route.world, route.ranks_per_node, s))
        if route.ranks_per_node != 1 or (y == 1 and skips(y)) or async_op \
                or _placed_view(out, columns, y, s) is None:
            return None
        riding = None if exact is None else as_row(exact[0])
        wire_slot = self.qwd.planned_wire_slot(slot, route.row, y, riding)
        decode = self.qwd.planned_decompress_rows(s, slot.dtype)

        def run(out: torch.Tensor, slot: torch.Tensor, meter: WireMeter | None, tag: str,
                exact: tuple[torch.Tensor, torch.Tensor] | None):
            self._used = route
            row = wire_slot(slot, None if exact is None else as_row(exact[0]))
            wire = torch.empty(y, row.shape[1], dtype=torch.uint8, device=row.device)
            all_gather_single(wire, row, group=route.inter)
            if meter is not None:
                meter.record_sends(tag, row.shape[1], route.inter_remote, route.row)
            decode(wire, _placed_view(out, columns, y, s), None if exact is None else exact[1])
        return run

    def _step1(self, unchanged: bool, sent: SentBytes | None,
               exact: tuple[torch.Tensor, torch.Tensor] | None) -> bool:
        """Whether a call sends differences (step 1; ``sent`` None on the first, exact,
        gather); exact columns ride only it, and not with ``sent``."""
        step1 = self.qwd.reference is None or not (unchanged or (sent is not None
                                                                 and not sent.count))
        if exact is not None and (not step1 or sent is not None):
            raise ValueError("qwd: exact columns ride step 1 only (sends_differences(), no "
                             "frozen columns)")
        return step1

    def _in_node(self, route: Route, out: torch.Tensor, s: int, values: torch.Tensor | None,
                 exact: tuple[torch.Tensor, torch.Tensor] | None, columns: Runs | None,
                 async_op: bool, record, rows: torch.Tensor | None,
                 placed: torch.Tensor | None) -> torch.futures.Future | None:
        """Step 3: the intra-node gather of the Y rebuilt slots (each followed by its exact
        ``values``, if riding and not copied by the decode) into the rank-major output;
        ``rows``: :func:`_slot_rows`' (``placed``: this rank's row of them, holding its
        rebuilt references already); ``record(intra, inter)`` meters the call with its
        bytes."""
        x, y, ref = route.ranks_per_node, route.rows, self.qwd.reference
        if rows is not None:    # one node, each slot its row of the output: gathered there
            mine = rows[route.local] if placed is None else placed
            if placed is None:
                mine[:s].copy_(ref)
            if values is not None:
                put_values(mine[s:], values.view(-1))
            record(*sends(mine.numel() * ref.element_size(), route.intra_remote, route.local))
            work = all_gather_single(rows.view(-1), mine, group=route.intra,
                                     async_op=overlaps(out.device, async_op))
            return finish(work, None, async_op, out.device)
        slots = ref.view(y, s) if values is None else torch.cat([ref.view(y, s), values], 1)
        width = slots.shape[1]
        record(*sends(y * width * ref.element_size(), route.intra_remote, route.local))
        gathered = torch.empty(x, y, width, dtype=ref.dtype, device=ref.device)
        work = all_gather_single(gathered.view(-1), slots.reshape(-1), group=route.intra,
                                 async_op=overlaps(out.device, async_op))

        def place() -> None:
            # gathered is [local, node, s]; the output is rank-major [node, local, s]
            place_slots(out.view(y, x, -1), columns, gathered[:, :, :s].transpose(0, 1))
            if values is not None:
                exact[1].view(y, x, -1).copy_(gathered[:, :, s:].transpose(0, 1))
        return finish(work, place, async_op, out.device)

    @staticmethod
    def rows(world: int, ranks_per_node: int, shard: bool = True) -> int:
        """Slots whose references each rank holds and decodes: the Y = world / X of its
        inter-node group when node-sharded with X > 1, else all ``world``."""
        return world // ranks_per_node if shard and ranks_per_node > 1 else world

    @staticmethod
    def traffic(numel: int, ranks_per_node: int, nodes: int, compressor: ReferenceCoded,
                itemsize: int, unchanged: bool = False, exact: int = 0) -> list[Phase]:
        """One call after the first (exact) one over the world, node-sharded (``traffic.py``):
        step 1, the inter-node gather of the coded differences (not when ``unchanged``), and
        with X > 1 step 3, the intra-node gather of the Y rebuilt slots; ``exact`` values
        per slot ride both (``riders.py``; not with ``unchanged``, which has no step 1)."""
        x, y = ranks_per_node, nodes
        e = 0 if unchanged else exact
        phases = []
        if not unchanged and y > 1:     # X = 1: the Y = W ranks hold every slot
            phases.append(gather("inter", payload_bytes(compressor.steady(), numel, itemsize)
                                 + e * itemsize))
        if x > 1:
            phases.append(gather("intra", y * (numel + e) * itemsize))
        return phases

    @property
    def numel(self) -> int | None:
        """Values per slot the references were built for (None: no all-gather yet)."""
        return None if self.layout is None else self.layout[2]

    def restart(self) -> None:
        """The next all-gather is exact and sets every reference to the weights, for the
        columns it is then given (their number may change: ``comm/frozen.py``)."""
        self.qwd.reset_reference()
        self.layout = None

    def _check_layout(self, layout: tuple[int, int, int]) -> None:
        if self.layout is not None and self.layout != layout:
            raise ValueError(f"qwd keeps references built for (world, ranks_per_node, numel) = "
                             f"{self.layout}; got {layout}. Use one all-gather object per "
                             f"tensor and process group.")
        self.layout = layout

    # -- state ----------------------------------------------------------------------------
    def _default_route(self) -> Route:
        group = self.topology.group if self.topology is not None else dist.group.WORLD
        return self.route(group)

    def state_bytes(self) -> dict[str, int]:
        return self.qwd.state_bytes()

    def state_dict(self) -> dict[str, Any]:
        """This rank's slots only. Every node holds one copy of each slot (the ranks of an
        inter-node group hold the same rows): each rank saves its own, as it loads its own."""
        r = self._used or self._default_route()
        return {"layout": {"world_size": r.world, "ranks_per_node": r.ranks_per_node,
                           "numel": self.numel,
                           "slots": r.slots()},
                "qwd": self.qwd.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["layout"]
        r = self._default_route()
        here = {"world_size": r.world, "ranks_per_node": r.ranks_per_node, "slots": r.slots()}
        if any(saved[k] != v for k, v in here.items()):
            raise ValueError(
                f"qwd references were saved with world_size={saved['world_size']}, "
                f"ranks_per_node={saved['ranks_per_node']} (this rank held slots "
                f"{saved['slots']}); this run has {r.describe()} (slots {here['slots']}). "
                f"Resume with the same number of ranks and nodes, or drop the hfcompress "
                f"state from the checkpoint to start the references afresh")
        self.qwd.load_state_dict(state["qwd"])
        self._used = r
        numel = saved["numel"]
        self.layout = None if numel is None else (r.world, r.ranks_per_node, numel)
