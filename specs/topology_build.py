"""Building a ``Cluster`` (specs/topology.py) from a validated topology file: devices,
nodes, NIC columns and leaves made once per node type and repeated by list operations,
the intra-node meshes, tree networks described by name (specs/topology_links.py) and
explicit networks as a networkx graph. ``specs.topology.load_topology`` is the entry point."""
from __future__ import annotations

import functools
import gc
import re
from itertools import chain, repeat
from operator import attrgetter, floordiv, itemgetter
from typing import TYPE_CHECKING

from costmodel.errors import InputError
from costmodel.gpus import GpuSpec, get_gpu
from specs import topology_schema as schema
from specs.topology_links import NodeLinks, TreeLinks
from specs.topology import Cluster, Device, NodeInfo
from specs.validation import short

if TYPE_CHECKING:   # networkx (a third of a second to import) only where a graph is built
    import networkx as nx

_NODE_VERTEX = re.compile(r"^n\d+\.")
_FIRST = itemgetter(0)      # (Device fields by position)
_NIC_COUNT, _NIC_BW = attrgetter("nic_count"), attrgetter("nic_bw_Bps")


def _mesh_paths(tname: str, nt: schema.NodeType, source: str) -> tuple[dict, dict, float]:
    """NVLink mesh of one node type: ({(a, b): local GPU chain}, {(a, b): bytes/s of the direct
    link(s), a < b}, per-GPU bandwidth of GPU 0 in bytes/s). Chains take the fewest links (the
    lowest latency, as every link has the same latency)."""
    import networkx as nx
    n, field = nt.gpus_per_node, f"node_types.{tname}.intra.links"
    links = nt.intra.links
    if links is None:
        links = [(a, b, 1) for a in range(n) for b in range(a + 1, n)]
    local = nx.Graph()
    local.add_nodes_from(range(n))
    for i, (a, b, count) in enumerate(links):
        if not (0 <= a < n and 0 <= b < n) or a == b:
            raise InputError(source, f"{field}.{i}", f"GPU pair [{a}, {b}] must name two different local GPUs in 0..{n - 1}")
        if local.has_edge(a, b):
            raise InputError(source, f"{field}.{i}", f"GPU pair [{a}, {b}] listed twice; give the link count once")
        local.add_edge(a, b, count=count)
    if not nx.is_connected(local):
        parts = [sorted(c) for c in nx.connected_components(local)]
        raise InputError(source, field, f"GPUs are not all connected; separate sets: {parts}")
    paths = {(a, b): tuple(p) for a, by_dst in nx.all_pairs_shortest_path(local) for b, p in by_dst.items() if a != b}
    link_Bps = nt.intra.bw_GBps * 1e9
    pair_Bps = {(min(a, b), max(a, b)): c * link_Bps for a, b, c in local.edges(data="count")}
    gpu0_Bps = sum(c for _, _, c in local.edges(0, data="count")) * link_Bps
    return paths, pair_Bps, gpu0_Bps


def check_group_node_types(topo: schema.TopologyFile, source: str) -> None:
    """Every group names a node type of the file (InputError naming the group otherwise)."""
    for i, grp in enumerate(topo.groups):
        if grp.node_type not in topo.node_types:
            raise InputError(source, f"groups.{i}.node_type", f"unknown node type {short(grp.node_type)}; "
                                                               f"allowed: {', '.join(topo.node_types)}")


def _check_node_type(tname: str, nt: schema.NodeType, source: str, networked: bool) -> GpuSpec:
    base = get_gpu(nt.gpu, source, f"node_types.{tname}.gpu")
    ov = nt.gpu_overrides
    spec = base.with_overrides(peak_tflops=ov.peak_tflops, mem_gib=ov.mem_gib, mem_bw_GBps=ov.mem_bw_GBps)
    if nt.intra.links is not None and nt.intra.kind != "nvlink_mesh":
        raise InputError(source, f"node_types.{tname}.intra.links", f"only for kind nvlink_mesh, not {short(nt.intra.kind)}")
    if networked and nt.nics is None:
        raise InputError(source, f"node_types.{tname}.nics", "required: the cluster has a network (more than one node)")
    if nt.nics is not None and nt.pcie is None:
        raise InputError(source, f"node_types.{tname}.pcie", "required when nics is given (the GPU <-> NIC hop)")
    return spec


class _Builder:
    def __init__(self, topo: schema.TopologyFile, source: str, lazy: bool = True):
        self.topo, self.source = topo, source
        # lazy: a cluster without an explicit network records no vertex or edge; its links
        # are computed from names (TreeLinks) and the graph is built on first use.
        self.lazy = lazy and not isinstance(topo.network, schema.Explicit)
        self.node_links: list[NodeLinks] = []
        self._node_links_of: dict[str, NodeLinks] = {}
        self.uplink_Bps: dict[str, float] = {}
        self.switch_s = 0.0
        if self.lazy:
            self.g = None
        else:
            import networkx as nx
            self.g = nx.DiGraph()
        self.devices: list[Device] = []
        self.nodes: list[NodeInfo] = []
        self.intra: list[tuple[str | None, dict | None]] = []
        self.nic_of: list[str | None] = []
        self.nic_flat: list[str] = []     # every NIC vertex, node by node
        self.leaf_nodes: dict[str, range] = {}     # tree networks: leaf -> the nodes of its unit
        # Vertices and edges are collected and added to the graph in bulk, in the same
        # order (so adjacency order, and with it routing tie-breaks, are unchanged): one
        # networkx add_node / add_edge call per element costs ~3x more at 100k edges.
        self._vertices: list[tuple[str, dict]] = []
        self._edges: list[tuple[str, str, dict]] = []
        self._buffered = True

    def vertex(self, v: str, **attrs) -> None:
        if self.lazy:
            return
        if self._buffered:
            self._vertices.append((v, attrs))
        else:
            self.g.add_node(v, **attrs)

    def link(self, a: str, b: str, bw_Bps: float, lat_ab_s: float, lat_ba_s: float, kind: str) -> None:
        """One physical link = two directed edges (same bandwidth each way)."""
        if self.lazy:
            return
        ab = (a, b, {"bw_Bps": bw_Bps, "latency_s": lat_ab_s, "kind": kind})
        ba = (b, a, {"bw_Bps": bw_Bps, "latency_s": lat_ba_s, "kind": kind})
        if self._buffered:
            self._edges += (ab, ba)
        else:
            self.g.add_edges_from((ab, ba))

    def flush(self) -> None:
        """Add the collected vertices, then edges, to the graph; later ones go directly."""
        if self.g is None:          # lazy: nothing was collected
            return
        self.g.add_nodes_from(self._vertices)
        self.g.add_edges_from(self._edges)
        self._vertices, self._edges, self._buffered = [], [], False

    def build(self) -> Cluster:
        topo, source = self.topo, self.source
        total = sum(grp.nodes for grp in topo.groups)
        if total > 1 and topo.network is None:
            raise InputError(source, "network", f"required: the cluster has {total} nodes; "
                                                f"allowed kinds: {', '.join(schema.NETWORK_KINDS)}")
        names = set()
        for i, grp in enumerate(topo.groups):
            if grp.name in names:
                raise InputError(source, f"groups.{i}.name", f"duplicate group name {short(grp.name)}")
            names.add(grp.name)
        check_group_node_types(topo, source)
        used = {grp.node_type for grp in topo.groups}
        networked = topo.network is not None
        specs = {t: _check_node_type(t, nt, source, networked) for t, nt in topo.node_types.items() if t in used}
        meshes = {t: _mesh_paths(t, nt, source) for t, nt in topo.node_types.items()
                  if t in used and nt.intra.kind == "nvlink_mesh"}
        for grp in topo.groups:
            self.add_group(grp, topo.node_types[grp.node_type], specs[grp.node_type], meshes.get(grp.node_type))
        leaf_of = spine = None
        if isinstance(topo.network, schema.Explicit):
            self.flush()        # the explicit links are checked against the graph as added
            self.add_explicit(topo.network)
        elif topo.network is not None:
            leaf_of, spine = self.add_tree(topo.network)
        self.flush()
        links = materialise = None
        if self.lazy:
            links = TreeLinks(self.node_links, leaf_of, self.uplink_Bps, spine, self.switch_s)
            materialise = functools.partial(_graph_of, topo, source)     # (picklable)
        cluster = Cluster(topo.name, source, topo.description, self.devices, self.nodes,
                          None if self.lazy else self.g, self.intra, self.nic_of, leaf_of, spine,
                          links=links, materialise=materialise, leaf_nodes=self.leaf_nodes)
        cluster.profiles = tuple(topo.profiles)
        return cluster

    def add_group(self, grp: schema.Group, nt: schema.NodeType, spec: GpuSpec, mesh) -> None:
        """The group's ``grp.nodes`` nodes, all alike: each per-node and per-device column
        is made once for the whole group from the node type's template (names, rail
        assignment, link figures), so loading costs C-level list work per device rather
        than Python steps (16k GPUs are 16k devices, NIC names and routes' table rows)."""
        i0, r0, count = len(self.nodes), len(self.devices), grp.nodes
        n, intra, nics = nt.gpus_per_node, nt.intra, nt.nics
        lat_s = intra.latency_us * 1e-6
        prefixes = [f"n{i}." for i in range(i0, i0 + count)]
        gpu_sfx = [f"gpu{g}" for g in range(n)]
        gpus = [p + x for p in prefixes for x in gpu_sfx]
        node_col = chain.from_iterable(map(repeat, range(i0, i0 + count), repeat(n)))
        self.devices += map(tuple.__new__, repeat(Device), zip(
            range(r0, r0 + n * count), node_col, list(range(n)) * count, repeat(grp.name), repeat(spec), gpus))
        if mesh is None:  # star: GPU <-> hub
            hubs = [p + intra.kind for p in prefixes]
            self.intra += zip(hubs, repeat(None))
            intra_bw = intra.bw_GBps * 1e9
        else:
            paths, pair_Bps, intra_bw = mesh
            self.intra += [(None, paths)] * count
        nl = self._node_links_of.get(grp.node_type)
        if nl is None:      # one record per node type, shared by its nodes
            nl = self._node_links_of[grp.node_type] = NodeLinks(
            gpus=n, hub=intra.kind if mesh is None else None, intra_Bps=intra.bw_GBps * 1e9,
            intra_latency_s=lat_s, mesh_Bps=None if mesh is None else mesh[1],
            pcie_Bps=nt.pcie.bw_GBps * 1e9 if nt.pcie else 0.0,
            pcie_latency_s=nt.pcie.latency_us * 1e-6 if nt.pcie else 0.0,
            nics=nics.count if nics else 0, nic_Bps=nics.bw_gbps * 1e9 / 8 if nics else 0.0,
            nic_latency_s=nics.latency_us * 1e-6 if nics else 0.0)
        self.node_links += [nl] * count
        if nics is not None:
            # rail assignment, see module docstring: local GPU g uses NIC g * nics // gpus
            rail = [g * nics.count // n for g in range(n)]
            nic_sfx = [f"nic{k}" for k in range(nics.count)]
            nic_vs = [p + x for p in prefixes for x in nic_sfx]
            self.nic_flat += nic_vs
            self.nic_of += nic_vs if nics.count == n else \
                [nic_vs[j * nics.count + k] for j in range(count) for k in rail]
        else:
            self.nic_of += [None] * (n * count)
        self.nodes += map(tuple.__new__, repeat(NodeInfo), zip(
            range(i0, i0 + count), repeat(grp.name), repeat(grp.node_type),
            map(tuple, map(range, range(r0, r0 + n * count, n), range(r0 + n, r0 + n * count + n, n))), repeat(intra.kind),
            repeat(intra_bw), repeat(lat_s), repeat(nics.count if nics else 0),
            repeat(nics.bw_gbps * 1e9 / 8 if nics else 0.0), repeat(nics.latency_us * 1e-6 if nics else 0.0)))
        if self.lazy:       # no vertex or edge is recorded
            return
        for i in range(i0, i0 + count):     # the graph, node by node in the order routing expects
            node_gpus = gpus[(i - i0) * n:(i - i0 + 1) * n]
            for v in node_gpus:
                self.vertex(v, role="gpu", node=i)
            if mesh is None:  # half the GPU-to-GPU latency on each hop
                hub = self.intra[i][0]
                self.vertex(hub, role="hub", node=i)
                for v in node_gpus:
                    self.link(v, hub, intra_bw, lat_s / 2, lat_s / 2, intra.kind)
            else:
                for (a, b), bw_Bps in pair_Bps.items():
                    self.link(node_gpus[a], node_gpus[b], bw_Bps, lat_s, lat_s, "nvlink")
            if nics is not None:
                for v in nic_vs[(i - i0) * nics.count:(i - i0 + 1) * nics.count]:
                    self.vertex(v, role="nic", node=i)
                pcie_lat_s = nt.pcie.latency_us * 1e-6
                for r, v in enumerate(node_gpus, start=r0 + (i - i0) * n):
                    self.link(v, self.nic_of[r], nt.pcie.bw_GBps * 1e9, pcie_lat_s, pcie_lat_s, "pcie")

    def add_tree(self, net: schema.FatTree | schema.RailOptimized) -> tuple[dict[str, str], str | None]:
        """Leaves (and a spine when there are several): NIC -> leaf edges add the switch latency,
        leaf uplink bandwidth = sum of NIC bandwidth below / oversubscription."""
        sw_s = self.switch_s = net.switch_latency_us * 1e-6
        below_Bps: dict[str, float] = {}
        fat, per_leaf, lazy = net.kind == "fat_tree", net.nodes_per_leaf, self.lazy
        # Per node, its NICs' leaves: one list per (unit, NIC count), shared by the unit's nodes.
        # (keys and look-ups as C-level maps: 2,048 nodes at 16k GPUs)
        unit_leaves: dict[tuple[int, int], list[str]] = {}
        keys = list(zip(map(floordiv, map(_FIRST, self.nodes), repeat(per_leaf)), map(_NIC_COUNT, self.nodes)))
        for unit, count in dict.fromkeys(keys):
            unit_leaves[(unit, count)] = [f"leaf{unit}" if fat else f"su{unit}.rail{k}" for k in range(count)]
        leaves_of = list(map(unit_leaves.__getitem__, keys))
        leaf_of = dict(zip(self.nic_flat, chain.from_iterable(leaves_of)))
        # Each leaf's NIC bandwidth below, summed in NIC order (as the links are made); units
        # whose nodes have the same NICs have the same sums, added up once.
        node_nics = list(zip(map(_NIC_COUNT, self.nodes), map(_NIC_BW, self.nodes)))
        sums_of: dict[tuple, list[float]] = {}
        for u0 in range(0, len(node_nics), per_leaf):
            sig = tuple(node_nics[u0:u0 + per_leaf])
            sums = sums_of.get(sig)
            if sums is None:
                sums = sums_of[sig] = [0.0] * (1 if fat else max(c for c, _ in sig))
                for c, bw_Bps in sig:
                    for k in range(c):
                        sums[0 if fat else k] += bw_Bps
            # (a fat tree's unit has one leaf, named once per NIC in unit_leaves)
            unit_all = unit_leaves[(u0 // per_leaf, max(c for c, _ in sig))]
            self.leaf_nodes.update(zip(unit_all, repeat(range(u0, u0 + len(sig)))))
            for leaf, bw_Bps in zip(unit_all, sums):
                if leaf not in below_Bps:
                    self.vertex(leaf, role="leaf")
                below_Bps[leaf] = bw_Bps
        if not lazy:
            nic_it = iter(self.nic_flat)
            for node, leaves in zip(self.nodes, leaves_of):
                for leaf, nic in zip(leaves, nic_it):
                    self.link(nic, leaf, node.nic_bw_Bps, node.nic_latency_s + sw_s, node.nic_latency_s, "nic")
        self.uplink_Bps = {leaf: bw / net.oversubscription for leaf, bw in below_Bps.items()}
        if len(below_Bps) <= 1:
            return leaf_of, None
        self.vertex("spine", role="spine")
        for leaf, bw in below_Bps.items():
            self.link(leaf, "spine", bw / net.oversubscription, sw_s, sw_s, "leaf_spine")
        return leaf_of, "spine"

    def add_explicit(self, net: schema.Explicit) -> None:
        import networkx as nx
        roles = dict(self.g.nodes(data="role"))
        for i, ln in enumerate(net.links):
            for end in ("a", "b"):
                name = getattr(ln, end)
                if _NODE_VERTEX.match(name) and roles.get(name) != "nic":
                    raise InputError(self.source, f"network.links.{i}.{end}",
                                     f"unknown vertex {short(name)}; node vertices here are NICs n<node>.nic<i> "
                                     f"(nodes 0..{len(self.nodes) - 1}); other names are switches")
                if name not in roles:
                    self.g.add_node(name, role="switch")
                    roles[name] = "switch"
            if ln.a == ln.b or self.g.has_edge(ln.a, ln.b):
                raise InputError(self.source, f"network.links.{i}", f"link {ln.a} - {ln.b} is a loop or given twice")
            lat_s = ln.latency_us * 1e-6
            self.link(ln.a, ln.b, ln.bw_gbps * 1e9 / 8, lat_s, lat_s, "explicit")
        net_vertices = [v for v, r in roles.items() if r in ("nic", "switch")]
        for v in net_vertices:
            if roles[v] == "nic" and not any(self.g.edges[v, w]["kind"] == "explicit" for w in self.g.successors(v)):
                raise InputError(self.source, "network.links", f"NIC {v} has no link: the network is disconnected")
        net = self.g.subgraph(net_vertices)
        if not nx.is_weakly_connected(net):
            parts = sorted((sorted(c) for c in nx.weakly_connected_components(net)), key=len)
            raise InputError(self.source, "network.links", f"the links leave the network disconnected; "
                                                           f"e.g. {parts[0][:4]} cannot reach {parts[-1][:4]}")


def _graph_of(topo: schema.TopologyFile, source: str) -> nx.DiGraph:
    """The networkx graph of a lazily built cluster, built now."""
    return build(topo, source, lazy=False).graph


def build(topo: schema.TopologyFile, source: str, lazy: bool = True) -> Cluster:
    """The Cluster of ``topo`` (read from ``source``); lazy: no networkx graph unless asked."""
    # The graph is hundreds of thousands of small dicts that all live on: the cyclic
    # collector's passes, triggered as they are allocated, would walk them again and
    # again (half of building a 100k-GPU cluster). Nothing here makes cyclic garbage.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Builder(topo, source, lazy).build()
    finally:
        if enabled:
            gc.enable()
