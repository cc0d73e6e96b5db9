"""Microbenchmarks that calibration fits the hardware profile to.

Four families, each run in ``world`` worker processes at the same time (validate/launch.py),
because the plans they calibrate for run that many processes on the same cores: what one
process achieves while its peers compute is what a plan's rank gets.

(a) GEMMs: the shapes a plan's TP slicing produces (taken from costmodel/flops.py's op
    listing, so calibration covers exactly the shapes the cost model asks about) plus a
    sweep of square and skinny sizes.
(b) Memory-bound ops (add, gelu, layernorm, softmax) over sizes, with bytes counted as
    costmodel/flops.py counts them (each operand read once, each result written once).
(c) Per-op overhead: the runner's GPT at width 8, plain (no autograd) and as a plan's rank
    trains it (validate/pp.PipelineStage over a one-stage schedule, autograd, gradient
    hooks), per op as the cost model counts ops.
(c') Top-k compression: validate/topk.select (error feedback and top-k selection, the
    runner's own function) over bucket sizes and kept fractions, as a stream.
(d) Collectives (all-reduce, all-gather, reduce-scatter, broadcast, send/recv) from 4 KiB
    to 64 MiB: validate/collective_bench.py.

(a)-(c') run in each worker as validate/compute_bench.py's compute_worker; this module
holds the samples, the shapes and sizes, and starts the workers. Timings are per call.
Compute: each rank takes the median over repeats of its own calls, and the figure kept is
the median over ranks (every rank measures the same thing); top-k keeps every selection
(mean and spread).

torch is imported inside the functions only: this module imports without it.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from costmodel import flops as fl
from costmodel.errors import InputError
from costmodel.limits import number_problem
from costmodel.shapes import ModelSpec
from validate.collective_bench import (BUSY_OP, COLLECTIVES, KIB, MIB, OVERHEAD_PLAIN_OP, OVERHEAD_TRAIN_OP,
                                       POSTED_BUSY_OP, POSTED_IDLE_OP, PREPOSTED_CALL_OP, PREPOSTED_OP, PROBE_OP,
                                       STRAGGLER_OP, CollectiveConfig, CollectiveSample, collective_worker)

MEMORY_OPS = ("add", "gelu", "layernorm", "softmax")
# ----------------------------------------------------------------------- records
@dataclass
class GemmSample:
    m: int
    n: int
    k: int
    batch: int
    seconds: float  # per call

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass
class AttentionSample:
    """Fused attention forward (torch's scaled_dot_product_attention) of ``batch`` heads."""

    batch: int  # microbatch x heads on this rank
    s: int
    d: int
    seconds: float

    @property
    def flops(self) -> float:
        """QK^T and attention over V, as costmodel/flops.py counts them: 2 x 2*b*s*s*d."""
        return 4.0 * self.batch * self.s * self.s * self.d

    @property
    def bytes(self) -> float:
        """Q, K, V read and O written once (fp32): the fused kernel's HBM traffic."""
        return 4.0 * 4 * self.batch * self.s * self.d


@dataclass
class MemorySample:
    op: str
    elems: int
    bytes: float  # as costmodel/flops.py counts the op's traffic
    seconds: float


@dataclass
class OverheadSample:
    what: str  # 'plain' (no autograd) or 'train' (forward + backward under autograd)
    model_ops: int  # ops of the chain as the cost model counts them
    seconds: float  # per chain

    @property
    def per_op_s(self) -> float:
        return self.seconds / self.model_ops


@dataclass
class TopkSample:
    """validate/topk.select on a bucket of ``elems`` fp32 gradients keeping ``fraction``."""

    elems: int
    fraction: float
    seconds: float  # mean over the error-feedback stream's selections and the ranks
    cv: float = 0.0  # their coefficient of variation (0 in records written before it)


@dataclass
class MicrobenchResult:
    world: int
    backend: str
    threads: int  # torch intra-op threads per process
    gemm: list[GemmSample] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    attention: list[AttentionSample] = field(default_factory=list)
    overhead: list[OverheadSample] = field(default_factory=list)
    collectives: list[CollectiveSample] = field(default_factory=list)
    topk: list[TopkSample] = field(default_factory=list)
    wall_s: float = 0.0
    # Processes the compute families (a)-(c') ran in at once: min(world, host cores) on
    # a CPU (time-sharing beyond the cores is the simulator's, sim/core_sharing.py),
    # world on GPUs; 0 in records written before this field (then: world).
    compute_world: int = 0
    host_cores: int = 0  # cores this process may run on (0: not recorded)
    # validate/probe.py's probe: the median of probe_draws_s (0: not recorded)
    probe_s: float = 0.0
    # Each draw of the probe, seconds, in order: the compute worker's (median over its
    # processes) first, then one per collective launch (median over its ranks); [] in
    # records written before the draws were kept (their probe_s is the compute draw).
    probe_draws_s: list = field(default_factory=list)
    # Seconds of each family's smallest call in the timing harness ('gemm', 'bmm',
    # 'memory:<op>', 'attention'), median over the compute workers; {} in older records
    harness: dict = field(default_factory=dict)
    # CPU time per wall second in a stream of small all-reduces (collective_bench.busy_fraction_row); 0: not measured
    comm_busy_fraction: float = 0.0
    # Extra wait of a collective closing a long compute phase (collective_bench.straggler_row),
    # seconds, mean over the group sizes of the median over launches; 0: not measured
    straggler_s: float = 0.0
    # What receiving a message its sender posted earlier adds to a round of compute while
    # the sender computes, and while it is blocked (collective_bench.posted_rows), seconds,
    # mean over the pairs, first launch only (collective_bench.posted_rows); 0: not measured
    posted_busy_s: float = 0.0
    posted_idle_s: float = 0.0
    # What one pipeline handoff into a receive posted before its send adds to a ping-pong
    # of compute rounds (collective_bench.preposted_handoff_s), seconds, mean over the
    # pairs, median over the launches; 0: not measured
    preposted_s: float = 0.0
    # Of that, the sender's own isend call (collective_bench.preposted_handoff_s), seconds,
    # mean over the pairs, median over the launches; 0: not measured
    preposted_call_s: float = 0.0
    # Every launch's figure of the rows timed in several launches: [op, n, nbytes,
    # [seconds, launch by launch]]; the rows themselves hold the median (the mean in
    # records written before 2026-12-03). [] in older records.
    launch_samples: list = field(default_factory=list)
    # Each draw of the overhead chain, [plain s, train s] (median over the compute
    # processes), in the order taken; ``overhead`` holds their median. [] in records
    # written before 2026-12-03 (one draw, which ``overhead`` holds).
    overhead_draws: list = field(default_factory=list)
    # Each draw of the chain's training step under recompute none, full and selective,
    # [seconds] in that order (compute_bench.recompute_drawer; median over the compute
    # processes), and what one checkpointed region adds from their median
    # (compute_bench.checkpoint_region_us: {'full': us, 'selective': us}). Empty in records
    # written before 2026-12-04 (then not measured: 0 in the profile).
    recompute_draws: list = field(default_factory=list)
    checkpoint_region_us: dict = field(default_factory=dict)
    # Each draw of the runner's FSDP against plain training, [plain s, zero=3 s] for each of
    # compute_bench.FSDP_MODELS (median over the compute processes), and what taking one
    # unit into use adds from their median (compute_bench.fsdp_unit_costs: {'us': us,
    # 'us_per_mib': us}). Empty in records written before 2026-12-04 (session 13).
    fsdp_draws: list = field(default_factory=list)
    fsdp_unit: dict = field(default_factory=dict)
    # Each draw of the alive stage's step at each of compute_bench.ALIVE_DEPTHS (seconds,
    # median over the compute processes), and what their median fits
    # (compute_bench.alive_fit: {'knee_mib': MiB, 'per_doubling': share}). Empty where not
    # measured (GPU workers, a model too large for the draws, records before session 14).
    alive_draws: list = field(default_factory=list)
    alive: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MicrobenchResult":
        return cls(world=d["world"], backend=d["backend"], threads=d["threads"],
                   gemm=[GemmSample(**x) for x in d.get("gemm", [])],
                   memory=[MemorySample(**x) for x in d.get("memory", [])],
                   attention=[AttentionSample(**x) for x in d.get("attention", [])],
                   overhead=[OverheadSample(**x) for x in d.get("overhead", [])],
                   collectives=[CollectiveSample(**x) for x in d.get("collectives", [])],
                   topk=[TopkSample(**x) for x in d.get("topk", [])],
                   wall_s=d.get("wall_s", 0.0), compute_world=d.get("compute_world", 0),
                   host_cores=d.get("host_cores", 0), probe_s=d.get("probe_s", 0.0),
                   probe_draws_s=list(d.get("probe_draws_s", [])),
                   harness=dict(d.get("harness", {})), comm_busy_fraction=d.get("comm_busy_fraction", 0.0),
                   straggler_s=d.get("straggler_s", 0.0), posted_busy_s=d.get("posted_busy_s", 0.0),
                   posted_idle_s=d.get("posted_idle_s", 0.0), preposted_s=d.get("preposted_s", 0.0),
                   preposted_call_s=d.get("preposted_call_s", 0.0), launch_samples=list(d.get("launch_samples", [])),
                   overhead_draws=list(d.get("overhead_draws", [])),
                   recompute_draws=list(d.get("recompute_draws", [])),
                   checkpoint_region_us=dict(d.get("checkpoint_region_us", {})),
                   fsdp_draws=list(d.get("fsdp_draws", [])), fsdp_unit=dict(d.get("fsdp_unit", {})),
                   alive_draws=list(d.get("alive_draws", [])), alive=dict(d.get("alive", {})))


# ------------------------------------------------------------------------ shapes
def model_gemm_shapes(model: ModelSpec, tps: list[int], mbs_list: list[int] = (1,)) -> list[tuple[int, int, int, int]]:
    """(m, n, k, batch) of every matmul the cost model lists for one layer forward and
    backward and the output layer, for each TP degree and microbatch size; deduplicated,
    sorted."""
    shapes = set()
    for tp in tps:
        for mbs in mbs_list:
            ops = (fl.layer_forward_ops(model, mbs, tp, False) + fl.layer_backward_ops(model, mbs, tp, False)
                   + fl.head_forward_ops(model, mbs, tp) + fl.head_backward_ops(model, mbs, tp))
            shapes.update((o.m, o.n, o.k, o.batch) for o in ops if o.is_matmul)
    return sorted(shapes)


def model_attention_shapes(model: ModelSpec, tps: list[int], mbs_list: list[int] = (1,)) -> list[tuple[int, int, int]]:
    """(microbatch x heads per rank, s, head dim) of the model's attention per TP degree."""
    return sorted({(mbs * model.num_attention_heads // tp, model.seq_length, model.head_dim)
                   for tp in tps for mbs in mbs_list})


def sweep_gemm_shapes(max_dim: int = 1024) -> list[tuple[int, int, int, int]]:
    """Square GEMMs 32..max_dim and skinny ones (small m, small k), batch 1: the curve
    efficiency-vs-shape is fitted over these as well as the model's own shapes."""
    out = []
    d = 32
    while d <= max_dim:
        out.append((d, d, d, 1))
        d *= 2
    for small in (16, 64):
        out += [(small, 512, 512, 1), (512, 512, small, 1), (512, small, 512, 1)]
    return sorted(set(out))


def memory_sizes(model: ModelSpec | None, tps: list[int], lo: int = 4 * KIB, hi: int = MIB) -> list[int]:
    """Element counts for the memory-bound sweep: powers of 4 from lo to hi plus the
    sizes a step streams: the model's activations (b*s*h and b*s*ffn/t per TP degree,
    microbatch 1) and the optimizer's parameter-sized operands (its parameters per TP
    rank, rounded down to whole 128-wide rows): eager Adam's element-wise ops run over the
    whole flat parameter and gradient buffers, larger than a core's L2 cache, where the
    activations stay inside it."""
    out, s = set(), lo
    while s <= hi:
        out.add(s)
        s *= 4
    if model is not None:
        for tp in tps:
            out.add(model.seq_length * model.hidden_size)
            out.add(model.seq_length * model.ffn // tp)
            out.add(max(128, model.total_params // tp // 128 * 128))
    return sorted(out)


def memory_op_bytes(op: str, elems: int, width: int, row: int) -> float:
    """HBM bytes of one memory-bound op as costmodel/flops.py counts them: add reads two
    and writes one (its 'residual'), gelu and softmax read one and write one, layernorm
    reads and writes the activation and reads gamma and beta of the row width."""
    if op == "add":
        return 3.0 * elems * width
    if op in ("gelu", "softmax"):
        return 2.0 * elems * width
    if op == "layernorm":
        return (2.0 * elems + 2.0 * row) * width
    raise ValueError(op)


TOPK_FRACTIONS = (0.01, 0.1, 0.3)


def topk_sizes(model: ModelSpec | None, tps: list[int], lo: int = 64 * KIB, hi: int = MIB) -> list[int]:
    """Bucket sizes (elements) for the top-k sweep: powers of 4 from lo to hi plus the
    model's gradient elements per rank at each TP degree (tiny models fit one bucket)."""
    out, s = set(), lo
    while s <= hi:
        out.add(s)
        s *= 4
    if model is not None:
        out.update(model.total_params // tp for tp in tps)
    return sorted(out)


def topk_sample(elems: int, fraction: float, times: list[float]) -> TopkSample:
    """One bucket size's selections (every rank's stream pooled): their mean, and their
    coefficient of variation (population standard deviation over mean)."""
    mean = statistics.fmean(times)
    return TopkSample(elems, fraction, mean, statistics.pstdev(times) / mean if mean > 0 else 0.0)


def host_cores() -> int:
    """Cores this process may run on (its affinity mask; os.cpu_count where the platform
    has no affinity call): what the host's worker processes share."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def compute_processes(world: int, kind: str) -> int:
    """Processes the compute microbenchmarks run at once. GPUs: ``world`` (one device
    each). CPU: at most one per core. Up to the cores, concurrent processes contend for
    the shared cache and memory bandwidth, which the figures must include; beyond them
    they only take turns on the cores, and how much depends on how often a plan's
    processes block in communication, which the simulator models from the plan
    (sim/core_sharing.py, runtime.host_cores), not a benchmark that never blocks."""
    return world if kind == "cuda" else max(1, min(world, host_cores()))


# Sizes of the collectives timed right after compute (collective_bench.after_compute_rows):
# from a small tensor-parallel activation to a gradient bucket of a small model.
AFTER_COMPUTE_SIZES = (4 * KIB, 32 * KIB, 256 * KIB, 2 * MIB)
# Separate launches the after-compute calls are timed in, merged by their median. Within one
# launch a call's cost is steady; between launches it is not (measured here, quiet: a 32 KiB
# 2-rank all-reduce in a stream of rounds with 1 ms of GEMMs cost 0.47, 0.99, 1.03, 1.30 and
# 1.90 ms in five launches), so one launch is one draw of where the processes and their
# threads landed, and a plan's own launch is another. The validator reports a plan's median
# step over its launches, the typical draw, so calibration takes the typical launch too: the
# median (docs/validation-cpu.md mechanism 32; the mean until 2026-12-03, when one launch of
# a calibration ran every call 2.5-3.5x slower than the other two and the mean priced tp=2
# at +48 %). Every launch's figure is kept in the .bench.json (launch_samples). Five launches
# (tried 2026-12-01, mechanism 19) cost 47 s more and did not do better in four runs.
AFTER_COMPUTE_LAUNCHES = 3
# Launches the pipeline handoff streams are timed in (collective_bench.posted_rows), merged by their median:
# the after-compute launches and more of their own (about 3 s each here). A receive from a
# computing sender moved 0.4-2.6 ms between single launches; the mean over three
# launches still moved 0.61-1.65 ms between calibrations (2026-11-30).
POSTED_LAUNCHES = 8
# The handoff launches beyond the after-compute ones also time the 2-rank all-reduce after
# compute, at every size, in streams of HANDOFF_LAUNCH_CALLS rounds (within a launch a
# call's cost is steady; between launches it is not): its median then runs over
# POSTED_LAUNCHES launches, not three. On the fourth host type (2026-12-03) that call was
# two-moded between launches, about 2 ms in some and 5 ms in others (32 KiB: 2.05, 4.80,
# 5.34 ms in `g-5`'s three), as were tp=2's own launches (launch medians 597-634 ms and
# 976 ms in the same run); the median of three drew the slow mode and predicted tp=2
# +97 %. All-reduce only: it is what tp=2, the DP buckets and the tied embedding pay; the
# other collectives' call costs keep their three launches. (Not timed apart: 4 sizes x
# 2 streams of 40-50 rounds of 2-8 ms, about 1-3 s a launch by that count.)
HANDOFF_LAUNCH_OPS = ("all_reduce",)
HANDOFF_LAUNCH_CALLS = 50
# Draws of the per-op overhead chain the compute worker takes (after the GEMMs, the memory
# ops, attention and top-k, and at its end: compute_bench.compute_worker); each collective
# launch takes one more (_pool_overhead_draws).
WORKER_CHAIN_DRAWS = 4
# Calls of the busy-fraction stream (collective_bench.busy_fraction_row): about 0.3-1 s here.
BUSY_CALLS = 300
# Long compute phases per group size and launch (collective_bench.straggler_row): about 0.6 s.
STRAGGLER_REPS = 12


THREADS_ENV = "OMP_NUM_THREADS"


def worker_threads(world: int) -> int:
    """Intra-op threads of each worker (calibration and validated plans alike): the user's
    OMP_NUM_THREADS when set, else 1. The validator's plans are small: their ops are
    shorter than what an intra-op thread team costs to wake and join, and where the cores
    are shared (several workers, or other programs) one descheduled team member stalls
    every op of its process for a scheduler tick (measured here: a 32x32x32 GEMM at 24 ms
    with 2 threads on a busy 2-core host, 2 us with 1)."""
    got = _USER_THREADS
    if got:
        try:
            if int(got) > 0:
                return int(got)
        except ValueError:
            pass
    return 1


_USER_THREADS = os.environ.get(THREADS_ENV)  # as the user started us, before we set it


@contextlib.contextmanager
def worker_threads_env(world: int):
    """OMP_NUM_THREADS = worker_threads(world) while workers are started (spawned
    interpreters read it when torch starts), so the measured plans run exactly as the
    microbenchmarks did; restored afterwards."""
    old = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = str(worker_threads(world))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = old


def _over_launches(rows: list, more: list[list]) -> tuple[list, list]:
    """(``rows`` ([op, n, nbytes, seconds]) with each row that ``more`` (rows of further
    launches) also has replaced by its median over all launches, [[op, n, nbytes,
    [seconds of each launch]]] of those rows)."""
    extra: dict[tuple, list[float]] = {}
    for launch_rows in more:
        for op, n, nbytes, s in launch_rows:
            extra.setdefault((op, n, nbytes), []).append(s)
    merged, samples = [], []
    for op, n, nbytes, s in rows:
        got = [s] + extra.get((op, n, nbytes), [])
        merged.append([op, n, nbytes, statistics.median(got)])
        if len(got) > 1:
            samples.append([op, n, nbytes, got])
    return merged, samples


def reused_compute(src: MicrobenchResult, source: str, world: int, backend: str, threads: int, gemm_shapes,
                   mem_sizes, attn_shapes, topk) -> MicrobenchResult:
    """A result holding ``src``'s compute families (a)-(c'), the speed probe and the
    harness figures, restricted to the shapes and sizes asked for: what this calibration's
    compute launch would have measured, because ``src``'s ran under the same conditions
    (backend, processes at once, threads per process, cores). On a CPU a world-4 and a
    world-2 calibration both time compute in min(world, cores) processes, so one launch
    serves both. InputError (naming ``source``) when a condition or a shape differs."""
    cw = compute_processes(world, "cuda" if backend == "nccl" else "cpu")
    have = {"backend": (src.backend, backend), "compute processes": (src.compute_world or src.world, cw),
            "threads": (src.threads, threads), "host cores": (src.host_cores, host_cores())}
    for what, (got, want) in have.items():
        if got != want:
            raise InputError(source, "--compute-from", f"its compute ran with {what} {got}; this calibration "
                             f"needs {want}")
    # The compute worker's own draw of the probe (src's others were taken by its collective
    # launches; this calibration's collective launches take their own).
    compute_draw = src.probe_draws_s[0] if src.probe_draws_s else src.probe_s
    figures = ([("probe_s", src.probe_s), ("probe_draws_s[0]", compute_draw)]
               + [(f"overhead.{o.what}", o.per_op_s) for o in src.overhead]
               + [(f"gemm.{i}", g.seconds) for i, g in enumerate(src.gemm)]
               + [(f"memory.{i}", x.seconds) for i, x in enumerate(src.memory)]
               + [(f"attention.{i}", a.seconds) for i, a in enumerate(src.attention)]
               + [(f"topk.{i}", t.seconds) for i, t in enumerate(src.topk)]
               + [(f"harness.{k}", v) for k, v in src.harness.items()])
    draws = _draw_rows(source, src.overhead_draws, "overhead_draws", 2, "[plain seconds, train seconds] pairs", figures)
    rdraws = _draw_rows(source, src.recompute_draws, "recompute_draws", 3, "[none, full, selective] seconds", figures)
    fdraws = _draw_rows(source, src.fsdp_draws, "fsdp_draws", 4, "[plain, zero=3, plain, zero=3] seconds", figures)
    regions = _figures(source, src.checkpoint_region_us, "checkpoint_region_us", {"full": _US, "selective": _US})
    unit = _figures(source, src.fsdp_unit, "fsdp_unit", {"us": _US, "us_per_mib": _US})
    from validate.compute_bench import ALIVE_DEPTHS
    adraws = _draw_rows(source, src.alive_draws, "alive_draws", len(ALIVE_DEPTHS),
                        f"[seconds at each of {len(ALIVE_DEPTHS)} depths]", figures)
    alive = _figures(source, src.alive, "alive", {"knee_mib": ("MiB", 1e6), "per_doubling": ("shares", 1.0)})
    for where, v in figures:
        if number_problem(v, 0.0, 60.0, lo_open=True, hi_open=True):
            raise InputError(source, where, f"{v!r}: a measured time must be a number of seconds in (0, 60)")
    if not src.overhead:
        raise InputError(source, "overhead", "absent: not a calibration's record")
    gemm = {(g.m, g.n, g.k, g.batch): g for g in src.gemm}
    mem = {(x.op, x.elems): x for x in src.memory}
    attn = {(a.batch, a.s, a.d): a for a in src.attention}
    tk = {(t.elems, t.fraction): t for t in src.topk}
    wanted = ([("GEMM", gemm, tuple(sh)) for sh in gemm_shapes]
              + [("memory op", mem, (op, n)) for op in MEMORY_OPS for n in mem_sizes]
              + [("attention", attn, tuple(sh)) for sh in attn_shapes]
              + [("top-k", tk, (n, f)) for n, f in topk])
    for what, table, key in wanted:
        if key not in table:
            raise InputError(source, "--compute-from", f"has no {what} sample {key}; calibrate the larger world "
                             f"first (its shapes include the smaller world's)")
    # Likewise the overhead chain's: the compute worker's draws come first (src's others were
    # its collective launches').
    mine = [list(d) for d in draws[:WORKER_CHAIN_DRAWS]]
    overhead = ([replace(o, seconds=float(statistics.median(d[i] for d in mine))) for i, o in enumerate(src.overhead)]
                if mine and len(src.overhead) == 2 else list(src.overhead))
    return MicrobenchResult(world=world, backend=backend, threads=threads, compute_world=cw, host_cores=host_cores(),
                            gemm=[gemm[tuple(sh)] for sh in gemm_shapes],
                            memory=[mem[(op, n)] for op in MEMORY_OPS for n in mem_sizes],
                            attention=[attn[tuple(sh)] for sh in attn_shapes], topk=[tk[k] for k in topk],
                            overhead=overhead, overhead_draws=mine,
                            recompute_draws=[list(d) for d in rdraws], checkpoint_region_us=dict(regions),
                            fsdp_draws=[list(d) for d in fdraws], fsdp_unit=dict(unit),
                            alive_draws=[list(d) for d in adraws], alive=dict(alive),
                            probe_s=compute_draw, probe_draws_s=[compute_draw],
                            harness=dict(src.harness))


def _draw_rows(source: str, rows, name: str, width: int, what: str, figures: list) -> list:
    """``rows`` checked to be a list of ``width``-long lists (InputError naming ``name``
    otherwise); each entry added to ``figures`` as (where, seconds) for the time check."""
    if not isinstance(rows, list) or any(not isinstance(d, list) or len(d) != width for d in rows):
        raise InputError(source, name, f"expected a list of {what}")
    figures += [(f"{name}[{j}][{i}]", d[i]) for j, d in enumerate(rows) for i in range(width)]
    return rows


_US = ("microseconds", 1e6)  # a per-call or per-unit cost in a record: (unit, upper bound)


def _figures(source: str, got, name: str, bounds: dict[str, tuple[str, float]]) -> dict:
    """``got`` checked to be {} (not measured) or a figure for every key of ``bounds``, each
    in [0, its bound] ({key: (unit, bound)}); InputError naming ``name`` and the key otherwise."""
    if not isinstance(got, dict) or (got and set(got) != set(bounds)):
        short = {"microseconds": "us"}
        raise InputError(source, name, "expected {" + ", ".join(f"'{k}': {short.get(u, 'number')}"
                                                                   for k, (u, _) in bounds.items()) + "}")
    for k, v in got.items():
        unit, hi = bounds[k]
        if number_problem(v, 0.0, hi):
            raise InputError(source, f"{name}.{k}", f"{v!r}: {unit} in [0, {'1e6' if hi == 1e6 else f'{hi:g}'}]")
    return got


def bench_record_path(profile) -> Path:
    """Where plansim calibrate writes a profile's microbenchmarks: P.yaml -> P.bench.json
    (the one definition: calibrate writes it, plansim validate's report reads it)."""
    p = Path(profile)
    return p.with_name(p.stem + ".bench.json")


def load_bench_dict(path, flag: str = "--compute-from") -> dict:
    """A calibration's saved microbenchmarks (P.bench.json, written beside P.yaml) as the
    mapping it holds, checked to be such a record (MicrobenchResult.from_dict reads it,
    and its 'gpu' and 'topology' names, when there, are strings); InputError (one line,
    naming the file and ``flag``) when it is missing, not JSON, nested beyond the
    decoder's depth or not such a record."""
    import json

    from costmodel.yamlio import read_text
    try:
        data = json.loads(read_text(path, what="calibration record (.bench.json)"))
        MicrobenchResult.from_dict(data)
    except RecursionError:  # json's decoder recurses once per nesting level
        raise InputError(str(path), flag, "JSON nested too deeply: not a calibration's microbenchmarks") from None
    except KeyError as e:
        raise InputError(str(path), flag, f"not a calibration's microbenchmarks (no {e} field)") from None
    except (json.JSONDecodeError, TypeError, AttributeError, ValueError) as e:
        raise InputError(str(path), flag, f"not a calibration's microbenchmarks ({type(e).__name__})") from None
    for key in ("gpu", "topology"):
        if key in data and not isinstance(data[key], str):
            raise InputError(str(path), key, f"{data[key]!r}: expected a name")
    return data


def load_bench(path, flag: str = "--compute-from") -> MicrobenchResult:
    """load_bench_dict's record as a MicrobenchResult."""
    return MicrobenchResult.from_dict(load_bench_dict(path, flag))


def run_microbenchmarks(world: int, gemm_shapes, mem_sizes, coll_sizes, *, attn_shapes=(), topk=(), runtime=None,
                        repeats: int = 5, threads: int | None = None, backend: str | None = None,
                        timeout_s: float = 600.0, progress=None, compute_from: tuple | None = None,
                        alive_model: ModelSpec | None = None) -> MicrobenchResult:
    """Run (a)-(d) in ``world`` processes; compute medians over ranks. ``runtime``
    (costmodel.profile.RuntimeSettings) decides how the cost model counts the chain's ops.
    ``compute_from``: (MicrobenchResult, its file name) whose compute families to take
    instead of measuring them again (reused_compute); the collectives are measured.
    ``alive_model``: the model whose layers the compute workers time against the
    activations held (compute_bench.alive_drawer); None: not measured."""
    from validate.backend import pick_backend

    t_wall = time.perf_counter()
    be = pick_backend() if backend is None else backend
    be_name = be if isinstance(be, str) else be.name
    threads = threads or worker_threads(world)
    say = progress or (lambda msg: None)
    if compute_from is not None:
        res = reused_compute(compute_from[0], compute_from[1], world, be_name, threads, gemm_shapes, mem_sizes,
                             attn_shapes, topk)
        say(f"compute microbenchmarks: taken from {compute_from[1]} (measured there in {res.compute_world} "
            f"concurrent processes, {threads} thread(s) each, as here)")
    else:
        res = _measure_compute(world, gemm_shapes, mem_sizes, attn_shapes, topk, runtime, repeats, threads, be_name,
                               timeout_s, say, alive_model)
    _measure_collectives(res, world, coll_sizes, repeats, threads, be_name, timeout_s, say)
    res.wall_s = time.perf_counter() - t_wall
    return res


def _measure_compute(world: int, gemm_shapes, mem_sizes, attn_shapes, topk, runtime, repeats: int, threads: int,
                     be_name: str, timeout_s: float, say, alive_model: ModelSpec | None = None) -> MicrobenchResult:
    """(a)-(c'), the speed probe and the harness figures, in compute_processes(world)
    processes at once; each figure the median over the ranks."""
    from costmodel.profile import RuntimeSettings
    from validate.compute_bench import (ALIVE_DEPTHS, ComputeConfig, alive_fit, chain_op_counts, checkpoint_region_us,
                                        compute_worker, fsdp_unit_costs)
    from validate.launch import launch

    cw = compute_processes(world, "cuda" if be_name == "nccl" else "cpu")
    say(f"compute microbenchmarks: {len(gemm_shapes)} GEMM shapes, {len(mem_sizes)} sizes x "
        f"{len(MEMORY_OPS)} memory ops, {cw} concurrent processes ({host_cores()} cores), {threads} thread(s) each")
    ccfg = ComputeConfig(tuple(gemm_shapes), tuple(mem_sizes), tuple(attn_shapes), tuple(topk), repeats, threads, be_name,
                         alive_model=alive_model)
    with worker_threads_env(world):
        per_rank = launch(compute_worker, cw, (ccfg,), timeout_s=timeout_s, backend=be_name)
    res = MicrobenchResult(world=world, backend=be_name, threads=threads, compute_world=cw, host_cores=host_cores())
    for i, row in enumerate(per_rank[0]["gemm"]):
        m, n, k, b, _ = row
        res.gemm.append(GemmSample(m, n, k, b, statistics.median(r["gemm"][i][4] for r in per_rank)))
    for i, row in enumerate(per_rank[0]["memory"]):
        op, elems, nbytes, _ = row
        res.memory.append(MemorySample(op, elems, nbytes, statistics.median(r["memory"][i][3] for r in per_rank)))
    for i, row in enumerate(per_rank[0]["attention"]):
        bh, sq, d, _ = row
        res.attention.append(AttentionSample(bh, sq, d, statistics.median(r["attention"][i][3] for r in per_rank)))
    for i, row in enumerate(per_rank[0]["topk"]):
        elems, frac, _ = row
        res.topk.append(topk_sample(elems, frac, [t for r in per_rank for t in r["topk"][i][2]]))
    res.probe_s = statistics.median(r["probe"] for r in per_rank)
    res.probe_draws_s = [res.probe_s]
    res.harness = {kind: statistics.median(r["harness"][i][1] for r in per_rank)
                   for i, (kind, _) in enumerate(per_rank[0]["harness"])}
    n_fwd, n_train = chain_op_counts(runtime or RuntimeSettings())
    # Each draw of the overhead chain the median over the processes, and the figure the
    # median over the draws (compute_bench.compute_worker).
    res.overhead_draws = _draws_over_ranks(per_rank, "overhead_draws", 2)
    for i, (what, ops) in enumerate((("plain", n_fwd), ("train", n_train))):
        res.overhead.append(OverheadSample(what, ops, statistics.median(d[i] for d in res.overhead_draws)))
    res.recompute_draws = _draws_over_ranks(per_rank, "recompute_draws", 3)
    if res.recompute_draws:
        steps = [statistics.median(d[i] for d in res.recompute_draws) for i in range(3)]
        res.checkpoint_region_us = checkpoint_region_us(steps, res.overhead[1].per_op_s, runtime or RuntimeSettings())
    res.fsdp_draws = _draws_over_ranks(per_rank, "fsdp_draws", 4)
    if res.fsdp_draws:
        res.fsdp_unit = fsdp_unit_costs([statistics.median(d[i] for d in res.fsdp_draws) for i in range(4)])
    res.alive_draws = _draws_over_ranks(per_rank, "alive_draws", len(ALIVE_DEPTHS))
    if res.alive_draws and alive_model is not None:
        res.alive = alive_fit([statistics.median(d[i] for d in res.alive_draws) for i in range(len(ALIVE_DEPTHS))],
                              alive_model)
    return res


def _draws_over_ranks(per_rank: list[dict], key: str, width: int) -> list[list[float]]:
    """Each draw of the compute workers' ``key`` list ([width figures] per draw, in the
    order taken), every figure the median over the ranks; [] when the workers took none."""
    return [[statistics.median(r[key][j][i] for r in per_rank) for i in range(width)]
            for j in range(len(per_rank[0].get(key, [])))]


def _measure_collectives(res: MicrobenchResult, world: int, coll_sizes, repeats: int, threads: int, be_name: str,
                         timeout_s: float, say) -> None:
    """(d): the collectives, their after-compute streams and the pipeline handoffs, into ``res``."""
    from validate.launch import launch

    if world > 1 and coll_sizes:
        ops = COLLECTIVES
        # Groups of every size n that divides the world, world/n of them at once (a plan's
        # TP or DP groups of n ranks run beside each other on the same cores).
        ns = tuple(n for n in range(2, world + 1) if world % n == 0)
        say(f"collectives: {', '.join(ops)} in groups of {', '.join(map(str, ns))} of {world} processes, "
            f"{len(coll_sizes)} sizes {coll_sizes[0]} B .. {coll_sizes[-1]} B")
        after = tuple(sz for sz in AFTER_COMPUTE_SIZES if coll_sizes[0] <= sz <= coll_sizes[-1])
        kcfg = CollectiveConfig(tuple(coll_sizes), ops, ns, repeats=repeats, threads=threads, backend=be_name,
                                after_compute_sizes=after, busy_calls=BUSY_CALLS,
                                straggler_reps=STRAGGLER_REPS if after else 0, posted=bool(after) and world % 2 == 0,
                                probe=True, overhead_chain=True)
        # The first launch times everything; the busy- and idle-sender streams there only
        # (collective_bench.posted_rows): the validator's runtime has no rendezvous to price with them.
        more = []
        if after:
            more = [("after-compute streams", replace(kcfg, sizes=(), ops=(), busy_calls=0, posted_busy_idle=False))
                    ] * (AFTER_COMPUTE_LAUNCHES - 1)
            if kcfg.posted:
                more += [("pipeline handoffs and 2-rank all-reduce after compute",
                          replace(kcfg, sizes=(), ops=(), busy_calls=0, group_sizes=(2,),
                                  after_compute_ops=HANDOFF_LAUNCH_OPS, after_compute_calls=HANDOFF_LAUNCH_CALLS,
                                  straggler_reps=0, posted_busy_idle=False))] * (POSTED_LAUNCHES - AFTER_COMPUTE_LAUNCHES)
        plan = [("every size back to back" + (", after compute, pipeline handoffs" if after else ""), kcfg)] + more
        got = []
        with worker_threads_env(world):
            for i, (what, cfg) in enumerate(plan):
                say(f"collective launch {i + 1} of {len(plan)} in {world} processes: {what}")
                got.append(launch(collective_worker, world, (cfg,), timeout_s=timeout_s, backend=be_name)[0])
        rows = got[0]
        if more:
            rows, res.launch_samples = _over_launches(rows, got[1:])
        _apply_collective_rows(res, rows)
        _pool_probe_draws(res, rows)
        _pool_overhead_draws(res, rows)


def _pool_probe_draws(res: MicrobenchResult, rows: list) -> None:
    """Append each collective launch's probe draw (PROBE_OP rows: one launch's is its row,
    several launches' are in launch_samples) to res.probe_draws_s, and make res.probe_s
    their median with the compute worker's (validate/probe.py)."""
    several = [ss for op, _, _, ss in res.launch_samples if op == PROBE_OP]
    draws = several[0] if several else [s for op, _, _, s in rows if op == PROBE_OP]
    res.probe_draws_s = list(res.probe_draws_s or ([res.probe_s] if res.probe_s > 0 else [])) + [float(d) for d in draws]
    good = [d for d in res.probe_draws_s if d > 0]
    if good:
        res.probe_s = float(statistics.median(good))


def _pool_overhead_draws(res: MicrobenchResult, rows: list) -> None:
    """Append each collective launch's draw of the overhead chain ([plain s, train s] from
    its OVERHEAD_PLAIN_OP / OVERHEAD_TRAIN_OP rows, one launch's or each launch's in
    launch_samples) to res.overhead_draws, and make each res.overhead figure the median
    of all the draws. Why (docs/validation-cpu.md mechanism 39): the compute worker's
    draws span its ~20 s; on the fourth host type a whole worker could sit in a slow
    phase (run f-3: its four trained draws 24.9-30.0 us an op, median 28.3, at 2
    processes, the median 19.8 at 4 minutes later; the 2-process plans' compute predicted
    +19-36 %), while the collective launches span the rest of the calibration's minutes."""
    several = {op: ss for op, _, _, ss in res.launch_samples if op in (OVERHEAD_PLAIN_OP, OVERHEAD_TRAIN_OP)}
    if len(several) == 2:
        got = [list(p) for p in zip(several[OVERHEAD_PLAIN_OP], several[OVERHEAD_TRAIN_OP])]
    else:
        one = {op: s for op, _, _, s in rows if op in (OVERHEAD_PLAIN_OP, OVERHEAD_TRAIN_OP)}
        got = [[one[OVERHEAD_PLAIN_OP], one[OVERHEAD_TRAIN_OP]]] if len(one) == 2 else []
    got = [[float(a), float(b)] for a, b in got if a > 0 and b > 0]
    if not got or len(res.overhead) != 2:
        return
    res.overhead_draws = list(res.overhead_draws) + got
    res.overhead = [replace(o, seconds=float(statistics.median(d[i] for d in res.overhead_draws)))
                    for i, o in enumerate(res.overhead)]


_SCALAR_OPS = (PROBE_OP, BUSY_OP, STRAGGLER_OP, POSTED_BUSY_OP, POSTED_IDLE_OP, PREPOSTED_OP, PREPOSTED_CALL_OP,
               OVERHEAD_PLAIN_OP, OVERHEAD_TRAIN_OP)


def _apply_collective_rows(res: MicrobenchResult, rows: list) -> None:
    """Set ``res``'s collective samples and the figures derived from special rows
    ([op, n, nbytes, seconds], every launch already merged); a figure whose rows are not
    in ``rows`` keeps its value."""
    special: dict[str, list[float]] = {}
    for op, n, nbytes, s in rows:
        if op in _SCALAR_OPS:
            special.setdefault(op, []).append(s)
    if BUSY_OP in special:
        res.comm_busy_fraction = special[BUSY_OP][0]
    if STRAGGLER_OP in special:  # one row per group size
        res.straggler_s = statistics.fmean(special[STRAGGLER_OP])
    if POSTED_BUSY_OP in special:
        res.posted_busy_s = special[POSTED_BUSY_OP][0]
    if POSTED_IDLE_OP in special:
        res.posted_idle_s = special[POSTED_IDLE_OP][0]
    if PREPOSTED_OP in special:
        res.preposted_s = special[PREPOSTED_OP][0]
    if PREPOSTED_CALL_OP in special:
        res.preposted_call_s = special[PREPOSTED_CALL_OP][0]
    res.collectives = [CollectiveSample(op, nbytes, n, s) for op, n, nbytes, s in rows if op not in _SCALAR_OPS]


def with_launch_aggregate(res: MicrobenchResult, aggregate) -> MicrobenchResult:
    """A copy of ``res`` whose rows timed in several launches take ``aggregate`` (a
    function of the list of each launch's seconds, e.g. statistics.fmean) of their
    launch_samples instead of the median: the same measurements, merged another way
    (benchmarks/repredict.py --launch-aggregate). Rows measured once are unchanged."""
    agg = {(op, n, nbytes): float(aggregate(ss)) for op, n, nbytes, ss in res.launch_samples}
    rows = [[c.op, c.n, c.nbytes, agg.get((c.op, c.n, c.nbytes), c.seconds)] for c in res.collectives]
    rows += [[op, n, nbytes, v] for (op, n, nbytes), v in agg.items() if op in _SCALAR_OPS]
    out = replace(res)
    _apply_collective_rows(out, rows)
    return out


def format_compute(res: MicrobenchResult) -> str:
    """GEMM GFLOP/s per shape, memory-op GB/s per size, per-op overheads."""
    lines = [f"# GEMM ({res.compute_world or res.world} concurrent processes, {res.threads} thread(s) each)",
             f"{'m':>6} {'n':>6} {'k':>6} {'batch':>5} {'time (us)':>10} {'GFLOP/s':>9}"]
    for g in res.gemm:
        lines.append(f"{g.m:>6} {g.n:>6} {g.k:>6} {g.batch:>5} {g.seconds * 1e6:>10.1f} {g.flops / g.seconds / 1e9:>9.2f}")
    lines += ["# memory-bound ops", f"{'op':>10} {'elements':>10} {'time (us)':>10} {'GB/s':>8}"]
    for s in res.memory:
        lines.append(f"{s.op:>10} {s.elems:>10} {s.seconds * 1e6:>10.1f} {s.bytes / s.seconds / 1e9:>8.2f}")
    lines += ["# fused attention (scaled_dot_product_attention, causal)", f"{'heads':>6} {'s':>5} {'d':>4} {'time (us)':>10} {'GFLOP/s':>9}"]
    for a in res.attention:
        lines.append(f"{a.batch:>6} {a.s:>5} {a.d:>4} {a.seconds * 1e6:>10.1f} {a.flops / a.seconds / 1e9:>9.2f}")
    if res.topk:
        lines += ["# top-k compression (validate/topk.select, error-feedback stream: mean and CV)",
                  f"{'elements':>10} {'kept':>6} {'time (us)':>10} {'ns/elem':>8} {'cv':>6}"]
        for t in res.topk:
            lines.append(f"{t.elems:>10} {t.fraction:>6.2f} {t.seconds * 1e6:>10.1f} {t.seconds / t.elems * 1e9:>8.2f}"
                         f" {t.cv:>6.3f}")
    if res.harness:
        lines.append("# timing harness per call (smallest call of each family; taken out before fitting rates)")
        lines.append("  " + ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in res.harness.items()))
    lines.append("# per-op overhead (GPT layer chain at width 8, per op as the cost model counts them)")
    for i, o in enumerate(res.overhead):  # ("plain", "train"), as each draw's pair
        draws = [d[i] / o.model_ops * 1e6 for d in res.overhead_draws]
        each = f"  (median of {len(draws)} draws: {', '.join(f'{x:.2f}' for x in draws)})" if len(draws) > 1 else ""
        lines.append(f"{o.what:>10} {o.model_ops:>4} ops {o.per_op_s * 1e6:>8.2f} us/op{each}")
    if res.comm_busy_fraction or res.straggler_s:
        lines.append(f"# waits: busy fraction in collectives {res.comm_busy_fraction:.3f}; a collective closing "
                     f"50 ms of compute waits {res.straggler_s * 1e6:.0f} us more than one closing 1 ms")
    if res.posted_busy_s or res.posted_idle_s:
        lines.append(f"# pipeline handoffs: receiving a message posted earlier adds {res.posted_busy_s * 1e6:.0f} us "
                     f"to a round while its sender computes, {res.posted_idle_s * 1e6:.0f} us while it is blocked; "
                     f"a handoff into a receive posted first adds {res.preposted_s * 1e6:.0f} us to a ping-pong "
                     f"(the sender's isend call {res.preposted_call_s * 1e6:.0f} us of it)")
    return "\n".join(lines)


