"""The pruned busiest-links search (sim/metrics.py _busiest_pruned, which looks up only
links that can make the list) against the plain definition computed here: every link's
utilisation, sorted by (-utilisation, name), first ``top``."""
from __future__ import annotations

import random

from sim.metrics import _busiest_pruned
from specs.topology import load_topology


def _reference(g, carried, step, top):
    rows = [{"link": f"{u}->{v}", "kind": g.edges[u, v].get("kind", ""), "bytes": b,
             "utilisation": b / (g.edges[u, v]["bw_Bps"] * step)} for (u, v), b in carried.items() if b > 0]
    rows.sort(key=lambda r: (-r["utilisation"], r["link"]))
    return rows[:top]


def test_pruned_equals_definition_with_ties():
    """dgx-a100, 64 nodes: bytes on every link of 300 random routes, drawn from a few
    values so that many links tie (same bytes, same bandwidth), plus zero-byte links;
    for top 1, 10 and 50 the pruned rows equal the reference rows exactly, and the
    bandwidth floor is the NIC's 25 GB/s (200 Gb/s HDR, the slowest link here)."""
    c = load_topology("dgx-a100", nodes=64)
    rng = random.Random(7)
    carried = {}
    for _ in range(300):
        a, b = rng.randrange(c.num_devices), rng.randrange(c.num_devices)
        for e in c.route(a, b):
            carried[e] = carried.get(e, 0.0) + rng.choice([0.0, 1e9, 2e9, 5e9])
    assert c.links.min_bw_Bps == 25e9
    for top in (1, 10, 50):
        assert _busiest_pruned(c.links, carried, 0.5, top, c.links.min_bw_Bps) == _reference(c.links, carried, 0.5, top)
