"""Collective algorithms as flows, independent of topology.

A collective on a group of ranks becomes a list of phases run one after another; the
flows of one phase (Flow: src rank, dst rank, bytes) run concurrently. A phase also says
how many sequential latency hops it pays: a pipelined ring moves data through n-1 (or
2(n-1)) neighbour steps, so each flow pays latency_steps times its path latency once,
while its bytes stream through (the alpha-beta ring model: time = steps*alpha + bytes/bw).
``run_phases`` routes the flows on a ``FlowNetwork``; links shared with other flows
(including unsimulated symmetric replicas) slow them down by max-min sharing.

Byte counts per flow follow the nccl-tests bus-bandwidth factors quoted in
docs/facts.md (NCCL bus bandwidth): all-reduce 2(n-1)/n of the buffer,
all-gather and reduce-scatter (n-1)/n of the full (gathered) buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import simpy

from costmodel.errors import InputError
from sim.flownet import Edge, FlowNetwork
from sim.symmetric_collective import Representative, representatives

__all__ = [
    "Flow", "Phase", "ring_allreduce", "tree_allreduce", "hierarchical_allreduce",
    "hierarchical_reduce_scatter", "hierarchical_allgather", "allgather", "reduce_scatter",
    "sparse_allgather", "p2p", "build", "run_phases", "double_binary_trees",
    "ALGORITHMS", "OPS",
]

ALGORITHMS = ("ring", "tree", "hierarchical")
OPS = ("allreduce", "allgather", "reduce_scatter", "sparse_allgather", "p2p")


class Flow(NamedTuple):
    """``nbytes`` bytes from rank ``src`` to rank ``dst``."""

    src: int
    dst: int
    nbytes: float


@dataclass(frozen=True)
class Phase:
    """Flows that run concurrently; each pays ``latency_steps`` times its path latency.
    ``group`` is the ordered group the flows belong to (used to map flows onto replica
    groups by position); () if unknown."""
    flows: tuple[Flow, ...]
    latency_steps: int
    group: tuple[int, ...] = ()


def _ring_flows(members: Sequence[int], nbytes: float) -> list[Flow]:
    n = len(members)
    return [Flow(members[i], members[(i + 1) % n], nbytes) for i in range(n)]


def _group(group: Sequence[int]) -> tuple[int, ...]:
    g = tuple(group)
    if len(set(g)) != len(g):
        raise ValueError(f"collective group {g} repeats a rank")
    return g


def ring_allreduce(group: Sequence[int], nbytes: float) -> list[Phase]:
    """Pipelined ring: every rank sends 2(n-1)/n * S to its successor (reduce-scatter then
    all-gather, n-1 steps each), paying 2(n-1) latency hops. One rank: nothing to do."""
    g = _group(group)
    n = len(g)
    if n < 2:
        return []
    return [Phase(tuple(_ring_flows(g, 2 * (n - 1) / n * nbytes)), 2 * (n - 1), g)]


def allgather(group: Sequence[int], nbytes_total: float) -> list[Phase]:
    """Ring all-gather of a buffer of ``nbytes_total`` (gathered size): each rank forwards
    (n-1)/n of it to its successor over n-1 latency hops."""
    g = _group(group)
    n = len(g)
    if n < 2:
        return []
    return [Phase(tuple(_ring_flows(g, (n - 1) / n * nbytes_total)), n - 1, g)]


def reduce_scatter(group: Sequence[int], nbytes_total: float) -> list[Phase]:
    """Ring reduce-scatter of a buffer of ``nbytes_total`` (input size): same traffic as
    the ring all-gather, (n-1)/n of the buffer per rank over n-1 hops."""
    return allgather(group, nbytes_total)


def sparse_allgather(group: Sequence[int], nnz_per_rank: float,
                     bytes_per_entry: float) -> list[Phase]:
    """Top-k compression: every rank's nnz (index, value) entries must reach all others.
    Sparse sums do not stay sparse, so they are gathered, not reduced: a ring all-gather
    whose flows each carry (n-1) * nnz * bytes_per_entry, over n-1 hops."""
    g = _group(group)
    n = len(g)
    if n < 2:
        return []
    return [Phase(tuple(_ring_flows(g, (n - 1) * nnz_per_rank * bytes_per_entry)), n - 1, g)]


def p2p(src: int, dst: int, nbytes: float) -> list[Phase]:
    """One point-to-point transfer, one latency hop. To itself: nothing."""
    if src == dst:
        return []
    return [Phase((Flow(src, dst, nbytes),), 1, (src, dst))]


def double_binary_trees(n: int) -> tuple[list[int | None], list[int | None]]:
    """Parents (by position 0..n-1; None for the root) of two complementary binary trees.

    Tree 1 is the in-order tree over positions i = 1..n (i = rank + 1): node i sits at
    height log2(lowbit(i)), and its parent is the nearest ancestor in the infinite in-order
    tree that exists (<= n). Odd i are leaves, so only odd ranks are interior. Tree 2 is the
    same tree over i = rank (rank 0 taking i = n), so only even ranks are interior: every
    rank is interior in at most one tree, which balances the traffic (Sanders et al.'s
    two-tree idea, the one NCCL's tree all-reduce uses)."""
    def parents(pos_of: Callable[[int], int]) -> list[int | None]:
        rank_at = {pos_of(r): r for r in range(n)}
        out: list[int | None] = []
        for r in range(n):
            i = pos_of(r)
            while True:
                k = i & -i
                i = i + k if (i // k) % 4 == 1 else i - k   # step to the in-order parent
                if i <= 0 or i > 2 * n:
                    # Walked above the top: r is the root (this only happens for the
                    # largest power of two <= n, whose chain leaves [1, n] upwards).
                    out.append(None)
                    break
                if i <= n:
                    out.append(rank_at[i])
                    break
        return out

    t1 = parents(lambda r: r + 1)
    t2 = parents(lambda r: r if r > 0 else n)
    return t1, t2


def _tree_depth(parent: list[int | None]) -> int:
    depth = 0
    for r in range(len(parent)):
        d, q = 0, parent[r]
        while q is not None:
            d, q = d + 1, parent[q]
        depth = max(depth, d)
    return depth


def tree_allreduce(group: Sequence[int], nbytes: float) -> list[Phase]:
    """Double binary tree all-reduce: each of two complementary trees reduces half the
    buffer up to its root, then broadcasts it down. Two phases (up, down); every tree edge
    carries S/2; each phase pays the deeper tree's depth (~log2 n) in latency hops."""
    g = _group(group)
    n = len(g)
    if n < 2:
        return []
    half = nbytes / 2
    t1, t2 = double_binary_trees(n)
    steps = max(_tree_depth(t1), _tree_depth(t2))
    up, down = [], []
    for tree in (t1, t2):
        for r, parent in enumerate(tree):
            if parent is not None:
                up.append(Flow(g[r], g[parent], half))
                down.append(Flow(g[parent], g[r], half))
    return [Phase(tuple(up), steps, g), Phase(tuple(down), steps, g)]


def _members_by_node(g: tuple[int, ...], node_of: Callable[[int], int]) -> dict[int, list[int]]:
    nodes: dict[int, list[int]] = {}
    for r in g:
        nodes.setdefault(node_of(r), []).append(r)
    return nodes


def _split_by_node(g: tuple[int, ...], node_of: Callable[[int], int]) -> list[list[int]]:
    nodes = _members_by_node(g, node_of)
    sizes = {len(m) for m in nodes.values()}
    if len(sizes) != 1:
        raise ValueError(f"hierarchical collective needs the same number of group members "
                         f"on every node; got {[len(m) for m in nodes.values()]} on nodes "
                         f"{list(nodes)}")
    return list(nodes.values())


def _concurrent(per_group: list[list[Phase]], g: tuple[int, ...]) -> list[Phase]:
    """Merge sub-collectives that run at the same time on disjoint sub-groups."""
    flat = [ph for phases in per_group for ph in phases]
    if not flat:
        return []
    flows = tuple(fl for ph in flat for fl in ph.flows)
    return [Phase(flows, max(ph.latency_steps for ph in flat), g)]


def hierarchical_allreduce(group: Sequence[int], nbytes: float,
                           node_of: Callable[[int], int],
                           inter: Callable[[Sequence[int], float], list[Phase]] = ring_allreduce) -> list[Phase]:
    """Intra-node ring reduce-scatter of S, inter-node all-reduce of S/n_local among
    members with the same local index (``inter``: a ring, or tree_allreduce), intra-node
    ring all-gather of S. With one member per node it is the plain inter-node all-reduce."""
    g = _group(group)
    nodes = _split_by_node(g, node_of)
    n_local = len(nodes[0])
    rails = [[members[j] for members in nodes] for j in range(n_local)]
    return (_concurrent([reduce_scatter(m, nbytes) for m in nodes], g)
            + _concurrent([inter(r, nbytes / n_local) for r in rails], g)
            + _concurrent([allgather(m, nbytes) for m in nodes], g))


def hierarchical_reduce_scatter(group: Sequence[int], nbytes_total: float,
                                node_of: Callable[[int], int]) -> list[Phase]:
    """Intra-node ring reduce-scatter of S, then inter-node ring reduce-scatter of
    S/n_local among same-local-index members."""
    g = _group(group)
    nodes = _split_by_node(g, node_of)
    n_local = len(nodes[0])
    rails = [[members[j] for members in nodes] for j in range(n_local)]
    return (_concurrent([reduce_scatter(m, nbytes_total) for m in nodes], g)
            + _concurrent([reduce_scatter(r, nbytes_total / n_local) for r in rails], g))


def hierarchical_allgather(group: Sequence[int], nbytes_total: float,
                           node_of: Callable[[int], int]) -> list[Phase]:
    """Inter-node ring all-gather of S/n_local among same-local-index members, then
    intra-node ring all-gather of S: the mirror of hierarchical_reduce_scatter."""
    g = _group(group)
    nodes = _split_by_node(g, node_of)
    n_local = len(nodes[0])
    rails = [[members[j] for members in nodes] for j in range(n_local)]
    return (_concurrent([allgather(r, nbytes_total / n_local) for r in rails], g)
            + _concurrent([allgather(m, nbytes_total) for m in nodes], g))


_OP_ALIASES = {"allreduce": "allreduce", "all_reduce": "allreduce",
               "allgather": "allgather", "all_gather": "allgather",
               "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
               "sparse_allgather": "sparse_allgather", "sparse_all_gather": "sparse_allgather",
               "p2p": "p2p", "send": "p2p"}


def build(algorithm: str, op: str, group: Sequence[int], nbytes: float,
          node_of: Callable[[int], int] | None = None, **kw) -> list[Phase]:
    """Phases of collective ``op`` with ``algorithm`` on ``group``.

    op: allreduce | allgather | reduce_scatter (nbytes = full buffer) | sparse_allgather
    (nbytes = one rank's payload; or pass nnz_per_rank= and bytes_per_entry=) | p2p
    (group = (src, dst)). algorithm: ring | tree (allreduce only) | hierarchical (needs
    node_of). p2p and sparse_allgather ignore the algorithm (a ring / a direct send)."""
    o = _OP_ALIASES.get(str(op).lower().replace("-", "_"))
    if o is None:
        raise InputError("plan", "collective.op",
                         f"unknown collective op {op!r}; allowed: {', '.join(OPS)}")
    alg = str(algorithm).lower()
    if alg not in ALGORITHMS:
        raise InputError("plan", "collective.algorithm",
                         f"unknown collective algorithm {algorithm!r}; "
                         f"allowed: {', '.join(ALGORITHMS)}")
    if o == "p2p":
        if len(group) != 2:
            raise ValueError(f"p2p needs group (src, dst), got {tuple(group)}")
        return p2p(group[0], group[1], nbytes)
    if o == "sparse_allgather":
        bpe = kw.get("bytes_per_entry", 1.0)
        nnz = kw.get("nnz_per_rank", nbytes / bpe)
        return sparse_allgather(group, nnz, bpe)
    if alg == "ring" and node_of is not None and several_per_node(_group(group), node_of):
        alg = "hierarchical"  # see several_per_node
    if alg == "hierarchical":
        if node_of is None:
            raise ValueError("hierarchical collectives need node_of(rank) -> node id")
        fn = {"allreduce": hierarchical_allreduce, "allgather": hierarchical_allgather,
              "reduce_scatter": hierarchical_reduce_scatter}[o]
        return fn(group, nbytes, node_of)
    if alg == "tree":
        if o != "allreduce":
            raise InputError("plan", "collective.algorithm",
                             f"algorithm 'tree' is for allreduce only, not {o}; "
                             "allowed for it: ring, hierarchical")
        if node_of is not None and several_per_node(_group(group), node_of):
            # NCCL's tree all-reduce across nodes: within a node a chain to the member
            # whose NIC the channel leaves by, between nodes a pair of binary trees, one
            # such tree per channel and the channels over every NIC (src/graph/search.cc,
            # src/graph/trees.cc). One pair of trees in rank order sent up to all of S
            # through one member's NIC (tests/test_collective_flows.py); the chain is priced here as the node's ring
            # reduce-scatter and all-gather, the trees over S/m per local index.
            return hierarchical_allreduce(group, nbytes, node_of, inter=tree_allreduce)
        return tree_allreduce(group, nbytes)
    return {"allreduce": ring_allreduce, "allgather": allgather,
            "reduce_scatter": reduce_scatter}[o](group, nbytes)


def several_per_node(g: tuple[int, ...], node_of: Callable[[int], int]) -> bool:
    """Whether ``g`` has the same number m > 1 of members on each of several nodes. A ring
    collective on such a group is priced by the hierarchical decomposition (within each
    node, a ring per local index across nodes, within each node again), not as one ring
    through the members in order. NCCL runs a ring collective on several rings (channels),
    each crossing the nodes through its own NIC (src/graph/search.cc, ncclTopoCompute: a
    channel per NIC found), so its inter-node traffic spreads over every member's NIC; one
    ring in rank order would send all of it through one NIC per node, m times too slow
    (MPT-70B FSDP on 32 A100s, llm-foundry's published table: 195 tokens/s/GPU predicted
    against 373 measured). The m rings themselves, simulated flow by flow, cost m times the
    flows and defeat the symmetric shortcut (131,072 devices at tp=4: 2.9 s -> over 60 s);
    the hierarchical form moves the same share through each NIC, 2(N-1)/N of S/m on N
    nodes where m rings move 2(n-1)/n of it (n = mN; at most (N/(N-1)) x, 1.33 x at N = 4,
    less), at the cost of one inter-node ring per local index."""
    blocks = _members_by_node(g, node_of)
    sizes = {len(m) for m in blocks.values()}
    return len(blocks) > 1 and len(sizes) == 1 and min(sizes) > 1


Route = Callable[[int, int], Sequence[Edge]]


def _route_key(route: Route):
    """A hashable identity for a route function that survives re-binding a method
    (``cluster.route`` is a new object at every attribute access)."""
    owner = getattr(route, "__self__", None)
    if owner is not None and hasattr(route, "__func__"):
        return ("method", id(owner), route.__func__)
    return ("func", id(route))


def _cached_route(net: FlowNetwork, route: Route, rkey, s: int, d: int) -> tuple[Edge, ...]:
    cache = net.cache.setdefault("collective_routes", {})
    key = (rkey, s, d)
    path = cache.get(key)
    if path is None:
        path = route(s, d)
        # Cluster.route already gives a tuple of 2-tuples; other routes are copied.
        if type(path) is not tuple:
            path = tuple((e[0], e[1]) for e in path)
        cache[key] = path
    return path


def _replica_counts(net: FlowNetwork, route: Route, rkey, path: tuple[Edge, ...], pairs) -> dict | None:
    """Multiplicity on each edge of ``path``: 1 + the replica flows (src, dst) in ``pairs``
    whose routes use it; None where every edge has 1."""
    counter = getattr(getattr(route, "__self__", None), "route_counts", None)
    if counter is not None and getattr(route, "__func__", None) is type(route.__self__).route:
        # A Cluster counts without routing the pairs that cannot reach the path's links.
        count = {e: c + 1 for e, c in counter(path, pairs).items()}
        return None if all(c == 1 for c in count.values()) else count
    count = {e: 1 for e in path}
    for a, b in pairs:
        # Each replica route is used once per call site: not worth net.cache's copy
        # (Cluster.route keeps its own cache across simulations).
        for e in route(a, b):
            if e in count:
                count[e] += 1
    return None if all(c == 1 for c in count.values()) else count


def p2p_route(net: FlowNetwork, route: Route, src: int, dst: int,
              replicas: Sequence[tuple[int, int]]) -> tuple[tuple[Edge, ...], dict | None]:
    """Path and multiplicity map of a point-to-point send src -> dst whose unsimulated
    replica sends ``replicas`` (pairs) run alongside, as run_phases would compute them.
    Not cached here: the pipeline executor keeps the result per stage pair (hashing a
    few thousand replica pairs at 16k GPUs would cost more than the look-up saves)."""
    rkey = _route_key(route)
    net.cache.setdefault("collective_route_owners", {})[rkey] = route
    path = _cached_route(net, route, rkey, src, dst)
    return path, _replica_counts(net, route, rkey, path, replicas)


def run_phases(env: simpy.Environment, net: FlowNetwork, route: Route,
               phases: list[Phase], replicas: Sequence[Sequence[int]] = (), label: str = "",
               group: Sequence[int] | None = None, symmetric: bool = False) -> simpy.Event:
    """Run ``phases`` one after another, each phase's flows concurrently on ``net``.
    Returns an event that succeeds when the last phase is done.

    ``replicas``: other groups of the same size doing the identical collective at the same
    time but not simulated. For each flow (s, d) at positions (i, j) of the group (``group``
    or each phase's own ``Phase.group``), the replica flows (R[i], R[j]) are routed, and the
    simulated flow gets multiplicity 1 + (number of replica flows using that edge) on each
    edge of its own path. Routes and multiplicity maps are cached on ``net.cache``.

    ``symmetric``: the group is homogeneous (one GPU type, identical replicas), so a
    phase's flows may run as one representative per class of identical flows
    (sim/symmetric_collective.py), with the same rates, bytes per link and end time."""
    rkey = _route_key(route)
    # A call repeats with the very same phases and replicas (a stage's gradient buckets):
    # the flows each phase starts (their checked weights, latency, bytes and credited
    # links) are kept under those objects' identities (the entry holds them, so an id is
    # not reused), and a repeat starts them without routing, multiplicity or
    # representative look-ups. Nothing else they depend on changes during a run.
    plans = net.cache.setdefault("phase_plans", {})
    pkey = (rkey, id(phases), id(replicas), id(group), symmetric)
    hit = plans.get(pkey)
    if hit is not None and hit[0] is phases and hit[1] is replicas and hit[2] is group:
        return env.process(_replay(env, net, hit[3], label))
    # Keep the route's owner alive while its id is a cache key, so the id is not reused.
    net.cache.setdefault("collective_route_owners", {})[rkey] = route
    reps = replicas if type(replicas) is tuple and all(type(r) is tuple for r in replicas) \
        else tuple(tuple(r) for r in replicas)
    mcache = net.cache.setdefault("collective_multiplicity", {})

    def multiplicity_maps(ph: Phase) -> dict | None:
        """Cache entry of this phase's (route, group, replicas): rank positions in the
        group, and maps (s, d) -> multiplicity map (None where all ones). Looked up once
        per phase rather than per flow, since hashing the group tuples costs O(n)."""
        if not reps:
            return None
        g = tuple(group) if group is not None else ph.group
        if not g:
            raise ValueError("run_phases with replicas needs the group (Phase.group or group=)")
        for rep in reps:
            if len(rep) != len(g):
                raise ValueError(f"replica group {rep} has {len(rep)} ranks, group {g} has {len(g)}")
        key = (rkey, g, reps)
        if key not in mcache:
            mcache[key] = {"positions": {r: i for i, r in enumerate(g)}, "maps": {}}
        return mcache[key]

    def multiplicity(cached: dict, s: int, d: int, path: tuple[Edge, ...]):
        maps = cached["maps"]
        if (s, d) in maps:
            return maps[(s, d)]
        i, j = cached["positions"][s], cached["positions"][d]
        m = maps[(s, d)] = _replica_counts(net, route, rkey, path, ((rep[i], rep[j]) for rep in reps))
        return m

    # Resolved now, not inside the process, so bad replica groups fail at the call site.
    per_phase = [multiplicity_maps(ph) for ph in phases]
    scache = net.cache.setdefault("symmetric_representatives", {})

    def symmetric_reps(ph: Phase, cached: dict | None) -> list[Representative]:
        key = (rkey, reps, ph.flows)
        out = scache.get(key)
        if out is None:
            g = tuple(group) if group is not None else ph.group
            out = _shifted_representatives(net, route, rkey, g, reps, ph.flows)
            if out is None:
                first = g[0] if g else None
                paths, weights = [], []
                for s, d, _nbytes in ph.flows:
                    path = _cached_route(net, route, rkey, s, d)
                    mult = None if cached is None else multiplicity(cached, s, d, path)
                    paths.append(path)
                    weights.append({e: 1 for e in path} if mult is None else mult)
                out = representatives(
                    paths, weights, [f.nbytes for f in ph.flows],
                    [first in (f.src, f.dst) for f in ph.flows], net.edge_params)
                if ph.flows:    # the phase later phases shifted from it can be renamed from
                    net.cache.setdefault("symmetric_bases", {}).setdefault(
                        _base_key(rkey, ph.flows), []).append((g, reps, ph.flows, out))
            scache[key] = out
        return out

    def phase_flows(ph: Phase, cached: dict | None) -> list[tuple]:
        """(weights, latency s, bytes, credited links) of each flow ``ph`` starts."""
        steps = ph.latency_steps
        if steps < 0:
            raise ValueError(f"transfer {label!r}: latency_steps={steps!r} must be >= 0")
        out = []
        if symmetric and len(ph.flows) > 2:
            for rep in symmetric_reps(ph, cached):
                weights, latency = net.prepare(rep.path, None, rep.weights, label)
                out.append((weights, latency * steps + 0.0, ph.flows[rep.index].nbytes, rep.carried))
            return out
        for s, d, nbytes in ph.flows:
            path = _cached_route(net, route, rkey, s, d)
            mult = None if cached is None else multiplicity(cached, s, d, path)
            weights, latency = net.prepare(path, mult, None, label)
            out.append((weights, latency * steps + 0.0, nbytes, None))
        return out

    def proc():
        plan = []
        for ph, cached in zip(phases, per_phase):
            flows = phase_flows(ph, cached)
            plan.append(flows)
            yield env.all_of([net.start(w, lat, nbytes, None, label, carried) for w, lat, nbytes, carried in flows])
        plans[pkey] = (phases, replicas, group, plan)

    return env.process(proc())


def _replay(env: simpy.Environment, net: FlowNetwork, plan: list[list[tuple]], label: str):
    """run_phases' process for a call whose flows were kept (see there)."""
    for flows in plan:
        yield env.all_of([net.start(w, lat, nbytes, None, label, carried) for w, lat, nbytes, carried in flows])


def _base_key(rkey, flows: tuple[Flow, ...]) -> tuple:
    """What a phase and the phases shifted from it share, cheap to hash. Where every flow
    carries the same bytes the amount does not matter: colour refinement starts from
    one colour for all of them either way, and representatives() returns no bytes (the
    first and last stages' rings, with the embedding, are then renamed from the others)."""
    nb = flows[0].nbytes
    return rkey, len(flows), flows[0].dst - flows[0].src, \
        "uniform" if all(f.nbytes == nb for f in flows) else tuple(f.nbytes for f in flows)


def _shifted_representatives(net: FlowNetwork, route: Route, rkey, group: tuple[int, ...],
                             reps: tuple, flows: tuple[Flow, ...]) -> list[Representative] | None:
    """The representatives of a symmetric phase whose group, replicas and flows are those
    of a phase already solved with every rank shifted by the same delta (the stages of a
    pipeline at 16k GPUs; bytes equal, or uniform in both: see _base_key), renamed with the cluster's shift map (Cluster.shift_map);
    None where there is no such phase or no such map. Colour refinement sees only link
    attributes, multiplicities and the order of flows and links, all of which the
    renaming keeps, so the result is what representatives() would return for the
    shifted phase (benchmarks/identical_outputs.py compares the two)."""
    owner = getattr(route, "__self__", None)
    shift_map = getattr(owner, "shift_map", None)
    if shift_map is None or getattr(route, "__func__", None) is not type(owner).route \
            or net.graph is not getattr(owner, "links", None) or net.scaled:
        return None
    if not flows or not group:
        return None
    bases = net.cache.get("symmetric_bases", {}).get(_base_key(rkey, flows), ())
    # (same key: the bytes are uniform in both, or equal flow by flow)
    # (the stages of one class of leaf alignment are shifts of each other; try each, the
    # nearest shift first: a failed try can walk most of the nodes before it fails, and
    # the nearest base is the likeliest to share this phase's alignment)
    for base in sorted(bases, key=lambda b: abs(flows[0].src - b[2][0].src)):
        out = _renamed(owner, base, group, reps, flows)
        if out is not None:
            return out
    return None


def _renamed(cluster, base: tuple, group: tuple[int, ...], reps: tuple,
             flows: tuple[Flow, ...]) -> list[Representative] | None:
    """``base``'s representatives renamed onto the shifted phase, or None (see above)."""
    bgroup, breps, bflows, bout = base
    delta = flows[0].src - bflows[0].src
    # (checks and renaming as maps and comprehensions: at 16k GPUs a stage's group and
    # replicas hold 2048 ranks and a representative credits about 600 links)
    shift = delta.__add__
    if delta == 0 or len(bgroup) != len(group) or len(breps) != len(reps) \
            or list(map(shift, bgroup)) != list(group) \
            or [(f.src, f.dst) for f in flows] != [(b.src + delta, b.dst + delta) for b in bflows] \
            or any(list(map(shift, br)) != list(r) for r, br in zip(reps, breps)):
        return None
    vmap = cluster.shift_map([*bgroup, *(x for r in breps for x in r)], delta)
    if vmap is None:
        return None
    try:
        return [Representative(r.index, tuple([(vmap[u], vmap[v]) for u, v in r.path]),
                               {(vmap[u], vmap[v]): w for (u, v), w in r.weights.items()},
                               {(vmap[u], vmap[v]): w for (u, v), w in r.carried.items()}) for r in bout]
    except KeyError:        # a link outside the mapped nodes: solve it directly
        return None
