"""Tests of costmodel/collectives.py: hand-worked alpha-beta costs and algorithm comparisons."""
from __future__ import annotations

import math

import pytest

from costmodel.collectives import (
    allgather_s,
    allreduce_s,
    best_allreduce,
    busbw_factor,
    hierarchical_allreduce_s,
    p2p_s,
    reduce_scatter_s,
    ring_allreduce_s,
    sparse_allgather_s,
    tree_allreduce_s,
)
from costmodel.errors import InputError

GB = 1e9


def test_ring_allreduce_hand_worked():
    """1 GB over 8 ranks at 100 GB/s, alpha 5 us: 2*7/8*0.01 s + 14*5e-6 s = 0.01757 s."""
    assert math.isclose(ring_allreduce_s(1 * GB, 8, 100 * GB, 5e-6), 2 * 7 / 8 * 0.01 + 14 * 5e-6, rel_tol=1e-12)
    assert math.isclose(ring_allreduce_s(1 * GB, 8, 100 * GB, 5e-6), 0.01757, rel_tol=1e-12)


def test_busbw_factors():
    """nccl-tests: all-reduce 2(n-1)/n, gather/scatter/all-to-all (n-1)/n, broadcast/reduce 1."""
    assert busbw_factor("all_reduce", 8) == 1.75
    assert busbw_factor("all_gather", 8) == busbw_factor("reduce_scatter", 8) == busbw_factor("all_to_all", 8) == 0.875
    assert busbw_factor("broadcast", 8) == busbw_factor("reduce", 8) == 1.0
    with pytest.raises(InputError, match="allowed: all_reduce"):
        busbw_factor("gather", 8)


@pytest.mark.parametrize("n", [2, 4, 16, 128])
def test_ring_bandwidth_term_is_busbw(n):
    """With zero latency a ring all-reduce / all-gather takes busbw_factor * S / B: ring is bus-optimal."""
    S, B = 3 * GB, 50 * GB
    assert math.isclose(ring_allreduce_s(S, n, B, 0.0), busbw_factor("all_reduce", n) * S / B, rel_tol=1e-12)
    assert math.isclose(allgather_s(S, n, B, 0.0), busbw_factor("all_gather", n) * S / B, rel_tol=1e-12)


def test_allgather_reduce_scatter_hand_worked():
    """0.8 GB gathered over 4 ranks at 50 GB/s, alpha 10 us: 3/4*0.016 + 3e-5 = 0.01203 s."""
    assert math.isclose(allgather_s(0.8 * GB, 4, 50 * GB, 1e-5), 0.01203, rel_tol=1e-12)
    assert math.isclose(reduce_scatter_s(0.8 * GB, 4, 50 * GB, 1e-5), 0.01203, rel_tol=1e-12)


def test_sparse_allgather_hand_worked():
    """Top-k: 1e6 (int32 index, fp32 value) = 8-byte entries per rank, 16 ranks, 25 GB/s, 10 us:
    each rank receives 15*8 MB: 15*8e6/25e9 + 15*1e-5 = 0.0048 + 0.00015 s."""
    assert math.isclose(sparse_allgather_s(1_000_000, 8, 16, 25 * GB, 1e-5), 0.00495, rel_tol=1e-12)


def test_p2p_and_single_rank():
    """p2p = alpha + S/B; a group of one rank communicates nothing."""
    assert math.isclose(p2p_s(1e8, 25 * GB, 2e-6), 0.004002, rel_tol=1e-12)
    for fn in (ring_allreduce_s, tree_allreduce_s, allgather_s, reduce_scatter_s):
        assert fn(GB, 1, 10 * GB, 1e-5) == 0.0


def test_tree_hand_worked_and_n2():
    """Tree, 8 ranks: 2*S/B + 2*ceil(log2 8)*alpha; 2 ranks: S/B + 2*alpha, identical to the ring."""
    assert math.isclose(tree_allreduce_s(1 * GB, 8, 100 * GB, 5e-6), 0.02 + 6 * 5e-6, rel_tol=1e-12)
    assert math.isclose(tree_allreduce_s(1 * GB, 6, 100 * GB, 5e-6), 0.02 + 6 * 5e-6, rel_tol=1e-12)
    assert tree_allreduce_s(GB, 2, 100 * GB, 5e-6) == ring_allreduce_s(GB, 2, 100 * GB, 5e-6)


def test_tree_vs_ring_crossover():
    """Ring - tree = -S/(4B) + 8*alpha for n=8 (bandwidth 1.75 vs 2 S/B, latency 14 vs 6 alpha):
    tree wins below S* = 32*alpha*B = 16 MB at 100 GB/s and 5 us, ring above."""
    B, a = 100 * GB, 5e-6
    assert tree_allreduce_s(15.9e6, 8, B, a) < ring_allreduce_s(15.9e6, 8, B, a)
    assert tree_allreduce_s(16.1e6, 8, B, a) > ring_allreduce_s(16.1e6, 8, B, a)
    # many ranks, small message: log latency wins by far. In general S* = alpha*B*n*(n-1-ceil(log2 n)):
    # for 1024 ranks that is 5e-6*1e11*1024*1013 = 518.7 GB, so 100 GB still favours the tree, 1 TB the ring.
    assert tree_allreduce_s(1e3, 1024, B, a) < ring_allreduce_s(1e3, 1024, B, a) / 50
    assert tree_allreduce_s(100 * GB, 1024, B, a) < ring_allreduce_s(100 * GB, 1024, B, a)
    assert ring_allreduce_s(1000 * GB, 1024, B, a) < tree_allreduce_s(1000 * GB, 1024, B, a)


def test_hierarchical_hand_worked_and_degenerate():
    """1 GB, 8 GPUs x 4 nodes, intra 200 GB/s 2 us, inter 25 GB/s/GPU 10 us:
    RS 7/8*0.005 + 7*2e-6, inter ring of 125 MB over 4: 1.5*0.005 + 6*1e-5, AG = RS. n_local=1 is a ring
    across nodes and n_nodes=1 a ring inside the node."""
    t = hierarchical_allreduce_s(GB, 8, 4, 200 * GB, 2e-6, 25 * GB, 1e-5)
    rs = 7 / 8 * 0.005 + 7 * 2e-6
    assert math.isclose(t, 2 * rs + 1.5 * 0.005 + 6e-5, rel_tol=1e-12)
    one_per_node = hierarchical_allreduce_s(GB, 1, 16, 200 * GB, 2e-6, 25 * GB, 1e-5)
    assert math.isclose(one_per_node, ring_allreduce_s(GB, 16, 25 * GB, 1e-5), rel_tol=1e-12)
    one_node = hierarchical_allreduce_s(GB, 8, 1, 200 * GB, 2e-6, 25 * GB, 1e-5)
    assert math.isclose(one_node, ring_allreduce_s(GB, 8, 200 * GB, 2e-6), rel_tol=1e-12)


def test_dispatcher_and_best():
    """allreduce_s picks the formula by name; flat algorithms across nodes see the slower link;
    best_allreduce returns the minimum with its name; 'auto' equals that minimum."""
    args = (GB, 8, 4, 200 * GB, 2e-6, 25 * GB, 1e-5)
    assert allreduce_s("ring", *args) == ring_allreduce_s(GB, 32, 25 * GB, 1e-5)
    assert allreduce_s("tree", *args) == tree_allreduce_s(GB, 32, 25 * GB, 1e-5)
    assert allreduce_s("hierarchical", *args) == hierarchical_allreduce_s(*args)
    name, secs = best_allreduce(*args)
    assert name == "hierarchical"  # 1/8 of the bytes cross the slow link
    assert secs == min(allreduce_s(a, *args) for a in ("ring", "tree", "hierarchical")) == allreduce_s("auto", *args)
    # one node: hierarchical equals ring, the tie goes to ring; tiny message on one node: tree
    assert best_allreduce(GB, 8, 1, 200 * GB, 2e-6)[0] == "ring"
    assert best_allreduce(1e3, 8, 1, 200 * GB, 2e-6)[0] == "tree"


def test_bad_input():
    """Unknown algorithm, missing inter-node figures, zero bandwidth and negative sizes raise InputError."""
    with pytest.raises(InputError, match="allowed: ring, tree, hierarchical, auto"):
        allreduce_s("butterfly", GB, 8, 1, 100 * GB, 1e-6)
    with pytest.raises(InputError, match="n_nodes=2"):
        allreduce_s("ring", GB, 8, 2, 100 * GB, 1e-6)
    with pytest.raises(InputError, match="bw_Bps"):
        ring_allreduce_s(GB, 8, 0, 1e-6)
    with pytest.raises(InputError, match="nbytes"):
        allgather_s(-1, 8, GB, 1e-6)
    with pytest.raises(InputError, match="group size"):
        ring_allreduce_s(GB, 0, GB, 1e-6)
