"""Cluster topology: load a YAML file (schema in ``specs/topology_schema.py``) into a ``Cluster``,
a networkx graph of every link with routes between devices. Without an explicit network the
graph is built only when ``Cluster.graph`` is read: ``Cluster.links`` (specs/topology_links.py)
gives every link's attributes from its vertex names, which is what the engine reads.

Graph. Vertices: GPU devices ``n<node>.gpu<g>``, one intra-node hub per node for star fabrics
(``n<node>.nvswitch`` / ``.pcie`` / ``.loopback``), NICs ``n<node>.nic<i>``, leaf switches
(``leaf<j>`` for a fat tree, ``su<j>.rail<i>`` rail-optimised), one aggregate ``spine`` (only
when there are several leaves), and the switches an explicit network names. Each vertex has a
``role`` attribute (gpu, hub, nic, leaf, spine, switch). Every physical link is two directed
edges carrying ``bw_Bps`` (bytes/s, per direction), ``latency_s`` and ``kind`` (the intra kind
for GPU <-> hub, 'nvlink' for mesh links, 'pcie' for GPU <-> NIC, 'nic' for NIC <-> leaf,
'leaf_spine', 'explicit').

Latency accounting, so that a route's summed latency is physical: a star fabric's
``latency_us`` (GPU to GPU) is split in half over its two hops; an edge entering a leaf or spine
switch adds ``switch_latency_us`` (one traversal per switch); a NIC <-> leaf edge carries the
NIC's ``latency_us`` (counted once at each end of a message).

Rail assignment: local GPU g uses NIC ``g * nics // gpus`` (GPUs share NICs in consecutive
blocks, as DGX nodes pair each GPU with the NIC behind the same PCIe switch).

Routing (deterministic, cached): within a node through the intra fabric (nvlink_mesh: the
lowest-latency chain of direct links); across nodes GPU -> its NIC -> network -> the NIC of the
destination GPU -> GPU. Tree networks are routed structurally (leaf, or leaf-spine-leaf);
explicit networks by lowest-latency path.
"""
from __future__ import annotations

import functools
import gc
import re
from itertools import chain, repeat
from operator import add, attrgetter, floordiv, is_, itemgetter, sub
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple, Sequence

from costmodel.errors import InputError
from costmodel.gpus import GpuSpec, get_gpu
from costmodel.limits import MAX_DEVICES, MAX_GPUS_PER_NODE, MAX_NODES, number_problem
from costmodel.yamlio import bundled_file, bundled_names, decode, parse_yaml, read_text
from specs import topology_schema as schema
from specs.topology_links import NodeLinks, TreeLinks
from specs.validation import short, validate

if TYPE_CHECKING:   # networkx (a third of a second to import) only where a graph is built
    import networkx as nx

_BUNDLE = "topologies"
_NODE_VERTEX = re.compile(r"^n\d+\.")
_FIRST, _NODE, _VERTEX = itemgetter(0), itemgetter(1), itemgetter(5)     # (Device fields by position)
_LEAF = itemgetter(4)       # (of a Cluster._rank_at row)
_MESH = itemgetter(1)       # (of a Cluster._intra row)
_NICS = attrgetter("nics")
_RANKS = attrgetter("ranks")
_NIC_COUNT, _NIC_BW = attrgetter("nic_count"), attrgetter("nic_bw_Bps")


class Device(NamedTuple):
    """One device (immutable; a named tuple because a 100k-GPU cluster builds 100k of
    them, and a frozen dataclass costs several times as much to create)."""

    rank: int
    node: int
    local_rank: int
    group: str
    gpu: GpuSpec
    vertex: str


class NodeInfo(NamedTuple):
    """One node. ``intra_bw_Bps`` is per GPU, per direction: the hub link for star fabrics, the
    sum of local GPU 0's links for an NVLink mesh. ``nic_bw_Bps`` is per NIC (0 without NICs).
    (A named tuple, as Device: 12,500 are built for 100k GPUs.)"""

    index: int
    group: str
    node_type: str
    ranks: tuple[int, ...]
    intra_kind: str
    intra_bw_Bps: float
    intra_latency_s: float
    nic_count: int
    nic_bw_Bps: float
    nic_latency_s: float


Edge = tuple[str, str]


class Cluster:
    """Devices in global rank order (groups in file order, nodes in order, local index), nodes,
    the link graph, and cached routes between ranks. Built by ``load_topology``."""

    def __init__(self, name: str, source: str, description: str, devices: list[Device],
                 nodes: list[NodeInfo], graph: nx.DiGraph | None, intra: list[tuple[str | None, dict | None]],
                 nic_of: list[str | None], leaf_of: dict[str, str] | None, spine: str | None,
                 links: "TreeLinks | None" = None, materialise: Callable[[], nx.DiGraph] | None = None,
                 leaf_nodes: dict[str, range] | None = None):
        self.name, self.source, self.description = name, source, description
        self.devices, self.nodes = devices, nodes
        # Without an explicit network every link follows from the file (specs/topology_links.py):
        # the networkx graph (~100k edges at 16k GPUs) is then built only if asked for.
        self._graph = graph
        self._materialise = materialise
        self.links = links if links is not None else graph
        self.profiles: tuple[str, ...] = ()  # bundled hardware profiles named by the file
        # Per node: (hub vertex, None) for star fabrics, or (None, {(a, b): local GPU chain}) for a
        # mesh; the chain table is shared by all nodes of a node type.
        self._intra = intra
        self._nic_of = nic_of  # per rank: its NIC vertex (None without NICs)
        self._leaf_of = leaf_of  # tree networks: NIC vertex -> leaf vertex; None for explicit
        self._leaf_nodes = leaf_nodes or {}     # tree networks: leaf -> the nodes of its unit
        self._spine = spine
        self._routes: dict[tuple[int, int], tuple[Edge, ...]] = {}
        # Per rank, for routing without look-ups through Device objects: (vertex, node, the
        # node's hub or None for a mesh, NIC vertex, leaf vertex or None).
        # (built column by column with C-level maps: one Python step per device costs
        # as much as the rest of loading at 16k GPUs)
        node_col = self._node_col = list(map(_NODE, devices))
        self._rank_at = list(zip(map(_VERTEX, devices), node_col, map(_FIRST, map(intra.__getitem__, node_col)),
                                 nic_of, map(leaf_of.get, nic_of) if leaf_of is not None else repeat(None)))
        self._net_paths: dict[str, dict[str, list[str]]] = {}  # explicit: source NIC -> paths
        self._node_first = list(map(_FIRST, map(_RANKS, nodes)))      # (for shift_map)
        self._node_size = list(map(len, map(_RANKS, nodes)))
        self._leaves_by_node: list[tuple] | None = None

    @property
    def graph(self) -> nx.DiGraph:
        """The link graph as networkx (built on first use where the cluster has no explicit
        network; ``links`` answers the same questions without building it)."""
        if self._graph is None:
            self._graph = self._materialise()
        return self._graph

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, {len(self.nodes)} nodes, {self.num_devices} devices)"

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def gpus_per_node(self) -> int:
        return len(self.nodes[0].ranks)

    def node_of(self, rank: int) -> int:
        try:        # (asked for every rank of a plan's groups: 12k calls at 16k GPUs)
            if rank >= 0:
                return self._node_col[rank]
        except (TypeError, IndexError):
            pass
        return self._device(rank).node     # (raises ValueError naming the bad rank)

    def groups(self) -> dict[str, list[int]]:
        """Group name -> its ranks, in file order."""
        out: dict[str, list[int]] = {}
        for d in self.devices:
            out.setdefault(d.group, []).append(d.rank)
        return out

    def _device(self, rank: int) -> Device:
        if not 0 <= rank < len(self.devices):
            raise ValueError(f"rank {rank} out of range 0..{len(self.devices) - 1}")
        return self.devices[rank]

    def route(self, src_rank: int, dst_rank: int) -> tuple[Edge, ...]:
        """Directed edges from ``src_rank``'s device to ``dst_rank``'s; () for the same rank."""
        key = (src_rank, dst_rank)
        cached = self._routes.get(key)
        if cached is None:
            cached = self._routes[key] = self._tree_route(src_rank, dst_rank) \
                or tuple(zip(*self._chain(src_rank, dst_rank)))
        return cached

    def _tree_route(self, src_rank: int, dst_rank: int) -> tuple[Edge, ...] | None:
        """The route of a star node or a two-level tree written out directly (the same
        chain _chain builds; tests/test_topology.py checks both agree), or None where
        _chain must build it (same rank, mesh node, explicit network, bad rank)."""
        n = len(self._rank_at)
        if src_rank == dst_rank or not (0 <= src_rank < n and 0 <= dst_rank < n) \
                or type(src_rank) is not int or type(dst_rank) is not int:
            return None
        vs, ns, hub, nic_s, leaf_s = self._rank_at[src_rank]
        vd, nd, _, nic_d, leaf_d = self._rank_at[dst_rank]
        if ns == nd:
            return None if hub is None else ((vs, hub), (hub, vd))
        if leaf_s is None:
            return None
        if leaf_s == leaf_d:
            return (vs, nic_s), (nic_s, leaf_s), (leaf_s, nic_d), (nic_d, vd)
        sp = self._spine
        return (vs, nic_s), (nic_s, leaf_s), (leaf_s, sp), (sp, leaf_d), (leaf_d, nic_d), (nic_d, vd)

    def route_counts(self, path: Sequence[Edge], pairs: Iterable[tuple[int, int]]) -> dict[Edge, int]:
        """For each edge of ``path``: how many routes of ``pairs`` (src, dst ranks) use it.
        In a two-level tree a route can share an edge with ``path`` only if one of its
        ends is on a node, or its NIC on a leaf, that ``path`` passes through (the spine
        alone is not an edge), so the other pairs are skipped without being routed."""
        count = dict.fromkeys(path, 0)
        pairs = pairs if type(pairs) in (tuple, list) else list(pairs)
        near = None
        tree = self._leaf_of is not None
        if tree:
            verts = {x for e in path for x in e}
            no_spine = self._spine not in verts
            if len(pairs) > 16:   # (routing a few costs less than the filter)
                near = ({self.links.nodes[x].get("node") for x in verts} - {None}, verts)
        at, tree_route = self._rank_at, self._tree_route
        if near is not None:
            # The ranks near the path, from the nodes under its leaves (a leaf's unit of
            # nodes), then one set look-up per pair end (2,047 replica pairs per DP ring
            # link at 16k GPUs).
            near_nodes, near_verts = near
            first, size, near_ranks = self._node_first, self._node_size, set()
            for i in near_nodes:
                near_ranks.update(range(first[i], first[i] + size[i]))
            for leaf in near_verts:
                for i in self._leaf_nodes.get(leaf, ()):
                    near_ranks.update(r for r in range(first[i], first[i] + size[i]) if at[r][4] == leaf)
            pairs = [p for p in pairs if p[0] in near_ranks or p[1] in near_ranks]
        for a, b in pairs:
            if tree:
                # Each edge of a route between two nodes of a tree has one of its ends'
                # GPUs or NICs at one end, or the spine: if none of them is on the path,
                # none of its edges is (an edge on the path has both ends on it). (512
                # pipeline sends with 7 replicas each, on other rails, at 16k GPUs.)
                ra, rb = at[a], at[b]
                if ra[1] != rb[1] and no_spine and ra[0] not in verts and ra[3] not in verts \
                        and rb[0] not in verts and rb[3] not in verts:
                    continue
            # Written out, not cached: each replica route is asked for once per path.
            for e in tree_route(a, b) or self.route(a, b):
                if e in count:
                    count[e] += 1
        return count

    def shift_map(self, ranks: Iterable[int], delta: int) -> dict[str, str] | None:
        """A renaming of the vertices of the nodes holding ``ranks`` (and of their leaves
        and the spine) such that, for any ranks a, b among them, route(a + delta, b +
        delta) is the renamed route(a, b) and every renamed link has the same attributes
        (bandwidth, latency, kind); None where this cluster cannot tell cheaply that one
        exists (explicit network, mesh or star nodes of other types, a shift that is not
        whole nodes, leaves that do not map one to one or have other uplinks).
        sim/collective_flows.py uses it to reuse one stage's symmetric collective for the
        shifted stages (at 16k GPUs the stages' data-parallel rings are shifted copies)."""
        links = self.links
        if not isinstance(links, TreeLinks) or self._leaf_of is None or delta == 0:
            return None
        gpn = len(self.nodes[0].ranks)
        if delta % gpn:
            return None
        dn, nodes, n_nodes = delta // gpn, self.nodes, len(self.nodes)
        node_links, uplink, intra = links._nodes, links._uplink, self._intra
        touched = sorted(set(map(self._node_col.__getitem__, ranks)))
        if not touched or touched[0] + dn < 0 or touched[-1] + dn >= n_nodes:
            return None
        # Checked per node with C-level maps (a stage's ring at 16k GPUs spans 256 nodes):
        # same node type (same link figures: the NodeLinks record is shared per type, as
        # is a mesh's chain table), whole nodes of gpn devices, ranks shifted by delta, NICs.
        images = list(map(dn.__add__, touched))
        size, first = self._node_size, self._node_first
        if not all(map(is_, map(node_links.__getitem__, touched), map(node_links.__getitem__, images))) \
                or not all(map(is_, map(_MESH, map(intra.__getitem__, touched)),
                               map(_MESH, map(intra.__getitem__, images)))) \
                or any(map(gpn.__ne__, map(size.__getitem__, touched))) \
                or any(map(gpn.__ne__, map(size.__getitem__, images))) \
                or any(map(delta.__ne__, map(sub, map(first.__getitem__, images), map(first.__getitem__, touched)))) \
                or 0 in map(_NICS, map(node_links.__getitem__, touched)):
            return None
        out: dict[str, str] = {} if self._spine is None else {self._spine: self._spine}
        back: dict[str, str] = dict(out)
        # A node's GPUs, NICs and hub are renamed by node index alone (same node type: same
        # names and rail assignment, see _ShiftMap): only the leaves can fail to map one to
        # one. Each node's leaves (per local GPU) are a tuple; the nodes of a unit share one.
        leaves = self._node_leaves()
        for li, lj in set(zip(map(leaves.__getitem__, touched), map(leaves.__getitem__, images))):
            for la, lb in zip(li, lj):
                if la is None or lb is None:
                    return None
                m = out.get(la)
                if m is None:
                    if back.get(lb, la) != la or uplink[la] != uplink[lb]:
                        return None     # not one to one, or another uplink
                    out[la], back[lb] = lb, la
                elif m != lb:
                    return None
        return _ShiftMap(out, links, set(touched), dn)

    def _node_leaves(self) -> list[tuple]:
        """Per node, the leaf of each local GPU's NIC (None without one), made on first use."""
        if self._leaves_by_node is None:
            col = list(map(_LEAF, self._rank_at))
            self._leaves_by_node = list(map(tuple, map(col.__getitem__, map(
                slice, self._node_first, map(add, self._node_first, self._node_size)))))
        return self._leaves_by_node

    def _chain(self, src_rank: int, dst_rank: int) -> tuple[list[str], list[str]]:
        """The route as a vertex chain, returned as (chain[:-1], chain[1:]) for zipping."""
        src, dst = self._device(src_rank), self._device(dst_rank)
        if src.rank == dst.rank:
            return [], []
        if src.node == dst.node:
            hub, mesh = self._intra[src.node]
            if hub is not None:
                chain = [src.vertex, hub, dst.vertex]
            else:
                gpus = [self.devices[r].vertex for r in self.nodes[src.node].ranks]
                chain = [gpus[i] for i in mesh[(src.local_rank, dst.local_rank)]]
        else:
            nic_s, nic_d = self._nic_of[src.rank], self._nic_of[dst.rank]
            chain = [src.vertex, *self._network_chain(nic_s, nic_d), dst.vertex]
        return chain[:-1], chain[1:]

    def _network_chain(self, nic_s: str, nic_d: str) -> list[str]:
        if self._leaf_of is not None:  # two-level tree: structural, no search
            leaf_s, leaf_d = self._leaf_of[nic_s], self._leaf_of[nic_d]
            if leaf_s == leaf_d:
                return [nic_s, leaf_s, nic_d]
            return [nic_s, leaf_s, self._spine, leaf_d, nic_d]
        paths = self._net_paths.get(nic_s)
        if paths is None:  # one Dijkstra per source NIC, over the network part only
            import networkx as nx
            net = self.graph.subgraph(v for v, role in self.graph.nodes(data="role") if role in ("nic", "switch"))
            paths = self._net_paths[nic_s] = nx.single_source_dijkstra_path(net, nic_s, weight="latency_s")
        return paths[nic_d]

    def path_latency_s(self, path) -> float:
        """Sum of the edges' latencies (0 for the empty path)."""
        return sum(self.links.edges[e]["latency_s"] for e in path)

    def path_bw_Bps(self, path) -> float:
        """Bottleneck bandwidth of the path (inf for the empty path: nothing limits it)."""
        return min((self.links.edges[e]["bw_Bps"] for e in path), default=float("inf"))


def nic_in_use(k: int, gpus: int, nics: int) -> bool:
    """Whether some local GPU g has NIC k under the rail assignment g * nics // gpus:
    the first g with g * nics // gpus >= k is ceil(k * gpus / nics); k is used iff that
    GPU exists and lands on k (with more NICs than GPUs some NICs carry no GPU)."""
    g = -(-k * gpus // nics)
    return g < gpus and g * nics // gpus == k


class _ShiftMap(dict):
    """Cluster.shift_map's renaming: the leaves and spine are stored; a GPU, NIC or hub of a
    mapped node ``n<i>.<rest>`` is renamed ``n<i + dn>.<rest>`` when first asked for (a
    stage's ring at 16k GPUs spans 256 nodes, of whose 4,000-odd vertices a representative
    names a few hundred). KeyError, as a dict's, for any other vertex and for a NIC no GPU
    uses (no route reaches it)."""

    __slots__ = ("_links", "_nodes", "_dn")

    def __init__(self, fixed: dict[str, str], links: TreeLinks, nodes: set[int], dn: int):
        super().__init__(fixed)
        self._links, self._nodes, self._dn = links, nodes, dn

    def __missing__(self, v):
        p = self._links.vertex(v)
        if p is None or p[1] not in self._nodes:
            raise KeyError(v)
        role, i, k = p
        if role == "nic":
            nl = self._links._nodes[i]
            if not nic_in_use(k, nl.gpus, nl.nics):
                raise KeyError(v)
        w = self[v] = f"n{i + self._dn}.{v.partition('.')[2]}"
        # The image's parse is known (node i + dn is of i's type: shift_map checked it):
        # the flow network asks TreeLinks for every renamed link, which then skips it.
        self._links._parsed[w] = (role, i + self._dn, k)
        return w


# ----------------------------------------------------------------------------- loading

def list_topologies() -> list[str]:
    """Names of the bundled topology files (stems of ``topologies/*.yaml``)."""
    return bundled_names(_BUNDLE)


def _read(name_or_path: str) -> tuple[str, str]:
    """(source, text) of a bundled name or a file path."""
    bundled = ", ".join(list_topologies())
    looks_like_path = name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path or "\\" in name_or_path
    if not looks_like_path:
        res = bundled_file(_BUNDLE, name_or_path)
        if res is not None:
            return str(res), decode(res.read_bytes(), str(res))
        if not Path(name_or_path).is_file():
            raise InputError(name_or_path, "topology", f"no bundled topology or file named {short(name_or_path)}; bundled: {bundled}")
    if not Path(name_or_path).is_file():
        raise InputError(name_or_path, "topology", f"file not found; bundled topologies: {bundled}")
    return name_or_path, read_text(name_or_path, what="topology file")


def _parse(source: str, text: str) -> schema.TopologyFile:
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise InputError(source, None, f"expected a mapping of topology fields at top level, got {type(data).__name__}")
    topo = validate(schema.TopologyFile, data, source)
    _check_size(topo, source)
    return topo


def _check_size(topo: schema.TopologyFile, source: str) -> None:
    """At most MAX_DEVICES devices, checked before any node is built."""
    total = _count(topo)
    if total > MAX_DEVICES:
        raise InputError(source, "groups", f"{total:,} devices: the cluster would have more than "
                                           f"{MAX_DEVICES:,} devices, the most plansim models")


def _resize_node_type(topo: schema.TopologyFile, gpus_per_node: int, source: str) -> schema.TopologyFile:
    """The single group's node type with ``gpus_per_node`` devices (the validator's --world)."""
    problem = number_problem(gpus_per_node, 1, MAX_GPUS_PER_NODE, integer=True)
    if problem:
        raise InputError(source, "--world", f"{str(gpus_per_node)[:60]}: {problem}")
    if len(topo.groups) != 1:
        raise InputError(source, "--world", f"cannot resize the devices of a topology with "
                                            f"{len(topo.groups)} groups; edit node_types in the file instead")
    nt_name = topo.groups[0].node_type
    nt = topo.node_types.get(nt_name)
    if nt is None:
        raise InputError(source, "groups[0].node_type", f"unknown node type {nt_name[:60]!r}")
    if nt.intra.kind == "nvlink_mesh" and nt.intra.links is not None:
        raise InputError(source, "--world", "cannot resize a node type with explicit NVLink links; "
                                            "edit the file instead")
    types = dict(topo.node_types)
    types[nt_name] = nt.model_copy(update={"gpus_per_node": gpus_per_node})
    topo = topo.model_copy(update={"node_types": types})
    _check_size(topo, source)
    return topo


def topology_devices(name_or_path: str, nodes: int | None = None) -> int:
    """The device count ``load_topology`` would build, read from the validated file without
    building anything (so a plan can be checked against it first)."""
    return TopologyFileRead(name_or_path).devices(nodes)


class TopologyFileRead:
    """One topology file read and validated once, for callers that ask several node counts
    of it (a sweep's nodes axis) without parsing the file again for each."""

    def __init__(self, name_or_path: str):
        self.source, text = _read(str(name_or_path))
        self.topo = _parse(self.source, text)

    def devices(self, nodes: int | None = None) -> int:
        """Devices with ``nodes`` nodes (None: as the file says); InputError as --nodes gives."""
        return _count(self.topo if nodes is None else _with_nodes(self.topo, nodes, self.source))


def _count(topo: schema.TopologyFile) -> int:
    return sum(grp.nodes * topo.node_types[grp.node_type].gpus_per_node
               for grp in topo.groups if grp.node_type in topo.node_types)


def _load_file(name_or_path: str, nodes: int | None,
               gpus_per_node: int | None = None) -> tuple[schema.TopologyFile, str]:
    """The validated topology file, with ``gpus_per_node`` and ``nodes`` applied; nothing
    built yet."""
    source, text = _read(str(name_or_path))
    topo = _parse(source, text)
    if gpus_per_node is not None:
        topo = _resize_node_type(topo, gpus_per_node, source)
    if nodes is not None:
        topo = _with_nodes(topo, nodes, source)
    return topo, source


def _with_nodes(topo: schema.TopologyFile, nodes: int, source: str) -> schema.TopologyFile:
    """The single group of ``topo`` with ``nodes`` nodes (the --nodes option)."""
    problem = number_problem(nodes, 1, MAX_NODES, integer=True)
    if problem:
        raise InputError(source, "--nodes", f"{str(nodes)[:60]}: {problem}")
    if len(topo.groups) != 1:
        names = ", ".join(g.name for g in topo.groups)
        raise InputError(source, "--nodes", f"cannot scale a heterogeneous topology with {len(topo.groups)} "
                                            f"groups ({names[:200]}); edit groups[].nodes in the file instead")
    topo = topo.model_copy(update={"groups": [topo.groups[0].model_copy(update={"nodes": nodes})]})
    _check_size(topo, source)
    return topo


def load_topology(name_or_path: str, nodes: int | None = None, gpus_per_node: int | None = None) -> Cluster:
    """Load a bundled topology (file stem in ``topologies/``) or a YAML file. ``nodes`` replaces
    the node count of a single-group topology (the ``--nodes`` option); ``gpus_per_node``
    replaces its node type's device count (``--world`` of the validator: N worker processes
    on one host are N devices)."""
    return _build(*_load_file(name_or_path, nodes, gpus_per_node))


# ----------------------------------------------------------------------------- building

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
            if grp.node_type not in topo.node_types:
                raise InputError(source, f"groups.{i}.node_type", f"unknown node type {short(grp.node_type)}; "
                                                                   f"allowed: {', '.join(topo.node_types)}")
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
    return _build(topo, source, lazy=False).graph


def _build(topo: schema.TopologyFile, source: str, lazy: bool = True) -> Cluster:
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
