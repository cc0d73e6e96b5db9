"""FlowNetwork: latency plus max-min fair bandwidth sharing, checked against hand numbers."""
from __future__ import annotations

import random
from typing import Hashable, Mapping, NamedTuple, Sequence

import networkx as nx
import pytest
import simpy

from sim.flownet import Edge, FlowNetwork


class Link(NamedTuple):
    """One directed link of a test graph."""

    u: str
    v: str
    bw_Bps: float
    latency_s: float


class Send(NamedTuple):
    """One transfer of a test: started at ``start_s``, named ``name`` in the results."""

    name: Hashable
    start_s: float
    path: Sequence[Edge]
    nbytes: float
    multiplicity: Mapping[Edge, int] | None = None
    latency_steps: int = 1


def graph(*links: Link):
    """DiGraph of the given links."""
    g = nx.DiGraph()
    for u, v, bw, lat in links:
        g.add_edge(u, v, bw_Bps=bw, latency_s=lat)
    return g


def run_transfers(g, sends: Sequence[Send], record=False):
    """Run the sends; returns (finish time per name, network)."""
    env = simpy.Environment()
    net = FlowNetwork(env, g, record=record)
    done = {}

    def go(t: Send):
        yield env.timeout(t.start_s)
        yield net.transfer(t.path, t.nbytes, t.multiplicity, latency_steps=t.latency_steps, label=t.name)
        done[t.name] = env.now

    for t in sends:
        env.process(go(t))
    env.run()
    return done, net


def test_single_flow_is_size_over_bandwidth_plus_latency():
    """One 1 MB flow on a 1 GB/s link with 2 us latency: 1 ms + 2 us. Over two links
    (1 and 0.5 GB/s, 2 and 3 us) with latency_steps=3: 3*(5 us) + 1 MB / 0.5 GB/s."""
    g = graph(Link("a", "b", 1e9, 2e-6), Link("b", "c", 0.5e9, 3e-6))
    done, net = run_transfers(g, [Send("one", 0, [("a", "b")], 1e6),
                                  Send("two", 1.0, [("a", "b"), ("b", "c")], 1e6, None, 3)])
    assert done["one"] == pytest.approx(1e-3 + 2e-6, rel=1e-12)
    assert done["two"] == pytest.approx(1.0 + 15e-6 + 2e-3, rel=1e-12)
    assert net.bytes_carried == {("a", "b"): 2e6, ("b", "c"): 1e6}


def test_n_simultaneous_flows_share_equally_and_finish_together():
    """4 flows of 1 MB start together on a 1 GB/s link: each gets 0.25 GB/s and all finish
    at 4 ms; the recorded link rate is 1 GB/s from 0 and drops to 0 at 4 ms."""
    g = graph(Link("a", "b", 1e9, 0.0))
    done, net = run_transfers(g, [Send(i, 0, [("a", "b")], 1e6) for i in range(4)], record=True)
    assert len(set(done.values())) == 1   # all at the very same instant
    assert done[0] == pytest.approx(4e-3, rel=1e-12)
    assert [(t, e) for t, e, _ in net.samples] == [(0, ("a", "b")), (pytest.approx(4e-3), ("a", "b"))]
    assert [r for _, _, r in net.samples] == [pytest.approx(1e9), 0.0]


def test_multiplicity_counts_unsimulated_identical_flows():
    """A flow with multiplicity 3 alone on a link behaves like 3 identical flows: it
    finishes at 3*S/B and the link is charged 3*S bytes."""
    g = graph(Link("a", "b", 2e9, 0.0))
    done, net = run_transfers(g, [Send("x", 0, [("a", "b")], 1e6, {("a", "b"): 3})])
    assert done["x"] == pytest.approx(3 * 1e6 / 2e9, rel=1e-12)
    assert net.bytes_carried[("a", "b")] == pytest.approx(3e6)


def test_max_min_gives_slow_flow_its_bottleneck_and_the_other_the_rest():
    """Link a-b 10 B/s carries A (60 B) and B (20 B); B also crosses b-c at 4 B/s.
    Max-min: B gets 4, A gets 6. B ends at 20/4 = 5 s with A at 30 B sent; A then has the
    whole 10 B/s for its last 30 B: ends at 8 s."""
    g = graph(Link("a", "b", 10.0, 0.0), Link("b", "c", 4.0, 0.0))
    done, net = run_transfers(g, [Send("A", 0, [("a", "b")], 60.0),
                                  Send("B", 0, [("a", "b"), ("b", "c")], 20.0)], record=True)
    assert done == {"A": pytest.approx(8.0), "B": pytest.approx(5.0)}
    assert net.samples == [(0, ("a", "b"), pytest.approx(10.0)), (0, ("b", "c"), pytest.approx(4.0)),
                           (pytest.approx(5.0), ("b", "c"), 0.0), (pytest.approx(8.0), ("a", "b"), 0.0)]


def test_weighted_max_min_three_flows_piecewise():
    """L1 (10 B/s) carries X and Y; L2 (10 B/s) carries X and Z with multiplicity 3.
    Filling: L2's share 10/(1+3) = 2.5 is lowest, so X = Z = 2.5 and Y = 10 - 2.5 = 7.5.
    Y (15 B) ends at 2 s; X stays 2.5 (L2 still binds); Z (10 B) ends at 4 s; X has sent
    10 of 25 B and then runs alone at 10 B/s: ends at 5.5 s."""
    g = graph(Link("s", "m", 10.0, 0.0), Link("m", "t", 10.0, 0.0))
    L1, L2 = ("s", "m"), ("m", "t")
    done, _ = run_transfers(g, [Send("X", 0, [L1, L2], 25.0), Send("Y", 0, [L1], 15.0),
                                Send("Z", 0, [L2], 10.0, {L2: 3})])
    assert done == {"X": pytest.approx(5.5), "Y": pytest.approx(2.0), "Z": pytest.approx(4.0)}


def test_late_starter_shares_then_first_flow_gets_full_bandwidth():
    """10 B/s link. A (100 B) alone 0-4 s sends 40 B; B (30 B) joins at 4 s, both at 5 B/s,
    B ends at 10 s when A has 30 B left; A alone at 10 B/s ends at 13 s. C (50 B) starts
    at 20 s on the idle link and ends at 25 s."""
    g = graph(Link("a", "b", 10.0, 0.0))
    done, _ = run_transfers(g, [Send("A", 0, [("a", "b")], 100.0), Send("B", 4, [("a", "b")], 30.0),
                                Send("C", 20, [("a", "b")], 50.0)])
    assert done == {"A": pytest.approx(13.0), "B": pytest.approx(10.0), "C": pytest.approx(25.0)}


def test_zero_bytes_and_empty_path_pay_only_latency():
    """nbytes == 0 costs latency_steps * path latency; an empty path costs nothing."""
    g = graph(Link("a", "b", 1e9, 5e-6))
    done, net = run_transfers(g, [Send("zero", 0, [("a", "b")], 0.0, None, 2), Send("local", 0, [], 1e9)])
    assert done == {"zero": pytest.approx(1e-5), "local": 0}
    assert net.flows_started == 0


def test_busy_link_is_work_conserving():
    """Independent check: 200 flows with seeded random sizes join a 1 GB/s link while it is
    never idle (the first flow alone outlasts all start times), so the last one ends at
    total bytes / bandwidth, whatever the sharing; every flow completes; bytes add up."""
    rng = random.Random(7)
    sends = [Send("first", 0.0, [("a", "b")], 1e9)]
    sends += [Send(i, rng.uniform(0, 0.5), [("a", "b")], rng.uniform(1e5, 1e7)) for i in range(200)]
    total = sum(t.nbytes for t in sends)
    done, net = run_transfers(graph(Link("a", "b", 1e9, 0.0)), sends)
    assert len(done) == 201
    assert max(done.values()) == pytest.approx(total / 1e9, rel=1e-9)
    assert net.bytes_carried[("a", "b")] == pytest.approx(total)


def test_tiny_transfer_late_in_time_completes():
    """A 1-byte flow at t = 1e4 s on a 1 TB/s link ends 1 ps later: the finish is not
    lost to float rounding of the clock (no endless zero-length wake-ups)."""
    done, _ = run_transfers(graph(Link("a", "b", 1e12, 0.0)), [Send("t", 1e4, [("a", "b")], 1.0)])
    assert done["t"] == pytest.approx(1e4 + 1e-12, rel=1e-15)


def test_bad_edges_are_rejected():
    """An edge missing from the graph, or one without bandwidth, is an error naming it."""
    g = graph(Link("a", "b", 1e9, 0.0))
    g.add_edge("b", "c")
    net = FlowNetwork(simpy.Environment(), g)
    with pytest.raises(ValueError, match="'x', 'y'"):
        net.transfer([("x", "y")], 1.0)
    with pytest.raises(ValueError, match="no 'bw_Bps'"):
        net.transfer([("b", "c")], 1.0)


def test_delay_event_and_bw_scale():
    """A send that first waits a 1 s call cost (delay_s) on a 10 B/s link of kind 'nic'
    whose usable fraction is 0.5 (bw_scale): 1 s + 0.25 s latency + 20 B / 5 B/s = 5.25 s.
    The caller's own event is the one that succeeds (no forwarding), also for 0 bytes
    (then after the delay and latency only: 1.25 s)."""
    g = nx.DiGraph()
    g.add_edge("a", "b", bw_Bps=10.0, latency_s=0.25, kind="nic")
    env = simpy.Environment()
    net = FlowNetwork(env, g, bw_scale=lambda kind: {"nic": 0.5}[kind])
    mine, empty = env.event(), env.event()
    assert net.transfer([("a", "b")], 20.0, delay_s=1.0, event=mine) is mine
    assert net.transfer([("a", "b")], 0.0, delay_s=1.0, event=empty) is empty
    times = {}
    mine.callbacks.append(lambda _e: times.__setitem__("mine", env.now))
    empty.callbacks.append(lambda _e: times.__setitem__("empty", env.now))
    env.run()
    assert times == {"mine": pytest.approx(5.25), "empty": pytest.approx(1.25)}
    assert net.bytes_carried[("a", "b")] == pytest.approx(20.0)


class _BatchedOnly(FlowNetwork):
    """Every start and finish goes through the zero-delay batched re-solve (the path the
    lone-flow shortcut of FlowNetwork skips)."""

    def _activate(self, flow, _ev=None):
        flow.t_last = self.env.now
        self._pending_add.append(flow)
        self._request_flush()

    def _wake(self, flow, version, _ev):
        if flow.done or flow.version != version:
            return
        self._pending_done.append(flow)
        self._request_flush()



def _run_sends(cls, g, sends, record: bool = False, wrap=None):
    """Run ``sends`` (Send records) on a fresh ``cls`` network over graph g; returns
    ({name: finish time}, the network). ``wrap(net)`` may instrument it first."""
    env = simpy.Environment()
    net = cls(env, g, record=True) if record else cls(env, g)
    if wrap is not None:
        wrap(net)
    done = {}

    def go(t):
        yield env.timeout(t.start_s)
        yield net.transfer(t.path, t.nbytes, label=t.name)
        done[t.name] = env.now
    for t in sends:
        env.process(go(t))
    env.run()
    return done, net


def _same_finishes(done, net, reference):
    """Assert equal finish times and bytes per link against ``reference`` (done, net);
    returns it."""
    ref_done, ref = reference
    assert done.keys() == ref_done.keys()
    for k in done:
        assert done[k] == pytest.approx(ref_done[k], rel=1e-12)
    assert net.bytes_carried == pytest.approx(ref.bytes_carried, rel=1e-12)
    return reference


def _two_racks():
    """8 hosts h0..h7 in two racks (switches s0, s1) of mixed 1-3 GB/s host links and a
    2.5 GB/s inter-switch trunk: links where some flows run alone and some share."""
    links = [Link(f"h{i}", f"s{i // 4}", 1e9 * (1 + i % 3), 1e-6) for i in range(8)]
    links += [Link(f"s{i // 4}", f"h{i}", 1e9 * (1 + i % 2), 1e-6) for i in range(8)]
    links += [Link("s0", "s1", 2.5e9, 2e-6), Link("s1", "s0", 2.5e9, 2e-6)]
    return graph(*links)


def _rack_path(a: int, b: int) -> tuple:
    """Host a to host b through its rack switch (and the other rack's), as edges."""
    sa, sb = f"s{a // 4}", f"s{b // 4}"
    chain = [f"h{a}", sa] + ([sb] if sa != sb else []) + [f"h{b}"]
    return tuple(zip(chain, chain[1:]))


def test_lone_flow_shortcut_matches_the_batched_solve():
    """Random transfers over a small two-rack network, some alone on their links, some
    sharing, some starting at the same instant: finish times, bytes per link and the
    recorded link rates equal those of a network where every change is re-solved in the
    batched zero-delay flush."""
    rng = random.Random(7)
    g = _two_racks()

    def path(a, b):
        return list(_rack_path(a, b))
    sends = []
    for k in range(60):
        a, b = rng.sample(range(8), 2)
        start = rng.choice([0.0, 1e-3, 2e-3]) if k % 5 == 0 else rng.uniform(0, 5e-3)
        sends.append(Send(k, start, path(a, b), rng.choice([1e5, 1e6, 3e6])))
    flushes = {}

    def count_flushes(net):
        flush = net._flush

        def counted(ev):
            flushes[type(net)] = flushes.get(type(net), 0) + 1
            flush(ev)
        net._flush = counted
    done, net = _run_sends(FlowNetwork, g, sends, record=True, wrap=count_flushes)
    _, ref = _same_finishes(done, net, _run_sends(_BatchedOnly, g, sends, record=True, wrap=count_flushes))

    def rate_steps(samples):
        """Per link: time -> the rate from then on (the last sample of an instant wins)."""
        out = {}
        for t, e, r in samples:
            out.setdefault(e, {})[t] = r
        return out
    got, want = rate_steps(net.samples), rate_steps(ref.samples)
    assert got.keys() == want.keys()
    for e in got:
        assert sorted(got[e]) == pytest.approx(sorted(want[e]), rel=1e-12)
        assert [got[e][t] for t in sorted(got[e])] == pytest.approx([want[e][t] for t in sorted(want[e])], rel=1e-9)
    # Both paths were taken: some changes were solved in a flush, fewer than without
    # the shortcut.
    assert 0 < flushes[FlowNetwork] < flushes[_BatchedOnly]


class _AlwaysSolve(FlowNetwork):
    """Reference: every component is solved afresh (no reuse of earlier solves)."""

    def _solve_known(self, flows, edges):
        self._solve(flows, edges)


def test_reused_component_solves_match_fresh_solves():
    """Transfers over a few fixed (tuple) paths of a two-rack network recur in the same
    combinations, so the network answers repeated components from its earlier solves:
    finish times and bytes per link equal those of a network that re-solves every
    component, and reuse did happen."""
    rng = random.Random(11)
    g = _two_racks()
    path = _rack_path
    paths = [path(0, 5), path(1, 6), path(4, 2), path(3, 1)]
    # Rounds of the same sends at the same offsets: the same components recur.
    sends = [Send((r, k), 1e-2 * r + 1e-4 * k, paths[k], 1e6 * (1 + k)) for r in range(5) for k in range(4)]
    sends += [Send(("x", k), rng.uniform(0, 5e-2), paths[rng.randrange(4)], 2e6) for k in range(20)]

    done, net = _run_sends(FlowNetwork, g, sends)
    assert net.solves_reused > 0
    _same_finishes(done, net, _run_sends(_AlwaysSolve, g, sends))


def test_flows_with_room_run_at_their_lone_rates_without_a_re_solve():
    """Hand numbers: a 10 GB/s trunk t->u shared by flows from a and b, each behind its
    own 2 GB/s access link. Both fit the trunk at their lone 2 GB/s (4 of 10 GB/s), so
    1 GB each takes 0.5 s, and the network starts and finishes them without the batched
    re-solve. A third flow from c behind a 7 GB/s link, started at 0.1 s, does not fit
    (4 + 7 > 10): a re-solve shares the trunk max-min (2, 2 and 6 GB/s); a and b still
    end at 0.5 s, and c, having sent 2.4 GB of 2.8 GB by then, sends the rest at its
    lone 7 GB/s."""
    g = graph(Link("a", "t", 2e9, 0.0), Link("b", "t", 2e9, 0.0), Link("c", "t", 7e9, 0.0),
              Link("t", "u", 10e9, 0.0))

    def run(sends):
        env = simpy.Environment()
        net = FlowNetwork(env, g)
        flushes = []
        flush = net._flush
        net._flush = lambda ev: (flushes.append(env.now), flush(ev))
        done = {}

        def go(src, start, nbytes):
            yield env.timeout(start)
            yield net.transfer(((src, "t"), ("t", "u")), nbytes)
            done[src] = env.now
        for src, start, nbytes in sends:
            env.process(go(src, start, nbytes))
        env.run()
        return done, flushes
    done, flushes = run([("a", 0.0, 1e9), ("b", 0.0, 1e9)])
    assert done == {"a": pytest.approx(0.5, rel=1e-12), "b": pytest.approx(0.5, rel=1e-12)}
    assert flushes == []
    done, flushes = run([("a", 0.0, 1e9), ("b", 0.0, 1e9), ("c", 0.1, 2.8e9)])
    assert done["a"] == pytest.approx(0.5, rel=1e-12) and done["b"] == pytest.approx(0.5, rel=1e-12)
    assert done["c"] == pytest.approx(0.5 + 0.4e9 / 7e9, rel=1e-12)
    assert flushes, "the flow that does not fit is placed by a re-solve"
