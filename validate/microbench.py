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
holds the shapes and sizes, starts the workers and fills the record (its samples, reading
and checking: validate/bench_record.py). Timings are per call.
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
from dataclasses import asdict, replace

from costmodel import flops as fl
from costmodel.errors import InputError
from costmodel.limits import number_problem
from costmodel.shapes import ModelSpec
from validate.bench_record import (US, AttentionSample, GemmSample, MemorySample, MicrobenchResult, OverheadSample,
                                   TopkSample, check_draws, check_figures)
from validate.collective_bench import (COLLECTIVES, KIB, MIB, OVERHEAD_PLAIN_OP, OVERHEAD_TRAIN_OP, PROBE_OP,
                                       CollectiveConfig, CollectiveSample, collective_worker)
from validate.contention_bench import BUSY_OP, STRAGGLER_OP
from validate.handoff_bench import POSTED_BUSY_OP, POSTED_IDLE_OP, PREPOSTED_CALL_OP, PREPOSTED_OP

MEMORY_OPS = ("add", "gelu", "layernorm", "softmax")
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


# The largest element count a model may add to the memory-bound and top-k sweeps: 64 Mi
# fp32 elements (256 MiB), far beyond every cache the figures must leave (32 MiB of L3 on
# the CPU hosts here; 50 MB of L2 on an H100, NVIDIA H100 Tensor Core GPU Architecture
# whitepaper), so a larger buffer streams at the same rate per byte and the cost model
# scales it. Uncapped, a large model's parameter-sized operands would be allocated whole
# in every process (gpt3-1.3b: 1.3 G elements, 5.3 GB a tensor, four of them for top-k).
MAX_MODEL_ELEMS = 1 << 26


def memory_sizes(model: ModelSpec | None, tps: list[int], lo: int = 4 * KIB, hi: int = MIB) -> list[int]:
    """Element counts for the memory-bound sweep: powers of 4 from lo to hi plus the
    sizes a step streams: the model's activations (b*s*h and b*s*ffn/t per TP degree,
    microbatch 1) and the optimizer's parameter-sized operands (its parameters per TP
    rank, rounded down to whole 128-wide rows): eager Adam's element-wise ops run over the
    whole flat parameter and gradient buffers, larger than a core's L2 cache, where the
    activations stay inside it. A model's sizes are capped at MAX_MODEL_ELEMS."""
    out, s = set(), lo
    while s <= hi:
        out.add(s)
        s *= 4
    if model is not None:
        for tp in tps:
            out.add(min(MAX_MODEL_ELEMS, model.seq_length * model.hidden_size))
            out.add(min(MAX_MODEL_ELEMS, model.seq_length * model.ffn // tp))
            out.add(max(128, min(MAX_MODEL_ELEMS, model.total_params // tp) // 128 * 128))
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
    model's gradient elements per rank at each TP degree (tiny models fit one bucket),
    capped at MAX_MODEL_ELEMS."""
    out, s = set(), lo
    while s <= hi:
        out.add(s)
        s *= 4
    if model is not None:
        out.update(min(MAX_MODEL_ELEMS, model.total_params // tp) for tp in tps)
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


# Sizes of the collectives timed right after compute (contention_bench.after_compute_rows):
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
# Two since session 31 (mechanism 60): the third cost 22 s at 4 processes and 9 s at 2 on
# the seventh host type and bought nothing measurable. The 34 saved runs of sessions 26-30
# refitted without it met the six in 17 of 34, as with it, each plan's mean error within
# 0.2 point. The 2-rank all-reduce, whose outlier launch once priced tp=2 at +48 %, keeps
# its POSTED_LAUNCHES draws; the third launch becomes a handoff launch.
AFTER_COMPUTE_LAUNCHES = 2
# Launches the pipeline handoff streams are timed in (handoff_bench.posted_rows), merged by their median:
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
# ops, attention and top-k, and at its end: compute_bench.compute_worker); each of the
# first DRAW_LAUNCHES collective launches takes one more, and a speed-probe draw
# (_pool_overhead_draws, _pool_probe_draws).
WORKER_CHAIN_DRAWS = 4
# Every collective launch draws the probe and the chain at its start. Drawn in the two
# after-compute launches only (docs/validation-cpu.md mechanism 63, 2026-12-08), skipping
# the six handoff launches' draws (1.0-1.2 s of a handoff launch's 2.9-3.8 s at 2
# processes, 2.0-2.4 s of 4.3-4.9 s at 4 on the seventh host type's slow state) took the
# calibrations from 206-224 s to 187-203 s a run, and the 311 saved runs of 2026-12-01..07
# refitted with the first two launches' draws (benchmarks/repredict.py --refit --pool
# --draw-launches 2) met the six in 123 of 311 as with all eight. But the handoff launches
# then started their streams in fresh processes, and at 4 processes timed the 2-rank
# all-reduce after compute about twice as high (each run's median of its six launches
# 2.0-3.0 ms against 1.1-1.5 ms in the four runs without the cut), which no refit of saved
# rows can show; the six met in 2 of 5 runs with the cut against 3 of 4 alternated with
# them (5 of 8 over the session's runs without it). So each launch keeps its draw.
DRAW_LAUNCHES = POSTED_LAUNCHES
# Calls of the busy-fraction stream (contention_bench.busy_fraction_row): about 0.3-1 s here.
BUSY_CALLS = 300
# Long compute phases per group size and launch (contention_bench.straggler_row): about 0.6 s.
STRAGGLER_REPS = 12


THREADS_ENV = "OMP_NUM_THREADS"


def worker_threads(world: int) -> int:
    """Intra-op threads of each worker (calibration and validated plans alike): the user's
    OMP_NUM_THREADS when set, else 1. The validator's plans are small: their ops are
    shorter than what an intra-op thread team costs to wake and join, and where the cores
    are shared (several workers, or other programs) one descheduled team member stalls
    every op of its process for a scheduler tick (measured here: a 32x32x32 GEMM at 24 ms
    with 2 threads on a busy 2-core host, 2 us with 1)."""
    got = USER_THREADS
    if got:
        try:
            if int(got) > 0:
                return int(got)
        except ValueError:
            pass
    return 1


USER_THREADS = os.environ.get(THREADS_ENV)  # as the user started us, before we set it


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


def checked_compute(src: MicrobenchResult, source: str) -> dict:
    """``src``'s compute families checked as any input is (InputError naming ``source``
    and the field: a draw of the wrong width, a figure out of range, a time that is not a
    number of seconds in (0, 60), no overhead chain): {field: value} of its draws and the
    figures fitted to them. What reusing a record's compute (reused_compute) and pooling
    records (validate/pool.py) both read."""
    compute_draw = src.probe_draws_s[0] if src.probe_draws_s else src.probe_s  # the compute worker's
    figures = ([("probe_s", src.probe_s), ("probe_draws_s[0]", compute_draw)]
               + ([("device_kernel_s", src.device_kernel_s)] if src.device_kernel_s != 0 else [])
               + [(f"overhead.{o.what}", o.per_op_s) for o in src.overhead]
               + [(f"gemm.{i}", g.seconds) for i, g in enumerate(src.gemm)]
               + [(f"memory.{i}", x.seconds) for i, x in enumerate(src.memory)]
               + [(f"attention.{i}", a.seconds) for i, a in enumerate(src.attention)]
               + [(f"topk.{i}", t.seconds) for i, t in enumerate(src.topk)]
               + [(f"harness.{k}", v) for k, v in src.harness.items()])
    draws = check_draws(source, src.overhead_draws, "overhead_draws", 2, "[plain seconds, train seconds] pairs", figures)
    rdraws = check_draws(source, src.recompute_draws, "recompute_draws", 3, "[none, full, selective] seconds", figures)
    fdraws = check_draws(source, src.fsdp_draws, "fsdp_draws", 4, "[plain, zero=3, plain, zero=3] seconds", figures)
    regions = check_figures(source, src.checkpoint_region_us, "checkpoint_region_us", {"full": US, "selective": US})
    unit = check_figures(source, src.fsdp_unit, "fsdp_unit", {"us": US, "us_per_mib": US})
    from validate.alive_bench import ALIVE_DEPTHS, SPLIT_SPANS
    adraws = check_draws(source, src.alive_draws, "alive_draws", len(ALIVE_DEPTHS),
                        f"[seconds at each of {len(ALIVE_DEPTHS)} depths]", figures)
    alive = check_figures(source, src.alive, "alive", {"knee_mib": ("MiB", 1e6), "per_doubling": ("shares", 1.0)})
    held = src.alive_held_mib
    if held and (not isinstance(held, list) or len(held) != len(ALIVE_DEPTHS)
                 or any(number_problem(h, 0.0, 1e6) for h in held)):
        raise InputError(source, "alive_held_mib", f"expected [] or {len(ALIVE_DEPTHS)} MiB figures in [0, 1e6]")
    mdraws = check_draws(source, src.microbatch_draws, "microbatch_draws", 2, "[seconds, seconds] pairs", figures)
    sdraws = check_draws(source, src.split_draws, "split_draws", len(SPLIT_SPANS),
                         "[forward seconds, backward seconds, optimizer seconds]", figures)
    smodel = split_model(src, source)
    mhost = check_figures(source, src.microbatch_host, "microbatch_host", {"us": US, "per_op_us": US})
    mops = src.microbatch_ops
    if mops and (not isinstance(mops, list) or len(mops) != 2
                 or any(isinstance(n, bool) or not isinstance(n, int) or not 0 < n < 10**6 for n in mops)):
        raise InputError(source, "microbatch_ops", "expected [] or 2 op counts in (0, 1e6)")
    for where, v in figures:
        if number_problem(v, 0.0, 60.0, lo_open=True, hi_open=True):
            raise InputError(source, where, f"{v!r}: a measured time must be a number of seconds in (0, 60)")
    if not src.overhead:
        raise InputError(source, "overhead", "absent: not a calibration's record")
    return {"overhead_draws": draws, "recompute_draws": rdraws, "fsdp_draws": fdraws, "alive_draws": adraws,
            "checkpoint_region_us": regions, "fsdp_unit": unit, "alive": alive, "alive_held_mib": held,
            "microbatch_draws": mdraws, "split_draws": sdraws, "split_model": smodel, "microbatch_host": mhost,
            "microbatch_ops": mops}


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
    c = checked_compute(src, source)
    draws, rdraws, fdraws, adraws = c["overhead_draws"], c["recompute_draws"], c["fsdp_draws"], c["alive_draws"]
    regions, unit, alive, held = c["checkpoint_region_us"], c["fsdp_unit"], c["alive"], c["alive_held_mib"]
    mdraws, sdraws, smodel, mhost, mops = (c["microbatch_draws"], c["split_draws"], c["split_model"],
                                           c["microbatch_host"], c["microbatch_ops"])
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
                            alive_draws=[list(d) for d in adraws], alive=dict(alive), alive_held_mib=list(held),
                            microbatch_draws=[list(d) for d in mdraws], microbatch_ops=list(mops),
                            microbatch_host=dict(mhost),
                            split_draws=[list(d) for d in sdraws], split_model=asdict(smodel) if smodel else {},
                            probe_s=compute_draw, probe_draws_s=[compute_draw],
                            harness=dict(src.harness), device_kernel_s=src.device_kernel_s)


def run_microbenchmarks(world: int, gemm_shapes, mem_sizes, coll_sizes, *, attn_shapes=(), topk=(), runtime=None,
                        repeats: int = 5, threads: int | None = None, backend: str | None = None,
                        timeout_s: float = 600.0, progress=None, compute_from: tuple | None = None,
                        alive_model: ModelSpec | None = None) -> MicrobenchResult:
    """Run (a)-(d) in ``world`` processes; compute medians over ranks. ``runtime``
    (costmodel.profile.RuntimeSettings) decides how the cost model counts the chain's ops.
    ``compute_from``: (MicrobenchResult, its file name) whose compute families to take
    instead of measuring them again (reused_compute); the collectives are measured.
    ``alive_model``: the model whose layers the compute workers time against the
    activations held (alive_bench.alive_drawer); None: not measured."""
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
    from validate.alive_bench import ALIVE_DEPTHS, SPLIT_SPANS, alive_held_mib
    from validate.compute_bench import ComputeConfig, compute_worker
    from validate.host_draws import chain_op_counts, checkpoint_region_us, microbatch_ops
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
    res.device_kernel_s = statistics.median(r.get("device_kernel", 0.0) for r in per_rank)
    res.harness = {kind: statistics.median(r["harness"][i][1] for r in per_rank)
                   for i, (kind, _) in enumerate(per_rank[0]["harness"])}
    n_fwd, n_train = chain_op_counts(runtime or RuntimeSettings())
    # Each draw of the overhead chain the median over the processes, and the figure the
    # median over the draws (compute_bench.compute_worker).
    res.overhead_draws = _draws_over_ranks(per_rank, "overhead_draws", 2)
    for i, (what, ops) in enumerate((("plain", n_fwd), ("train", n_train))):
        res.overhead.append(OverheadSample(what, ops, statistics.median(d[i] for d in res.overhead_draws)))
    res.microbatch_draws = _draws_over_ranks(per_rank, "microbatch_draws", 2)
    if res.microbatch_draws:
        res.microbatch_ops = microbatch_ops(runtime or RuntimeSettings())
        res.microbatch_host = microbatch_figure(res)  # before the regions: they price ops without it
    res.recompute_draws = _draws_over_ranks(per_rank, "recompute_draws", 3)
    if res.recompute_draws:
        steps = [statistics.median(d[i] for d in res.recompute_draws) for i in range(3)]
        res.checkpoint_region_us = checkpoint_region_us(steps, train_per_op_s(res), runtime or RuntimeSettings())
    res.fsdp_draws = _draws_over_ranks(per_rank, "fsdp_draws", 4)
    res.alive_draws = _draws_over_ranks(per_rank, "alive_draws", len(ALIVE_DEPTHS))
    if res.alive_draws and alive_model is not None:
        res.alive_held_mib = alive_held_mib(alive_model)
    res.split_draws = _draws_over_ranks(per_rank, "split_draws", len(SPLIT_SPANS))
    if res.split_draws and alive_model is not None:
        res.split_model = asdict(alive_model)
    return fit_draw_figures(res)


def split_model(res: MicrobenchResult, source: str):
    """The ModelSpec whose stage ``res``'s split draws timed (checked as any model file is:
    InputError naming ``source`` and the field), or None where the record has none."""
    if not res.split_model:
        return None
    from specs.model import model_from_mapping
    if not isinstance(res.split_model, dict):
        raise InputError(source, "split_model", "expected a model's fields")
    return model_from_mapping(res.split_model, f"{source} (split_model)")


def train_per_op_s(res: MicrobenchResult) -> float:
    """The overhead chain's training cost per cost-model op (OverheadSample 'train'), less
    its per-microbatch share where the record measured one (microbatch_host: the chain's
    CHAIN_MICROBATCHES microbatches each cost that much besides their ops): what the
    simulator charges an op, which is priced apart from the microbatch
    (RuntimeSettings.microbatch_host_us). calibrate.per_op_overheads and the checkpoint
    regions' fit both take it from here."""
    from validate.host_draws import CHAIN_MICROBATCHES
    train = next((o for o in res.overhead if o.what == "train"), None)
    if train is None:
        return res.overhead[0].per_op_s if res.overhead else 0.0
    per_mb_s = res.microbatch_host.get("us", 0.0) * 1e-6
    return max(0.0, (train.seconds - CHAIN_MICROBATCHES * per_mb_s) / train.model_ops)


def microbatch_figure(res: MicrobenchResult) -> dict:
    """host_draws.microbatch_host_fit of the medians of ``res``'s microbatch draws, or
    what ``res`` holds where it lacks the draws or their op counts."""
    from validate.host_draws import microbatch_host_fit
    if not res.microbatch_draws or len(res.microbatch_ops) != 2:
        return res.microbatch_host
    return microbatch_host_fit([statistics.median(d[i] for d in res.microbatch_draws) for i in range(2)],
                               res.microbatch_ops)


def fit_draw_figures(res: MicrobenchResult) -> MicrobenchResult:
    """``res`` with the figures fitted to its own draws: FSDP's unit cost from the medians
    of its fsdp_draws (host_draws.fsdp_unit_costs) and the alive law from the medians of
    its alive_draws against the MiB held (alive_bench.fit_alive_law) and the per-microbatch
    host cost from the medians of its microbatch_draws (host_draws.microbatch_host_fit), each where the
    record has what it needs, else as it was. What calibration does once the draws are
    taken, and what a refit of a saved record does (benchmarks/repredict.py --refit)."""
    from validate.alive_bench import ALIVE_DEPTHS, fit_alive_law
    from validate.host_draws import fsdp_unit_costs
    out = replace(res)
    out.microbatch_host = microbatch_figure(res)
    if res.fsdp_draws:
        out.fsdp_unit = fsdp_unit_costs([statistics.median(d[i] for d in res.fsdp_draws) for i in range(4)])
    if res.alive_draws and len(res.alive_held_mib) == len(ALIVE_DEPTHS):
        out.alive = fit_alive_law([statistics.median(d[i] for d in res.alive_draws) for i in range(len(ALIVE_DEPTHS))],
                                  res.alive_held_mib)
    return out


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
        # (handoff_bench.posted_rows): the validator's runtime has no rendezvous to price with them.
        more = []
        if after:
            more = [("after-compute streams", replace(kcfg, sizes=(), ops=(), busy_calls=0, posted_busy_idle=False))
                    ] * (AFTER_COMPUTE_LAUNCHES - 1)
            if kcfg.posted:
                more += [("pipeline handoffs and 2-rank all-reduce after compute",
                          replace(kcfg, sizes=(), ops=(), busy_calls=0, group_sizes=(2,),
                                  after_compute_ops=HANDOFF_LAUNCH_OPS, after_compute_calls=HANDOFF_LAUNCH_CALLS,
                                  straggler_reps=0, posted_busy_idle=False,
                                  probe=i < DRAW_LAUNCHES, overhead_chain=i < DRAW_LAUNCHES))
                         for i in range(AFTER_COMPUTE_LAUNCHES, POSTED_LAUNCHES)]
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
    """Append the probe draw of each collective launch that took one (PROBE_OP rows: the
    first DRAW_LAUNCHES; one launch's is its row, several launches' are in launch_samples)
    to res.probe_draws_s, and make res.probe_s their median with the compute worker's
    (validate/probe.py)."""
    several = [ss for op, _, _, ss in res.launch_samples if op == PROBE_OP]
    draws = several[0] if several else [s for op, _, _, s in rows if op == PROBE_OP]
    res.probe_draws_s = list(res.probe_draws_s or ([res.probe_s] if res.probe_s > 0 else [])) + [float(d) for d in draws]
    probe_from_draws(res)


def probe_from_draws(res: MicrobenchResult) -> None:
    """res.probe_s set to the median of res.probe_draws_s's positive draws (left where there
    are none): the calibrated probe is the median of its draws (validate/probe.py)."""
    good = [d for d in res.probe_draws_s if d > 0]
    if good:
        res.probe_s = float(statistics.median(good))


def overhead_from_draws(res: MicrobenchResult) -> None:
    """Each res.overhead figure (plain, train) set to the median of its res.overhead_draws
    (left where there are no draws or the record has not both figures)."""
    if res.overhead_draws and len(res.overhead) == 2:
        res.overhead = [replace(o, seconds=float(statistics.median(d[i] for d in res.overhead_draws)))
                        for i, o in enumerate(res.overhead)]


def _pool_overhead_draws(res: MicrobenchResult, rows: list) -> None:
    """Append the overhead-chain draw of each collective launch that took one (the first
    DRAW_LAUNCHES; [plain s, train s] from its OVERHEAD_PLAIN_OP / OVERHEAD_TRAIN_OP rows,
    one launch's or each launch's in
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
    overhead_from_draws(res)


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


def with_first_launches(res: MicrobenchResult, launches: int, rows: bool = True) -> MicrobenchResult:
    """A copy of ``res`` as if its collective calibration had stopped after its first
    ``launches`` launches (benchmarks/repredict.py --first-launches, --draw-launches): the
    speed-probe and overhead-chain draws of the later launches dropped (the compute
    worker's own draws, which come first, kept), and with ``rows`` every row timed in more
    launches merged by the median of its first ``launches`` only. What fewer launches would
    have fitted, tried on measurements already taken."""
    if launches < 1:
        raise ValueError(f"launches must be >= 1, got {launches}")
    out = replace(res)
    if rows and res.launch_samples:
        out = with_launch_aggregate(res, lambda ss: statistics.median(ss[:launches]))
        out.launch_samples = [[op, n, nbytes, list(ss[:launches])] for op, n, nbytes, ss in res.launch_samples]
    several = {op: ss for op, _, _, ss in res.launch_samples if op in (PROBE_OP, OVERHEAD_PLAIN_OP)}
    if PROBE_OP in several and res.probe_draws_s:
        keep = len(res.probe_draws_s) - len(several[PROBE_OP]) + launches
        out.probe_draws_s = list(res.probe_draws_s[:keep])
        probe_from_draws(out)
    if OVERHEAD_PLAIN_OP in several and res.overhead_draws and len(res.overhead) == 2:
        keep = len(res.overhead_draws) - len(several[OVERHEAD_PLAIN_OP]) + launches
        out.overhead_draws = [list(d) for d in res.overhead_draws[:keep]]
        overhead_from_draws(out)
    return out


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
