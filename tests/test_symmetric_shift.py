"""Reusing one stage's symmetric DP collective for the stages shifted from it
(Cluster.shift_map, sim/collective_flows.py _shifted_representatives): the independent
computation is the same simulation with the reuse turned off (every stage's ring
routed and coloured on its own); results must be equal to the last bit, and the map
must be what it claims (renamed routes, equal link attributes)."""
from __future__ import annotations

import dataclasses

from costmodel.profile import load_profile
from sim.metrics import simulate
from specs.model import load_model
from specs.plan import resolve_plan
from specs.topology import Cluster, load_topology


def test_shift_map_renames_routes_and_keeps_link_attributes():
    """dgx-a100 with 40 nodes: leaves of 20 nodes. Shifting nodes {0, 2, 4} by one node
    stays within leaf0, so a map exists: every route between their ranks, renamed, is
    the route between the shifted ranks, over links with the same attributes. Shifting
    {18, 19} by one node puts node 19's image on leaf1 while node 18's stays on leaf0: the
    leaves do not map one to one, so there is no map."""
    c = load_topology("dgx-a100", nodes=40)
    ranks = [r for i in (0, 2, 4) for r in c.nodes[i].ranks]
    vmap = c.shift_map(ranks, 8)
    assert vmap is not None
    for a in ranks:
        for b in ranks:
            mine = c.route(a, b)
            assert c.route(a + 8, b + 8) == tuple((vmap[u], vmap[v]) for u, v in mine)
            for u, v in mine:
                assert c.links.edges[u, v] == c.links.edges[vmap[u], vmap[v]]
    assert c.shift_map([r for i in (18, 19) for r in c.nodes[i].ranks], 8) is None
    assert c.shift_map(ranks, 4) is None                  # not whole nodes


def test_reuse_gives_identical_results(monkeypatch):
    """GPT-3 175B, tp=8 pp=8 dp=32 on 256 A100s (leaves of 20 nodes, stage s on nodes
    s, s+8, ...): some stages' rings are renamed from others' (the map is asked for and
    found), and every figure (but the simulator's own wall time) equals the run where no ring is reused."""
    cluster = load_topology("dgx-a100", nodes=256)
    model = load_model("gpt3-175b")
    profile = load_profile(None, bundled=cluster.profiles)
    plan = resolve_plan("tp=8,pp=8,dp=32,mbs=1", model, cluster.num_devices)
    found = []
    orig = Cluster.shift_map

    def counting(self, ranks, delta):
        out = orig(self, ranks, delta)
        found.append(out is not None)
        return out
    monkeypatch.setattr(Cluster, "shift_map", counting)
    reused = simulate(model, plan, cluster, profile)
    assert any(found)
    monkeypatch.setattr(Cluster, "shift_map", lambda self, ranks, delta: None)
    direct = simulate(model, plan, load_topology("dgx-a100", nodes=256), profile)
    a, b = dataclasses.asdict(reused), dataclasses.asdict(direct)
    a.pop("sim_wall_s"), b.pop("sim_wall_s")          # (the simulator's own run time)
    assert a == b
