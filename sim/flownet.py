"""Flow-level network model on SimPy: transfers share links max-min fairly.

A transfer waits its latency, then becomes an active flow until its bytes are sent. At
every instant the active flows' rates are the weighted max-min fair allocation
(progressive filling): on each edge e, sum over active flows f of
multiplicity(f, e) * rate(f) <= bw(e), and no flow can go faster without slowing one that
is no faster. A multiplicity k stands for k identical flows of symmetric groups that are
not simulated: each copy gets the same rate and uses the edge's capacity.

Cost: each change (flows starting or finishing at one instant) re-solves only the
connected component of active flows that share links with the changed ones, found by a
walk from the changed flows' edges; no per-event work touches idle edges. Changes at the
same simulated instant are batched into one re-solve. While no flow is held below its
rate alone on its links, a flow that fits its links at that rate starts, and any flow
finishes, without a re-solve (every flow at its lone rate is then the max-min
allocation). A component whose set of flow weight maps was solved before reuses those
rates. Completions are per-flow SimPy timeouts; a version counter makes timeouts of
flows whose rate later changed no-ops.
"""
from __future__ import annotations

import heapq
import math
from functools import partial
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, Sequence

import simpy

if TYPE_CHECKING:   # only for annotations: the engine passes a cluster's link table
    import networkx

Edge = tuple[str, str]

__all__ = ["Edge", "FlowNetwork", "LinkSample"]


class LinkSample(NamedTuple):
    """From ``t_s`` on, the flows on directed link ``edge`` move ``rate_Bps`` bytes/s in
    all (copies counted); recorded whenever that total changes."""

    t_s: float
    edge: Edge
    rate_Bps: float

# A flow is finished when at most this fraction of its bytes is left: float rounding in
# rate * dt leaves ~1e-15 relative residue, and 1e-9 of a transfer is far below any
# timing resolution we report.
_DONE_REL = 1e-9
# Edges whose remaining capacity or rates differ by less than this relative amount are
# treated as saturating at the same level, so symmetric flows freeze together.
_LEVEL_REL = 1e-12


class _Flow:
    __slots__ = ("fid", "weights", "carried", "size", "remaining", "rate", "t_last", "version",
                 "done", "event", "label", "contended")

    def __init__(self, fid: int, weights: dict, size: float, event: simpy.Event, label: str,
                 carried: Mapping[Edge, float] | None = None):
        self.fid = fid
        self.weights = weights      # edge -> multiplicity on that edge
        # edge -> copies of this flow's bytes that cross it, for bytes_carried (defaults to
        # weights; a representative of a symmetric collective also counts its twins' links).
        self.carried = weights if carried is None else carried
        self.size = size
        self.remaining = size       # bytes left as of t_last
        self.rate = 0.0             # bytes/s per copy
        self.t_last = 0.0
        self.version = 0
        self.done = False
        self.contended = False      # rate below its rate alone on its links (FlowNetwork._contended)
        self.event = event
        self.label = label


class FlowNetwork:
    """Max-min fair bandwidth sharing over a directed graph whose edges carry ``bw_Bps``
    (bytes/s) and ``latency_s`` (seconds).

    ``bw_scale(kind)``, if given, is the fraction of an edge's ``bw_Bps`` that flows can
    use, by the edge's ``kind`` attribute: applied when a flow first touches the edge, so
    a 100k-edge cluster graph is neither copied nor rescaled as a whole."""

    def __init__(self, env: simpy.Environment, graph: networkx.DiGraph, record: bool = False,
                 bw_scale: Callable[[str], float] | None = None,
                 hop_latency: Callable[[str], float | None] | None = None):
        self.env = env
        self.graph = graph
        self.record = record
        self._bw_scale = bw_scale
        self._hop_latency = hop_latency
        self._scale_of: dict[str, float] = {}       # kind -> bw_scale(kind), memoised
        self._bytes_carried: dict[Edge, float] = {}
        self._carried_later: dict[int, list] = {}   # id(map) -> [map, bytes sent with it]
        self.samples: list[LinkSample] = []
        # Scratch space for callers that derive data from this network and want to reuse
        # it across calls (collective_flows keeps routes and multiplicity maps here).
        self.cache: dict = {}
        self.flows_started = 0
        self.flows_finished = 0
        self.resolves = 0           # number of component re-solves (for benchmarks)
        self._bw: dict[Edge, float] = {}
        self._bw_base: dict[Edge, float] = {}     # edges scaled by scale_edge: their unscaled bw
        self._lat: dict[Edge, float] = {}
        self._on_edge: dict[Edge, dict[_Flow, float]] = {}   # active flows per edge
        self._last_sample: dict[Edge, float] = {}
        self._pending_add: list[_Flow] = []
        self._pending_done: list[_Flow] = []
        self._pending_edges: list[Edge] = []   # edges whose bandwidth changed (scale_edge)
        self._flush_at: float | None = None
        self._prepared: dict[tuple, tuple] = {}    # see transfer()
        self._alone_rate: dict[int, tuple] = {}     # id(weights) -> (weights, rate alone)
        # Sorted ids of the weight maps of a solved component -> rate per map id (bytes/s
        # per copy): see _solve_known.
        self._solved: dict[tuple, dict[int, float]] = {}
        self._contended = 0         # active flows whose rate is below their lone rate
        self._kept: set[int] = set()    # ids of the weight maps _prepared holds for good
        self.solves_reused = 0          # component solves answered by _solved

    # ----------------------------------------------------------------- public API
    def transfer(self, path: Sequence[Edge], nbytes: float,
                 multiplicity: Mapping[Edge, int] | None = None, latency_steps: int = 1,
                 label: str = "", carried: Mapping[Edge, float] | None = None,
                 shares: Mapping[Edge, int] | None = None, delay_s: float = 0.0,
                 event: simpy.Event | None = None) -> simpy.Event:
        """Send ``nbytes`` along ``path`` (directed edges). Waits
        latency_steps * sum(latency_s over path) seconds, then shares bandwidth until done.
        ``multiplicity[e]`` (default 1) counts identical unsimulated flows on edge e.
        ``shares``, if given, replaces the per-edge multiplicities outright and may name
        edges off the path (a symmetric collective's representative sharing its twins'
        links, sim/symmetric_collective.py); the path then only sets the latency.
        ``carried`` (default: the multiplicities) says how many copies of the bytes each
        edge is credited with in ``bytes_carried`` at completion; it may name edges off the
        path (the links of unsimulated twins). ``delay_s`` is waited before the latency
        (a call's software cost) in the same timeout. Empty path or nbytes == 0: only the
        latency. Returns an event that succeeds at completion: ``event`` if given (so a
        caller's own event needs no forwarding callback), else a new one. ``path``,
        ``multiplicity`` and ``shares`` must not be changed once passed (they are kept)."""
        if latency_steps < 0:
            raise ValueError(f"transfer {label!r}: latency_steps={latency_steps!r} must be >= 0")
        weights, latency = self.prepare(path, multiplicity, shares, label)
        return self.start(weights, latency * latency_steps + delay_s, nbytes, event, label, carried)

    def prepare(self, path: Sequence[Edge], multiplicity: Mapping[Edge, int] | None = None,
                shares: Mapping[Edge, int] | None = None, label: str = "") -> tuple[dict, float]:
        """(multiplicity per edge, summed path latency in s) of a transfer (see transfer),
        checked; what start() takes. Kept for a tuple path under the identities of the
        path and maps, which must not change once passed."""
        # A pipeline send or a collective's representative passes the same (cached) path
        # and maps at every call: their checked weights and summed latency are kept,
        # under the objects' identities (the entry holds them, so an id is not reused).
        key = (id(path), id(multiplicity), id(shares))
        hit = self._prepared.get(key)
        if hit is not None and hit[0] is path and hit[1] is multiplicity and hit[2] is shares:
            return hit[3]
        got = self._prepare(path, multiplicity, shares, label)
        if type(path) is tuple:
            self._prepared[key] = (path, multiplicity, shares, got)
            self._kept.add(id(got[0]))
        return got

    def start(self, weights: dict, latency_s: float, nbytes: float, event: simpy.Event | None = None,
              label: str = "", carried: Mapping[Edge, float] | None = None) -> simpy.Event:
        """Start a flow of ``nbytes`` with ``weights`` from prepare() after ``latency_s``
        seconds; returns its completion event (``event`` if given). A caller that sends
        on one path again and again (a pipeline send) prepares it once."""
        if nbytes < 0 or not math.isfinite(nbytes):
            raise ValueError(f"transfer {label!r}: nbytes={nbytes!r} must be finite and >= 0")
        if nbytes == 0 or not weights:
            if event is None:
                return self.env.timeout(latency_s)
            self.env.timeout(latency_s).callbacks.append(lambda _ev: event.succeed())
            return event
        if event is None:
            event = self.env.event()
        flow = _Flow(self.flows_started, weights, float(nbytes), event, label, carried)
        self.flows_started += 1
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(partial(self._activate, flow))
        else:
            self._activate(flow)
        return event

    def _prepare(self, path, multiplicity, shares, label: str) -> tuple[dict, float]:
        """(weights per edge, summed path latency) of a transfer, checked."""
        weights: dict[Edge, float] = {}
        latency = 0.0
        for e in path:
            e = (e[0], e[1])
            self._edge_info(e)
            latency += self._lat[e]
            k = 1 if multiplicity is None else multiplicity.get(e, 1)
            if k < 0:
                raise ValueError(f"transfer {label!r}: multiplicity {k!r} on edge {e} must be >= 0")
            if k:
                weights[e] = weights.get(e, 0) + k
        if shares is not None:
            weights = {}
            for e, k in shares.items():
                self._edge_info(e)
                if k < 0:
                    raise ValueError(f"transfer {label!r}: multiplicity {k!r} on edge {e} must be >= 0")
                if k:
                    weights[e] = k
        return weights, latency

    @property
    def bytes_carried(self) -> dict[Edge, float]:
        """Bytes each directed edge has carried so far (copies counted), by edge."""
        if self._carried_later:
            bc = self._bytes_carried
            for carried, size in self._carried_later.values():
                for e, w in carried.items():
                    bc[e] = bc.get(e, 0.0) + w * size
            self._carried_later = {}
        return self._bytes_carried

    def edge_params(self, e: Edge) -> tuple[float, float]:
        """(usable bandwidth in bytes/s, latency in s) of directed edge ``e``."""
        self._edge_info(e)
        return self._bw[e], self._lat[e]


    @property
    def scaled(self) -> bool:
        """Whether any edge was ever scaled by scale_edge (link attributes alone then no
        longer give an edge's bandwidth)."""
        return bool(self._bw_base)

    def scale_edge(self, e: Edge, factor: float) -> None:
        """From now on edge ``e`` carries ``factor`` times its usable bandwidth (relative
        to the graph's figure after ``bw_scale``; factor 1 restores it). Flows crossing it
        are re-solved at this instant. For time-varying clusters (sim/multistep.py)."""
        if not factor > 0 or not math.isfinite(factor):
            raise ValueError(f"scale_edge {e!r}: factor={factor!r} must be finite and > 0")
        e = (e[0], e[1])
        self._edge_info(e)
        base = self._bw_base.setdefault(e, self._bw[e])
        self._bw[e] = base * factor
        self._alone_rate.clear()  # lone-flow rates were computed with the old bandwidth
        self._solved.clear()
        self._pending_edges.append(e)
        self._request_flush()

    # ----------------------------------------------------------------- internals
    def _edge_info(self, e: Edge) -> None:
        if e in self._bw:
            return
        try:
            data = self.graph.edges[e]      # one look-up: has_edge first would be two
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"edge {e!r} is not in the network graph") from None
        try:
            bw = float(data["bw_Bps"])
        except KeyError:
            raise ValueError(f"edge {e!r} has no 'bw_Bps' attribute") from None
        if not bw > 0:
            raise ValueError(f"edge {e!r}: bw_Bps={bw!r} must be > 0")
        if self._bw_scale is not None:
            kind = data.get("kind", "default")
            scale = self._scale_of.get(kind)
            if scale is None:
                scale = self._scale_of[kind] = float(self._bw_scale(kind))
            bw = bw * scale
        self._bw[e] = bw
        self._lat[e] = edge_latency_s(self.graph, e[0], e[1], data, self._hop_latency)

    def _request_flush(self) -> None:
        now = self.env.now
        if self._flush_at == now:
            return
        self._flush_at = now
        # Zero-delay timeout: runs after the events already queued for this instant, so
        # flows starting or finishing at the same time are solved together once.
        self.env.timeout(0).callbacks.append(self._flush)

    def _alone(self, weights: dict) -> float:
        """The rate (bytes/s per copy) of a flow with ``weights`` alone on its links: its
        tightest link's bandwidth over its multiplicity there (what _solve gives one flow)."""
        got = self._alone_rate.get(id(weights))
        if got is None or got[0] is not weights:
            bw = self._bw
            got = self._alone_rate[id(weights)] = (
                weights, max(min(bw[e] / (0.0 + w) for e, w in weights.items()), 0.0))
        return got[1]

    def _fits(self, weights: dict, rate: float) -> bool:
        """Whether each link of ``weights`` can carry a flow at ``rate`` on top of the
        flows on it now, at their rates."""
        on_edge, bw = self._on_edge, self._bw
        for e, w in weights.items():
            on = on_edge.get(e)
            if on and sum((w2 * g.rate for g, w2 in on.items()), 0.0) + w * rate > bw[e]:
                return False
        return True

    def _activate(self, flow: _Flow, _ev=None) -> None:
        now = flow.t_last = self.env.now
        on_edge = self._on_edge
        weights = flow.weights
        if self._flush_at != now:
            # Nothing else changes at this instant and the flow is alone on its links (most
            # pipeline sends), or every active flow runs at its lone rate (no link limits
            # two flows) and its links have room for this one at its own: then every flow
            # at its lone rate is feasible and no flow can go faster, which is the max-min
            # allocation _flush would compute. Done here, without the zero-delay flush
            # event and the component walk.
            if on_edge.keys().isdisjoint(weights):
                for e, w in weights.items():
                    on_edge[e] = {flow: w}
                rate = self._alone(weights)
            elif not self._contended and self._fits(weights, rate := self._alone(weights)):
                for e, w in weights.items():
                    on = on_edge.get(e)
                    if on is None:
                        on_edge[e] = {flow: w}
                    else:
                        on[flow] = w
            else:
                rate = None
            if rate is not None:
                flow.rate = rate
                self.resolves += 1
                self._schedule_wake(flow)
                if self.record:
                    self._sample(weights, now)
                return
        self._pending_add.append(flow)
        self._request_flush()

    def _wake(self, flow: _Flow, version: int, _ev) -> None:
        if flow.done or flow.version != version:
            return      # stale: the flow's rate changed after this wake-up was set
        now = self.env.now
        on_edge = self._on_edge
        weights = flow.weights
        # Alone on every link (each holds at least this flow: alone iff the sizes sum to
        # its count), or no flow limited by another: the others' rates stay as they are,
        # so _flush's work is this flow's alone, done here.
        if self._flush_at != now and (not self._contended
                                      or sum(map(len, map(on_edge.__getitem__, weights))) == len(weights)):
            self.resolves += 1
            if flow.rate > 0:
                flow.remaining -= flow.rate * (now - flow.t_last)
            flow.t_last = now
            if (flow.remaining <= _DONE_REL * flow.size
                    or (flow.rate > 0 and flow.remaining / flow.rate <= _LEVEL_REL * now)):
                self._retire(flow)
            else:
                self._schedule_wake(flow)
            if self.record:
                self._sample(weights, now)
            return
        self._pending_done.append(flow)
        self._request_flush()

    def _schedule_wake(self, f: _Flow) -> None:
        f.version += 1
        self.env.timeout(f.remaining / f.rate).callbacks.append(partial(self._wake, f, f.version))

    def _sample(self, edges, now: float) -> None:
        """Record the total rate on each of ``edges`` where it changed (as _flush does)."""
        on_edge = self._on_edge
        for e in edges:
            total = sum((w * f.rate for f, w in on_edge.get(e, {}).items()), 0.0)
            if total != self._last_sample.get(e, 0.0):
                self._last_sample[e] = total
                self.samples.append(LinkSample(now, e, total))

    def _flush(self, _ev) -> None:
        now = self.env.now
        self._flush_at = None
        added, self._pending_add = self._pending_add, []
        finished, self._pending_done = self._pending_done, []
        on_edge = self._on_edge
        seeds: dict[Edge, None] = {}
        for f in added:
            for e, w in f.weights.items():
                on = on_edge.get(e)
                if on is None:
                    on_edge[e] = {f: w}
                else:
                    on[f] = w
                seeds[e] = None
        for f in finished:
            seeds.update(dict.fromkeys(f.weights))
        if self._pending_edges:
            seeds.update(dict.fromkeys(self._pending_edges))
            self._pending_edges = []
        flows, edges = self._component(seeds)
        # Bring every flow of the component to `now` at its old rate, and retire those
        # that are done (the woken ones and any that finish at the same time): a few bytes
        # of rounding residue, or a finish time that `now` cannot be told apart from (a
        # timeout that short would fire at `now` again and make no progress).
        level_now = _LEVEL_REL * now
        still = []
        old = []
        for f in flows:
            rate = f.rate
            if rate > 0:
                f.remaining -= rate * (now - f.t_last)
            f.t_last = now
            if f.remaining <= _DONE_REL * f.size or (rate > 0 and f.remaining / rate <= level_now):
                self._retire(f)
            else:
                still.append(f)
                old.append(rate)
        self._solve_known(still, edges)
        self.resolves += 1
        # New flows (no wake-up yet: version 0), flows whose rate changed, and woken flows
        # that rounding left a little short of done all need a (new) wake-up; the others
        # keep theirs.
        woken = set(finished) if finished else ()
        alone = self._alone
        for f, rate in zip(still, old):
            if f.rate != rate or not f.version or f in woken:
                self._schedule_wake(f)
            # Count the flows held below their lone rate (see _activate).
            held = f.rate != alone(f.weights)
            if held is not f.contended:
                f.contended = held
                self._contended += 1 if held else -1
        if self.record:
            self._sample(edges, now)

    def _retire(self, f: _Flow) -> None:
        f.done = True
        if f.contended:
            f.contended = False
            self._contended -= 1
        f.rate = 0.0
        f.remaining = 0.0
        on_edge = self._on_edge
        for e in f.weights:
            on = on_edge[e]
            del on[f]
            if not on:
                del on_edge[e]
        # A pipeline send or a symmetric collective's representative (which credits every
        # link of its class, thousands at 16k GPUs) passes the same map at every call: sum
        # the sizes per map now, add them per link when bytes_carried is read.
        carried = f.carried
        got = self._carried_later.get(id(carried))
        if got is None:
            self._carried_later[id(carried)] = [carried, f.size]
        else:
            got[1] += f.size
        self.flows_finished += 1
        f.event.succeed()

    def _component(self, seeds: Mapping[Edge, None]) -> tuple[list[_Flow], list[Edge]]:
        """Active flows reachable from the seed edges through shared edges, and all edges
        visited (seeds included, even if now idle, so their rate drops get recorded), in
        the order first reached (the solver's arithmetic follows it: deterministic)."""
        on_edge = self._on_edge
        edges = list(seeds)
        seen_e = set(edges)
        flows: list[_Flow] = []
        seen_f: set[_Flow] = set()
        for e in edges:         # (the list grows while it is walked: breadth first)
            on = on_edge.get(e)
            if on is None:
                continue
            for f in on:
                if f not in seen_f:
                    seen_f.add(f)
                    flows.append(f)
                    for e2 in f.weights:
                        if e2 not in seen_e:
                            seen_e.add(e2)
                            edges.append(e2)
        return flows, edges

    def _solve_known(self, flows: list[_Flow], edges: list[Edge]) -> None:
        """_solve, or the rates of an earlier solve of the same flows. A component's
        max-min rates depend only on its flows' weight maps and the edges' bandwidths:
        flows with the same map cross the same edges and freeze together, so one rate per
        map. Gradient buckets repeat a few sizes and paths, so the same set of maps
        (a multiset: two calls can share one) recurs step after step. Maps are keyed by
        identity; only maps kept for good (those of a transfer's cached path, see
        transfer) are remembered, so an id is never reused while it is a key, and
        one-off maps do not pile up. A bandwidth change (scale_edge) drops the entries."""
        if len(flows) < 2:
            self._solve(flows, edges)
            return
        key = tuple(sorted([id(f.weights) for f in flows]))
        got = self._solved.get(key)
        if got is not None:
            self.solves_reused += 1
            for f in flows:
                f.rate = got[id(f.weights)]
            return
        self._solve(flows, edges)
        if self._kept.issuperset(key):
            self._solved[key] = {id(f.weights): f.rate for f in flows}

    def _solve(self, flows: list[_Flow], edges: list[Edge]) -> None:
        """Weighted progressive filling: raise all unfrozen flows' rate together; when an
        edge's capacity is used up, freeze the flows crossing it at the current level.

        An edge's fair share (capacity left) / (unfrozen multiplicity) only changes when a
        flow on it freezes, and never drops below the current level, so a lazy min-heap
        of shares (stale entries skipped by a per-edge version) finds each next
        bottleneck in O(log E)."""
        if not flows:
            return
        bw = self._bw
        if len(flows) == 1:
            # Alone on its links (most pipeline sends): progressive filling stops at its
            # tightest edge, the same quotient the general loop below would compute.
            f = flows[0]
            f.rate = max(min(bw[e] / (0.0 + w) for e, w in f.weights.items()), 0.0)
            return
        on_edge = self._on_edge
        heappop, heappush = heapq.heappop, heapq.heappush
        # Per edge, by its position in ``edges`` (also the heap's tie-break: stable and
        # cheap): capacity taken by frozen flows, sum of unfrozen multiplicities.
        index = {e: i for i, e in enumerate(edges)}
        n_e = len(edges)
        used = [0.0] * n_e
        wsum = [0.0] * n_e
        for f in flows:
            for e, w in f.weights.items():
                wsum[index[e]] += w
        ver = [0] * n_e
        # Entries (fair share in bytes/s, edge index, version): plain tuples on purpose,
        # the solver's innermost loop pushes one per touched edge and a named record
        # costs several times a tuple to build.
        heap = [(bw[e] / wsum[i], i, 0) for i, e in enumerate(edges) if wsum[i] > 0]
        heapq.heapify(heap)
        unfrozen = set(flows)
        hi = 1 + _LEVEL_REL
        while unfrozen:
            tight: list[Edge] = []
            level = None
            while heap:
                share, i, v = heap[0]
                if v != ver[i] or wsum[i] <= 1e-12:
                    heappop(heap)                # stale, or every flow on it is frozen
                    continue
                if level is not None and share > level * hi:
                    break
                heappop(heap)
                if level is None:
                    level = max(share, 0.0)
                tight.append(edges[i])
            if level is None:
                raise RuntimeError("flow network: unfrozen flows left with no edge to bound them")
            touched: dict[int, None] = {}
            for e in tight:
                for f in on_edge[e]:
                    if f in unfrozen:
                        unfrozen.discard(f)
                        f.rate = level
                        for e2, w in f.weights.items():
                            j = index[e2]
                            used[j] += w * level
                            wsum[j] -= w
                            touched[j] = None
            for j in touched:
                if wsum[j] > 1e-12:
                    ver[j] += 1
                    heappush(heap, ((bw[edges[j]] - used[j]) / wsum[j], j, ver[j]))


def edge_latency_s(graph: networkx.DiGraph, u, v, data: Mapping,
                   hop_latency: Callable[[str], float | None] | None) -> float:
    """Latency of edge (u, v) in seconds: the graph's ``latency_s``, unless
    ``hop_latency(kind)`` gives a fitted device-to-device figure for the edge's class; that
    one is split in half over a star's two hops (device-hub-device), as specs/topology.py
    splits the topology's own figure. The flow network and the search's cost tables both
    read latencies through here."""
    fitted = None if hop_latency is None else hop_latency(data.get("kind", "default"))
    if fitted is None:
        return float(data.get("latency_s", 0.0))
    hub = "hub" in (graph.nodes[u].get("role"), graph.nodes[v].get("role"))
    return fitted * (0.5 if hub else 1.0)
