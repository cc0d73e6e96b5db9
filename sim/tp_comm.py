"""What tensor-parallel communication costs a chunk on the critical path, and the group
facts every collective's cost starts from (its fabric class, its call cost, its ring's
bottleneck link).

TP collectives are short, frequent and on the critical path, so they are costed
analytically (costmodel/collectives.py's alpha-beta formulas on the group's bottleneck
link) rather than as flows through the network simulation; sim/program.chunk_work adds
them to each chunk's forward and backward. The collective algorithms themselves live in
costmodel/collectives.py, the topology in specs/topology.py.
"""
from __future__ import annotations

import math

from costmodel import collectives as cc
from costmodel.efficiency import op_time_s
from costmodel.profile import Profile
from specs.topology import Cluster


def _tp_group_s(cluster: Cluster, profile: Profile, ranks: list[int], nbytes: float) -> tuple[float, float, float]:
    """(all-reduce, all-gather, reduce-scatter) of an ``nbytes`` buffer over the TP group,
    each with its call's cost (analytic: TP collectives are short, frequent and on the
    critical path, so they are costed with the alpha-beta formulas on the group's
    bottleneck link instead of as flows)."""
    n = len(ranks)
    bw, lat, kind = group_link(cluster, ranks, profile)
    fab = profile.fabric(kind)
    bw_eff = bw * fab.bw_eff
    return (cc.ring_allreduce_s(nbytes, n, bw_eff, lat) + fab.call_s("all_reduce", n),
            cc.allgather_s(nbytes, n, bw_eff, lat) + fab.call_s("all_gather", n),
            cc.reduce_scatter_s(nbytes, n, bw_eff, lat) + fab.call_s("reduce_scatter", n))


def group_allreduce_s(cluster: Cluster, profile: Profile, ranks: list[int], nbytes: float) -> float:
    """One ring all-reduce of `nbytes` over a small group on the critical path (the TP
    group; the first and last stage's tied embedding), plus the call's cost (_tp_group_s)."""
    return 0.0 if len(ranks) == 1 else _tp_group_s(cluster, profile, ranks, nbytes)[0]


def _overlapped_s(comm_s: float, compute_s: float, slowdown: float) -> float:
    """Exposed cost of a collective run beside a GEMM: what outlasts the GEMM, plus the
    GEMM's slowdown while both run (the collective's kernels take SMs and HBM bandwidth)."""
    return max(0.0, comm_s - compute_s) + slowdown * min(comm_s, compute_s)


def pipelined_overlap_s(comm_s: float, gemm_s: float, chunks: int, slowdown: float) -> float:
    """Exposed cost of a collective split into ``chunks`` pieces and pipelined with its
    GEMM, as Transformer Engine's userbuffer overlap does (Megatron-Core --tp-comm-overlap):
    the first GEMM chunk runs on local data while the second piece moves, so the GEMM hides
    (chunks-1)/chunks of itself behind the transfer; only what the transfer outlasts that
    is exposed, plus the fabric's compute slowdown while both run."""
    hide = gemm_s * (chunks - 1) / chunks
    return max(0.0, comm_s - hide) + slowdown * min(comm_s, hide)


def tp_layer_comm_s(cluster: Cluster, profile: Profile, ranks: list[int], act_bytes: float, sp: bool,
                    recompute: str, b_ops: list, gpu, eff, prec: str, f_ops: list | None = None) -> tuple[float, float]:
    """Exposed tensor-parallel communication of one layer and one microbatch, (forward,
    backward with recompute), on the critical path of the compute stream.

    Megatron's f/g operators: without SP, two all-reduces of the b*s*h activation forward
    (after attention-out and MLP-down) and two backward (the input gradients of QKV and
    MLP-up); with SP each forward all-reduce becomes an all-gather before the column-parallel
    GEMM and a reduce-scatter after the row-parallel one (same volume, Korthikanti et al.
    2022 Sec. 4.2), and backward has an all-gather of the output gradient, a reduce-scatter
    of the input gradient and a second all-gather of the saved s/t input for the weight
    gradient. Full recompute repeats the forward's collectives.

    With runtime.tp_bwd_overlap (Megatron-LM's asynchronous TP all-reduce) the backward
    input-gradient reduction runs beside the weight-gradient GEMM, and SP's re-gather of
    the input beside the input-gradient GEMM; only what outlasts them is exposed, plus the
    fabric's ``compute_slowdown`` of the GEMM while both run.

    With runtime.tp_comm_overlap and SP (Megatron-Core --tp-comm-overlap, which requires
    sequence parallelism: megatron/training/arguments.py; the overlap itself is Transformer
    Engine's userbuffers) every all-gather and reduce-scatter next to a GEMM is chunked and
    pipelined with it (pipelined_overlap_s, n = tp chunks): forward, the gathers before QKV
    and MLP-up and the reduce-scatters after attention-out and MLP-down; backward, the
    output-gradient gathers before the dgrad GEMMs of attention-out and MLP-down. The
    backward re-gather and reduce-scatter of QKV and MLP-up overlap as above ("bulk"
    overlaps with the dgrad and wgrad GEMMs, TE's tp_comm_bulk_dgrad/_wgrad)."""
    n = len(ranks)
    if n == 1:
        return 0.0, 0.0
    ar, ag, rs = _tp_group_s(cluster, profile, ranks, act_bytes)
    full = recompute == "full"
    overlap = profile.runtime.tp_bwd_overlap
    gemm = {o.name: op_time_s(o, gpu, eff, prec) for o in b_ops
            if o.name in ("qkv_wgrad", "mlp_up_wgrad", "qkv_dgrad", "mlp_up_dgrad", "attn_out_dgrad", "mlp_down_dgrad")}
    slow = profile.fabric(group_kind(cluster, ranks)).compute_slowdown
    if sp and profile.runtime.tp_comm_overlap and f_ops is not None:
        fg = {o.name: op_time_s(o, gpu, eff, prec) for o in f_ops if o.kind == "gemm"}
        fwd = sum(pipelined_overlap_s(ag, fg.get(g, 0.0), n, slow) for g in ("qkv", "mlp_up")) + \
            sum(pipelined_overlap_s(rs, fg.get(g, 0.0), n, slow) for g in ("attn_out", "mlp_down"))
        bwd = sum(pipelined_overlap_s(ag, gemm.get(f"{g}_dgrad", 0.0), n, slow) for g in ("attn_out", "mlp_down")) + \
            sum(_overlapped_s(rs, gemm.get(f"{g}_wgrad", 0.0), slow) + _overlapped_s(ag, gemm.get(f"{g}_dgrad", 0.0), slow)
                for g in ("qkv", "mlp_up"))
        return fwd, bwd + (fwd if full else 0.0)
    if not sp:
        fwd = 2 * ar
        if overlap:
            bwd = sum(_overlapped_s(ar, gemm.get(f"{g}_wgrad", 0.0), slow) for g in ("qkv", "mlp_up"))
        else:
            bwd = 2 * ar
    else:
        fwd = 2 * (ag + rs)
        # The re-gather of QKV's and MLP-up's s/t input for their weight gradients
        # (runtime.sp_regather_input), beside the input-gradient GEMM when overlapped.
        regather = profile.runtime.sp_regather_input
        if overlap:
            bwd = 2 * ag + sum(_overlapped_s(rs, gemm.get(f"{g}_wgrad", 0.0), slow)
                               + (_overlapped_s(ag, gemm.get(f"{g}_dgrad", 0.0), slow) if regather else 0.0)
                               for g in ("qkv", "mlp_up"))
        else:
            bwd = 2 * (ag + rs + (ag if regather else 0.0))
    return fwd, bwd + (fwd if full else 0.0)


def tp_ends_comm_s(cluster: Cluster, profile: Profile, ranks: list[int], act_bytes: float, sp: bool,
                   first: bool, last: bool, tokens: int) -> tuple[float, float]:
    """Tensor-parallel collectives at the ends of the layer stack, one microbatch of
    ``tokens`` tokens, (forward, backward), on the critical path. The token embedding and
    the logits are split along the vocabulary (Megatron-Core tensor_parallel/layers.py
    VocabParallelEmbedding, cross_entropy.py VocabParallelCrossEntropy; costmodel/flops.py
    counts their compute so; validate/tp.py runs them so):
    - first stage: the word embedding's all-reduce forward (Megatron reduces it before
      adding learned positions); with SP the split along the sequence after it all-gathers
      the gradient backward;
    - last stage: the logits GEMM is column-parallel: without SP an all-reduce of its input
      gradient backward, with SP an all-gather of its input forward and a reduce-scatter
      backward; the loss adds two all-reduces of per-token fp32 scalars forward (the
      maximum logit, then the target logit and the sum of exponentials together)."""
    if len(ranks) == 1:
        return 0.0, 0.0
    ar, ag, rs = _tp_group_s(cluster, profile, ranks, act_bytes)
    fwd = bwd = 0.0
    if first:
        fwd += ar
        bwd += ag if sp else 0.0
    if last:
        fwd += ag if sp else 0.0
        bwd += rs if sp else ar
        fwd += group_allreduce_s(cluster, profile, ranks, tokens * 4) + group_allreduce_s(cluster, profile, ranks, 2 * tokens * 4)
    return fwd, bwd


def group_kind(cluster: Cluster, ranks: list[int]) -> str:
    """The fabric class a group's collective runs over: the node's own fabric when every
    rank is on one node, else the inter-node network."""
    nodes = {cluster.node_of(r) for r in ranks}
    return cluster.nodes[next(iter(nodes))].intra_kind if len(nodes) == 1 else "network"


def call_latency_s(cluster: Cluster, profile: Profile, ranks: list[int], op: str | None = None) -> float:
    """Software cost of one call of collective ``op`` over ``ranks`` (the group's fabric's
    FabricEfficiency.call_s: the op's own call cost when the profile has one)."""
    return profile.fabric(group_kind(cluster, ranks)).call_s(op, len(ranks))


def group_link(cluster: Cluster, ranks: list[int], profile: Profile) -> tuple[float, float, str]:
    """(bottleneck bytes/s, worst per-hop latency s, fabric kind) of a ring over `ranks`;
    within a node, the profile's fitted hop latency of its fabric when it has one."""
    kind = group_kind(cluster, ranks)
    if kind != "network":
        node = cluster.nodes[cluster.node_of(ranks[0])]
        return node.intra_bw_Bps, profile.fabric(kind).hop_latency_s(node.intra_latency_s), kind
    bw, lat = math.inf, 0.0
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        path = cluster.route(a, b)
        bw = min(bw, cluster.path_bw_Bps(path))
        lat = max(lat, cluster.path_latency_s(path))
    return bw, lat, kind
