"""The template build of specs/topology.py (each group's columns made at once) and the
node-index arithmetic of Cluster.shift_map, checked against the naming and rail rules of
the module docstring written out one device, NIC and leaf at a time."""
from __future__ import annotations

import pytest
import yaml

from specs.topology import load_topology, nic_in_use

# Two node types in one rail-optimised unit, one with more NICs than GPUs (NICs 1 and 3
# of a 2-GPU node carry no GPU), and a last unit of one node.
MIXED = {
    "name": "mixed",
    "node_types": {
        "four": {"gpu": "A100-SXM4-80GB", "gpus_per_node": 4,
                 "intra": {"kind": "nvswitch", "bw_GBps": 300, "latency_us": 1.0},
                 "pcie": {"bw_GBps": 31.5, "latency_us": 0.5},
                 "nics": {"count": 4, "bw_gbps": 100, "latency_us": 0.6}},
        "two": {"gpu": "V100-SXM2-32GB", "gpus_per_node": 2,
                "intra": {"kind": "pcie", "bw_GBps": 16, "latency_us": 2.0},
                "pcie": {"bw_GBps": 15.75, "latency_us": 0.5},
                "nics": {"count": 4, "bw_gbps": 12.3, "latency_us": 0.7}},
    },
    "groups": [{"name": "a", "node_type": "four", "nodes": 3}, {"name": "b", "node_type": "two", "nodes": 2}],
    "network": {"kind": "rail_optimized", "nodes_per_leaf": 2, "oversubscription": 1.5, "switch_latency_us": 0.1},
}


def _expected(cluster, per_leaf: int, fat: bool, oversub: float):
    """Per rank (vertex, node, local, NIC, leaf) and per leaf its uplink, by the rules."""
    rows, below = [], {}
    for node in cluster.nodes:
        n, c = len(node.ranks), node.nic_count
        for g, r in enumerate(node.ranks):
            k = g * c // n
            leaf = f"leaf{node.index // per_leaf}" if fat else f"su{node.index // per_leaf}.rail{k}"
            rows.append((f"n{node.index}.gpu{g}", node.index, g, f"n{node.index}.nic{k}", leaf))
        for k in range(c):
            leaf = f"leaf{node.index // per_leaf}" if fat else f"su{node.index // per_leaf}.rail{k}"
            below[leaf] = below.get(leaf, 0.0) + node.nic_bw_Bps
    return rows, {leaf: bw / oversub for leaf, bw in below.items()}


@pytest.mark.parametrize("source,nodes,gpus,per_leaf,fat,oversub", [
    ("dgx-a100", 45, None, 20, True, 1.0), ("dgx-h100", 70, None, 32, False, 1.0),
    ("dgx-h100", 3, 1, 32, False, 1.0), ("dgx-a100", 2, 3, 20, True, 1.0),
    ("hetero-a100-v100", None, None, 4, True, 2.0), ("mixed", None, None, 2, False, 1.5)])
def test_template_build_follows_the_naming_and_rail_rules(tmp_path, source, nodes, gpus, per_leaf, fat, oversub):
    """Every device's vertex, node, local index, NIC and leaf, and every leaf's uplink
    (NIC bandwidth below / oversubscription, summed in node order), equal the rules
    applied device by device; ranks are numbered in node order. Includes 1 and 3 GPUs
    per node on 8 NICs (the validator's --world)."""
    if source == "mixed":
        source = str(tmp_path / "mixed.yaml")
        (tmp_path / "mixed.yaml").write_text(yaml.safe_dump(MIXED))
    cluster = load_topology(source, nodes=nodes, gpus_per_node=gpus)
    rows, uplink = _expected(cluster, per_leaf, fat, oversub)
    assert [(d.vertex, d.node, d.local_rank) for d in cluster.devices] == [r[:3] for r in rows]
    assert [d.rank for d in cluster.devices] == list(range(len(rows)))
    assert [(a[0], a[1], a[3], a[4]) for a in cluster._rank_at] == [(r[0], r[1], r[3], r[4]) for r in rows]
    assert cluster.links._uplink == uplink and list(cluster.links._uplink) == list(uplink)


def test_nic_in_use_matches_the_rail_assignment():
    """nic_in_use(k) is True exactly for the NICs some local GPU g gets as g * nics // gpus."""
    for gpus in range(1, 17):
        for nics in range(1, 33):
            used = {g * nics // gpus for g in range(gpus)}
            assert [nic_in_use(k, gpus, nics) for k in range(nics)] == [k in used for k in range(nics)]


def test_shift_map_renames_each_vertex_of_the_mapped_nodes(tmp_path):
    """On the mixed file shifted by one 'four' node (node 0 -> 1, unit su0 to itself): each
    GPU, used NIC and hub of node 0 is renamed to node 1's, its rail leaves to themselves;
    node 2 (not mapped) is a KeyError. Nodes 2 -> 3 change node type: no map. With only
    'two' nodes (4 NICs for 2 GPUs), NICs 1 and 3 carry no GPU and are KeyErrors."""
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump(MIXED))
    c = load_topology(str(tmp_path / "mixed.yaml"))
    vmap = c.shift_map(list(c.nodes[0].ranks), 4)
    for v in ["gpu0", "gpu3", "nic0", "nic3", "nvswitch"]:
        assert vmap[f"n0.{v}"] == f"n1.{v}"
    assert [vmap[f"su0.rail{k}"] for k in range(4)] == [f"su0.rail{k}" for k in range(4)]
    assert vmap["spine"] == "spine"
    for v in ("n2.gpu0", "n1.gpu0", "leaf0", "su1.rail0"):
        with pytest.raises(KeyError):
            vmap[v]
    assert c.shift_map(list(c.nodes[2].ranks), 4) is None
    # Only 'two' nodes (2 GPUs, 4 NICs), two per unit: node 0 -> 2 moves su0 onto su1.
    only_two = dict(MIXED, groups=[{"name": "b", "node_type": "two", "nodes": 4}])
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(only_two))
    c2 = load_topology(str(tmp_path / "two.yaml"))
    two = c2.shift_map(list(c2.nodes[0].ranks), 4)
    assert [two["n0.nic0"], two["n0.nic2"], two["n0.pcie"]] == ["n2.nic0", "n2.nic2", "n2.pcie"]
    assert [two["su0.rail0"], two["su0.rail2"]] == ["su1.rail0", "su1.rail2"]
    for v in ("n0.nic1", "n0.nic3", "su0.rail1"):       # no GPU uses NICs 1 and 3
        with pytest.raises(KeyError):
            two[v]


@pytest.mark.parametrize("name,nodes", [("dgx-a100", 45), ("dgx-h100", 70), ("hetero-a100-v100", None)])
def test_route_counts_of_few_replicas_match_routing_each(name, nodes):
    """A pipeline send's few replicas (the other local GPUs of the same two nodes, or
    shifted sends) counted by route_counts, which skips routes that cannot touch the path,
    equal counting each replica route edge by edge (same leaf, across the spine, same node)."""
    c = load_topology(name, nodes=nodes)
    n = c.num_devices
    for s, d in [(56, 120), (0, 8), (0, n - 8), (1, 2), (9, n - 1)]:
        if d >= n:
            continue
        path = c.route(s, d)
        for pairs in ([(s + k, d + k) for k in range(1, 7) if max(s, d) + k < n],
                      [(s + 8 * k, d + 8 * k) for k in range(1, 5) if max(s, d) + 8 * k < n],
                      [(d, s), (s, d), (s, s + 1), (d - 1, d)]):
            brute = {e: sum(e in c.route(a, b) for a, b in pairs) for e in path}
            assert c.route_counts(path, pairs) == brute
