"""Build the Program the engine runs: schedule action lists per pipeline rank plus, per
model chunk, the durations, bytes and memory that costmodel gives for them.

Symmetry: TP peers are identical, so one device (TP index 0) stands for its TP group;
data-parallel replicas whose stages sit on the same GPU types and that get the same
number of microbatches are identical too, so one pipeline is simulated per such
class. Only heterogeneity (GPU types, microbatch shares) adds simulated pipelines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from costmodel import collectives as cc
from costmodel import flops as fl
from costmodel import memory as mem
from costmodel.efficiency import op_time_s, ops_time_s, optimizer_time_s
from costmodel.flops import matmul_flops
from costmodel.errors import InputError
from costmodel.profile import Profile, RuntimeSettings
from costmodel.shapes import ModelSpec
from specs.plan import Plan
from sim.schedules import Action, make_schedule
from specs.topology import Cluster

BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
# Gradients are accumulated and reduced in fp32 for bf16 training (Megatron-LM's
# default accumulate_allreduce_grads_in_fp32 for bf16; DeepSpeed's bf16 optimizer
# likewise); fp16 training reduces fp16 gradients. A profile's runtime.grad_reduce_dtype
# overrides this (grad_reduce_bytes).
GRAD_REDUCE_BYTES = {"bf16": 4, "fp16": 2, "fp8": 4, "fp32": 4}
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def grad_reduce_bytes(precision: str, runtime: RuntimeSettings) -> int:
    """Bytes per gradient element in the data-parallel reduction."""
    if runtime.grad_reduce_dtype == "auto":
        return GRAD_REDUCE_BYTES[precision]
    return _DTYPE_BYTES[runtime.grad_reduce_dtype]


# Gradient bucket size for overlapped reduction, bytes. PyTorch DDP's default
# bucket_cap_mb is 25 MB; we use that and never split finer than one layer.
BUCKET_BYTES = 25e6
# Top-k payload per kept entry: int32 index + 16-bit value.
TOPK_ENTRY_BYTES = 6.0


@dataclass(frozen=True)
class ChunkWork:
    """One model chunk (virtual pipeline stage) on one simulated device, per microbatch."""

    layers: int
    first: bool  # holds the embedding
    last: bool  # holds the output layer and loss
    fwd_s: float  # compute
    bwd_s: float  # compute, recompute included
    fwd_tp_s: float  # tensor-parallel collectives on the critical path
    bwd_tp_s: float
    fwd_flops: float  # matmul FLOPs on this device (model FLOPs)
    bwd_flops: float  # matmul FLOPs, recompute included (hardware FLOPs)
    p2p_bytes: float  # activation (and its gradient) sent to the neighbour stage, per device
    params: float  # parameters held by this device for this chunk
    grad_buckets: tuple[float, ...]  # bytes to reduce, in the order backward produces them
    act_bytes: float  # activation memory kept per in-flight microbatch


@dataclass
class PipelineProgram:
    """One simulated data-parallel replica (it stands for `dp_indices`)."""

    name: str
    dp_indices: tuple[int, ...]
    ranks: tuple[int, ...]  # representative device (TP index 0) of each pipeline stage
    microbatches: int
    actions: list[list[Action]]
    chunks: dict[tuple[int, int], ChunkWork]  # (stage, chunk) -> work
    optimizer_s: tuple[float, ...]  # per stage
    memory: tuple[dict, ...]  # per stage: bytes by kind


@dataclass
class Program:
    model: ModelSpec
    plan: Plan
    cluster: Cluster
    profile: Profile
    pipelines: list[PipelineProgram]
    dp_algorithm: tuple[str, ...] = ()  # per stage (auto resolved)
    notes: list[str] = field(default_factory=list)
    # Framework behaviour the engine needs (from profile.runtime): the sender of a pipeline
    # transfer waits for it to finish; ZeRO-1/2 all-reduce the gradients instead of
    # reduce-scattering them (DeepSpeed's bf16 optimizer).
    p2p_blocking: bool = False
    zero_grad_all_reduce: bool = False

    @property
    def p(self) -> int:
        return self.plan.pp

    @property
    def v(self) -> int:
        return self.plan.vpp


def _tp_call_s(cluster: Cluster, profile: Profile, ranks: list[int], nbytes: float) -> float:
    """One ring all-reduce of `nbytes` over the TP group (analytic: TP collectives are
    short, frequent and on the critical path, so they are costed with the alpha-beta
    formula on the group's bottleneck link instead of as flows), plus the call's cost."""
    n = len(ranks)
    if n == 1:
        return 0.0
    bw, lat, kind = group_link(cluster, ranks, profile)
    fab = profile.fabric(kind)
    return cc.ring_allreduce_s(nbytes, n, bw * fab.bw_eff, lat) + fab.call_latency_us * 1e-6


def _tp_comm_s(cluster: Cluster, profile: Profile, ranks: list[int], nbytes: float, calls: int) -> float:
    """Time of `calls` all-reduces of `nbytes` over the TP group."""
    return calls * _tp_call_s(cluster, profile, ranks, nbytes) if calls else 0.0


def _overlapped_s(comm_s: float, compute_s: float, slowdown: float) -> float:
    """Exposed cost of a collective run beside a GEMM: what outlasts the GEMM, plus the
    GEMM's slowdown while both run (the collective's kernels take SMs and HBM bandwidth)."""
    return max(0.0, comm_s - compute_s) + slowdown * min(comm_s, compute_s)


def tp_layer_comm_s(cluster: Cluster, profile: Profile, ranks: list[int], act_bytes: float, sp: bool,
                    recompute: str, b_ops: list, gpu, eff, prec: str) -> tuple[float, float]:
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
    fabric's ``compute_slowdown`` of the GEMM while both run."""
    n = len(ranks)
    if n == 1:
        return 0.0, 0.0
    bw, lat, kind = group_link(cluster, ranks, profile)
    fab = profile.fabric(kind)
    bw_eff, call = bw * fab.bw_eff, fab.call_latency_us * 1e-6
    ar = cc.ring_allreduce_s(act_bytes, n, bw_eff, lat) + call
    ag = cc.allgather_s(act_bytes, n, bw_eff, lat) + call
    rs = cc.reduce_scatter_s(act_bytes, n, bw_eff, lat) + call
    full = recompute == "full"
    overlap = profile.runtime.tp_bwd_overlap
    gemm = {o.name: op_time_s(o, gpu, eff, prec) for o in b_ops
            if o.name in ("qkv_wgrad", "mlp_up_wgrad", "qkv_dgrad", "mlp_up_dgrad")}
    slow = fab.compute_slowdown
    if not sp:
        fwd = 2 * ar
        if overlap:
            bwd = sum(_overlapped_s(ar, gemm.get(f"{g}_wgrad", 0.0), slow) for g in ("qkv", "mlp_up"))
        else:
            bwd = 2 * ar
    else:
        fwd = 2 * (ag + rs)
        if overlap:
            bwd = 2 * ag + sum(_overlapped_s(rs, gemm.get(f"{g}_wgrad", 0.0), slow)
                               + _overlapped_s(ag, gemm.get(f"{g}_dgrad", 0.0), slow) for g in ("qkv", "mlp_up"))
        else:
            bwd = 2 * (ag + rs + ag)
    return fwd, bwd + (fwd if full else 0.0)


def group_link(cluster: Cluster, ranks: list[int], profile: Profile | None = None) -> tuple[float, float, str]:
    """(bottleneck bytes/s, worst per-hop latency s, fabric kind) of a ring over `ranks`;
    within a node, the profile's fitted hop latency of its fabric when it has one."""
    nodes = {cluster.node_of(r) for r in ranks}
    if len(nodes) == 1:
        node = cluster.nodes[next(iter(nodes))]
        lat = node.intra_latency_s if profile is None else profile.fabric(node.intra_kind).hop_latency_s(node.intra_latency_s)
        return node.intra_bw_Bps, lat, node.intra_kind
    bw, lat = math.inf, 0.0
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        path = cluster.route(a, b)
        bw = min(bw, cluster.path_bw_Bps(path))
        lat = max(lat, cluster.path_latency_s(path))
    return bw, lat, "network"


def _buckets(total_bytes: float, layers: int) -> tuple[float, ...]:
    if total_bytes <= 0:
        return ()
    k = max(1, min(layers, math.ceil(total_bytes / BUCKET_BYTES)))
    return (total_bytes / k,) * k


def chunk_work(model: ModelSpec, plan: Plan, cluster: Cluster, profile: Profile,
               rank: int, layers: int, first: bool, last: bool) -> ChunkWork:
    """Durations, FLOPs, bytes and memory of one chunk on device `rank` (per microbatch)."""
    gpu = cluster.devices[rank].gpu
    eff = profile.gpu(gpu.name)
    rt = profile.runtime
    prec = plan.precision
    b, tp, sp = plan.mbs, plan.tp, plan.sp
    width = BYTES[prec] if prec != "fp8" else 2  # activations stay 16-bit under fp8 GEMMs

    def secs(ops):
        return ops_time_s(ops, gpu, eff, prec, rt)

    f_ops = fl.layer_forward_ops(model, b, tp, sp, width)
    b_ops = fl.layer_backward_ops(model, b, tp, sp, width)
    r_ops = fl.recompute_ops(model, b, tp, sp, plan.recompute, width)
    fwd_s = layers * secs(f_ops)
    bwd_s = layers * (secs(b_ops + grad_accumulation_ops(model, 1, tp, False, False, prec, rt)) + secs(r_ops))
    fwd_fl = layers * matmul_flops(f_ops)
    bwd_fl = layers * (matmul_flops(b_ops) + matmul_flops(r_ops))
    extra_acc = grad_accumulation_ops(model, 0, tp, first, last, prec, rt)
    if first:
        fwd_s += secs(fl.embedding_ops(model, b, tp, width, sp=sp))
        bwd_s += secs(fl.embedding_backward_ops(model, b, tp, width, sp=sp) + ([] if last else extra_acc))
    if last:
        hf = fl.head_forward_ops(model, b, tp, width, sp=sp)
        hb = fl.head_backward_ops(model, b, tp, width, sp=sp) + extra_acc
        fwd_s += secs(hf)
        bwd_s += secs(hb)
        fwd_fl += matmul_flops(hf)
        bwd_fl += matmul_flops(hb)

    ranks = plan.tp_group(*_coords(plan, rank))
    act = b * model.seq_length * model.hidden_size * width
    tp_fwd1, tp_bwd1 = tp_layer_comm_s(cluster, profile, ranks, act, sp, plan.recompute, b_ops, gpu, eff, prec)
    fwd_tp, bwd_tp = layers * tp_fwd1, layers * tp_bwd1
    if last and tp > 1:
        # Cross-entropy over vocab-parallel logits: all-reduces of b*s floats (max, sum).
        small = b * model.seq_length * 4
        fwd_tp += _tp_comm_s(cluster, profile, ranks, small, 2)

    params = mem.stage_params(model, layers, tp, first, last)
    grad_bytes = params * grad_reduce_bytes(prec, rt) if plan.dp > 1 else 0.0
    act_bytes = layers * mem.activation_bytes_per_layer(model, b, tp, sp, plan.recompute)
    # Pipeline p2p: with scatter/gather (Megatron-LM's default; DeepSpeed's pipeline engine
    # partitions its boundary tensors the same way) each TP rank sends its b*s*h/t slice and
    # the receivers all-gather it over the node's fabric; without it every TP rank sends b*s*h.
    p2p = act / tp if rt.p2p_scatter_gather else act
    return ChunkWork(
        layers=layers, first=first, last=last, fwd_s=fwd_s, bwd_s=bwd_s,
        fwd_tp_s=fwd_tp, bwd_tp_s=bwd_tp, fwd_flops=fwd_fl, bwd_flops=bwd_fl,
        p2p_bytes=p2p, params=params, grad_buckets=_buckets(grad_bytes, layers), act_bytes=act_bytes,
    )


def grad_accumulation_ops(model: ModelSpec, layers: int, tp: int, first: bool, last: bool,
                          precision: str, runtime: RuntimeSettings) -> list[fl.Op]:
    """Accumulating one microbatch's weight gradients into the gradient buffer, when the
    framework does it as a separate pass (autograd's ``param.grad += g``): read the
    accumulator and the new gradient, write the accumulator, for every parameter this
    device holds (``layers`` layers, plus the embedding / output layer on the first / last
    stage). Megatron-LM's gradient-accumulation fusion (runtime.grad_accumulation_fusion)
    accumulates inside the weight-gradient GEMM instead: no extra pass."""
    if runtime.grad_accumulation_fusion:
        return []
    params = mem.stage_params(model, layers, tp, first, last)
    if params <= 0:
        return []
    acc = grad_reduce_bytes(precision, runtime)
    new = BYTES[precision] if precision != "fp8" else 2
    return [fl.Op("grad_accumulate", "memory", params, params * (2 * acc + new))]


def _coords(plan: Plan, rank: int) -> tuple[int, int]:
    """(dp_index, stage) of a device rank under the plan's placement."""
    q = rank // plan.tp
    if plan.placement == "tp-pp-dp":
        return q // plan.pp, q % plan.pp
    return q % plan.dp, q // plan.dp


def peak_activation_bytes(actions: list[Action], chunk_act: dict[int, float]) -> float:
    """Walk one rank's action list: F keeps a microbatch's activations, B frees them."""
    cur = peak = 0.0
    for a in actions:
        cur += chunk_act[a.chunk] if a.kind == "F" else -chunk_act[a.chunk]
        peak = max(peak, cur)
    return peak


def build_program(model: ModelSpec, plan: Plan, cluster: Cluster, profile: Profile) -> Program:
    if plan.num_devices != cluster.num_devices:
        raise InputError("--plan", "dp", f"plan covers {plan.num_devices} devices, cluster has {cluster.num_devices}")
    p, v = plan.pp, plan.vpp
    # TP groups must be one GPU type: a TP group runs in lock step.
    for d in range(plan.dp):
        for s in range(p):
            names = {cluster.devices[r].gpu.name for r in plan.tp_group(d, s)}
            if len(names) > 1:
                raise InputError("--plan", "tp", f"TP group of replica {d}, stage {s} mixes GPU types "
                                 f"{sorted(names)}; choose tp and placement so each TP group is one type")
    # Classes of identical DP replicas.
    classes: dict[tuple, list[int]] = {}
    for d in range(plan.dp):
        sig = (tuple(cluster.devices[plan.rank(d, s, 0)].gpu.name for s in range(p)), plan.mb_shares[d])
        classes.setdefault(sig, []).append(d)

    pipelines = []
    cache: dict[tuple, ChunkWork] = {}
    for (gpus, m), members in classes.items():
        d0 = members[0]
        ranks = tuple(plan.rank(d0, s, 0) for s in range(p))
        actions = make_schedule(plan.schedule, p, m, v)
        chunks: dict[tuple[int, int], ChunkWork] = {}
        opt, memory = [], []
        for s in range(p):
            gpu = cluster.devices[ranks[s]].gpu
            per_chunk = plan.chunk_layers(s)
            for c in range(v):
                vs = c * p + s
                key = (gpu.name, per_chunk[c], vs == 0, vs == p * v - 1)
                if key not in cache:
                    cache[key] = chunk_work(model, plan, cluster, profile, ranks[s], *key[1:])
                chunks[(s, c)] = cache[key]
            params = sum(chunks[(s, c)].params for c in range(v))
            # The gradient buffer has the dtype gradients are accumulated and reduced in.
            states = mem.model_state_bytes(params, plan.dp, plan.zero, plan.precision,
                                           grad_bytes=grad_reduce_bytes(plan.precision, profile.runtime))
            opt_params = params / plan.dp if plan.zero >= 1 else params
            opt.append(optimizer_time_s(opt_params, gpu, profile.gpu(gpu.name), plan.precision, profile.runtime))
            acts = peak_activation_bytes(actions[s], {c: chunks[(s, c)].act_bytes for c in range(v)})
            extra = mem.logits_bytes(model, plan.mbs, plan.tp) if chunks[(s, v - 1)].last or any(
                chunks[(s, c)].last for c in range(v)) else 0.0
            residual = mem.topk_residual_bytes(params) if plan.topk_fraction else 0.0
            memory.append({**states, "activations": acts, "logits": extra, "topk_residual": residual})
        name = "+".join(sorted(set(gpus))) + f" x{m}mb"
        pipelines.append(PipelineProgram(name, tuple(members), ranks, m, actions, chunks, tuple(opt), tuple(memory)))

    algos = tuple(_choose_allreduce(plan, cluster, profile, s, pipelines[0]) for s in range(p))
    rt = profile.runtime
    return Program(model, plan, cluster, profile, pipelines, algos,
                   p2p_blocking=rt.p2p_blocking, zero_grad_all_reduce=rt.zero1_grad_all_reduce)


def _choose_allreduce(plan: Plan, cluster: Cluster, profile: Profile, stage: int, pipe: PipelineProgram) -> str:
    """Resolve allreduce=auto per stage: the cheapest algorithm for one bucket by the
    analytic formulas on this DP group's links."""
    group = plan.dp_group(stage, 0)
    per_node: dict[int, int] = {}
    for r in group:
        per_node[cluster.node_of(r)] = per_node.get(cluster.node_of(r), 0) + 1
    even = len(set(per_node.values())) == 1
    if plan.allreduce == "hierarchical" and not even:
        raise InputError("--plan", "allreduce", f"hierarchical needs the same number of DP ranks on every "
                         f"node; stage {stage} has {sorted(set(per_node.values()))} per node (use ring, tree or auto)")
    if plan.allreduce != "auto" or plan.dp == 1:
        return plan.allreduce if plan.allreduce != "auto" else "ring"
    buckets = [b for c in range(plan.vpp) for b in pipe.chunks[(stage, c)].grad_buckets]
    size = buckets[0] if buckets else 0.0
    bw, lat, kind = group_link(cluster, group, profile)
    fab = profile.fabric(kind)
    nodes = sorted({cluster.node_of(r) for r in group})
    local = len(group) // len(nodes)
    n_node = cluster.nodes[nodes[0]]
    costs = {
        "ring": cc.ring_allreduce_s(size, len(group), bw * fab.bw_eff, lat),
        "tree": cc.tree_allreduce_s(size, len(group), bw * fab.bw_eff, lat),
    }
    if local > 1 and len(nodes) > 1 and even:
        ifab = profile.fabric(n_node.intra_kind)
        costs["hierarchical"] = cc.hierarchical_allreduce_s(
            size, local, len(nodes), n_node.intra_bw_Bps * ifab.bw_eff, ifab.hop_latency_s(n_node.intra_latency_s),
            bw * fab.bw_eff, lat)
    return min(sorted(costs), key=lambda k: costs[k])
