"""The node layout of data-parallel groups inside N-D meshes (``comm/topology.group_layout``,
a pure function: no processes), at the layouts of SDP4Bit Table 2: DP ranks per node
x = 1, 2, 4, 8 with 1-8 DP groups per node (tensor / context parallelism of k = tp * cp
consecutive ranks inside each node), the intra-/inter-node subgroups built for them
(``comm/topology.subgroups_to_build``: none of one rank), and what the collectives declare
on them."""

from __future__ import annotations

import pytest

from hfcompress.comm.all_gather import QuantizedAllGather
from hfcompress.comm.reduce_scatter import QuantizedReduceScatter
from hfcompress.comm.reference_gather import ShardedReferences
from hfcompress.comm.topology import group_layout, subgroups_to_build
from hfcompress.comm.traffic import sent
from hfcompress.comm.two_hop import TwoHopReduceScatter, slice_order
from hfcompress.compressors import get_compressor
from hfcompress.cost.units import hpz_reshard

S = 4096


def dp_groups(nodes: int, per_node: int, k: int) -> list[list[int]]:
    """The DP groups of a ``(dp, tp)`` mesh over ``nodes`` x ``per_node`` ranks with TP of
    ``k`` consecutive ranks innermost: group g holds ranks ``g, g + k, g + 2k, ..``."""
    world = nodes * per_node
    return [list(range(g, world, k)) for g in range(k)]


# (x DP ranks per node, k groups per node): Table 2's TP = 8 / x on 8-GPU nodes, and more
LAYOUTS = [(x, k) for x in (1, 2, 4, 8) for k in (1, 2, 4, 8)]


@pytest.mark.parametrize("nodes", [1, 2, 4, 16])
@pytest.mark.parametrize("x,k", LAYOUTS)
def test_layout_of_every_dp_group(x, k, nodes):
    per_node = x * k
    groups = dp_groups(nodes, per_node, k)
    assert len(groups) == k
    seen_intra, seen_inter = [], []
    for ranks in groups:
        lay = group_layout(ranks, per_node)
        assert (lay.ranks_per_node, lay.num_nodes) == (x, nodes)
        assert lay.nodes == tuple(range(nodes))
        for i, r in enumerate(ranks):      # group rank i: node i // x, local index i % x
            assert r // per_node == lay.nodes[i // x]
        intra, inter = lay.intra(), lay.inter()
        assert len(intra) == nodes and len(inter) == x
        for n, members in enumerate(intra):        # one node, x ranks of this group
            assert len(members) == x and {r // per_node for r in members} == {n}
        for members in inter:                      # one rank on every node
            assert [r // per_node for r in members] == list(range(nodes))
        assert sorted(r for m in intra for r in m) == ranks
        assert sorted(r for m in inter for r in m) == ranks
        seen_intra += [tuple(m) for m in intra]
        seen_inter += [tuple(m) for m in inter]
    # the k groups of a node are disjoint: every global rank in exactly one of each kind
    world = nodes * per_node
    assert sorted(r for m in seen_intra for r in m) == list(range(world))
    assert sorted(r for m in seen_inter for r in m) == list(range(world))


@pytest.mark.parametrize("x,k", LAYOUTS)
def test_collectives_on_a_dp_group_layout(x, k):
    """What the 2-hop reduce-scatter, the qWD all-gather and hpZ do at (x, y = 4): with
    x = 1 there is no intra-node hop (no phase, nothing sent inside the node), references
    are not node-sharded (one holder per node: every slot) and hpZ keeps full weights."""
    y = 4
    w = x * y
    assert group_layout(dp_groups(y, x * k, k)[0], x * k).ranks_per_node == x
    assert sorted(slice_order(x, y)) == list(range(w))
    hs = get_compressor("hadamard", bits=4)
    i8 = get_compressor("hadamard", bits=8)
    phases = TwoHopReduceScatter.traffic(S, x, y, i8, hs, 4)
    assert [p.group for p in phases] == (["intra", "inter"] if x > 1 else ["inter"])
    intra, inter = sent(phases, x, y)
    assert inter == (y - 1) * hs.wire_bits(S) / 8
    assert intra == ((x - 1) * i8.wire_bits(y * S) / 8 if x > 1 else 0)
    # exact 2-hop: the inter-node bytes per rank of torch's reduce-scatter over the group
    # divided by x (the node's partial sums cross once per local index)
    exact_two_hop = sent(TwoHopReduceScatter.traffic(S, x, y, None, None, 4), x, y)
    assert exact_two_hop[1] * x == sent(QuantizedReduceScatter.traffic(S, x, y, None, 4), x,
                                        y)[1] == (y - 1) * x * S * 4
    qwd = get_compressor("qwd")
    assert ShardedReferences.rows(w, x) == (y if x > 1 else w)   # slots kept per rank
    fwd = sent(QuantizedAllGather.traffic(S, x, y, qwd, 2), x, y)
    bwd = sent(QuantizedAllGather.traffic(S, x, y, qwd, 2, unchanged=True), x, y)
    # forward: only the 4-bit differences cross nodes, once per holder (the y - 1 others)
    assert fwd[1] == (y - 1) * qwd.steady().wire_bits(S) / 8
    assert bwd[1] == 0                          # the backward gather never leaves the node
    # ... and inside it the rebuilt y slots go to the x - 1 others (x = 1: a local copy)
    assert bwd[0] == (x - 1) * y * S * 2
    assert hpz_reshard(x, w) == (False if x == 1 else (True if x == w else x))


@pytest.mark.parametrize("nodes", [1, 2, 4, 16])
@pytest.mark.parametrize("x,k", LAYOUTS)
def test_subgroups_built_per_layout(x, k, nodes):
    """Every rank gathers every rank's DP group (rank order: each group repeated once per
    member) and builds their subgroups in one order: per group, y intra-node groups of x
    ranks when x > 1 and x inter-node groups of y ranks when y > 1; no group of one rank
    (x = 1 with TP filling the node: no intra-node groups; one node: no inter-node ones),
    so the count grows with the groups that carry traffic, not with the world."""
    per_node = x * k
    world = nodes * per_node
    groups = dp_groups(nodes, per_node, k)
    gathered = [next(g for g in groups if r in g) for r in range(world)]
    built = subgroups_to_build(gathered, per_node)
    assert len(built) == k * ((nodes if x > 1 else 0) + (x if nodes > 1 else 0))
    assert all(len(g) > 1 for g in built) and len(set(built)) == len(built)
    assert built == subgroups_to_build(list(reversed(gathered)), per_node)   # one order
    for ranks in groups:       # each rank's hops over more than itself have their group
        lay = group_layout(ranks, per_node)
        for members in lay.intra() + lay.inter():
            assert (tuple(members) in built) == (len(members) > 1)
    if x == 1 and nodes > 1:   # the inter-node group of x = 1 is the DP group itself
        assert sorted(built) == sorted(map(tuple, groups))


def test_subgroups_of_the_world_group():
    """The world as the DP group: one node builds its one intra-node group, one rank per
    node its one inter-node group, a one-rank world none."""
    assert subgroups_to_build([range(8)] * 8, 8) == [tuple(range(8))]
    assert subgroups_to_build([range(8)] * 8, 1) == [tuple(range(8))]
    assert subgroups_to_build([range(16)] * 16, 8) == \
        [tuple(range(8)), tuple(range(8, 16))] + [(l, l + 8) for l in range(8)]
    assert subgroups_to_build([[0]], 1) == []


def test_world_group_is_the_old_layout():
    lay = group_layout(range(16), 8)
    assert (lay.ranks_per_node, lay.num_nodes) == (8, 2)
    assert lay.intra() == [list(range(8)), list(range(8, 16))]
    assert lay.inter() == [[l, l + 8] for l in range(8)]


@pytest.mark.parametrize("ranks,per_node,words", [
    ([0, 1, 2], 2, "different number of ranks on each node"),     # 2 on node 0, 1 on node 1
    ([0, 1, 2, 4], 4, "different number of ranks on each node"),  # TP across a node boundary
    ([2, 0], 2, "increasing global order"),
    ([], 2, "non-empty"),
])
def test_bad_layouts_name_the_fix(ranks, per_node, words):
    with pytest.raises(ValueError, match=words) as err:
        group_layout(ranks, per_node)
    with pytest.raises(ValueError, match=words):   # beside a good group: no subgroup listed
        subgroups_to_build([[0], ranks], per_node)
    if "different" in words:
        assert "innermost" in str(err.value) and "ranks_per_node" in str(err.value)
