"""Analytic (alpha-beta) costs of collectives, for the fast search estimate and TP collectives.

A transfer of S bytes over a link costs alpha + S/B: alpha = ``latency_s`` per step, B =
``bw_Bps`` bytes/s per direction per rank (links full duplex). n = ranks in the group. The
simulator's flow network replaces these formulas where links are shared; here every rank is
assumed to get its full bandwidth.
"""
from __future__ import annotations

import math

from costmodel.errors import InputError

# nccl-tests "bus bandwidth" factors: busbw = algbw * factor (docs/facts.md, NCCL
# bus bandwidth): the bytes each rank must move over its link per byte of the operation.
_BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
ALLREDUCE_ALGORITHMS = ("ring", "tree", "hierarchical")


def _check(nbytes: float, n: int, bw_Bps: float, latency_s: float, what: str = "") -> None:
    p = f"{what}." if what else ""
    if not isinstance(n, int) or n < 1:
        raise InputError(None, f"{p}n", f"group size must be an integer >= 1, got {n!r}")
    if nbytes < 0:
        raise InputError(None, f"{p}nbytes", f"must be >= 0, got {nbytes!r}")
    if not bw_Bps > 0:
        raise InputError(None, f"{p}bw_Bps", f"bandwidth must be > 0 bytes/s, got {bw_Bps!r}")
    if latency_s < 0:
        raise InputError(None, f"{p}latency_s", f"must be >= 0 s, got {latency_s!r}")


def busbw_factor(op: str, n: int) -> float:
    """busbw/algbw of a collective over n ranks, as nccl-tests defines it."""
    if op not in _BUSBW:
        raise InputError(None, "op", f"unknown collective {op!r}; allowed: {', '.join(_BUSBW)}")
    if not isinstance(n, int) or n < 1:
        raise InputError(None, "n", f"group size must be an integer >= 1, got {n!r}")
    return float(_BUSBW[op](n))


def ring_allreduce_s(nbytes: float, n: int, bw_Bps: float, latency_s: float) -> float:
    """Ring all-reduce: reduce-scatter then all-gather, each n-1 steps of S/n bytes:
    2(n-1)/n * S/B + 2(n-1) * alpha."""
    _check(nbytes, n, bw_Bps, latency_s)
    return 2 * (n - 1) / n * nbytes / bw_Bps + 2 * (n - 1) * latency_s


def tree_allreduce_s(nbytes: float, n: int, bw_Bps: float, latency_s: float) -> float:
    """Double binary tree all-reduce (NCCL): two complementary binary trees, each carrying
    half of the buffer, reduce up to the root and broadcast back down, pipelined in chunks.

    Bandwidth: a rank is interior (two children) in one tree and a leaf in the other. In
    its interior tree it receives S/2 from each child and sends S/2 up, then receives S/2
    from the parent and sends S/2 to each child: sends S, receives S. As a leaf it sends
    S/2 up and receives S/2 down. Each rank so sends and receives 2S in total, and with the
    up and down phases pipelined the time is bounded by that traffic: 2 * S/B (for n = 2
    there are no two-child nodes: each rank sends its half once, S/B, as a ring would).
    Compared with the ring's 2(n-1)/n * S/B this is n/(n-1) slower in bandwidth (the gap,
    2S/(nB), shrinks as n grows).

    Latency: the first chunk climbs and descends the tree: 2 * ceil(log2 n) * alpha (ceil,
    because the shifted second tree can be one level deeper than a complete one), against
    the ring's 2(n-1) * alpha. So for n >= 3 the tree is faster below
    S* = alpha * B * n * (n - 1 - ceil(log2 n)) bytes and the ring above (n = 8, 5 us,
    100 GB/s: 16 MB; n = 1024: about 519 GB, so at scale the tree wins almost always).
    """
    _check(nbytes, n, bw_Bps, latency_s)
    if n == 1:
        return 0.0
    bw_factor = 1.0 if n == 2 else 2.0
    return bw_factor * nbytes / bw_Bps + 2 * math.ceil(math.log2(n)) * latency_s


def allgather_s(nbytes_total: float, n: int, bw_Bps: float, latency_s: float) -> float:
    """Ring all-gather; ``nbytes_total`` is the gathered size (each rank holds S/n):
    (n-1)/n * S/B + (n-1) * alpha."""
    _check(nbytes_total, n, bw_Bps, latency_s)
    return (n - 1) / n * nbytes_total / bw_Bps + (n - 1) * latency_s


def reduce_scatter_s(nbytes_total: float, n: int, bw_Bps: float, latency_s: float) -> float:
    """Ring reduce-scatter of an S-byte buffer (each rank ends with S/n): same traffic as
    the all-gather, (n-1)/n * S/B + (n-1) * alpha."""
    _check(nbytes_total, n, bw_Bps, latency_s)
    return (n - 1) / n * nbytes_total / bw_Bps + (n - 1) * latency_s


def hierarchical_allreduce_s(
    nbytes: float,
    n_local: int,
    n_nodes: int,
    intra_bw_Bps: float,
    intra_latency_s: float,
    inter_bw_Bps: float,
    inter_latency_s: float,
) -> float:
    """Two-level all-reduce: ring reduce-scatter inside each node (each GPU keeps S/n_local),
    ring all-reduce of that S/n_local across nodes (the n_local shards in parallel, one
    per GPU, so ``inter_bw_Bps`` is the inter-node bandwidth per GPU, e.g. one NIC per GPU),
    then ring all-gather inside each node. n_local = 1 is a plain ring across nodes;
    n_nodes = 1 is a ring inside the node."""
    _check(nbytes, n_local, intra_bw_Bps, intra_latency_s, "intra")
    _check(nbytes, n_nodes, inter_bw_Bps, inter_latency_s, "inter")
    shard = nbytes / n_local
    return (
        reduce_scatter_s(nbytes, n_local, intra_bw_Bps, intra_latency_s)
        + ring_allreduce_s(shard, n_nodes, inter_bw_Bps, inter_latency_s)
        + allgather_s(nbytes, n_local, intra_bw_Bps, intra_latency_s)
    )


def sparse_allgather_s(nnz_per_rank: int, bytes_per_entry: float, n: int, bw_Bps: float, latency_s: float) -> float:
    """All-gather of top-k compressed gradients: each rank contributes nnz (index, value)
    entries of ``bytes_per_entry`` bytes and receives the other ranks' (n-1)*nnz entries,
    i.e. a ring all-gather of n*nnz*bytes_per_entry bytes: (n-1)*nnz*bpe/B + (n-1)*alpha."""
    if nnz_per_rank < 0 or bytes_per_entry < 0:
        got = f"got nnz_per_rank={nnz_per_rank!r}, bytes_per_entry={bytes_per_entry!r}"
        raise InputError(None, "nnz_per_rank", f"need nnz_per_rank >= 0 and bytes_per_entry >= 0, {got}")
    return allgather_s(n * nnz_per_rank * bytes_per_entry, n, bw_Bps, latency_s)


def p2p_s(nbytes: float, bw_Bps: float, latency_s: float) -> float:
    """One point-to-point send: alpha + S/B."""
    _check(nbytes, 1, bw_Bps, latency_s)
    return nbytes / bw_Bps + latency_s


def _flat_link(n_nodes: int, intra_bw_Bps: float, intra_latency_s: float, inter_bw_Bps, inter_latency_s):
    """The link a flat (ring or tree) algorithm sees: inside one node the intra link;
    across nodes every step waits for its slowest hop, so the narrower bandwidth and the
    larger latency of the two."""
    if n_nodes == 1:
        return intra_bw_Bps, intra_latency_s
    return min(intra_bw_Bps, inter_bw_Bps), max(intra_latency_s, inter_latency_s)


def allreduce_s(
    algorithm: str,
    nbytes: float,
    n_local: int,
    n_nodes: int,
    intra_bw_Bps: float,
    intra_latency_s: float,
    inter_bw_Bps: float | None = None,
    inter_latency_s: float | None = None,
) -> float:
    """All-reduce of ``nbytes`` over n_local GPUs per node on n_nodes nodes with
    ``algorithm`` in ring, tree, hierarchical or auto (the cheapest; see best_allreduce).
    Inter-node figures are needed only when n_nodes > 1."""
    if algorithm == "auto":
        return best_allreduce(nbytes, n_local, n_nodes, intra_bw_Bps, intra_latency_s, inter_bw_Bps, inter_latency_s)[1]
    if algorithm not in ALLREDUCE_ALGORITHMS:
        allowed = ", ".join(ALLREDUCE_ALGORITHMS + ("auto",))
        raise InputError(None, "plan.allreduce", f"unknown algorithm {algorithm!r}; allowed: {allowed}")
    if not isinstance(n_nodes, int) or n_nodes < 1:
        raise InputError(None, "n_nodes", f"must be an integer >= 1, got {n_nodes!r}")
    if n_nodes > 1 and (inter_bw_Bps is None or inter_latency_s is None):
        raise InputError(None, "inter_bw_Bps", f"n_nodes={n_nodes} > 1 needs inter-node bandwidth and latency")
    if n_nodes == 1:  # no inter-node step; any placeholder passes the checks
        inter_bw_Bps, inter_latency_s = intra_bw_Bps, intra_latency_s
    if algorithm == "hierarchical":
        return hierarchical_allreduce_s(
            nbytes, n_local, n_nodes, intra_bw_Bps, intra_latency_s, inter_bw_Bps, inter_latency_s
        )
    bw, lat = _flat_link(n_nodes, intra_bw_Bps, intra_latency_s, inter_bw_Bps, inter_latency_s)
    fn = ring_allreduce_s if algorithm == "ring" else tree_allreduce_s
    return fn(nbytes, n_local * n_nodes, bw, lat)


def best_allreduce(
    nbytes: float,
    n_local: int,
    n_nodes: int,
    intra_bw_Bps: float,
    intra_latency_s: float,
    inter_bw_Bps: float | None = None,
    inter_latency_s: float | None = None,
) -> tuple[str, float]:
    """(algorithm, seconds) of the cheapest all-reduce; ties go to the earlier of ring,
    tree, hierarchical (deterministic)."""
    best: tuple[str, float] | None = None
    for name in ALLREDUCE_ALGORITHMS:
        t = allreduce_s(name, nbytes, n_local, n_nodes, intra_bw_Bps, intra_latency_s, inter_bw_Bps, inter_latency_s)
        if best is None or t < best[1]:
            best = (name, t)
    assert best is not None
    return best
