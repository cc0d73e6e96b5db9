"""Collectives as flows on a FlowNetwork, against alpha-beta closed forms worked by hand.

Byte factors: nccl-tests bus bandwidth definitions in docs/facts.md
(all-reduce 2(n-1)/n, all-gather / reduce-scatter (n-1)/n).
"""
from collections import Counter

import networkx as nx
import pytest
import simpy

from costmodel.errors import InputError
from sim.collective_flows import (Phase, allgather, build, double_binary_trees,
                                  hierarchical_allreduce, p2p, reduce_scatter, ring_allreduce,
                                  run_phases, sparse_allgather, tree_allreduce)
from sim.flownet import FlowNetwork

B = 1e9        # bytes/s, test link bandwidth
ALPHA = 1e-6   # s, test link latency
S = 8e6        # bytes, buffer


def link(g, u, v, bw, lat):
    g.add_edge(u, v, bw_Bps=bw, latency_s=lat)
    g.add_edge(v, u, bw_Bps=bw, latency_s=lat)


def ring_graph(n, bw=B, lat=ALPHA):
    """n GPUs 'g0'..'g{n-1}', each linked both ways to the next."""
    g = nx.DiGraph()
    for i in range(n):
        link(g, f"g{i}", f"g{(i + 1) % n}", bw, lat)
    return g


def star_graph(n, bw=B, lat=ALPHA):
    """n GPUs each linked both ways to one non-blocking switch 'sw'."""
    g = nx.DiGraph()
    for i in range(n):
        link(g, f"g{i}", "sw", bw, lat)
    return g


def router(g, name=lambda r: f"g{r}"):
    def route(s, d):
        p = nx.shortest_path(g, name(s), name(d))
        return tuple(zip(p[:-1], p[1:]))
    return route


def finish(g, phases, route=None, replicas=(), group=None):
    """Simulated completion time of the phases on graph g."""
    env = simpy.Environment()
    net = FlowNetwork(env, g)
    ev = run_phases(env, net, route or router(g), phases, replicas=replicas, group=group)
    env.run()
    assert ev.processed
    return env.now, net


@pytest.mark.parametrize("n", [2, 4, 5])
def test_ring_allreduce_on_uniform_ring(n):
    """Ring all-reduce of S on n GPUs in a bidirectional ring (B, alpha per link):
    2(n-1)/n * S/B + 2(n-1)*alpha. On a star (two links per hop of alpha/2) the same."""
    expect = 2 * (n - 1) / n * S / B + 2 * (n - 1) * ALPHA
    t, net = finish(ring_graph(n), ring_allreduce(range(n), S))
    assert t == pytest.approx(expect, rel=1e-12)
    assert net.bytes_carried[("g0", "g1")] == pytest.approx(2 * (n - 1) / n * S)
    t_star, _ = finish(star_graph(n, lat=ALPHA / 2), ring_allreduce(range(n), S))
    assert t_star == pytest.approx(expect, rel=1e-12)


def test_allgather_and_reduce_scatter_closed_form():
    """Ring all-gather and reduce-scatter of S (full buffer) on 4 GPUs:
    (n-1)/n * S/B + (n-1)*alpha = 3/4 * 8 ms + 3 us."""
    expect = 0.75 * S / B + 3 * ALPHA
    assert finish(ring_graph(4), allgather(range(4), S))[0] == pytest.approx(expect, rel=1e-12)
    assert finish(ring_graph(4), reduce_scatter(range(4), S))[0] == pytest.approx(expect, rel=1e-12)


def two_node_graph(b_intra, a_intra, b_inter, a_inter):
    """2 nodes x 4 GPUs 'n{node}g{j}'; GPUs of a node meet at switch 'sw{node}';
    GPU j of node 0 has its own rail link to GPU j of node 1."""
    g = nx.DiGraph()
    for node in range(2):
        for j in range(4):
            link(g, f"n{node}g{j}", f"sw{node}", b_intra, a_intra)
    for j in range(4):
        link(g, f"n0g{j}", f"n1g{j}", b_inter, a_inter)
    return g


def test_hierarchical_allreduce_two_nodes_closed_form():
    """2 nodes x 4 GPUs, intra 100 GB/s and 1 us per link (2 links per intra hop), inter
    10 GB/s and 5 us: intra RS 3/4*S/B_i + 3*2 us, inter ring AR of S/4 between 2 nodes
    2*(1/2)*(S/4)/B_e + 2*5 us, intra AG = intra RS."""
    b_i, a_i, b_e, a_e = 100e9, 1e-6, 10e9, 5e-6
    g = two_node_graph(b_i, a_i, b_e, a_e)
    name = lambda r: f"n{r // 4}g{r % 4}"
    phases = hierarchical_allreduce(range(8), S, node_of=lambda r: r // 4)
    assert len(phases) == 3
    rs = 0.75 * S / b_i + 3 * 2 * a_i
    ar = (S / 4) / b_e + 2 * a_e
    t, _ = finish(g, phases, route=router(g, name))
    assert t == pytest.approx(rs + ar + rs, rel=1e-12)


def test_hierarchical_with_one_member_per_node_is_the_ring():
    """With one group member per node there is no intra-node step: the phases are exactly
    the flat ring all-reduce's."""
    assert hierarchical_allreduce([3, 7, 11], S, node_of=lambda r: r) == ring_allreduce([3, 7, 11], S)


def replica_graph():
    """GPUs a0, a1 on switch A and b0, b1 on switch B (fast links, 100 GB/s); one 10 GB/s
    link between A and B that both pairs must cross. Latency 1 us per link."""
    g = nx.DiGraph()
    for x in ("a0", "a1"):
        link(g, x, "A", 100e9, ALPHA)
    for x in ("b0", "b1"):
        link(g, x, "B", 100e9, ALPHA)
    link(g, "A", "B", 10e9, ALPHA)
    return g


def test_replicas_sharing_a_link_slow_each_other_by_their_count():
    """Ring all-reduce on (a0, b0) sends S each way across A-B. Alone: S/10 GB/s + 2 steps *
    3 us. With the replica group (a1, b1) declared (not simulated), the A-B link is shared
    by 2: bandwidth term doubles. Simulating both groups explicitly gives the same time."""
    g = replica_graph()
    names = {0: "a0", 1: "b0", 2: "a1", 3: "b1"}
    route = router(g, names.get)
    alone, _ = finish(g, ring_allreduce([0, 1], S), route)
    assert alone == pytest.approx(S / 10e9 + 2 * 3 * ALPHA, rel=1e-12)
    with_rep, net = finish(g, ring_allreduce([0, 1], S), route, replicas=[[2, 3]])
    assert with_rep == pytest.approx(2 * S / 10e9 + 2 * 3 * ALPHA, rel=1e-12)
    assert net.bytes_carried[("A", "B")] == pytest.approx(2 * S)
    both = [Phase(ring_allreduce([0, 1], S)[0].flows + ring_allreduce([2, 3], S)[0].flows, 2)]
    explicit, _ = finish(g, both, route)
    assert explicit == pytest.approx(with_rep, rel=1e-12)


def test_replica_multiplicity_maps_are_cached_and_reused():
    """Running the same collective twice on one network reuses the cached multiplicity
    map (one entry per flow) and gives identical timing for both runs back to back."""
    g = replica_graph()
    route = router(g, {0: "a0", 1: "b0", 2: "a1", 3: "b1"}.get)
    env = simpy.Environment()
    net = FlowNetwork(env, g)
    times = []

    def two_buckets():
        for _ in range(2):
            t0 = env.now
            yield run_phases(env, net, route, ring_allreduce([0, 1], S), replicas=[[2, 3]])
            times.append(env.now - t0)

    env.process(two_buckets())
    env.run()
    (entry,) = net.cache["collective_multiplicity"].values()   # one (route, group, replicas)
    assert len(entry["maps"]) == 2                             # one map per flow
    assert times[0] == pytest.approx(times[1], rel=1e-12)
    assert times[0] == pytest.approx(2 * S / 10e9 + 6 * ALPHA, rel=1e-12)


def test_double_binary_trees_are_complementary():
    """For n = 2..33 both trees have one root and at most 2 children per node, no rank is
    interior in both, and depth is floor(log2 n)."""
    for n in range(2, 34):
        t1, t2 = double_binary_trees(n)
        for t in (t1, t2):
            assert t.count(None) == 1
            assert max(Counter(x for x in t if x is not None).values()) <= 2
        interior1 = {x for x in t1 if x is not None}
        interior2 = {x for x in t2 if x is not None}
        assert not interior1 & interior2
        assert tree_allreduce(range(n), S)[0].latency_steps == n.bit_length() - 1


def test_tree_allreduce_on_star_by_hand():
    """n = 4: tree 1 edges 0->1, 2->1, 1->3; tree 2 edges 1->2, 3->2, 2->0; each carries
    S/2. Ranks 1 and 2 send and receive two halves in each phase, so on a non-blocking star
    each phase takes S/B plus depth 2 times the 2-link path latency: 2*(S/B + 2*2*alpha)."""
    phases = tree_allreduce(range(4), S)
    assert sorted(phases[0].flows) == sorted([(0, 1, S / 2), (2, 1, S / 2), (1, 3, S / 2),
                                              (1, 2, S / 2), (3, 2, S / 2), (2, 0, S / 2)])
    assert sorted(phases[1].flows) == sorted((d, s, b) for s, d, b in phases[0].flows)
    t, _ = finish(star_graph(4), phases)
    assert t == pytest.approx(2 * (S / B + 2 * 2 * ALPHA), rel=1e-12)


def test_sparse_allgather_equals_dense_allgather_of_all_entries():
    """Top-k gather of nnz entries of 6 bytes per rank on 4 ranks: each ring flow carries
    (n-1)*nnz*6 bytes, the same as a dense all-gather of the 4*nnz*6-byte concatenation;
    build() with nbytes = one rank's payload gives the same phases."""
    nnz, bpe = 1000.0, 6.0
    sp = sparse_allgather(range(4), nnz, bpe)
    assert [f[2] for f in sp[0].flows] == [3 * nnz * bpe] * 4
    assert sp == allgather(range(4), 4 * nnz * bpe)
    assert build("ring", "sparse_allgather", range(4), nnz * bpe, bytes_per_entry=bpe) == sp


def test_p2p_and_dispatcher():
    """p2p is one flow and one latency hop; build() dispatches by name and rejects unknown
    names and tree for all-gather with one-line input errors."""
    g = ring_graph(4)
    t, _ = finish(g, p2p(0, 1, S))
    assert t == pytest.approx(S / B + ALPHA, rel=1e-12)
    assert p2p(2, 2, S) == []
    assert build("ring", "all-reduce", range(4), S) == ring_allreduce(range(4), S)
    assert build("tree", "allreduce", range(4), S) == tree_allreduce(range(4), S)
    assert build("ring", "p2p", (0, 3), S) == p2p(0, 3, S)
    assert build("hierarchical", "allreduce", range(8), S, node_of=lambda r: r // 4) == \
        hierarchical_allreduce(range(8), S, lambda r: r // 4)
    with pytest.raises(InputError, match="unknown collective algorithm 'butterfly'"):
        build("butterfly", "allreduce", range(4), S)
    with pytest.raises(InputError, match="unknown collective op 'scan'"):
        build("ring", "scan", range(4), S)
    with pytest.raises(InputError, match="'tree' is for allreduce only"):
        build("tree", "allgather", range(4), S)
    with pytest.raises(ValueError, match="same number of group members"):
        hierarchical_allreduce(range(6), S, node_of=lambda r: 0 if r < 4 else 1)
    assert ring_allreduce([5], S) == []


def test_replicas_need_the_group_and_matching_sizes():
    """Replicas are mapped by position in the group: a phase without a group, or a replica
    of a different size, is rejected when run_phases is called."""
    g = replica_graph()
    route = router(g, {0: "a0", 1: "b0", 2: "a1", 3: "b1"}.get)
    env = simpy.Environment()
    net = FlowNetwork(env, g)
    bare = [Phase(((0, 1, S),), 1)]
    with pytest.raises(ValueError, match="needs the group"):
        run_phases(env, net, route, bare, replicas=[[2, 3]])
    with pytest.raises(ValueError, match="has 1 ranks"):
        run_phases(env, net, route, ring_allreduce([0, 1], S), replicas=[[2]])


def test_ring_over_several_members_per_node_is_priced_hierarchically():
    """A ring collective over 2 nodes x 4 members is priced by the hierarchical phases (its
    inter-node traffic over every member's NIC, as NCCL's channels spread it), not as one
    ring in rank order that leaves each node through one member; one member per node, or
    one node, stays the plain ring."""
    from sim.collective_flows import build, hierarchical_allreduce, ring_allreduce, several_per_node
    node_of = lambda r: r // 4  # noqa: E731
    g = tuple(range(8))
    assert several_per_node(g, node_of) and not several_per_node((0, 4), node_of)
    assert not several_per_node((0, 1, 2), node_of)
    assert build("ring", "allreduce", g, 8.0, node_of=node_of) == hierarchical_allreduce(g, 8.0, node_of)
    cross = {f.src for ph in build("ring", "allreduce", g, 8.0, node_of=node_of) for f in ph.flows
             if node_of(f.src) != node_of(f.dst)}
    assert cross == set(g)  # every member sends across nodes: each its own NIC
    assert build("ring", "allreduce", (0, 4), 8.0, node_of=node_of) == ring_allreduce((0, 4), 8.0)


def test_tree_over_several_members_per_node_runs_a_tree_per_local_index():
    """allreduce=tree over 2 nodes x 4 members: within each node the ring reduce-scatter and
    all-gather, between nodes a pair of binary trees per local index over S/4 (NCCL's tree
    per channel, one channel per NIC), so every member's NIC carries inter-node traffic;
    one pair of trees in rank order sent all of S through one member's NIC. One
    member per node, or one node, stays the plain pair of trees."""
    from sim.collective_flows import build, hierarchical_allreduce, tree_allreduce
    node_of = lambda r: r // 4  # noqa: E731
    g = tuple(range(8))
    phases = build("tree", "allreduce", g, 8.0, node_of=node_of)
    assert phases == hierarchical_allreduce(g, 8.0, node_of, inter=tree_allreduce)
    cross = [f for ph in phases for f in ph.flows if node_of(f.src) != node_of(f.dst)]
    assert {f.src for f in cross} == set(g)
    # 4 local indices x 2 trees x (up + down) x half of S/4: 16 bytes, 2 S
    assert sum(f.nbytes for f in cross) == pytest.approx(4 * 2 * 2 * (8.0 / 4 / 2))
    def most_one_member_sends(phs):
        sent: dict[int, float] = {}
        for f in (f for ph in phs for f in ph.flows if node_of(f.src) != node_of(f.dst)):
            sent[f.src] = sent.get(f.src, 0.0) + f.nbytes
        return max(sent.values())
    assert most_one_member_sends(phases) == pytest.approx(8.0 / 4)  # S/4: each its rail's half up, half down
    assert most_one_member_sends(tree_allreduce(g, 8.0)) == pytest.approx(8.0)  # in rank order: S through one NIC
    assert build("tree", "allreduce", (0, 4), 8.0, node_of=node_of) == tree_allreduce((0, 4), 8.0)
    assert build("tree", "allreduce", (0, 1, 2), 8.0, node_of=node_of) == tree_allreduce((0, 1, 2), 8.0)
