"""Build the Program the engine runs: schedule action lists per pipeline rank plus, per
model chunk, the durations, bytes and memory that costmodel gives for them.

Symmetry: TP peers are identical, so one device (TP index 0) stands for its TP group;
data-parallel replicas whose stages sit on the same GPU types and that get the same
number of microbatches are identical too, so one pipeline is simulated per such
class. Only heterogeneity (GPU types, microbatch shares) adds simulated pipelines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from costmodel import collectives as cc
from costmodel import flops as fl
from costmodel import memory as mem
from costmodel.device_memory import ChunkSpec, MemoryConfig, chunk_activation_bytes, cp_local, device_memory
from costmodel.dtypes import fp8_weight_bytes, grad_reduce_bytes, param_gather_bytes, working_bytes
from costmodel.context_parallel import cp_layer_work, pieces_checkpointed
from costmodel.efficiency import ops_time_s, optimizer_time_s
from costmodel.flops import matmul_flops
from costmodel.errors import InputError
from costmodel.profile import Profile, RuntimeSettings, reshard_after_forward
from costmodel.shapes import ModelSpec
from specs.plan import Plan
from sim.schedules import Action, inflight_peaks, make_schedule, mean_alive
from sim.tp_comm import group_allreduce_s, group_link, tp_ends_comm_s, tp_layer_comm_s
from specs.topology import Cluster

# Gradient bucket size for overlapped reduction, bytes. PyTorch DDP's default
# bucket_cap_mb is 25 MB; we use that and never split finer than one layer.
BUCKET_BYTES = 25e6


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
    # Context parallelism (sim/context_parallel.py), for all layers of the chunk: the core
    # attention of one K/V block (fwd_s / bwd_s hold cp of them) and the bytes one rank
    # sends per exchange (ring: one K/V block forward, K/V + dK/dV backward; a2a: its
    # share of the Q/K/V and output all-to-alls).
    cp_fwd_block_s: float = 0.0
    cp_bwd_block_s: float = 0.0
    cp_fwd_bytes: float = 0.0
    cp_bwd_bytes: float = 0.0
    # Of ``params``, those outside the chunk's layers (embedding, final norm, output layer):
    # ZeRO-3/FSDP gathers them as a unit of their own (sim/pipeline_executor._LayerGathers).
    outer_params: float = 0.0


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
    # Seconds of the tied word embedding's gradient all-reduce between the first and the
    # last stage after backward (embedding_grad_sync_s); 0 without pipeline parallelism.
    embedding_sync_s: float = 0.0


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
    # ZeRO-1/2's all-gather of the updated weights runs bucket by bucket beside the next
    # step's first forward (Megatron-Core --overlap-param-gather), not after the optimizer.
    overlap_param_gather: bool = False
    # The sender's bytes leave only once the receiver posted its receive (gloo's TCP
    # transport; runtime.p2p_rendezvous).
    p2p_rendezvous: bool = False

    @property
    def p(self) -> int:
        return self.plan.pp

    @property
    def v(self) -> int:
        return self.plan.vpp


def overlapped_gather_exposed_s(bucket_s: float, buckets: int, forward_s: float) -> float:
    """Exposed time of Megatron-Core's overlapped parameter gather (--overlap-param-gather):
    bucket 0's all-gather before the first forward, bucket j+1's beside the forward of
    bucket j's layers (forward_s / buckets each): bucket_s + (buckets-1) max(0, bucket_s -
    forward_s/buckets). The engine simulates it (sim/pipeline_executor._forward_gathering);
    the search's estimate uses this closed form."""
    if buckets <= 0:
        return 0.0
    return bucket_s + (buckets - 1) * max(0.0, bucket_s - forward_s / buckets)


def n_buckets(total_bytes: float, layers: int) -> int:
    """Gradient buckets of a chunk: BUCKET_BYTES each, never finer than one layer."""
    if total_bytes <= 0:
        return 0
    return max(1, min(layers, math.ceil(total_bytes / BUCKET_BYTES)))


def _buckets(total_bytes: float, layers: int) -> tuple[float, ...]:
    k = n_buckets(total_bytes, layers)
    return (total_bytes / k,) * k if k else ()


def fsdp_units(model: ModelSpec, layers: int, tp: int, first: bool, last: bool) -> tuple[list[float], float]:
    """ZeRO-3/FSDP units of a chunk of ``layers`` layers, as the runner wraps them
    (validate/fsdp.py: one unit per layer, one for the weights outside the layers when the
    chunk holds any): ([parameters of each layer unit], parameters of the outer unit, 0 when
    none). What chunk_work charges RuntimeSettings.fsdp_unit_s for and what calibration
    divides its measured FSDP cost by (validate/host_draws.fsdp_unit_costs)."""
    layer = mem.stage_params(model, 1, tp, False, False)
    return [layer] * layers, mem.stage_params(model, layers, tp, first, last) - layers * layer


def chunk_work(model: ModelSpec, plan: Plan, cluster: Cluster, profile: Profile,
               rank: int, layers: int, first: bool, last: bool) -> ChunkWork:
    """Durations, FLOPs, bytes and memory of one chunk on device `rank` (per microbatch)."""
    gpu = cluster.devices[rank].gpu
    eff = profile.gpu(gpu.name)
    rt = profile.runtime
    prec = plan.precision
    b, tp, sp = plan.mbs, plan.tp, plan.sp
    width = working_bytes(prec)  # activations stay 16-bit under fp8 GEMMs (costmodel/dtypes.py)

    def secs(ops):
        return ops_time_s(ops, gpu, eff, prec, rt)

    cp = plan.cp
    local = cp_local(model, cp)  # per-token work of this rank's seq/cp tokens
    f_ops = fl.layer_forward_ops(local, b, tp, sp, width)
    b_ops = fl.layer_backward_ops(local, b, tp, sp, width)
    r_ops = fl.recompute_ops(local, b, tp, sp, plan.recompute, width)
    cpw = (cp_layer_work(local, b, tp, cp, plan.cp_comm, prec, gpu, eff, rt, f_ops, b_ops + r_ops, plan.recompute)
           if cp > 1 else None)
    # ZeRO-3/FSDP's host work each time a unit is taken into use, forward and backward
    # (RuntimeSettings.fsdp_unit_s): one unit per layer, one for the weights outside them.
    gather_b = param_gather_bytes(prec, rt)
    layer_units, outer = fsdp_units(model, layers, tp, first, last)
    unit_s = rt.fsdp_unit_s(layer_units[0] * gather_b) if plan.zero == 3 and layer_units else 0.0
    # The runner's host time per microbatch of this chunk beyond its ops (calling the chunk,
    # autograd's backward call; RuntimeSettings.microbatch_host_us), half each way, on the
    # host side of the chunk's first layer: hidden, as any host time, under asynchronous
    # kernels that take longer (costmodel/efficiency.ops_time_s).
    mb_s = rt.microbatch_host_s() / 2

    def with_microbatch(ops, extra_s: float) -> float:
        """What mb_s adds to one layer of ``ops`` on the host side (all of it with no layers)."""
        if not mb_s:
            return 0.0
        if not layers:
            return mb_s
        return ops_time_s(ops, gpu, eff, prec, rt, extra_s + mb_s) - ops_time_s(ops, gpu, eff, prec, rt, extra_s)
    fwd_s = layers * ops_time_s(f_ops, gpu, eff, prec, rt, unit_s) + with_microbatch(f_ops, unit_s)
    # Backward re-runs each layer's checkpointed part first (r_ops), one region a layer.
    # (with context parallelism's pieces checkpointed one by one, cp_layer_work holds their regions)
    region_s = 0.0 if cp > 1 and pieces_checkpointed(rt, plan.cp_comm, plan.recompute) else \
        rt.checkpoint_region_s(plan.recompute)
    r_s = ops_time_s(r_ops, gpu, eff, prec, rt, region_s) if r_ops else 0.0
    b_acc = b_ops + grad_accumulation_ops(model, 1, tp, False, False, prec, rt)
    bwd_s = layers * (ops_time_s(b_acc, gpu, eff, prec, rt, unit_s) + r_s) + with_microbatch(b_acc, unit_s)
    fwd_fl = layers * matmul_flops(f_ops)
    bwd_fl = layers * (matmul_flops(b_ops) + matmul_flops(r_ops))
    if cpw is not None:  # cp K/V blocks of attention instead of the one the local ops hold
        fwd_s += layers * ((cp * cpw.fwd_block_s) - cpw.fwd_local_s)
        bwd_s += layers * ((cp * cpw.bwd_block_s) - cpw.bwd_local_s)
        fwd_fl += layers * (cp - 1) * cpw.fwd_block_flops
        bwd_fl += layers * (cp - 1) * cpw.bwd_block_flops
    extra_acc = grad_accumulation_ops(model, 0, tp, first, last, prec, rt)
    if first:
        fwd_s += secs(fl.embedding_ops(local, b, tp, width, sp=sp))
        bwd_s += secs(fl.embedding_backward_ops(local, b, tp, width, sp=sp) + ([] if last else extra_acc))
    if last:
        hf = fl.head_forward_ops(local, b, tp, width, sp=sp)
        hb = fl.head_backward_ops(local, b, tp, width, sp=sp) + extra_acc
        fwd_s += secs(hf)
        bwd_s += secs(hb)
        fwd_fl += matmul_flops(hf)
        bwd_fl += matmul_flops(hb)

    ranks = plan.tp_group(*_coords(plan, rank))
    act = b * local.seq_length * model.hidden_size * width
    tp_fwd1, tp_bwd1 = tp_layer_comm_s(cluster, profile, ranks, act, sp, plan.recompute, b_ops, gpu, eff, prec,
                                       f_ops=f_ops)
    ends_fwd, ends_bwd = tp_ends_comm_s(cluster, profile, ranks, act, sp, first, last, b * local.seq_length)
    fwd_tp, bwd_tp = layers * tp_fwd1 + ends_fwd, layers * tp_bwd1 + ends_bwd

    params = mem.stage_params(model, layers, tp, first, last)
    if plan.zero == 3 and outer > 0:  # the outer unit: in use for the whole forward, again for the backward
        outer_s = rt.fsdp_unit_s(outer * gather_b)  # host time with no ops of its own to hide behind
        fwd_s += outer_s
        bwd_s += outer_s
    # The model's stage as measured over as priced (RuntimeSettings.forward_scale: 1 unless
    # a CPU calibration timed it), context-parallel blocks alike.
    fs, bs = rt.forward_scale, rt.backward_scale
    fwd_s, bwd_s = fwd_s * fs, bwd_s * bs
    if cpw is not None:
        cpw = cpw._replace(fwd_block_s=cpw.fwd_block_s * fs, bwd_block_s=cpw.bwd_block_s * bs)
    grad_bytes = params * grad_reduce_bytes(prec, rt) if plan.grad_degree > 1 else 0.0
    # Pipeline p2p: with scatter/gather (Megatron-LM's default; DeepSpeed's pipeline engine
    # partitions its boundary tensors the same way) each TP rank sends its b*s*h/t slice and
    # the receivers all-gather it over the node's fabric; without it every TP rank sends b*s*h.
    p2p = act / tp if rt.p2p_scatter_gather else act
    return ChunkWork(
        layers=layers, first=first, last=last, fwd_s=fwd_s, bwd_s=bwd_s,
        fwd_tp_s=fwd_tp, bwd_tp_s=bwd_tp, fwd_flops=fwd_fl, bwd_flops=bwd_fl,
        p2p_bytes=p2p, params=params, grad_buckets=_buckets(grad_bytes, layers),
        outer_params=outer,
        **({} if cpw is None else dict(
            cp_fwd_block_s=layers * cpw.fwd_block_s, cp_bwd_block_s=layers * cpw.bwd_block_s,
            cp_fwd_bytes=layers * cpw.fwd_bytes, cp_bwd_bytes=layers * cpw.bwd_bytes)),
    )


def embedding_grad_sync_s(model: ModelSpec, plan: Plan, cluster: Cluster, profile: Profile, d: int) -> float:
    """The tied word embedding's gradient all-reduce of replica ``d`` with pp > 1.

    The model ties the output layer to the word embedding (costmodel/shapes.ModelSpec
    counts one matrix; Megatron ties by default, --untie-embeddings-and-output-weights
    opts out). With pp > 1 the first stage (embedding) and the last stage (output layer)
    each hold a copy; after backward Megatron all-reduces the two copies' gradients over
    the embedding group, first and last stage of each replica and TP rank, so both apply
    the same update (megatron/core/distributed/finalize_model_grads.py,
    _allreduce_embedding_grads). V*h/t elements in the gradient-reduction dtype, one
    2-rank all-reduce on the critical path of both stages (analytic, as TP collectives).
    An untied output layer (model.tie_embeddings false) has nothing to keep in step."""
    if plan.pp == 1 or not model.tie_embeddings:
        return 0.0
    ranks = [plan.rank(d, 0, 0), plan.rank(d, plan.pp - 1, 0)]
    nbytes = model.vocab_size * model.hidden_size / plan.tp * grad_reduce_bytes(plan.precision, profile.runtime)
    return group_allreduce_s(cluster, profile, ranks, nbytes)


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
    new = working_bytes(precision)
    return [fl.Op("grad_accumulate", "memory", params, params * (2 * acc + new))]


def _coords(plan: Plan, rank: int) -> tuple[int, int]:
    """(dp_index, stage) of a device rank under the plan's placement."""
    q = rank // (plan.tp * plan.cp)
    if plan.placement == "tp-pp-dp":
        return q // plan.pp, q % plan.pp
    return q % plan.dp, q // plan.dp


def schedule_inflight(schedule: str, p: int, m: int, v: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per pipeline rank, the per-chunk in-flight counts at the moments its activations
    can peak (sim/schedules.inflight_peaks over the rank's action list).

    1F1B and interleaved hold the same moments for every m >= 3p: forward k is chunk
    (k // p) % v and backward k chunk v-1-(k // p) % v, both periodic in k with period p*v,
    so in the steady state (forward k + W beside backward k, W < (v+1)p warm-up forwards)
    the counts depend on k mod p*v only; 3p microbatches give 3pv >= W + pv actions, a
    warm-up and at least one whole period. Walking 3p instead of m keeps the search fast
    (tests/test_memory_model.py checks the equality). GPipe holds all m: no shortcut."""
    if schedule != "gpipe":
        m = min(m, 3 * p)
    return _schedule_inflight(schedule, p, m, v)


@lru_cache(maxsize=1024)
def _schedule_inflight(schedule: str, p: int, m: int, v: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    return tuple(inflight_peaks(acts, v) for acts in make_schedule(schedule, p, m, v))


def memory_config(plan: Plan, runtime: RuntimeSettings) -> MemoryConfig:
    """The plan and framework settings device memory depends on."""
    return MemoryConfig(tp=plan.tp, sp=plan.sp, mbs=plan.mbs, recompute=plan.recompute,
                        precision=plan.precision, dp=plan.grad_degree, zero=plan.zero,  # ZeRO shards over dp*cp
                        grad_bytes=grad_reduce_bytes(plan.precision, runtime),
                        topk=plan.topk_fraction is not None, flash_attention=runtime.flash_attention,
                        fp8_weight_bytes=fp8_weight_bytes(plan.precision, runtime),
                        cp=plan.cp, zero3_keep_gathered=not reshard_after_forward(runtime, plan.pp),
                        sp_saves_gathered=plan.sp and not runtime.sp_regather_input, dropout=runtime.dropout)


def stage_chunks(plan: Plan, stage: int) -> tuple[ChunkSpec, ...]:
    """The model chunks pipeline rank ``stage`` holds: chunk c is virtual stage c*p + stage."""
    last = plan.pp * plan.vpp - 1
    return tuple(ChunkSpec(n, c * plan.pp + stage == 0, c * plan.pp + stage == last)
                 for c, n in enumerate(plan.chunk_layers(stage)))


def stage_memory(model: ModelSpec, plan: Plan, runtime: RuntimeSettings, stage: int, m: int) -> dict[str, float]:
    """Peak bytes by kind on a device of pipeline rank ``stage`` of a replica that runs
    ``m`` microbatches: costmodel.device_memory on this plan's chunks and schedule. The
    program and the search's memory prune call this; the heterogeneous balancer calls
    device_memory on the same memory_config, stage_chunks flags and schedule_inflight."""
    inflight = schedule_inflight(plan.schedule, plan.pp, m, plan.vpp)[stage]
    return device_memory(model, memory_config(plan, runtime), stage_chunks(plan, stage), inflight)


def stage_alive_factor(model: ModelSpec, plan: Plan, runtime: RuntimeSettings, actions: list[Action],
                       stage: int) -> float:
    """How much slower pipeline rank ``stage`` computes for the activations it holds
    through its action list (RuntimeSettings.alive_factor of sim/schedules.mean_alive, each
    chunk's bytes a microbatch as device memory counts them); 1 when the runtime has no
    such figure."""
    if runtime.alive_slowdown_per_doubling <= 0:
        return 1.0
    cfg = memory_config(plan, runtime)
    per_mb = [chunk_activation_bytes(model, cfg, spec) for spec in stage_chunks(plan, stage)]
    return runtime.alive_factor(mean_alive(actions, per_mb))


def _slowed_compute(w: ChunkWork, factor: float) -> ChunkWork:
    """``w`` with its compute (context-parallel attention blocks included) ``factor`` times longer."""
    return replace(w, fwd_s=w.fwd_s * factor, bwd_s=w.bwd_s * factor,
                   cp_fwd_block_s=w.cp_fwd_block_s * factor, cp_bwd_block_s=w.cp_bwd_block_s * factor)


def _raise_uneven_span(plan: Plan, cluster: Cluster, d: int, s: int, first: int, last: int) -> None:
    gpn = min(len(node.ranks) for node in cluster.nodes)
    raise InputError("--plan", "tp", f"tp={plan.tp}: TP group of replica {d}, stage {s} "
                     f"(ranks {first}-{last}) crosses a node boundary while others "
                     f"do not; use a tp that divides the {gpn} GPUs per node, or a multiple of it")


def build_program(model: ModelSpec, plan: Plan, cluster: Cluster, profile: Profile) -> Program:
    if plan.num_devices != cluster.num_devices:
        raise InputError("--plan", "dp", f"plan covers {plan.num_devices} devices, cluster has {cluster.num_devices}")
    p, v = plan.pp, plan.vpp
    # TP groups must be one GPU type: a TP group runs in lock step. And every TP group must
    # span the same number of nodes: the program costs one representative group per stage
    # (TP index 0), so a plan whose groups straddle node boundaries unevenly (tp=3 on 8-GPU
    # nodes: ranks 6-8 cross from node 0 to node 1) would be reported faster than it runs.
    spans = set()
    # One GPU type in the whole cluster: no group can mix types (the checks below would
    # pass for every one of the dp x pp groups; 2,048 at 16k GPUs).
    one_type = len({dv.gpu.name for dv in cluster.devices}) == 1
    # TP peers are consecutive ranks (Plan.rank_strides), and nodes hold consecutive
    # ranks in order, so a group spans node_of(last) - node_of(first) + 1 nodes.
    consecutive = plan.rank_strides()[2] == 1
    for d in range(plan.dp):
        for s in range(p):
            if one_type and consecutive:
                first = plan.rank(d, s, 0)
                last = first + plan.tp - 1
                spans.add(cluster.node_of(last) - cluster.node_of(first) + 1)
                if len(spans) > 1:
                    _raise_uneven_span(plan, cluster, d, s, first, last)
                continue
            group = plan.tp_group(d, s)
            names = {cluster.devices[r].gpu.name for r in group}
            if len(names) > 1:
                raise InputError("--plan", "tp", f"TP group of replica {d}, stage {s} mixes GPU types "
                                 f"{sorted(names)}; choose tp and placement so each TP group is one type")
            if plan.cp > 1 and len({cluster.devices[r].gpu.name for r in plan.cp_group(d, s, 0)}) > 1:
                # One simulated device stands for its CP group: the ring runs in lock step.
                raise InputError("--plan", "cp", f"CP group of replica {d}, stage {s} mixes GPU types; "
                                 "choose cp and placement so each CP group is one type")
            spans.add(len({cluster.node_of(r) for r in group}))
            if len(spans) > 1:
                _raise_uneven_span(plan, cluster, d, s, group[0], group[-1])
    pipelines = []
    cache: dict[tuple, ChunkWork] = {}
    for gpus, m, members in replica_classes(plan, cluster):
        d0 = members[0]
        ranks = tuple(plan.rank(d0, s, 0) for s in range(p))
        actions = make_schedule(plan.schedule, p, m, v)
        chunks: dict[tuple[int, int], ChunkWork] = {}
        opt, memory = [], []
        for s in range(p):
            gpu = cluster.devices[ranks[s]].gpu
            for c, spec in enumerate(stage_chunks(plan, s)):
                key = (gpu.name, spec.layers, spec.first, spec.last)
                if key not in cache:
                    cache[key] = chunk_work(model, plan, cluster, profile, ranks[s], *key[1:])
                chunks[(s, c)] = cache[key]
            slow = stage_alive_factor(model, plan, profile.runtime, actions[s], s)
            if slow != 1.0:
                for c in range(v):
                    chunks[(s, c)] = _slowed_compute(chunks[(s, c)], slow)
            params = sum(chunks[(s, c)].params for c in range(v))
            opt_params = params / plan.grad_degree if plan.zero >= 1 else params
            opt.append(optimizer_time_s(opt_params, gpu, profile.gpu(gpu.name), plan.precision, profile.runtime))
            memory.append(stage_memory(model, plan, profile.runtime, s, m))
        name = "+".join(sorted(set(gpus))) + f" x{m}mb"
        pipelines.append(PipelineProgram(name, members, ranks, m, actions, chunks, tuple(opt), tuple(memory),
                                         embedding_grad_sync_s(model, plan, cluster, profile, d0)))

    algos = tuple(choose_allreduce(plan, cluster, profile, s, _first_bucket(pipelines[0], s, v)) for s in range(p))
    rt = profile.runtime
    return Program(model, plan, cluster, profile, pipelines, algos,
                   p2p_blocking=rt.p2p_blocking, zero_grad_all_reduce=rt.zero1_grad_all_reduce,
                   # the plan's cross-step overlap (overlap_step, sim/multistep_executor.py)
                   # replaces Megatron-Core's within-step version: both move the same gather
                   overlap_param_gather=rt.overlap_param_gather and plan.zero in (1, 2) and plan.grad_degree > 1
                   and plan.overlap_step == "none",
                   p2p_rendezvous=rt.p2p_rendezvous)


class ReplicaClass(NamedTuple):
    """Data-parallel replicas that run identically: same GPU type per stage, same
    number of microbatches. One pipeline is simulated (and costed) per class."""

    gpus: tuple[str, ...]  # GPU type of each pipeline stage
    microbatches: int
    members: tuple[int, ...]  # DP indices


def replica_classes(plan: Plan, cluster: Cluster) -> list[ReplicaClass]:
    """The plan's replicas grouped into classes, in order of their first member."""
    classes: dict[tuple, list[int]] = {}
    for d in range(plan.dp):
        sig = (tuple(cluster.devices[plan.rank(d, s, 0)].gpu.name for s in range(plan.pp)), plan.mb_shares[d])
        classes.setdefault(sig, []).append(d)
    return [ReplicaClass(gpus, m, tuple(members)) for (gpus, m), members in classes.items()]


def _first_bucket(pipe: PipelineProgram, stage: int, v: int) -> float:
    buckets = [b for c in range(v) for b in pipe.chunks[(stage, c)].grad_buckets]
    return buckets[0] if buckets else 0.0


def choose_allreduce(plan: Plan, cluster: Cluster, profile: Profile, stage: int, bucket_bytes: float) -> str:
    """The all-reduce algorithm of ``stage``'s DP reduction: the plan's, or for
    allreduce=auto the cheapest for one bucket of ``bucket_bytes`` by the analytic formulas
    on this DP group's links (hierarchical only where every node holds as many of the
    group's ranks). The program and the search both resolve through here."""
    group = plan.grad_group(stage, 0)
    per_node: dict[int, int] = {}
    for r in group:
        per_node[cluster.node_of(r)] = per_node.get(cluster.node_of(r), 0) + 1
    even = len(set(per_node.values())) == 1
    if plan.allreduce == "hierarchical" and not even:
        raise InputError("--plan", "allreduce", f"hierarchical needs the same number of DP ranks on every "
                         f"node; stage {stage} has {sorted(set(per_node.values()))} per node (use ring, tree or auto)")
    if plan.allreduce != "auto" or plan.grad_degree == 1:
        return plan.allreduce if plan.allreduce != "auto" else "ring"
    bw, lat, kind = group_link(cluster, group, profile)
    fab = profile.fabric(kind)
    nodes = sorted(per_node)
    local = len(group) // len(nodes)
    n_node = cluster.nodes[nodes[0]]
    costs = {
        "ring": cc.ring_allreduce_s(bucket_bytes, len(group), bw * fab.bw_eff, lat),
        "tree": cc.tree_allreduce_s(bucket_bytes, len(group), bw * fab.bw_eff, lat),
    }
    if local > 1 and len(nodes) > 1 and even:
        ifab = profile.fabric(n_node.intra_kind)
        costs["hierarchical"] = cc.hierarchical_allreduce_s(
            bucket_bytes, local, len(nodes), n_node.intra_bw_Bps * ifab.bw_eff, ifab.hop_latency_s(n_node.intra_latency_s),
            bw * fab.bw_eff, lat)
    return min(sorted(costs), key=lambda k: costs[k])
