"""Cluster topology: load a YAML file (schema in ``specs/topology_schema.py``) into a ``Cluster``
(built by specs/topology_build.py),
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

from itertools import repeat
from operator import add, attrgetter, is_, itemgetter, sub
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple, Sequence

from costmodel.errors import InputError
from costmodel.gpus import GpuSpec
from costmodel.limits import MAX_DEVICES, MAX_GPUS_PER_NODE, MAX_NODES, number_problem
from costmodel.yamlio import bundled_file, bundled_names, decode, not_a_file, parse_yaml, read_text
from specs import topology_schema as schema
from specs.topology_links import TreeLinks
from specs.validation import short, validate

if TYPE_CHECKING:   # networkx (a third of a second to import) only where a graph is built
    import networkx as nx

_BUNDLE = "topologies"
_FIRST, _NODE, _VERTEX = itemgetter(0), itemgetter(1), itemgetter(5)     # (Device fields by position)
_LEAF = itemgetter(4)       # (of a Cluster._rank_at row)
_MESH = itemgetter(1)       # (of a Cluster._intra row)
_NICS = attrgetter("nics")
_RANKS = attrgetter("ranks")


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
        dn, n_nodes = delta // gpn, len(self.nodes)
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
    problem = not_a_file(name_or_path, "topology file")
    if problem:
        raise InputError(name_or_path, "topology", problem)
    if not Path(name_or_path).is_file():
        raise InputError(name_or_path, "topology", f"file not found; bundled topologies: {bundled}" if looks_like_path
                         else f"no bundled topology or file named {short(name_or_path)}; bundled: {bundled}")
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
        from specs.topology_build import check_group_node_types
        check_group_node_types(self.topo, self.source)  # else its groups would count no devices

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
    net = topo.network
    if net is not None and net.kind == "explicit" and nodes != topo.groups[0].nodes:
        raise InputError(source, "--nodes", f"cannot scale an explicit network: its links name their "
                                            f"{topo.groups[0].nodes} nodes; add nodes and links in the file instead")
    topo = topo.model_copy(update={"groups": [topo.groups[0].model_copy(update={"nodes": nodes})]})
    _check_size(topo, source)
    return topo


def load_topology(name_or_path: str, nodes: int | None = None, gpus_per_node: int | None = None) -> Cluster:
    """Load a bundled topology (file stem in ``topologies/``) or a YAML file. ``nodes`` replaces
    the node count of a single-group topology (the ``--nodes`` option); ``gpus_per_node``
    replaces its node type's device count (``--world`` of the validator: N worker processes
    on one host are N devices)."""
    from specs.topology_build import build
    return build(*_load_file(name_or_path, nodes, gpus_per_node))
