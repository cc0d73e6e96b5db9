"""The links of a cluster without an explicit network, computed from vertex names.

A cluster whose network is a two-level tree (or absent) is regular: every link follows
from the node it belongs to (its intra-node fabric, PCIe hop and NICs) and the leaf its
NIC hangs from. ``TreeLinks`` answers what the flow network and the reports ask of the
link graph (``has_edge``, ``edges[u, v]`` -> attributes, ``nodes[v]`` -> attributes) by
parsing the vertex name, so that the networkx graph of a 16k-GPU cluster (~100k edges,
most of a simulation's CPU time at that size) is built only where someone iterates over
it (``Cluster.graph``). The attributes are exactly those specs/topology.py's builder
gives the same edge (tests/test_topology.py compares every edge on every bundled file).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLinks:
    """What one node's links carry: ``hub`` is the star fabric's hub vertex suffix (None for
    an NVLink mesh, whose direct links are ``mesh_Bps[(a, b)]``, a < b); bandwidths in
    bytes/s per direction, latencies in seconds (the star's GPU-to-GPU figure)."""

    gpus: int
    hub: str | None
    intra_Bps: float
    intra_latency_s: float
    mesh_Bps: dict | None
    pcie_Bps: float
    pcie_latency_s: float
    nics: int
    nic_Bps: float
    nic_latency_s: float


class _Edges:
    def __init__(self, links: "TreeLinks"):
        self._links = links
        self._seen: dict = {}

    def __getitem__(self, e) -> dict:
        try:
            data = self._seen.get(e)    # the flow network, then the report, ask for each link
        except TypeError:
            data = None
        if data is not None:
            return data
        data = self._links.edge_data(e[0], e[1])
        if data is None:
            raise KeyError(e)
        self._seen[(e[0], e[1])] = data
        return data


class _Nodes:
    def __init__(self, links: "TreeLinks"):
        self._links = links
        self._seen: dict = {}

    def __getitem__(self, v) -> dict:
        try:
            return self._seen[v]
        except (KeyError, TypeError):
            pass
        p = self._links.vertex(v)
        if p is None:
            raise KeyError(v)
        role, node = p[0], p[1]
        out = self._seen[v] = {"role": role} if node is None else {"role": role, "node": node}
        return out


class TreeLinks:
    """Edge and vertex attributes of a regular cluster, by name (see module docstring)."""

    def __init__(self, nodes: list[NodeLinks], leaf_of: dict[str, str] | None,
                 uplink_Bps: dict[str, float], spine: str | None, switch_latency_s: float):
        """``leaf_of``: NIC vertex -> its leaf; ``uplink_Bps``: every leaf -> its link to
        the spine (bytes/s; unused without a spine)."""
        self._nodes = nodes
        self._leaf_of = leaf_of or {}
        self._uplink = uplink_Bps
        self._spine = spine
        self._switch_s = switch_latency_s
        self.edges = _Edges(self)
        self.nodes = _Nodes(self)
        self._parsed: dict = {}     # vertex name -> vertex(): names repeat on every route

    @property
    def min_bw_Bps(self) -> float:
        """A lower bound on every link's bandwidth (bytes/s): the slowest figure any node
        type or leaf uplink gives a link (sim/metrics.py prunes its busiest-links search
        with it)."""
        figures = [x for nl in {id(nl): nl for nl in self._nodes}.values()
                   for x in (nl.intra_Bps, nl.pcie_Bps, nl.nic_Bps, *(nl.mesh_Bps or {}).values())]
        figures += self._uplink.values()
        return min((x for x in figures if x > 0), default=0.0)

    def vertex(self, v: str):
        """(role, node index or None, local index or leaf name) of vertex ``v``; None if
        the cluster has no such vertex."""
        try:
            p = self._parsed.get(v, _MISSING)
        except TypeError:           # unhashable: no such vertex
            return None
        if p is _MISSING:
            p = self._parsed[v] = self._vertex(v)
        return p

    def _vertex(self, v: str):
        if type(v) is not str:
            return None
        if v[:1] == "n":
            head, dot, rest = v.partition(".")
            if not dot or not _is_index(head[1:]):
                return None
            i = int(head[1:])
            if i >= len(self._nodes):
                return None
            nl = self._nodes[i]
            tag = rest[:3]
            if tag == "gpu" or tag == "nic":     # (no intra-node hub kind starts so)
                if not _is_index(rest[3:]):
                    return None
                k = int(rest[3:])
                return (tag, i, k) if k < (nl.gpus if tag == "gpu" else nl.nics) else None
            return ("hub", i, None) if nl.hub is not None and rest == nl.hub else None
        if v in self._uplink:
            return ("leaf", None, v)
        if self._spine is not None and v == self._spine:
            return ("spine", None, v)
        return None

    def has_edge(self, u, v) -> bool:
        return self.edge_data(u, v) is not None

    def edge_data(self, u, v) -> dict | None:
        """{'bw_Bps', 'latency_s', 'kind'} of directed edge (u, v), or None if absent."""
        parsed = self._parsed
        try:        # (vertex() inlined for names seen before: every link asks twice)
            a = parsed.get(u, _MISSING)
            b = parsed.get(v, _MISSING)
        except TypeError:           # unhashable: no such vertex
            return None
        # (a raised KeyError would cost more than the parse: most links bring a new name)
        if a is _MISSING:
            a = self.vertex(u)
        if b is _MISSING:
            b = self.vertex(v)
        if a is None or b is None:
            return None
        ra, rb = a[0], b[0]
        if a[1] is not None and a[1] == b[1]:                      # inside one node
            nl = self._nodes[a[1]]
            if (ra == "gpu" and rb == "hub") or (ra == "hub" and rb == "gpu"):
                return _data(nl.intra_Bps, nl.intra_latency_s / 2, nl.hub)
            if ra == rb == "gpu" and nl.mesh_Bps is not None:
                bw = nl.mesh_Bps.get((min(a[2], b[2]), max(a[2], b[2])))
                return None if bw is None else _data(bw, nl.intra_latency_s, "nvlink")
            if (ra == "gpu" and rb == "nic") or (ra == "nic" and rb == "gpu"):
                g, k = (a[2], b[2]) if ra == "gpu" else (b[2], a[2])
                if g * nl.nics // nl.gpus != k:      # rail assignment, as the builder's
                    return None
                return _data(nl.pcie_Bps, nl.pcie_latency_s, "pcie")
            return None
        if ra == "nic" and rb == "leaf" and self._leaf_of.get(u) == v:
            nl = self._nodes[a[1]]
            return _data(nl.nic_Bps, nl.nic_latency_s + self._switch_s, "nic")
        if ra == "leaf" and rb == "nic" and self._leaf_of.get(v) == u:
            nl = self._nodes[b[1]]
            return _data(nl.nic_Bps, nl.nic_latency_s, "nic")
        if (ra == "leaf" and rb == "spine") or (ra == "spine" and rb == "leaf"):   # (only exists where there is a spine)
            leaf = u if ra == "leaf" else v
            return _data(self._uplink[leaf], self._switch_s, "leaf_spine")
        return None


_MISSING = object()


def _is_index(s: str) -> bool:
    """``s`` is how the builder writes a non-negative integer (ASCII digits, no leading 0)."""
    return s.isascii() and s.isdigit() and (s[0] != "0" or s == "0")


def _data(bw_Bps: float, latency_s: float, kind: str) -> dict:
    return {"bw_Bps": bw_Bps, "latency_s": latency_s, "kind": kind}
