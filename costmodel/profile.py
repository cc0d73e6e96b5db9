"""Hardware profiles: the achievable-efficiency parameters of the cost model.

A profile is a YAML file a person can read and edit. ``gpus`` holds compute parameters per
GPU type (``default`` applies to types not listed), ``fabrics`` holds communication
parameters per link class (``nvswitch``, ``nvlink``, ``pcie``, ``loopback``, ``network``),
``runtime`` says how the training framework drives the hardware (launch mode, pipeline
transfers, fused kernels, gradient reduction). Every entry carries a ``source`` string
saying where its numbers came from (datasheet, published figure, or a fit with date and
device).

Bundled profiles live in ``costmodel/profiles/``: ``default.yaml`` (always the base), one
file per GPU type and cluster fabric (``a100-ib-hdr``, ``a100-opa``, ``h100-ib-ndr``) and the
runtime overlays of the named framework runtimes (``RUNTIMES``: ``runtime-megatron-core``,
``runtime-torchtitan``, ...; docs/runtimes.md), which hold only a ``runtime`` section.
``load_profile`` merges, key by key and in order: the default, the bundled names asked for,
the runtime's overlays, then the user's ``--profile`` file (a path or a bundled name).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Iterable

from costmodel.dtypes import GRAD_REDUCE_CHOICES
from costmodel.errors import InputError, allowed_names
from costmodel.gpus import GPU_CATALOG
from costmodel.limits import LATENCY_US_MAX, number_problem
from costmodel.yamlio import bundled_file, bundled_names, decode, load_yaml_mapping, not_a_file, parse_yaml


@dataclass(frozen=True)
class GpuEfficiency:
    """How close one GPU type gets to its datasheet peaks."""

    gemm_eff_max: float = 0.75  # fraction of dense peak a large, well-shaped GEMM reaches
    gemm_k_half: float = 64.0  # inner dimension at which a GEMM's k-loop efficiency halves: k/(k + k_half)
    sm_count: float = 0.0  # streaming multiprocessors; > 0 enables tile/wave quantisation of m and n
    gemm_dim_half: float = 64.0  # without sm_count: an m or n of this size halves efficiency, d/(d + half)
    attention_eff: float = 0.5  # fraction of peak of a fused (flash) attention kernel at long sequences
    # Fused attention's efficiency falls at short sequences and small heads (fewer, smaller
    # tiles per (batch, head)): attention_eff * s/(s + attention_seq_half) * d/(d + attention_head_dim_half)
    # (costmodel/efficiency.fused_attention_efficiency; docs/runtimes.md).
    attention_seq_half: float = 256.0
    attention_head_dim_half: float = 16.0
    # Fraction of the fp8 dense peak a large FP8 GEMM reaches (Transformer Engine's fp8
    # GEMMs), and its k-loop half point; 0 = unset: gemm_eff_max times FP8_EFF_RATIO and
    # gemm_k_half times FP8_K_HALF_RATIO (costmodel/efficiency.py).
    gemm_eff_max_fp8: float = 0.0
    gemm_k_half_fp8: float = 0.0
    hbm_eff: float = 0.8  # fraction of datasheet HBM bandwidth that memory-bound kernels reach
    # Fraction of the precision's dense peak that the arithmetic of element-wise ops (GELU's
    # erf or tanh, softmax's exp, layer norm's reductions: the FLOPs costmodel/flops.py counts
    # for each 'memory' op) reaches; such an op takes the longer of its traffic and its
    # arithmetic (costmodel/efficiency.op_time_s). 0 = unset: element-wise ops are bounded by
    # their traffic alone, as on GPUs, whose vector units outrun HBM by 1-2 orders of
    # magnitude. A CPU core's do not always: measured by plansim calibrate in 2 processes
    # (2026-12-05), GELU streamed 24 GB/s and an add 28 GB/s beyond the caches on a Xeon
    # host, but 3 GB/s and 12 GB/s on an EPYC one, so one bandwidth could not price both.
    vector_flops_eff: float = 0.0
    # A cache level: an op whose traffic (Op.bytes) is at most cache_mib MiB moves it at
    # cache_bw_eff of the datasheet bandwidth instead of hbm_eff. 0 = unset (one bandwidth,
    # as on GPUs, whose kernels stream from HBM). On a CPU the bandwidth falls by 3-10x
    # where an op's operands leave the caches (plansim calibrate, 2 processes, 2026-12-05:
    # an add streamed 123 GB/s over 0.8 MB and 28 GB/s over 5 MB on a Xeon host, 40 GB/s
    # over 3 MB and 12 GB/s over 10 MB on an EPYC one with 8 MiB of L3), and a plan's
    # parameter-sized ops (Adam, gradient accumulation) lie beyond where its activations
    # lie within (costmodel/efficiency.op_time_s).
    cache_bw_eff: float = 0.0
    cache_mib: float = 0.0
    kernel_overhead_us: float = 4.0  # GPU-side cost of every kernel (launch latency, ramp, tail), us
    # Top-k selection's compute per gradient element, ns, on top of its memory traffic
    # (costmodel/efficiency.topk_compress_time_s). 0 on GPUs, where the radix select is
    # memory bound; a CPU's selection (a partial sort, comparisons and branches) is not,
    # and plansim calibrate times it (validate/microbench.py).
    topk_select_ns_per_elem: float = 0.0
    # The selection's cost per kept entry, ns, beside the per-element one: gathering the k
    # kept values and indices and zeroing them in the residual (validate/topk.select) is
    # O(k) work next to the O(n) partial sort. On a CPU the time per element grows with the
    # kept fraction (plansim calibrate, 867k elements, 2026-11-30: 7.6 ns at 1 %, 9.2 ns at
    # 10 %); 0: selection independent of k (GPU radix select).
    topk_select_ns_per_kept: float = 0.0
    # Coefficient of variation of one selection's time from step to step and rank to rank
    # (its data changes with every step's gradients): the group waits for its slowest
    # member (costmodel/efficiency.topk_compress_time_s). 0 where selection time does not
    # depend on the data (GPU radix select); plansim calibrate measures it on a CPU.
    topk_select_cv: float = 0.0
    source: str = "built-in default"


# How plansim calibrate fits the element-wise ops (validate/calibrate.fit_memory): hbm_eff
# alone (the default, first), or with vector_flops_eff and the cache level too.
MEMORY_MODELS = ("bandwidth", "cache")

# Collectives with their own call cost in a fabric's parameters (FabricEfficiency.call_s).
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


@dataclass(frozen=True)
class FabricEfficiency:
    """Achievable share of a link class's line rate for collectives, and per-call cost."""

    bw_eff: float = 0.8  # achievable bus bandwidth / line rate
    call_latency_us: float = 10.0  # software cost of one collective call, microseconds
    compute_slowdown: float = 0.0  # share of compute speed lost while a collective overlaps it
    # Latency of one device-to-device message step of a collective on this link class, us.
    # Unset (None): the topology's latency_us. Set (plansim calibrate fits it): replaces the
    # topology's figure, because on a software transport (gloo over TCP loopback) each ring
    # step pays a send/receive handshake and a wake-up of the peer process that no link
    # datasheet states. Ring collectives pay it per step (2(n-1) for an all-reduce,
    # costmodel/collectives.py), so it is what makes a 4-rank collective dearer than a 2-rank one.
    hop_latency_us: float | None = None
    # Per-collective call cost, us, replacing call_latency_us for that collective when set
    # (None: call_latency_us). Software transports cost each collective differently beyond
    # its ring steps: gloo's small all-reduce cost about 1.2 ms per 4 KiB call on a 2-core
    # host where an all-gather of the same size took 0.17 ms (plansim calibrate, 2026-11-30).
    # plansim calibrate fits each from that collective's own calls issued after compute.
    all_reduce_call_us: float | None = None
    all_gather_call_us: float | None = None
    reduce_scatter_call_us: float | None = None
    send_recv_call_us: float | None = None
    # A rendezvous transport's pipeline receive of a message its sender posted earlier
    # (runtime.p2p_rendezvous: the bytes leave once the receive is posted, so the sender's
    # transport thread must answer): its whole cost to the receiver, us, while the sender
    # computes (busy) and while it is blocked or done (idle); each replaces send_recv's
    # call cost and the two message steps. None: those. Measured, not fitted
    # (validate/handoff_bench.posted_rows: a stream of such receives in pairs of ranks).
    # A computing sender's thread waits for a core: 0.92-1.12 ms against 0.22-0.27 ms for a
    # blocked sender, with 2 gloo processes on 2 cores; with 4 processes on 2 cores
    # 1.37-1.49 against 1.49-2.13 ms (a blocked sender's core goes to another process).
    # Means over 8 launches, four calibrations, 2026-11-30/12-01
    # (results/validate-cpu-2026-11-30/sender-state-6..8, results/validate-cpu-2026-12-01/final-4).
    send_recv_posted_busy_us: float | None = None
    send_recv_posted_idle_us: float | None = None
    # A pipeline handoff whose receive was posted before its send (validate/pp.py posts
    # every receive at the start of the step): from the sender computing to the receiver
    # computing again, as much as the handoff adds to a ping-pong of compute rounds between
    # two ranks, us; it replaces send_recv's call cost and the message step of a pipeline
    # send (the bytes still share the links). None: those. Measured, not fitted
    # (validate/handoff_bench.posted_rows, the pre-posted ping-pong).
    send_recv_preposted_us: float | None = None
    # The sender's own share of send_recv_preposted_us: its isend call, which with the
    # receive already posted writes the bytes from the calling thread (gloo/transport/tcp/
    # pair.cc), so the sender's compute stream is busy for it and the message arrives
    # send_recv_preposted_us after the call began, as in the ping-pong it was measured in.
    # Where the sender is the slower stage (GPipe's last stage in backward) this is what
    # the handoff adds to the step. Measured, not fitted (handoff_bench.
    # preposted_handoff_s, the isend calls of the same ping-pong), us; None: 0. Used only
    # with send_recv_preposted_us, and at most it.
    send_recv_preposted_call_us: float | None = None
    # Added to every call per member of the group beyond two, us. 0 where a collective's
    # members each have their own processor. Where more processes than cores share a host,
    # every member must be scheduled in turn before the call completes, and a bigger group
    # waits for more of them: with 4 gloo processes on 2 cores, a 4-rank all-reduce called
    # right after compute cost about 5.4 ms and a 2-rank one about 1.0 ms, five times, where
    # the ring's extra steps account for three (plansim calibrate fits it when it measured
    # more than one group size; 2026-11-30).
    call_us_per_rank: float = 0.0
    source: str = "built-in default"

    def call_s(self, op: str | None = None, n: int = 2) -> float:
        """Seconds one call of collective ``op`` ('all_reduce', 'all_gather',
        'reduce_scatter', 'send_recv'; None or another op: the generic figure) over ``n``
        ranks costs beyond its message steps: the op's own call cost when set, else
        call_latency_us, plus call_us_per_rank for each rank beyond two."""
        got = getattr(self, f"{op}_call_us", None) if op in COLLECTIVE_OPS else None
        return ((self.call_latency_us if got is None else got) + max(0, n - 2) * self.call_us_per_rank) * 1e-6

    def hop_latency_s(self, topology_s: float) -> float:
        """Seconds of one device-to-device step on this class: the profile's
        ``hop_latency_us`` when set, else ``topology_s`` (the topology's latency)."""
        return topology_s if self.hop_latency_us is None else self.hop_latency_us * 1e-6


@dataclass(frozen=True)
class RuntimeSettings:
    """How the training framework drives the GPUs (facts about a framework, not fits)."""

    host_overhead_us: float = 10.0  # CPU time to issue one op (Python, dispatcher, launch), us
    launch_blocking: bool = False  # CUDA_LAUNCH_BLOCKING=1: each op waits for the previous one
    p2p_scatter_gather: bool = True  # pipeline sends b*s*h/t per TP rank (Megatron-LM), else b*s*h
    p2p_blocking: bool = False  # the sender waits for its pipeline send before computing on
    # A pipeline send's bytes leave only once the receiver has posted its receive: gloo's
    # TCP transport (gloo/transport/tcp/pair.cc, Pair::send waits for NOTIFY_RECV_READY).
    p2p_rendezvous: bool = False
    tp_bwd_overlap: bool = True  # backward TP collective overlaps the weight-gradient GEMM
    # With SP a column-parallel GEMM saves only its s/t input slice and all-gathers it again in
    # backward for the weight gradient (Megatron-Core tensor_parallel/layers.py,
    # LinearWithGradAccumulationAndAsyncCommunication.backward); false: the gathered input was saved.
    sp_regather_input: bool = True
    # Dropout on (hidden and attention dropout p > 0: Megatron-LM's --hidden-dropout and
    # --attention-dropout default to 0.1, megatron/training/arguments.py): its
    # masks are kept for backward (Korthikanti et al. 2022 Table 2 counts them); false for
    # recipes that train without dropout (Llama-style) and the project's validator.
    dropout: bool = True
    fused_bias_dropout_add: bool = True  # bias + dropout + residual add in one kernel
    grad_accumulation_fusion: bool = True  # weight-gradient GEMMs accumulate into the grad buffer
    flash_attention: bool = False  # fused attention: no s x s scores in HBM
    grad_reduce_dtype: str = "auto"  # auto (fp32 for bf16, else the precision) | fp32 | bf16 | fp16
    zero1_grad_all_reduce: bool = False  # ZeRO-1 all-reduces gradients (not reduce-scatter)
    eager_adam: bool = False  # Adam as separate element-wise ops (validate/dp.adam_update), not fused kernels
    # Issue 9 (docs/runtimes.md; each bundled runtime cites its framework's flag):
    tp_comm_overlap: bool = False  # TP all-gather/reduce-scatter chunked and overlapped with GEMMs (needs sp)
    overlap_param_gather: bool = False  # ZeRO-1/2 parameter all-gather overlapped with the next forward
    fp8_param_gather: bool = False  # ZeRO/FSDP all-gathers fp8 weights (1 B) under precision=fp8
    fp8_weight_copies: int = 2  # fp8 copies of each weight Transformer Engine keeps (weight and its transpose)
    fsdp_reshard_after_forward: str = "always"  # ZeRO-3/FSDP frees gathered weights after forward: always | never | default (not with pp)
    fsdp_prefetch_layers: int = 1  # ZeRO-3/FSDP gathers this many units ahead of the compute
    # Cores of one host that its devices' processes share (CPU devices: each device is a
    # worker process computing in its own thread); 0: every device has its own processor.
    # More processes than cores time-share them (sim/core_sharing.py).
    host_cores: int = 0
    # Share of a process's waits in collectives and pipeline receives during which it still
    # occupies a core (a software transport's kernel copies, its threads waking and
    # polling); 0: a wait frees the core. Only matters with host_cores (sim/core_sharing.py).
    comm_busy_fraction: float = 0.0
    # Time of validate/probe.py's fixed compute probe when the profile was calibrated, us
    # (median over the compute workers); 0: not measured. The validator times the same
    # probe before each run and predicts with the compute slowed by the ratio.
    speed_probe_us: float = 0.0
    # What a 32 KiB 2-rank all-reduce added to a round of about 1 ms of the runner's layer
    # code when the profile was calibrated, us (the median over the calibration's launches
    # of that after-compute stream, validate/contention_bench.after_compute_rows); 0: not
    # measured. The validator times the same stream before and after each plan's steps
    # (validate/probe.call_probe_s) and scales the fabric's call costs by the ratio
    # (sim/core_sharing.slowed_calls), as speed_probe_us does the compute.
    call_probe_us: float = 0.0
    # How much longer the gradient reduction that closes each backward waits than the same
    # collective after a short compute, us: replicas given the same work drift apart over
    # a long phase where processes time-share cores (the scheduler is fair over its period,
    # not within it), and the reduction waits for the last (validate/contention_bench.
    # straggler_row: 1.1-1.4 ms with 2 gloo processes on 2 cores, 6.4-9.9 ms with 4; 2026-11-30).
    # 0: replicas stay in step (a device each, no sharing measured).
    straggler_us: float = 0.0
    # Host time activation checkpointing adds per checkpointed region and microbatch, on
    # top of the recomputed ops (each priced as any op): torch.utils.checkpoint's
    # Python-side work (saving and restoring RNG state, pack/unpack hooks per saved tensor,
    # re-entering the region in backward). One region per layer: the whole layer under
    # recompute=full, core attention under selective. Measured by plansim calibrate on the
    # runner's own layers at negligible width (validate/host_draws.recompute_drawer: 0.56
    # and 0.30 ms here on a 2-core CPU, 2026-12-04); 0: not measured, as for GPU runtimes,
    # whose host runs ahead of the kernels (costmodel/efficiency.ops_time_s).
    checkpoint_full_region_us: float = 0.0
    checkpoint_selective_region_us: float = 0.0
    # Host time ZeRO-3/FSDP adds each time a unit (a layer's weights, or those outside the
    # layers) is taken into use, forward and again backward, per microbatch: bookkeeping
    # of the gathered buffer, the weights' views of it, a saved-tensor hook per saved
    # tensor, the flat gradient's assembly; a fixed part and a part per MiB of the unit's
    # gathered weights (fresh buffers, their first touch, copies). Measured by plansim
    # calibrate on the runner's FSDP at one process (nothing communicated) at two layer
    # widths (validate/host_draws.fsdp_drawer: 89-135 us and 222-368 us/MiB over eight
    # calibrations on a 2-core CPU, 2026-12-04); 0: not measured, as for GPU runtimes,
    # whose host runs ahead of the kernels.
    fsdp_unit_us: float = 0.0
    fsdp_unit_us_per_mib: float = 0.0
    # Host time each microbatch of a chunk costs beyond its ops, forward and backward
    # together, us: the chunk's forward call, autograd's backward call into its engine, the
    # schedule's bookkeeping, paid once per chunk invocation however few ops it holds. A
    # per-op figure alone spreads it over the ops of the chain it was timed on, so a chunk
    # with fewer ops a microbatch (a pipeline stage, an interleaved chunk) was priced short.
    # Measured by plansim calibrate on the runner's overhead chain at two shapes of equal
    # width (validate/host_draws.microbatch_drawer: t = a x ops + F x microbatches; the
    # chain at five shapes fits so within 3 % where one per-op rate leaves +-10 %, 105 us a
    # microbatch on a 2-core CPU, 2026-12-06); charged half to the forward, half to the
    # backward (a split the measurement does not tell), on the host side of the chunk's
    # first layer, so that asynchronous kernels hide it where they take longer
    # (sim/program.chunk_work). 0: not measured, as in every bundled runtime.
    microbatch_host_us: float = 0.0
    # Context-parallel ring attention as the validator's runner computes it (validate/cp.py):
    # every visible pair of sequence chunks as unfused attention, merged by log-sum-exp
    # (costmodel/context_parallel.ring_piece_ops); false: fused block kernels, as
    # Transformer Engine's context-parallel attention runs (every bundled runtime).
    cp_attention_pieces: bool = False
    # Compute that slows as more activations are held for backward: on CPU workers a
    # backward reads its microbatch's saved tensors back from beyond the caches once many
    # are alive (two of tiny's layers as the runner trains a stage on one process,
    # 2026-12-04, benchmarks/schedule_order_cpu.py --depths: per microbatch 0.98,
    # 1.00-1.02, 1.06-1.09, 1.09-1.13 x at 2.4, 4.8, 9.5, 19 MiB alive at the peak). A stage's compute is multiplied by 1 + alive_slowdown_per_doubling x
    # log2(A / alive_knee_mib) where A, the MiB held when its actions start averaged over
    # its action list (sim/schedules.mean_alive), is above the knee. Measured by plansim
    # calibrate on three layers of the model, one process per core, in synthetic orders
    # of 1-12 microbatches deep (validate/alive_bench.alive_drawer); 0: not measured, as
    # for GPU runtimes, whose kernels stream activations from HBM either way.
    alive_knee_mib: float = 0.0
    alive_slowdown_per_doubling: float = 0.0
    # The model's own stage, timed as the runner trains it, over what the ops the cost model
    # lists for it cost at the fitted rates: forward and backward apart (measured over
    # priced). On CPU workers a training step's ops do not cost what the same ops cost in
    # the loops the rates are fitted to (2026-12-06, sessions 22 and 25, a Xeon host: the
    # runner's forwards 1.18-1.42 x their price, backwards 0.90-1.11 x). Measured by plansim
    # calibrate on the alive draws' stage (three layers of the model with both ends, one
    # microbatch in flight: validate/alive_bench.split_drawer) and priced by
    # sim/program.chunk_work itself (validate/calibrate.stage_scales); every chunk's
    # forward and backward compute is multiplied by them. Written only by plansim
    # calibrate --stage-scales (not the default: docs/validation-cpu.md, mechanism 57).
    # 1: not applied, as for GPU runtimes, whose kernels are timed as they run.
    forward_scale: float = 1.0
    backward_scale: float = 1.0
    # Likewise the optimizer step: the runner's Adam closing each step of that stage, over
    # what costmodel/efficiency.optimizer_time_s prices for the stage's weights. Its nine
    # in-place passes ran at 0.13-0.31 x their price on a 2-core AMD EPYC host (2026-12-06,
    # session 26, one run's traces), whose fitted element-wise bandwidth comes from GELU,
    # softmax and layer norm, slower per byte there than Adam's multiply-adds. 1: not applied.
    optimizer_scale: float = 1.0
    source: str = "built-in default"

    def alive_factor(self, mean_alive_bytes: float) -> float:
        """How much slower a stage computes when it holds ``mean_alive_bytes`` of
        activations on average (see alive_knee_mib); 1 when not measured or below the knee."""
        if self.alive_slowdown_per_doubling <= 0 or self.alive_knee_mib <= 0:
            return 1.0
        ratio = mean_alive_bytes / (self.alive_knee_mib * 2**20)
        return 1.0 + self.alive_slowdown_per_doubling * math.log2(ratio) if ratio > 1 else 1.0

    def checkpoint_region_s(self, recompute: str) -> float:
        """Host seconds of one checkpointed region under ``recompute`` (0 for 'none')."""
        us = {"full": self.checkpoint_full_region_us, "selective": self.checkpoint_selective_region_us}
        return us.get(recompute, 0.0) * 1e-6

    def microbatch_host_s(self) -> float:
        """Host seconds one microbatch of one chunk costs beyond its ops, forward and
        backward together (see microbatch_host_us)."""
        return self.microbatch_host_us * 1e-6

    def fsdp_unit_s(self, unit_bytes: float) -> float:
        """Host seconds FSDP spends taking one unit of ``unit_bytes`` gathered weights into use."""
        return (self.fsdp_unit_us + self.fsdp_unit_us_per_mib * unit_bytes / 2**20) * 1e-6


def _typed(kind: str) -> set[tuple[type, str]]:
    """(record class, field name) of every field annotated ``kind`` ('bool', 'str', 'int'),
    so fields added to a record later are checked by their type without touching this file."""
    return {(cls, f.name) for cls in (GpuEfficiency, FabricEfficiency, RuntimeSettings)
            for f in fields(cls) if f.type in (kind, {"bool": bool, "str": str, "int": int}[kind])}


_BOOL_FIELDS = _typed("bool")
_STR_FIELDS = _typed("str")
_INT_FIELDS = _typed("int")
# The smallest share of a peak a profile may give: 0.1 %. Nothing trains that slowly, and
# below it the numbers stop meaning anything (an efficiency of 5e-324, inside (0, 1],
# divided a GEMM's time by zero and made the flow solver spin on denormal rates).
EFF_MIN = 1e-3
# Allowed range of every number: (low, high, low open, high open). Efficiencies are shares of a
# peak, (0, 1]; times in microseconds up to one second (costmodel/limits.py); the share of
# compute lost to an overlapping collective is below 1 (at 1 compute would never finish).
# Any other (future) number: finite and in [0, 1e6].
_RANGES = {"compute_slowdown": (0.0, 1.0, False, True), "topk_select_cv": (0.0, 2.0, False, False),
           "comm_busy_fraction": (0.0, 1.0, False, False),
           "gemm_eff_max_fp8": (0.0, 1.0, False, False),  # 0: unset (derived from gemm_eff_max); else >= EFF_MIN
           "vector_flops_eff": (0.0, 1.0, False, False),  # 0: unset (traffic alone); else >= EFF_MIN
           "cache_bw_eff": (0.0, 1.0, False, False),  # 0: unset (hbm_eff for every op); else >= EFF_MIN
           "cache_mib": (0.0, 1e6, False, False),
           "fp8_weight_copies": (0, 4, False, False), "fsdp_prefetch_layers": (0, 64, False, False),
           "alive_slowdown_per_doubling": (0.0, 1.0, False, False), "alive_knee_mib": (0.0, 1e6, False, False),
           # a stage measured at a tenth or ten times its price is no calibration but a fault
           "forward_scale": (0.1, 10.0, False, False), "backward_scale": (0.1, 10.0, False, False),
           "optimizer_scale": (0.1, 10.0, False, False)}
_DEFAULT_RANGE = (0.0, 1e6, False, False)


def allowed_range(key: str) -> tuple[float, float]:
    """(low, high) a profile's number ``key`` may take (closed or open as load_profile checks)."""
    return _range(key)[:2]


def _range(key: str) -> tuple[float, float, bool, bool]:
    if key in _RANGES:
        return _RANGES[key]
    if key.endswith(("_eff", "_eff_max")):
        return (EFF_MIN, 1.0, False, False)
    if key.endswith("_us"):
        return (0.0, LATENCY_US_MAX, False, False)
    return _DEFAULT_RANGE


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
_STR_CHOICES = {"grad_reduce_dtype": ("auto",) + GRAD_REDUCE_CHOICES,
                "fsdp_reshard_after_forward": ("always", "never", "default")}

# Edge kinds of specs/topology's graph that belong to the inter-node network.
NETWORK_KINDS = ("network", "nic", "leaf_spine", "explicit")
# The link classes a profile's fabrics may name: the graph's edge kinds (intra-node hubs,
# NVLink mesh edges, PCIe, the network's), 'network' for all of the latter, 'default'.
FABRIC_KEYS = ("default", "nvswitch", "nvlink", "nvlink_mesh", "pcie", "loopback") + NETWORK_KINDS
PROFILE_KEYS = ("name", "source", "gpus", "fabrics", "runtime")


@dataclass(frozen=True)
class Profile:
    gpus: dict[str, GpuEfficiency]
    fabrics: dict[str, FabricEfficiency]
    name: str = "default"
    source: str = ""
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)

    def gpu(self, name: str) -> GpuEfficiency:
        return self.gpus.get(name) or self.gpus.get("default") or GpuEfficiency()

    def fabric(self, kind: str) -> FabricEfficiency:
        """Parameters of a link class. Graph edge kinds of the inter-node fabric (nic,
        leaf_spine, explicit) fall back to the 'network' entry, everything to 'default'."""
        got = self.fabrics.get(kind)
        if got is None and kind in NETWORK_KINDS:
            got = self.fabrics.get("network")
        return got or self.fabrics.get("default") or FabricEfficiency()


def _check_record(cls, data, source: str, where: str) -> None:
    if not isinstance(data, dict):
        raise InputError(source, where, "expected a mapping")
    allowed = {f.name for f in fields(cls)}
    for key, value in data.items():
        path = f"{where}.{str(key)[:60]}"
        if key not in allowed:
            raise InputError(source, path, f"unknown field; {allowed_names(key, allowed, f'costmodel/profile.py {cls.__name__}')}")
        if value is None and getattr(cls(), key) is None:
            continue  # an optional field left unset (e.g. fabrics.*.hop_latency_us: null)
        if key == "source":
            if not isinstance(value, str):
                raise InputError(source, path, f"{_short(value)}: must be a string")
        elif (cls, key) in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise InputError(source, path, f"{_short(value)}: must be true or false")
        elif key in _STR_CHOICES:
            if value not in _STR_CHOICES[key]:
                raise InputError(source, path, f"{_short(value)}: allowed: {', '.join(_STR_CHOICES[key])}")
        elif (cls, key) in _STR_FIELDS:
            if not isinstance(value, str):
                raise InputError(source, path, f"{_short(value)}: must be a string")
        else:
            lo, hi, lo_open, hi_open = _range(key)
            problem = number_problem(value, lo, hi, integer=(cls, key) in _INT_FIELDS,
                                     lo_open=lo_open, hi_open=hi_open)
            if not problem and key in ("gemm_eff_max_fp8", "vector_flops_eff", "cache_bw_eff") and 0 < value < EFF_MIN:
                problem = f"must be 0 (unset) or in [{EFF_MIN:g}, 1]"
            if problem:
                raise InputError(source, path, f"{_short(value)}: {problem}")


PROFILE_MAPPING = "a mapping with 'gpus', 'fabrics' and/or 'runtime'"


def _merge(base: Profile, data: dict, source: str) -> Profile:
    """``data`` (one profile file) over ``base``: entries replace the fields they name."""
    if not isinstance(data, dict):
        raise InputError(source, None, f"expected {PROFILE_MAPPING}")
    unknown = sorted((k for k in data if k not in PROFILE_KEYS), key=str)
    if unknown:
        raise InputError(source, str(unknown[0])[:60], f"unknown field; allowed: {', '.join(PROFILE_KEYS)}")
    for key in ("gpus", "fabrics"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise InputError(source, key, f"{_short(data[key])}: must be a mapping of name -> parameters")
    for key in ("name", "source"):
        if key in data and not isinstance(data[key], str):
            raise InputError(source, key, f"{_short(data[key])}: must be a string")
    gpus = dict(base.gpus)
    for key, entry in (data.get("gpus") or {}).items():
        if key != "default" and key not in GPU_CATALOG:  # a typo would silently calibrate nothing
            raise InputError(source, f"gpus.{str(key)[:60]}", f"unknown GPU; allowed: default, {', '.join(GPU_CATALOG)}")
        _check_record(GpuEfficiency, entry, source, f"gpus.{key}")
        gpus[key] = replace(gpus.get(key, gpus.get("default", GpuEfficiency())), **entry)
    fabrics = dict(base.fabrics)
    for key, entry in (data.get("fabrics") or {}).items():
        if key not in FABRIC_KEYS:
            raise InputError(source, f"fabrics.{str(key)[:60]}", f"unknown link class; allowed: {', '.join(FABRIC_KEYS)}")
        _check_record(FabricEfficiency, entry, source, f"fabrics.{key}")
        fabrics[key] = replace(fabrics.get(key, fabrics.get("default", FabricEfficiency())), **entry)
        got = fabrics[key]
        if got.send_recv_preposted_call_us is not None and (
                got.send_recv_preposted_us is None or got.send_recv_preposted_call_us > got.send_recv_preposted_us):
            raise InputError(source, f"fabrics.{str(key)[:60]}.send_recv_preposted_call_us",
                             f"{_short(got.send_recv_preposted_call_us)}: the sender's share of "
                             f"send_recv_preposted_us ({got.send_recv_preposted_us}); must be set with it "
                             f"and at most it")
    runtime = base.runtime
    if data.get("runtime") is not None:
        _check_record(RuntimeSettings, data["runtime"], source, "runtime")
        entry = dict(data["runtime"])
        if ("source" in entry and runtime.source and runtime.source != RuntimeSettings.source
                and not str(entry["source"]).startswith(runtime.source)):
            # Overlays refine a runtime; keep where every earlier setting came from too.
            entry["source"] = f"{runtime.source} | {entry['source']}"
        runtime = replace(runtime, **entry)
    return Profile(gpus=gpus, fabrics=fabrics, name=data.get("name", base.name),
                   source=", ".join(filter(None, [base.source, source])), runtime=runtime)


def bundled_profiles() -> list[str]:
    """Names of the bundled profiles (stems of costmodel/profiles/*.yaml)."""
    return bundled_names("costmodel", "profiles")


def _bundled(name: str) -> tuple[dict, str]:
    res = bundled_file("costmodel", name, "profiles")
    if res is None:
        raise InputError(name, "--profile", f"no bundled profile or file named {name!r}; "
                         f"bundled: {', '.join(bundled_profiles())}")
    src = f"costmodel/profiles/{name}.yaml"
    return parse_yaml(decode(res.read_bytes(), src), src) or {}, src


_EMPTY = Profile(gpus={"default": GpuEfficiency()}, fabrics={"default": FabricEfficiency()})


def default_profile() -> Profile:
    """The bundled base profile (costmodel/profiles/default.yaml)."""
    data, src = _bundled("default")
    return _merge(_EMPTY, data, src)


# Bundled framework runtimes (docs/runtimes.md): name -> the runtime overlays
# (costmodel/profiles/runtime-*.yaml) merged, in order, over the hardware profiles. A
# runtime file holds only a ``runtime`` section: hardware stays in the hardware profiles.
RUNTIMES: dict[str, tuple[str, ...]] = {
    "megatron-core": ("runtime-megatron-core",),
    "megatron-lm-2022": ("runtime-megatron-lm-2022",),
    "megatron-deepspeed": ("runtime-megatron-deepspeed",),
    "megatron-deepspeed-bf16opt": ("runtime-megatron-deepspeed", "runtime-deepspeed-bf16-optimizer"),
    "torchtitan": ("runtime-torchtitan",),
}
DEFAULT_RUNTIME = "megatron-core"  # what `plansim simulate/search` use without --runtime
# GPUs without FlashAttention kernels: FlashAttention-2 supports Ampere, Ada and Hopper
# (Dao 2023, Sec. 4; the flash-attention README's requirements), ROCm's port MI200/MI300,
# torch's CPU SDPA has a flash kernel; Volta has none. There, frameworks fall back to
# unfused core attention.
NO_FUSED_ATTENTION = frozenset({"V100-SXM2-32GB"})


def runtime_profiles(name: str | None) -> tuple[str, ...]:
    """The bundled overlays of runtime ``name`` (None: none); InputError for other names."""
    if name is None:
        return ()
    if name not in RUNTIMES:
        raise InputError(str(name)[:60], "--runtime", f"unknown runtime; allowed: {', '.join(RUNTIMES)}")
    return RUNTIMES[name]


def for_gpus(profile: Profile, gpu_names: Iterable[str]) -> Profile:
    """``profile`` with fused attention switched off when any GPU lacks the kernels
    (NO_FUSED_ATTENTION): the runtime falls back to unfused attention, in time and memory."""
    bad = sorted(set(gpu_names) & NO_FUSED_ATTENTION)
    if not bad or not profile.runtime.flash_attention:
        return profile
    rt = replace(profile.runtime, flash_attention=False,
                 source=f"{profile.runtime.source} | flash_attention off: no fused attention kernels on {', '.join(bad)}")
    return replace(profile, runtime=rt)


# The efficiencies that decide a GPU's compute times; a GPU whose entry matches the generic
# 'default' entry in all of them runs on assumptions, not on anything measured for it.
_COMPUTE_EFFICIENCIES = ("gemm_eff_max", "gemm_k_half", "attention_eff", "hbm_eff")


def uncalibrated_gpus(profile: Profile, gpu_names: Iterable[str]) -> list[str]:
    """GPUs of ``gpu_names`` whose compute efficiencies are the profile's generic 'default'
    entry (no entry of their own, or one that sets only facts such as sm_count), sorted."""
    base = profile.gpus.get("default") or GpuEfficiency()
    return sorted(n for n in set(gpu_names)
                  if n != "CPU" and all(getattr(profile.gpu(n), k) == getattr(base, k) for k in _COMPUTE_EFFICIENCIES))


def reshard_after_forward(runtime: RuntimeSettings, pp: int) -> bool:
    """Whether ZeRO-3/FSDP frees the gathered weights after forward: runtime
    fsdp_reshard_after_forward 'always', 'never', or 'default' = only without pipeline
    parallelism (TorchTitan, torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy)."""
    policy = runtime.fsdp_reshard_after_forward
    return policy == "always" or (policy == "default" and pp == 1)


def load_profile(path: str | None, bundled: Iterable[str] = (), runtime: str | None = None) -> Profile:
    """The default profile, then each bundled profile in ``bundled``, then the overlays of
    the bundled ``runtime`` (RUNTIMES), then the user's ``path`` (a YAML file, or the name
    of a bundled profile), each merged key by key."""
    prof = default_profile()
    for name in bundled:
        data, src = _bundled(name)
        prof = _merge(prof, data, src)
    for name in runtime_profiles(runtime):
        data, src = _bundled(name)
        hardware = sorted(k for k in ("gpus", "fabrics") if data.get(k))
        if hardware:
            raise InputError(src, hardware[0], "a runtime profile holds only a 'runtime' section (hardware "
                             "belongs in the hardware profiles)")
        prof = _merge(prof, data, src)
    if not path:
        return prof
    p = Path(path)
    if p.is_file():
        return _merge(prof, load_yaml_mapping(p, path, "profile file", PROFILE_MAPPING), path)
    if "/" not in path and not path.endswith((".yaml", ".yml")) and path in bundled_profiles():
        data, src = _bundled(path)
        return _merge(prof, data, src)
    problem = not_a_file(p, "profile file")
    if problem:
        raise InputError(path, "--profile", problem)
    raise InputError(path, "--profile", f"no such profile file; bundled profiles: {', '.join(bundled_profiles())}")


def overlay_profile(profile: Profile, data: dict, source: str) -> Profile:
    """``data`` (a profile mapping, as a profile file holds it) over ``profile``, checked
    and merged as load_profile merges a file; ``source`` names it in errors and in the
    result's source."""
    return _merge(profile, data, source)


def profile_to_dict(profile: Profile) -> dict:
    """The YAML form of a profile (what calibration writes; load_profile reads it back)."""
    def rec(v):
        return {f.name: getattr(v, f.name) for f in fields(v)}
    return {
        "name": profile.name,
        "gpus": {k: rec(v) for k, v in profile.gpus.items()},
        "fabrics": {k: rec(v) for k, v in profile.fabrics.items()},
        "runtime": rec(profile.runtime),
    }
