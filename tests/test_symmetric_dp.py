"""Symmetric data-parallel collectives (sim/symmetric_collective.py) against the explicit
simulation: every flow of every DP collective simulated one by one (Engine
symmetric_dp=False) is the independent computation; the representative flows must give
the same step time (issue 11: within 0.1 %) on every bundled topology, for ring, tree and
hierarchical all-reduce, ZeRO and top-k, and carry the same bytes per link."""
from __future__ import annotations

import networkx as nx
import pytest
import simpy

from costmodel.profile import load_profile
from sim.flownet import FlowNetwork
from sim.metrics import simulate
from sim.symmetric_collective import representatives
from specs.model import load_model
from specs.plan import resolve_plan
from specs.topology import load_topology

# (topology, nodes, model, plan): sizes where the explicit simulation still runs fast.
CASES = [
    ("dgx-a100", 32, "gpt3-6.7b", "tp=2,pp=2,mbs=1"),                         # 64 replicas, 2 leaves
    ("dgx-a100", 32, "gpt3-6.7b", "tp=8,pp=2,mbs=1,allreduce=tree"),
    ("dgx-a100", 32, "gpt3-13b", "tp=4,pp=2,mbs=1,allreduce=hierarchical,zero=1"),
    ("dgx-a100", 16, "gpt3-6.7b", "tp=2,pp=2,mbs=1,zero=3"),
    ("dgx-h100", 64, "gpt3-13b", "tp=8,pp=4,mbs=1,vpp=2"),                     # 2 scalable units
    ("dgx-h100", 64, "gpt3-6.7b", "tp=2,pp=4,mbs=1,placement=tp-dp-pp"),
    ("hetero-a100-v100", None, "gpt3-1.3b", "tp=1,pp=2,dp=32,mbs=2,layers=18:6,placement=tp-dp-pp"),
    ("hetero-a100-v100", None, "gpt3-1.3b", "tp=2,pp=1,mbs=1"),              # mixed: explicit
    ("jeanzay-a100-opa", None, "gpt3-13b", "tp=8,pp=3,mbs=1,layers=14:13:13"),
    ("pcie-l40s", None, "gpt3-1.3b", "tp=1,pp=2,mbs=1,compress=topk:0.01"),
    ("pcie-l40s", None, "gpt3-1.3b", "tp=2,pp=1,mbs=1,allreduce=hierarchical"),
    ("localhost-cpu", None, "gpt3-125m", "tp=1,pp=1,mbs=1"),
]


@pytest.mark.parametrize("topology,nodes,model,plan", CASES, ids=[f"{c[0]}:{c[3]}" for c in CASES])
def test_symmetric_matches_explicit(topology, nodes, model, plan):
    """The step time with representative DP flows equals the explicit one within 0.1 %
    (in practice to float rounding), and the busiest links carry the same bytes."""
    cluster = load_topology(topology, nodes=nodes)
    m = load_model(model)
    profile = load_profile(None, bundled=cluster.profiles)
    p = resolve_plan(plan, m, cluster.num_devices)
    sym = simulate(m, p, cluster, profile)
    exp = simulate(m, p, cluster, profile, symmetric_dp=False)
    assert sym.step_time_s == pytest.approx(exp.step_time_s, rel=1e-3)
    assert sym.breakdown["dp"] == pytest.approx(exp.breakdown["dp"], rel=1e-3, abs=1e-9)
    assert [x["bytes"] for x in sym.busiest_links] == pytest.approx([x["bytes"] for x in exp.busiest_links],
                                                                    rel=1e-9)


def _ring_net(n: int, uplink_Bps: float):
    """n hosts in two racks of n/2 on one switch each, racks joined by one link pair of
    ``uplink_Bps``; host links 10 B/s, no latency."""
    g = nx.DiGraph()
    for i in range(n):
        sw = f"sw{i // (n // 2)}"
        g.add_edge(f"h{i}", sw, bw_Bps=10.0, latency_s=0.0)
        g.add_edge(sw, f"h{i}", bw_Bps=10.0, latency_s=0.0)
    g.add_edge("sw0", "sw1", bw_Bps=uplink_Bps, latency_s=0.0)
    g.add_edge("sw1", "sw0", bw_Bps=uplink_Bps, latency_s=0.0)

    def route(s, d):
        a, b = f"sw{s // (n // 2)}", f"sw{d // (n // 2)}"
        chain = [f"h{s}", a] + ([b] if a != b else []) + [f"h{d}"]
        return tuple(zip(chain, chain[1:]))
    return g, route


def test_ring_classes_by_hand():
    """A ring over 8 hosts in two racks: 6 flows stay in a rack, 2 cross the 4 B/s rack
    link (one each way). Refinement gives two classes: in-rack and crossing. The
    crossing representative is the one into host 0 (7 -> 0, touching the group's first
    rank); it crosses sw1->sw0 alone (multiplicity 1). Host links give 10 B/s, so 20 B
    take 2 s in rack and 20 / 4 = 5 s across, as in the explicit run."""
    g, route = _ring_net(8, 4.0)
    paths = [route(i, (i + 1) % 8) for i in range(8)]
    env = simpy.Environment()
    net = FlowNetwork(env, g)
    reps = representatives(paths, [{e: 1 for e in p} for p in paths], [20.0] * 8,
                           [i in (0, 7) for i in range(8)], net.edge_params)
    assert [r.index for r in reps] == [0, 7]
    assert reps[1].weights[("sw1", "sw0")] == 1
    # In-rack class: 6 flows' bytes on 12 host links; its weights only on links a
    # representative crosses.
    assert sum(reps[0].carried.values()) == 12
    done = {}
    for r in reps:
        ev = net.transfer(r.path, 20.0, shares=r.weights, carried=r.carried)
        ev.callbacks.append(lambda _e, i=r.index: done.__setitem__(i, env.now))
    env.run()
    assert done == {0: pytest.approx(2.0), 7: pytest.approx(5.0)}
    assert net.bytes_carried[("sw0", "sw1")] == pytest.approx(20.0)
    assert net.bytes_carried[("h3", "sw0")] == pytest.approx(20.0)   # a twin's link, credited


def test_shared_link_loads_by_class():
    """Two racks of 4 hosts, all-to-next ring shifted by 4 (i -> i+4 mod 8): every flow
    crosses the 4 B/s rack link, 4 per direction. One class; its representative (0 -> 4)
    shares sw0->sw1 with multiplicity 4, so each flow gets 1 B/s and 20 B take 20 s, as 4
    explicit flows sharing 4 B/s would. The reverse link, crossed by no representative,
    is the same constraint mirrored: not simulated, but its bytes are credited."""
    g, route = _ring_net(8, 4.0)
    paths = [route(i, (i + 4) % 8) for i in range(8)]
    net = FlowNetwork(simpy.Environment(), g)
    reps = representatives(paths, [{e: 1 for e in p} for p in paths], [20.0] * 8,
                           [i in (0, 4) for i in range(8)], net.edge_params)
    assert len(reps) == 1
    r = reps[0]
    assert r.weights[("sw0", "sw1")] == 4 and ("sw1", "sw0") not in r.weights
    assert r.carried[("sw1", "sw0")] == 4
    ev = net.transfer(r.path, 20.0, shares=r.weights, carried=r.carried)
    net.env.run()
    assert ev.processed and net.env.now == pytest.approx(20.0)
    assert net.bytes_carried[("sw1", "sw0")] == pytest.approx(80.0)
