"""Symmetric collectives: one phase of a homogeneous collective as a few representative
flows with counted duplicates, instead of one flow per rank.

A data-parallel ring over n replicas has n flows, and at 16k GPUs a few hundred per
stage; most of them see the same links (same bandwidth, latency and number of flows per
link) and so get the same max-min rate. Flows are grouped into classes by colour
refinement (the 1-dimensional Weisfeiler-Leman procedure) over the bipartite graph of
flows and the links they cross: a flow's colour starts as its bytes and the (bandwidth,
latency, multiplicity) of each link on its path, and is refined by the multiset of
colours on each of its links until the partition is stable. In a stable (equitable)
partition every link of one colour carries the same number of flows of each class, so
progressive filling freezes all flows of a class at the same level: simulating one
representative per class, with multiplicity on its own links equal to the flows it
stands for there, gives every flow the rate the explicit simulation would.

Each representative shares every link that some representative crosses with the
flows of its class on that link (multiplicity = their count, also on links off its own
path, which then constrain its rate but add no latency). Every link colour on a flow's
path is on its representative's path, so every constraint of the explicit problem is
present, with its exact per-class loads. Bytes carried are credited to every link of
every flow a representative stands for, so per-link totals match the explicit run.

What the refinement cannot see is traffic outside the collective (pipeline sends of the
simulated replica): the representative of a class is therefore the flow that touches the
group's first rank (the simulated replica's device) where there is one, the flow the
explicit simulation would slow the most. tests/test_symmetric_dp.py compares symmetric
and explicit step times on every bundled topology.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, NamedTuple, Sequence

from sim.flownet import Edge

# Colour refinement stops when the number of classes stops growing; it always does
# within as many rounds as there are flows, but the path graphs here settle in 2-4.
_MAX_ROUNDS = 16


class Representative(NamedTuple):
    """One simulated flow standing for a class: its index in the phase, its path (for
    latency), its multiplicity per shared edge (rate) and copies of its bytes per edge
    (accounting); both maps may name edges off its path."""

    index: int
    path: tuple[Edge, ...]
    weights: dict[Edge, int]
    carried: dict[Edge, int]


def representatives(paths: Sequence[tuple[Edge, ...]], weights: Sequence[dict[Edge, int]],
                    nbytes: Sequence[float], touches_first: Sequence[bool],
                    edge_params: Callable[[Edge], tuple[float, float]]) -> list[Representative]:
    """Representatives of flows ``i`` with ``paths[i]``, multiplicity ``weights[i][e]`` on
    each of its edges (1 + unsimulated twins there), ``nbytes[i]``; ``touches_first[i]``
    marks flows from or to the group's first rank (preferred as representatives)."""
    n = len(paths)
    intern: dict = {}

    def code(x) -> int:
        c = intern.get(x)
        if c is None:
            c = intern[x] = len(intern)
        return c

    on_edge: dict[Edge, list[int]] = {}
    for i, path in enumerate(paths):
        for e in path:
            on_edge.setdefault(e, []).append(i)
    # A link's (bandwidth, latency) as one small code, looked up once per link.
    params = {e: code(("link", *edge_params(e))) for e in on_edge}
    color = [code(("flow", nbytes[i], tuple((params[e], weights[i][e]) for e in paths[i])))
             for i in range(n)]
    classes = len(set(color))
    # A link that one flow crosses tells the refinement nothing that flow's own colour
    # does not (its parameters and multiplicity are already in it, at the same place in
    # the path of every flow of that colour): only shared links are coloured, the others
    # stand as -1. The partition, and with it the representatives, are the same as when
    # every link is coloured; at 16k GPUs most links of a ring carry one flow.
    shared = {e: fl for e, fl in on_edge.items() if len(fl) > 1}
    for _ in range(_MAX_ROUNDS):
        # A shared link's colour: its parameters and the multiset of (flow colour,
        # multiplicity) on it.
        ecol = {e: code(("edge", params[e],
                         tuple(sorted(Counter((color[i], weights[i][e]) for i in fl).items()))))
                for e, fl in shared.items()}
        color = [code(("flow", color[i], tuple(ecol.get(e, -1) for e in paths[i]))) for i in range(n)]
        k = len(set(color))
        if k == classes:
            break
        classes = k
    # One representative per class, in order of first appearance (deterministic).
    rep_of: dict[int, int] = {}
    for i in range(n):
        c = color[i]
        j = rep_of.get(c)
        if j is None or (touches_first[i] and not touches_first[j]):
            rep_of[c] = i
    reps = sorted(rep_of.values())
    covered = {e for j in reps for e in paths[j]}
    out: dict[int, Representative] = {j: Representative(j, paths[j], {}, {}) for j in reps}
    for i in range(n):
        rep = out[rep_of[color[i]]]
        for e in paths[i]:
            w = weights[i][e]
            rep.carried[e] = rep.carried.get(e, 0) + w
            if e in covered:
                rep.weights[e] = rep.weights.get(e, 0) + w
    return [out[j] for j in reps]
