"""Topology files -> Cluster: device counts, graph links, routes, bandwidth rules, scaling, bad input."""
from __future__ import annotations

import copy
import math
from importlib.resources import files

import pytest
import yaml

from costmodel.errors import InputError
from specs.topology import load_topology, list_topologies

# A small valid cluster used as the base of the variants below: 3 nodes x 2 GPUs, 1 NIC each.
BASE = {
    "name": "tiny",
    "node_types": {
        "box": {
            "gpu": "A100-SXM4-80GB", "gpus_per_node": 2,
            "intra": {"kind": "nvswitch", "bw_GBps": 300, "latency_us": 1.0},
            "pcie": {"bw_GBps": 31.5, "latency_us": 0.5},
            "nics": {"count": 1, "bw_gbps": 200, "latency_us": 0.6},
        }
    },
    "groups": [{"name": "g", "node_type": "box", "nodes": 3}],
    "network": {"kind": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 1.0, "switch_latency_us": 0.1},
}


def write(tmp_path, data, name="topo.yaml") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def variant(**changes):
    """BASE with dotted-path replacements; the value None deletes the key."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = data
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if value is None:
            del target[last]
        else:
            target[last] = value
    return data


def vertices(route) -> list[str]:
    return [route[0][0]] + [b for _, b in route]


EXPECTED = {  # name: (devices, GPU of rank 0, GPU of the last rank)
    "dgx-a100": (128, "A100-SXM4-80GB", "A100-SXM4-80GB"),
    "dgx-h100": (128, "H100-SXM5-80GB", "H100-SXM5-80GB"),
    "hetero-a100-v100": (64, "A100-SXM4-80GB", "V100-SXM2-32GB"),
    "pcie-l40s": (64, "L40S", "L40S"),
    "localhost-cpu": (4, "CPU", "CPU"),
    "jeanzay-a100-opa": (384, "A100-SXM4-80GB", "A100-SXM4-80GB"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bundled_files_load(name):
    """Each bundled file loads with the device count and GPU models its comments describe, and every
    physical link is two directed edges with equal bandwidth and an edge kind."""
    assert name in list_topologies()
    cluster = load_topology(name)
    count, first, last = EXPECTED[name]
    assert cluster.num_devices == count
    assert (cluster.devices[0].gpu.name, cluster.devices[-1].gpu.name) == (first, last)
    assert [d.rank for d in cluster.devices] == list(range(count))
    for u, v, data in cluster.graph.edges(data=True):
        assert cluster.graph.edges[v, u]["bw_Bps"] == data["bw_Bps"] > 0
        assert data["latency_s"] >= 0 and data["kind"]


def test_intra_node_route_stays_in_the_node():
    """dgx-a100: GPU 0 -> GPU 5 goes GPU -> NVSwitch -> GPU, at 300 GB/s, latency 1 us (two half hops)."""
    cluster = load_topology("dgx-a100")
    route = cluster.route(0, 5)
    assert vertices(route) == ["n0.gpu0", "n0.nvswitch", "n0.gpu5"]
    assert cluster.path_bw_Bps(route) == 300e9
    assert cluster.path_latency_s(route) == pytest.approx(1e-6)
    assert cluster.route(3, 3) == ()
    assert cluster.path_bw_Bps(()) == math.inf and cluster.path_latency_s(()) == 0


def test_inter_node_route_through_leaf_and_spine():
    """dgx-a100 with 64 nodes (20 per leaf): rank 0 -> node 25 local 3 passes NIC 0, leaf0, the spine,
    leaf1, NIC 3; bottleneck = 200 Gb/s = 25e9 B/s; latency = 0.5 + (0.6 + 0.13) + 0.13 + 0.13 + 0.6 + 0.5 us."""
    cluster = load_topology("dgx-a100", nodes=64)
    dst = 25 * 8 + 3
    route = cluster.route(0, dst)
    assert vertices(route) == ["n0.gpu0", "n0.nic0", "leaf0", "spine", "leaf1", "n25.nic3", "n25.gpu3"]
    assert cluster.path_bw_Bps(route) == 25e9
    assert cluster.path_latency_s(route) == pytest.approx(2.59e-6)
    # Nodes on the same leaf skip the spine.
    assert vertices(cluster.route(0, 8)) == ["n0.gpu0", "n0.nic0", "leaf0", "n1.nic0", "n1.gpu0"]


def test_fat_tree_oversubscription_rule():
    """hetero-a100-v100, 2:1: leaf0 holds 4 A100 nodes x 8 x 25e9 B/s -> uplink 400e9 B/s; leaf1 holds
    4 V100 nodes x 4 x 12.5e9 B/s -> uplink 100e9 B/s. An A100 -> V100 route is limited by the 100 Gb/s NIC."""
    cluster = load_topology("hetero-a100-v100")
    g = cluster.graph
    assert g.edges["leaf0", "spine"]["bw_Bps"] == g.edges["spine", "leaf0"]["bw_Bps"] == 400e9
    assert g.edges["leaf1", "spine"]["bw_Bps"] == 100e9
    assert g.edges["leaf0", "spine"]["kind"] == "leaf_spine"
    route = cluster.route(0, 63)
    assert "spine" in vertices(route)
    assert cluster.path_bw_Bps(route) == 12.5e9
    assert cluster.groups() == {"a100": list(range(32)), "v100": list(range(32, 64))}


def test_v100_hybrid_cube_mesh():
    """DGX-1V: every GPU has 6 NVLink2 links (docs/facts.md: 300 GB/s total = 6 x 25 GB/s x 2 directions);
    doubled pair 0-3 carries 50 GB/s; 0 -> 5 has no direct link and takes two NVLink hops."""
    cluster = load_topology("hetero-a100-v100")
    node = cluster.nodes[4]
    assert (node.group, node.intra_kind, node.intra_bw_Bps) == ("v100", "nvlink_mesh", 150e9)
    g = cluster.graph
    for local in range(8):
        v = f"n4.gpu{local}"
        total = sum(g.edges[v, w]["bw_Bps"] for w in g.successors(v) if g.edges[v, w]["kind"] == "nvlink")
        assert total == 150e9
    assert vertices(cluster.route(32, 35)) == ["n4.gpu0", "n4.gpu3"]
    assert cluster.path_bw_Bps(cluster.route(32, 35)) == 50e9
    two_hop = cluster.route(32, 37)
    assert len(two_hop) == 2 and all(g.edges[e]["kind"] == "nvlink" for e in two_hop)


def test_rail_optimized_routes():
    """dgx-h100 with 64 nodes (2 units of 32): same rail in one unit = one leaf; another rail or unit
    goes through the spine; a rail leaf's uplink = 32 NICs x 50e9 B/s; the 400 Gb/s NIC is the bottleneck."""
    cluster = load_topology("dgx-h100", nodes=64)
    assert vertices(cluster.route(0, 8)) == ["n0.gpu0", "n0.nic0", "su0.rail0", "n1.nic0", "n1.gpu0"]
    assert vertices(cluster.route(0, 9))[2:5] == ["su0.rail0", "spine", "su0.rail1"]
    assert vertices(cluster.route(0, 32 * 8))[2:5] == ["su0.rail0", "spine", "su1.rail0"]
    assert cluster.graph.edges["su0.rail0", "spine"]["bw_Bps"] == 32 * 50e9
    assert cluster.path_bw_Bps(cluster.route(0, 9)) == 50e9


def test_rail_assignment_shares_nics_in_blocks():
    """With 8 GPUs and 4 NICs (Jean Zay), GPU g uses NIC g*4//8 = g//2."""
    cluster = load_topology("jeanzay-a100-opa")
    for local in range(8):
        assert cluster.route(local, 8)[0] == (f"n0.gpu{local}", f"n0.nic{local // 2}")
    assert cluster.nodes[0].nic_bw_Bps == 12.5e9 and cluster.nodes[0].nic_count == 4


def test_pcie_and_loopback_stars():
    """pcie-l40s: GPUs meet at the host PCIe hub at 31.5 GB/s; localhost-cpu: one node, no network,
    4 devices around a loopback hub."""
    l40s = load_topology("pcie-l40s")
    route = l40s.route(1, 6)
    assert vertices(route) == ["n0.gpu1", "n0.pcie", "n0.gpu6"]
    assert l40s.path_bw_Bps(route) == 31.5e9 and l40s.graph.edges[route[0]]["kind"] == "pcie"
    local = load_topology("localhost-cpu")
    assert local.graph.number_of_nodes() == 5 and local.nodes[0].nic_count == 0
    assert vertices(local.route(0, 3)) == ["n0.gpu0", "n0.loopback", "n0.gpu3"]


def test_nodes_scaling():
    """--nodes replaces the node count of a one-group file: 3 nodes = 24 devices; 128 nodes = 1024 devices
    on ceil(128/20) = 7 leaves; dgx-h100 at 384 nodes is the 3072-GPU cluster of a short file."""
    small = load_topology("dgx-a100", nodes=3)
    assert (small.num_devices, len(small.nodes), small.node_of(23), small.gpus_per_node) == (24, 3, 2, 8)
    big = load_topology("dgx-a100", nodes=128)
    assert big.num_devices == 1024
    assert sum(1 for _, r in big.graph.nodes(data="role") if r == "leaf") == 7
    assert load_topology("dgx-h100", nodes=384).num_devices == 3072
    text = (files("topologies") / "dgx-h100.yaml").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 40


def test_routes_cached_and_deterministic():
    """route() returns the cached tuple on a second call, and two independent loads agree."""
    a, b = load_topology("dgx-a100", nodes=32), load_topology("dgx-a100", nodes=32)
    assert a.route(3, 200) is a.route(3, 200)
    assert all(a.route(s, d) == b.route(s, d) for s, d in [(0, 255), (17, 4), (100, 180)])


def test_explicit_network(tmp_path):
    """Explicit links: nodes 0,1 on switch A, node 2 on switch B, A-B at 50 Gb/s. A route 0 -> 4 crosses
    A and B and is limited to 50 Gb/s = 6.25e9 B/s; its latency sums the given link latencies."""
    links = [{"a": "n0.nic0", "b": "A", "bw_gbps": 200, "latency_us": 1},
             {"a": "n1.nic0", "b": "A", "bw_gbps": 200, "latency_us": 1},
             {"a": "A", "b": "B", "bw_gbps": 50, "latency_us": 2},
             {"a": "B", "b": "n2.nic0", "bw_gbps": 200, "latency_us": 1}]
    cluster = load_topology(write(tmp_path, variant(network={"kind": "explicit", "links": links})))
    route = cluster.route(0, 4)
    assert vertices(route) == ["n0.gpu0", "n0.nic0", "A", "B", "n2.nic0", "n2.gpu0"]
    assert cluster.path_bw_Bps(route) == 6.25e9
    assert cluster.path_latency_s(route) == pytest.approx((0.5 + 1 + 2 + 1 + 0.5) * 1e-6)
    # Disconnected: drop the A-B link.
    with pytest.raises(InputError) as exc:
        load_topology(write(tmp_path, variant(network={"kind": "explicit", "links": links[:2] + links[3:]})))
    assert exc.value.field == "network.links" and "disconnected" in str(exc.value)
    # A NIC of a node that does not exist.
    bad = links + [{"a": "n9.nic0", "b": "A", "bw_gbps": 1, "latency_us": 1}]
    with pytest.raises(InputError) as exc:
        load_topology(write(tmp_path, variant(network={"kind": "explicit", "links": bad})))
    assert exc.value.field == "network.links.4.a" and "'n9.nic0'" in str(exc.value)


def test_gpu_overrides_reach_devices(tmp_path):
    """gpu_overrides change the devices' spec (power-capped part) while other fields keep datasheet values."""
    data = variant(node_types__box__gpu_overrides={"mem_gib": 40, "peak_tflops": {"bf16": 200}})
    gpu = load_topology(write(tmp_path, data)).devices[0].gpu
    assert (gpu.mem_gib, gpu.peak_flops("bf16"), gpu.peak_flops("tf32")) == (40, 200e12, 156e12)


BAD = [  # (case, data, expected dotted field, text the message must contain)
    ("unknown key", variant(node_types__box__colour="red"), "node_types.box.colour", "allowed: gpu,"),
    ("unknown top key", variant(nodez=3), "nodez", "allowed: name,"),
    ("unknown GPU", variant(node_types__box__gpu="A200"), "node_types.box.gpu", "H100-SXM5-80GB"),
    ("unknown intra kind", variant(node_types__box__intra__kind="ring"), "node_types.box.intra.kind", "nvlink_mesh"),
    ("unknown network kind", variant(network__kind="torus"), "network.kind", "rail_optimized"),
    ("unknown network key", variant(network__oversub=2), "network.oversub", "oversubscription"),
    ("negative bandwidth", variant(node_types__box__nics__bw_gbps=-1), "node_types.box.nics.bw_gbps", "-1"),
    ("zero NIC count", variant(node_types__box__nics__count=0), "node_types.box.nics.count", "0"),
    ("zero GPUs", variant(node_types__box__gpus_per_node=0), "node_types.box.gpus_per_node", "0"),
    ("zero nodes", variant(groups__0__nodes=0), "groups.0.nodes", "0"),
    ("missing field", variant(groups__0__node_type=None), "groups.0.node_type", "required"),
    ("unknown node type", variant(groups__0__node_type="rack"), "groups.0.node_type", "allowed: box"),
    ("multi-node without network", variant(network=None), "network", "fat_tree"),
    ("multi-node without NICs", variant(node_types__box__nics=None), "node_types.box.nics", "required"),
    ("NICs without pcie", variant(node_types__box__pcie=None), "node_types.box.pcie", "required"),
    ("bad precision override", variant(node_types__box__gpu_overrides={"peak_tflops": {"bf17": 1}}),
     "node_types.box.gpu_overrides.peak_tflops.bf17", "'bf16'"),
    ("mesh pair out of range", variant(node_types__box__intra={"kind": "nvlink_mesh", "bw_GBps": 25,
                                                               "latency_us": 1, "links": [[0, 2, 1]]}),
     "node_types.box.intra.links.0", "0..1"),
    ("links on a switch", variant(node_types__box__intra__links=[[0, 1, 1]]), "node_types.box.intra.links", "nvlink_mesh"),
    ("duplicate group", variant(groups=[{"name": "g", "node_type": "box", "nodes": 1}] * 2), "groups.1.name", "'g'"),
]


@pytest.mark.parametrize("case,data,field,text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_field(tmp_path, case, data, field, text):
    """Each malformed file raises one InputError whose field is the offending dotted path and whose
    one-line message says what is allowed or shows the bad value."""
    path = write(tmp_path, data)
    with pytest.raises(InputError) as exc:
        load_topology(path)
    err = exc.value
    assert err.field == field and err.source == path
    assert field in str(err) and text in str(err) and "\n" not in str(err)


def test_malformed_and_duplicate_yaml(tmp_path):
    """Broken YAML and a key given twice are InputErrors with the line number, not tracebacks."""
    with pytest.raises(InputError, match="malformed YAML at line 3"):
        load_topology(write(tmp_path, "name: x\ngroups: [\n  - a: b\n"))
    with pytest.raises(InputError, match="duplicate key 'name'"):
        load_topology(write(tmp_path, "name: x\nname: y\n"))
    with pytest.raises(InputError, match="top level"):
        load_topology(write(tmp_path, "- a\n- b\n"))


def test_missing_file_and_bad_nodes(tmp_path):
    """A missing file or unknown name lists the bundled names; --nodes <= 0 or on a heterogeneous file is rejected."""
    with pytest.raises(InputError) as exc:
        load_topology("no-such-cluster")
    assert exc.value.field == "topology" and "dgx-a100" in str(exc.value)
    with pytest.raises(InputError, match="bundled topologies: dgx-a100"):
        load_topology(str(tmp_path / "absent.yaml"))
    for nodes in (0, -4):
        with pytest.raises(InputError) as exc:
            load_topology("dgx-a100", nodes=nodes)
        assert exc.value.field == "--nodes"
    with pytest.raises(InputError, match="--nodes: cannot scale a heterogeneous topology with 2 groups"):
        load_topology("hetero-a100-v100", nodes=2)


@pytest.mark.parametrize("name,nodes", [(n, None) for n in sorted(EXPECTED)] + [("dgx-a100", 64), ("dgx-h100", 64),
                                                                              ("dgx-a100", 1)])
def test_links_by_name_match_the_graph(name, nodes):
    """The link table computed from vertex names (specs/topology_links.py, what the engine
    reads) gives every edge of the built networkx graph the same bandwidth, latency and
    kind, every vertex the same role, and no edge the graph lacks (each vertex against
    every other of a sample, both directions)."""
    lazy = load_topology(name, nodes=nodes)
    g = lazy.graph
    links = lazy.links
    assert links is not g
    for u, v, data in g.edges(data=True):
        assert links.edges[u, v] == data
    for v, data in g.nodes(data=True):
        assert links.nodes[v] == data
    sample = list(g.nodes)[:40] + list(g.nodes)[-20:]
    for u in sample:
        for v in sample:
            assert links.has_edge(u, v) == g.has_edge(u, v)
    for bad in ("n0.gpu99", "n999999.gpu0", "n00.gpu0", "n0.gpu01", "leafX", "spine2", "n0.nic", "x"):
        assert not links.has_edge(bad, "n0.gpu0") and not links.has_edge("n0.gpu0", bad)


@pytest.mark.parametrize("name,nodes", [("dgx-a100", 64), ("dgx-h100", 64), ("hetero-a100-v100", None),
                                        ("pcie-l40s", None), ("localhost-cpu", None)])
def test_direct_routes_and_counts_match_the_chain(name, nodes):
    """The routes written out directly for trees and stars equal the vertex chains the
    general router builds, and route_counts (which skips pairs far from the path) equals
    counting every pair's route edge by edge."""
    cluster = load_topology(name, nodes=nodes)
    n = cluster.num_devices
    ranks = sorted({0, 1, 5, 7, 8, 9, 31, 32, 35, n // 2, n - 9, n - 1} & set(range(n)))
    for s in ranks:
        for d in ranks:
            chain = tuple(zip(*cluster._chain(s, d)))
            assert cluster.route(s, d) == chain
    pairs = [(a, b) for a in range(0, n, 3) for b in range(1, n, 7) if a != b][:3000]
    for s, d in [(0, n - 1), (0, 1), (n - 3, (9 * n) // 16 + 1)]:
        path = cluster.route(s, d)
        brute = {e: sum(e in cluster.route(a, b) for a, b in pairs) for e in path}
        assert cluster.route_counts(path, pairs) == brute
