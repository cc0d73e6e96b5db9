"""The compute microbenchmarks as one worker process runs them (validate/microbench.py
starts the workers and turns what they return into samples): GEMMs, memory-bound ops,
fused attention, top-k selection in an error-feedback stream, each family's smallest call
through the same timing harness, the speed probe, and the per-op overhead chain.

torch is imported inside the functions only: this module imports without it.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace

from costmodel import flops as fl
from costmodel.shapes import ModelSpec
from sim.schedules import mean_alive, one_f_one_b
from validate.collective_bench import MIB
from validate.microbench import MEMORY_OPS, WORKER_CHAIN_DRAWS, memory_op_bytes


# The overhead chain: the runner's whole GPT (validate/gpt.py, the architecture
# costmodel/flops.py lists: embedding, pre-LayerNorm layers, final norm, logits, loss) at a
# width where its arithmetic is negligible, so its time is the cost of issuing its ops.
# 'train' runs it exactly as a plan's rank does: validate/pp.PipelineStage executing a
# one-stage schedule over CHAIN_MICROBATCHES microbatches (its per-action bookkeeping and
# timing spans), forward and backward under autograd with validate/dp.GradReducer's
# buckets (each gradient accumulated in place in its bucket, a post-accumulate hook per
# parameter counting readiness). Each time is divided by the number of ops the cost model
# lists for the same work (chain_op_counts), so the per-op figure is per cost-model op.
CHAIN_MODEL = ModelSpec("overhead-chain", num_layers=4, hidden_size=8, num_attention_heads=2, seq_length=4,
                        vocab_size=8, global_batch_size=2)
CHAIN_MICROBATCHES = 2


def chain_ops(layers: int, microbatches: int, runtime) -> tuple[int, int]:
    """(forward ops of one microbatch, forward + backward ops of ``microbatches``) the cost
    model counts for CHAIN_MODEL cut to ``layers`` layers on one device (every layer,
    embedding and output layer) under ``runtime`` (its op transforms, e.g. fused
    attention, and the separate gradient accumulation pass)."""
    from costmodel.efficiency import transform_ops
    from sim.program import grad_accumulation_ops
    m, L = replace(CHAIN_MODEL, num_layers=layers), layers
    f = (len(transform_ops(fl.layer_forward_ops(m, 1, 1, False, 4), runtime)) * L
         + len(transform_ops(fl.embedding_ops(m, 1, 1, 4), runtime))
         + len(transform_ops(fl.head_forward_ops(m, 1, 1, 4), runtime)))
    b = (len(transform_ops(fl.layer_backward_ops(m, 1, 1, False, 4), runtime)) * L
         + len(transform_ops(fl.embedding_backward_ops(m, 1, 1, 4), runtime))
         + len(transform_ops(fl.head_backward_ops(m, 1, 1, 4), runtime))
         + len(transform_ops(grad_accumulation_ops(m, L, 1, True, True, "fp32", runtime), runtime)))
    return f, microbatches * (f + b)


def chain_op_counts(runtime) -> tuple[int, int]:
    """chain_ops of the overhead chain itself (CHAIN_MODEL's layers, CHAIN_MICROBATCHES)."""
    return chain_ops(CHAIN_MODEL.num_layers, CHAIN_MICROBATCHES, runtime)


# The per-microbatch host cost (RuntimeSettings.microbatch_host_us): the overhead chain's
# training step at two shapes, (layers, microbatches), its own and one of a layer and four
# times the microbatches, whose ops a microbatch differ about threefold (118 and 40 as the
# cost model counts them). Timed interleaved, t = a x ops + F x microbatches separates the
# cost paid per op from the cost paid per microbatch (microbatch_host_fit). Measured with
# five shapes (results/validate-cpu-2026-12-06-s21/ab/chain-out.txt): 12.6 us an op and
# 105 us a microbatch fit every shape within 3 %, where one per-op rate missed by -7..+10 %.
MICROBATCH_SHAPES = ((CHAIN_MODEL.num_layers, CHAIN_MICROBATCHES), (1, 4 * CHAIN_MICROBATCHES))


def microbatch_drawer(torch, dev, dsync, repeats: int):
    """A function that takes one draw of the overhead chain's training step at each of
    MICROBATCH_SHAPES ([seconds, seconds]; interleaved windows as the chain's own)."""
    fns = [stage_trainer(replace(CHAIN_MODEL, num_layers=L, global_batch_size=max(mb, CHAIN_MODEL.global_batch_size)),
                         L, mb, dev)[2] for L, mb in MICROBATCH_SHAPES]
    return _interleaved_drawer(torch, fns, repeats * 2, dsync)


def microbatch_ops(runtime) -> list[int]:
    """Ops the cost model counts for each of MICROBATCH_SHAPES' steps (chain_ops). Kept in
    the calibration's record (MicrobenchResult.microbatch_ops), so a refit needs no runtime."""
    return [chain_ops(L, mb, runtime)[1] for L, mb in MICROBATCH_SHAPES]


def microbatch_host_fit(steps_s: list[float], ops: list[int]) -> dict[str, float]:
    """{'us': F, 'per_op_us': a}: the two shapes' step times (seconds, MICROBATCH_SHAPES'
    order) solved for t = a x ops + F x microbatches. F is never below 0 (then a is the
    first shape's time over its ops), nor a below 0 (then F takes the first shape's time
    over its microbatches)."""
    (n1, n2), (m1, m2) = ops, [mb for _, mb in MICROBATCH_SHAPES]
    t1, t2 = steps_s
    det = n1 * m2 - n2 * m1
    a = (t1 * m2 - t2 * m1) / det if det else t1 / n1
    f = (n1 * t2 - n2 * t1) / det if det else 0.0
    if f < 0:
        a, f = t1 / n1, 0.0
    elif a < 0:
        a, f = 0.0, t1 / m1
    return {"us": f * 1e6, "per_op_us": a * 1e6}


def stage_trainer(model, layers: int, microbatches: int, dev, recompute: str = "none", schedule: str = "1f1b",
                  actions=None, fsdp: bool = False, optimizer: bool = False):
    """(chunk, microbatches, one training step) of ``layers`` layers of ``model`` (with the
    embedding and the output layer and loss) as the runner trains a one-stage pipeline
    on one rank: validate/pp.PipelineStage executing ``schedule``'s action list over
    ``microbatches`` microbatches of one sequence (or ``actions``, an action list of chunk 0
    from sim/schedules.py, when given), validate/dp.GradReducer's buckets (or, when
    ``fsdp``, validate/fsdp.FSDP over a group of one: every unit gathered, viewed, hooked
    and reduced as at zero=3, nothing communicated), ``recompute`` applied as the runner
    applies it; ``optimizer``: each step ends with the runner's Adam over the stage's
    weights (validate/dp.GradReducer.step), as a plan's step does."""
    from validate.comm import Comm
    from validate.dp import GradReducer
    from validate.fsdp import FSDP, ShardedChunk
    from validate.gpt import GPTChunk, batch_tokens, full_weights
    from validate.pp import PipelineStage
    from validate.timeline import Recorder
    rec = Recorder()
    chunk = (ShardedChunk if fsdp else GPTChunk)(model, list(range(layers)), True, True, full_weights(model, 0), None,
                                                 False, recompute, dev)
    reducer = (FSDP({0: chunk}, Comm("dp", [0], 0, rec)) if fsdp else
               GradReducer([(0, chunk.params)], Comm("dp", [0], 0, rec), bucket_bytes=25e6,
                           overlap=True, zero=0, topk=None, late=set()))
    stage = PipelineStage(0, 1, 1, {0: chunk}, lambda st: 0, (1, model.seq_length, model.hidden_size), rec,
                          reducer, dev)
    acts = list(actions) if actions is not None else stage.actions(schedule, microbatches)
    tokens = batch_tokens(model, 0, 0).to(dev)
    mbs = [(tokens[i:i + 1, :-1], tokens[i:i + 1, 1:]) for i in range(microbatches)]

    steps = [0]

    def train() -> dict:
        rec.begin_step()
        reducer.begin_step()
        stage.run(acts, mbs, 1.0 / microbatches)
        reducer.mark_late_ready()
        reducer.finish()
        if optimizer:
            steps[0] += 1
            reducer.step(steps[0])
        return rec.end_step()  # the step's timing record (validate/timeline.Recorder)
    return chunk, mbs, train


def _chain_trainer(dev, recompute: str = "none"):
    """stage_trainer of CHAIN_MODEL, every layer, CHAIN_MICROBATCHES microbatches."""
    return stage_trainer(CHAIN_MODEL, CHAIN_MODEL.num_layers, CHAIN_MICROBATCHES, dev, recompute)


def chain_functions(torch, dev):
    """CHAIN_MODEL as the runner trains it on one rank (see above). Returns (plain forward
    of one microbatch, one step of CHAIN_MICROBATCHES microbatches)."""
    chunk, mbs, train = _chain_trainer(dev)

    def plain():
        with torch.no_grad():
            chunk.forward(*mbs[0])
    return plain, train


# Activation checkpointing's own cost: the chain trained with recompute none, full and
# selective, in this order (RuntimeSettings.checkpoint_*_region_us).
RECOMPUTE_KINDS = ("none", "full", "selective")


def recompute_drawer(torch, dev, dsync, repeats: int):
    """A function that takes one draw of the chain's training step under each of
    RECOMPUTE_KINDS: [seconds] in that order, each the median of ``repeats`` windows of
    about COMPUTE_WINDOW_S, interleaved (none, full, selective, none, ...) so that all
    three see the same host (3 x repeats windows of about 30 ms a draw: calibration's share
    of the benchmark's 5 minutes stays small). At width 8 the recomputed ops cost what issuing them costs,
    so a region's figure (checkpoint_region_us) is what the checkpointing itself adds."""
    return _interleaved_drawer(torch, [_chain_trainer(dev, r)[2] for r in RECOMPUTE_KINDS], repeats, dsync)


def checkpoint_region_us(steps_s: list[float], train_per_op_s: float, runtime) -> dict[str, float]:
    """{'full': us, 'selective': us}: what one checkpointed region adds besides its
    recomputed ops, from the chain's step under RECOMPUTE_KINDS (``steps_s``, seconds) and
    the chain's per-op training cost (OverheadSample 'train'). Each recomputed op the cost
    model lists for the region (costmodel/flops.recompute_ops under ``runtime``'s op
    transforms) is priced at that per-op cost, as the simulator prices it at this width;
    the rest of the difference from the plain step, per region (one a layer and
    microbatch), is the region's. Never below 0."""
    from costmodel.efficiency import transform_ops
    m = CHAIN_MODEL
    regions = m.num_layers * CHAIN_MICROBATCHES
    none = steps_s[0]
    out = {}
    for kind, t in zip(RECOMPUTE_KINDS[1:], steps_s[1:]):
        n_ops = len(transform_ops(fl.recompute_ops(m, 1, 1, False, kind, 4), runtime))
        out[kind] = max(0.0, ((t - none) / regions - n_ops * train_per_op_s) * 1e6)
    return out


# FSDP's own cost (RuntimeSettings.fsdp_unit_us, fsdp_unit_us_per_mib): the runner's
# whole GPT trained at zero=3 on one process and plainly (stage_trainer), at two widths:
# CHAIN_MODEL, whose units' bytes are negligible (the fixed part), and FSDP_WIDE_MODEL,
# whose layer units hold 0.19 MiB of fp32 weights (the part per MiB). Neither is a model a
# plan runs: the fit is a prediction for every other width.
# Microbatches of an FSDP draw's step: a unit's first microbatch of a step costs more (its
# gradient's first reduction allocates), so a step of several, as a plan's replica runs.
FSDP_MICROBATCHES = 8
FSDP_WIDE_MODEL = ModelSpec("fsdp-chain", num_layers=4, hidden_size=64, num_attention_heads=2, seq_length=16,
                            vocab_size=64, global_batch_size=FSDP_MICROBATCHES)
FSDP_MODELS = (replace(CHAIN_MODEL, global_batch_size=FSDP_MICROBATCHES), FSDP_WIDE_MODEL)


def fsdp_drawer(torch, dev, dsync, repeats: int):
    """A function that takes one draw of [plain s, zero=3 s] for each of FSDP_MODELS (a
    training step of FSDP_MICROBATCHES microbatches, stage_trainer), interleaved windows
    as recompute_drawer's, in that order (4 figures)."""
    fns = [stage_trainer(m, m.num_layers, FSDP_MICROBATCHES, dev, fsdp=z)[2] for m in FSDP_MODELS for z in (False, True)]
    return _interleaved_drawer(torch, fns, repeats, dsync)


def fsdp_unit_costs(steps_s: list[float]) -> dict[str, float]:
    """{'us': fixed us, 'us_per_mib': us per MiB}: what taking one FSDP unit into use adds,
    from fsdp_drawer's four step times (seconds). Each step takes every unit of its model
    into use twice a microbatch (forward, backward): with U units holding P MiB of fp32
    weights in all, a step's extra time is 2 x FSDP_MICROBATCHES x (U x us + P x us_per_mib);
    the two models give two such equations, solved exactly, each figure never below 0."""
    from costmodel.dtypes import DTYPE_BYTES
    from sim.program import fsdp_units
    rows = []
    for i, m in enumerate(FSDP_MODELS):
        extra_us = (steps_s[2 * i + 1] - steps_s[2 * i]) / (2 * FSDP_MICROBATCHES) * 1e6
        layer_units, outer = fsdp_units(m, m.num_layers, 1, True, True)  # as the simulator charges them
        units = len(layer_units) + (1 if outer > 0 else 0)
        rows.append((units, (sum(layer_units) + outer) * DTYPE_BYTES["fp32"] / 2**20, extra_us))
    (u1, p1, e1), (u2, p2, e2) = rows
    det = u1 * p2 - u2 * p1
    per_mib = max(0.0, (u1 * e2 - u2 * e1) / det)
    fixed = max(0.0, (e1 - p1 * per_mib) / u1)
    return {"us": fixed, "us_per_mib": per_mib}


# Compute against the activations held (RuntimeSettings.alive_knee_mib,
# alive_slowdown_per_doubling): ALIVE_LAYERS layers of the model with its embedding and
# output layer (stage_trainer), ALIVE_MICROBATCHES microbatches in stage 0's order of a
# d-stage 1F1B for each d of ALIVE_DEPTHS (sim/schedules.one_f_one_b: d forwards before the
# first backward; d = ALIVE_MICROBATCHES is every forward first). Three layers are no stage
# of a plan of the bundled tiny model (pp=2 holds two, pp=4 one) and the order is none of
# a plan's: the fit is a prediction for every stage. Only where such a step is cheap
# (ALIVE_MAX_PARAMS, ALIVE_MAX_MIB) and on CPU workers, whose caches the effect is about.
ALIVE_LAYERS = 3
ALIVE_MICROBATCHES = 12
ALIVE_DEPTHS = (1, 3, 6, 12)
ALIVE_MAX_PARAMS = 4_000_000  # weights of the three layers and the ends (tiny: 0.67 M)
ALIVE_MAX_MIB = 8.0  # activations one microbatch keeps (tiny: 1.7 MiB)


def alive_model(model: ModelSpec | None) -> ModelSpec | None:
    """``model`` when the alive draws can run on it here (ALIVE_MAX_PARAMS and ALIVE_MAX_MIB
    for ALIVE_LAYERS layers, at least that many layers), else None."""
    from costmodel.memory import stage_params
    if model is None or model.num_layers < ALIVE_LAYERS or model.global_batch_size < ALIVE_MICROBATCHES:
        return None
    if stage_params(model, ALIVE_LAYERS, 1, True, True) > ALIVE_MAX_PARAMS:
        return None
    return model if alive_stage_bytes(model) <= ALIVE_MAX_MIB * MIB else None


def alive_stage_bytes(model: ModelSpec) -> float:
    """Activation bytes one microbatch of the alive draws' stage keeps, as device memory
    counts them for the runner: a one-rank fp32 plan under the CPU runner's runtime facts
    (validate/profile_file.runtime_facts), its memory settings as the program takes them
    (sim/program.memory_config)."""
    from costmodel.device_memory import ChunkSpec, chunk_activation_bytes
    from costmodel.profile import RuntimeSettings
    from sim.program import memory_config
    from specs.plan import resolve_plan
    from validate.profile_file import runtime_facts
    cfg = memory_config(resolve_plan("precision=fp32", model, 1), RuntimeSettings(**runtime_facts("cpu")))
    return chunk_activation_bytes(model, cfg, ChunkSpec(ALIVE_LAYERS, True, True))


def alive_drawer(torch, dev, dsync, repeats: int, model: ModelSpec):
    """A function that takes one draw of the alive stage's training step at each of
    ALIVE_DEPTHS (seconds, in that order), each window after an untimed step of its own
    order (_interleaved_drawer's settle): a plan's stage runs one order step after step,
    and the first step of an order right after a deeper one is slower than the next."""
    fns = [stage_trainer(model, ALIVE_LAYERS, ALIVE_MICROBATCHES, dev, actions=one_f_one_b(d, ALIVE_MICROBATCHES)[0])[2]
           for d in ALIVE_DEPTHS]
    return _interleaved_drawer(torch, fns, repeats, dsync, settle=True)


# The spans each split draw reports, in order (split_drawer).
SPLIT_SPANS = ("forward", "backward", "optimizer")


def split_drawer(torch, dev, repeats: int, model: ModelSpec):
    """A function that takes one draw of the alive stage's training step in the shallowest
    order (ALIVE_DEPTHS[0]: one microbatch in flight, nothing held beyond it), each step
    closed by the runner's Adam as a plan's is: [forward s, backward s] a microbatch and
    [optimizer s] a step, each the median over 2 x ``repeats`` steps of the runner's own
    spans (validate/pp.PipelineStage's 'forward' and 'backward', validate/dp.GradReducer's
    'optimizer'), the first two divided by ALIVE_MICROBATCHES. What a plan's stage
    computes, as its trace times it, to set against what the cost model prices for the
    same stage (validate/calibrate.stage_scales; RuntimeSettings.forward_scale). CPU
    workers only (as the alive draws): the spans read the host's clock without a device sync."""
    train = stage_trainer(model, ALIVE_LAYERS, ALIVE_MICROBATCHES, dev,
                          actions=one_f_one_b(ALIVE_DEPTHS[0], ALIVE_MICROBATCHES)[0], optimizer=True)[2]

    def draw() -> list[float]:
        times = {k: [] for k in SPLIT_SPANS}
        with torch.enable_grad():  # some draws are taken inside the rates' no_grad block
            train()  # the first step after other work pays for what that left behind
            for _ in range(2 * repeats):
                detail = train()["detail_s"]
                for k in SPLIT_SPANS:
                    times[k].append(detail.get(k, 0.0))
        return [statistics.median(times[k]) / (ALIVE_MICROBATCHES if k != "optimizer" else 1) for k in SPLIT_SPANS]
    return draw


def alive_held_mib(model: ModelSpec) -> list[float]:
    """MiB of activations the alive draws' stage holds on average at each of ALIVE_DEPTHS
    (sim/schedules.mean_alive of its order, alive_stage_bytes a microbatch). Calibration
    keeps them in its record (MicrobenchResult.alive_held_mib) so that a refit needs no model."""
    per_mb = alive_stage_bytes(model)
    return [mean_alive(one_f_one_b(d, ALIVE_MICROBATCHES)[0], [per_mb]) / MIB for d in ALIVE_DEPTHS]


def alive_fit(steps_s: list[float], model: ModelSpec) -> dict[str, float]:
    """fit_alive_law of the alive draws' step times with ``model``'s bytes held."""
    return fit_alive_law(steps_s, alive_held_mib(model))


def fit_alive_law(steps_s: list[float], held_mib: list[float]) -> dict[str, float]:
    """{'knee_mib', 'per_doubling'} from the alive draws' step times (seconds, one per
    ALIVE_DEPTHS) and the MiB held at each (alive_held_mib): each depth's step over the
    shallowest's, fitted by least squares to 1 + per_doubling x max(0, log2(A / knee)):
    the knee scanned over quarter-octaves from the shallowest order's figure up to the
    second shallowest's, the slope solved for each (never below 0), the pair with the
    least squared error kept (the lower knee on a tie).
    The knee stops at the second depth so that at least two deeper depths carry the
    slope: let it reach the deepest and one noisy draw there sets it alone. Session 20's
    first calibration (Xeon host, world 2: steps 1.000, 0.985, 1.004, 1.051 x at 0.85,
    3.8, 7.2 and 10.1 MiB) fitted a knee of 8.0 MiB and 0.151 a doubling that way,
    which charges a stage holding 40 MiB +35 %; with the knee at most 3.8 MiB it is 3.4
    MiB and 0.022 a doubling (+8 % at 40 MiB), and the saved runs of that host predict
    as before (docs/validation-cpu.md, mechanism 49)."""
    xs = [h * MIB for h in held_mib]
    ys = [t / steps_s[0] - 1.0 for t in steps_s]
    best = None
    knee = xs[0]
    # The highest knee tried: the second depth's figure where two deeper ones follow it.
    in_scan = (lambda k: k <= xs[1] * (1 + 1e-9)) if len(xs) > 2 else (lambda k: k < xs[-1])
    while in_scan(knee):
        zs = [max(0.0, math.log2(x / knee)) for x in xs]
        zz = sum(z * z for z in zs)
        slope = max(0.0, sum(z * y for z, y in zip(zs, ys)) / zz) if zz > 0 else 0.0
        err = sum((y - slope * z) ** 2 for z, y in zip(zs, ys))
        if best is None or err < best[0] - 1e-15:
            best = (err, knee, slope)
        knee *= 2 ** 0.25
    _, knee, slope = best
    return {"knee_mib": knee / MIB, "per_doubling": slope}


def chain_drawer(torch, dev, dsync, repeats: int):
    """A function that takes one draw of the overhead chain (CHAIN_MODEL) on this process:
    [plain forward s, forward + backward s], each the median of ``repeats`` x 2 windows of
    about COMPUTE_WINDOW_S, both with the runner's own code (so its per-parameter gradient
    hooks are in the figure), their windows interleaved (plain, train, plain, ...) so that
    both see the same host. Calibration takes such draws spread over its compute worker
    and at the start of every collective launch, and its figure is their median, as the
    probe's is over its draws (validate/probe.py, validate/microbench.py)."""
    return _interleaved_drawer(torch, chain_functions(torch, dev), repeats * 2, dsync)


def _interleaved_drawer(torch, fns, windows: int, dsync, settle: bool = False):
    """A function that times ``fns`` in ``windows`` rounds of one window of about
    COMPUTE_WINDOW_S each, interleaved (f0, f1, .., f0, ..) so that all see the same host,
    and returns each one's median seconds per call, in order.

    ``settle``: each window follows one untimed call of its own function (f0, f0, f1, f1,
    ..), for functions that leave the process in different states, as the alive orders do
    (the deepest holds 20 MiB of tiny's activations where the shallowest holds 2): the
    call right after a switch pays for what the previous function left behind, and a
    plan never switches. Measured here (2026-12-06, two processes at once, tiny's three
    layers at 12 microbatches, medians of 12 blocks of six calls): the shallowest order
    59.1-59.9 ms right after the deepest, 56.3-57.5 ms on the calls after; the deepest
    63.0-63.9 and 62.1-63.1. Unsettled windows of one call each put the deepest order at
    1.05-1.06 x the shallowest; settled, 1.10-1.11 x, what the runner's own plans pay for
    GPipe's order over 1F1B's (tiny's dp=2 in either order: 1.06-1.18 x;
    docs/validation-cpu.md, mechanism 55). The rounds still interleave the functions: one
    block of each in turn over a whole draw let a slow second of the host put one
    depth's figure 26 % high."""
    inner = []
    for f in fns:
        f()
        t0 = time.perf_counter()
        f()
        inner.append(_inner_for(time.perf_counter() - t0))

    def draw() -> list[float]:
        times = [[] for _ in fns]
        with torch.enable_grad():  # some draws are taken inside the rates' no_grad block
            for _ in range(windows):
                for i, f in enumerate(fns):
                    if settle:
                        f()  # right after the previous function: not timed
                        if dsync:
                            dsync()
                    times[i].append(_median_time(f, 1, inner[i], dsync))
        return [statistics.median(t) for t in times]
    return draw


# ------------------------------------------------------------------------- timing
def worker_device(backend_name: str):
    """(torch device, synchronize) of this worker: its CUDA device under NCCL (asynchronous
    kernels: the clock stops only after synchronising), else the CPU (nothing to wait for)."""
    import torch
    from validate.backend import pick_backend
    from validate.launch import local_rank
    be = pick_backend(backend_name)
    dev = be.device_for(local_rank())
    if be.kind == "cuda":
        torch.cuda.set_device(dev)
        return dev, torch.cuda.synchronize
    return dev, None


def _median_time(fn, repeats: int, inner: int, sync=None) -> float:
    """Median over ``repeats`` of the mean time of ``inner`` back-to-back calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if sync is not None:
            sync()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


# A timed compute repeat lasts this long: many scheduler time slices (Linux EEVDF's base
# slice is 0.75 ms x (1 + log2 CPUs), kernel/sched/fair.c sysctl_sched_base_slice), so that
# the share of a core a worker gets while more processes than cores run (4 workers on 2
# cores, or other programs) is in the figure, as it is in a plan's step. Measured here with
# 4 workers on 2 cores: a 64x512x128 GEMM took 81 us per call in the median 2 ms window (one
# that no other process interrupted) and 317 us in 30 ms windows; alone, 81 us in both.
COMPUTE_WINDOW_S = 0.03


def _inner_for(est_s: float, target_s: float = COMPUTE_WINDOW_S) -> int:
    """Back-to-back calls per timed repeat so that one repeat lasts about target_s."""
    return max(1, min(100_000, int(target_s / max(est_s, 1e-7))))


# Operand bytes the GEMM benchmark cycles through: above a current x86 core's L2 cache
# (1-2 MiB), so weights arrive from L3 or DRAM as in a training step.
GEMM_POOL_BYTES = 8 * MIB


def _cycling(sets: int, call):
    """A no-argument function that calls call(j) for j = 0, 1, .., sets-1, 0, .. in turn."""
    state = [0]

    def f():
        j = state[0]
        state[0] = (j + 1) % sets
        return call(j)
    return f


@dataclass(frozen=True)
class ComputeConfig:
    gemm_shapes: tuple
    mem_sizes: tuple
    attn_shapes: tuple = ()
    topk: tuple = ()  # (elements, fraction) pairs
    repeats: int = 5
    threads: int = 0  # intra-op threads; 0 keeps what the worker started with
    backend: str = "gloo"
    alive_model: ModelSpec | None = None  # time its layers against the activations held (alive_drawer); None: not


def compute_worker(rank: int, world: int, cfg: ComputeConfig) -> dict:
    """One rank's compute microbenchmarks (a)-(c); every rank runs the same list at the
    same time, meeting at a barrier before each item so that they overlap."""
    import torch
    import torch.distributed as dist

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(rank)
    dev, dsync = worker_device(cfg.backend)
    sync = dist.barrier if dist.is_initialized() and world > 1 else (lambda: None)

    def timed(f):
        f()
        if dsync:
            dsync()
        t0 = time.perf_counter()
        f()
        if dsync:
            dsync()
        inner = _inner_for(time.perf_counter() - t0)
        sync()
        return _median_time(f, cfg.repeats, inner, dsync)

    # (c) the overhead chain (CHAIN_MODEL), drawn several times over the worker (chain_drawer).
    draw = chain_drawer(torch, dev, dsync, cfg.repeats)
    draws = []
    rdraw = recompute_drawer(torch, dev, dsync, cfg.repeats)
    rdraws = []
    fdraw = fsdp_drawer(torch, dev, dsync, cfg.repeats)
    fdraws = []
    adraw = alive_drawer(torch, dev, dsync, cfg.repeats, cfg.alive_model) if cfg.alive_model is not None else None
    adraws = []
    sdraw = split_drawer(torch, dev, cfg.repeats, cfg.alive_model) if cfg.alive_model is not None else None
    sdraws = []
    mdraw = microbatch_drawer(torch, dev, dsync, cfg.repeats)
    mdraws = []

    def chain_draw(with_regions: bool = False):
        sync()
        draws.append(draw())
        if with_regions:  # checkpoint regions, FSDP units and the alive stage, twice per worker (after the memory ops and at the end)
            sync()
            rdraws.append(rdraw())
            sync()
            fdraws.append(fdraw())
            sync()
            mdraws.append(mdraw())
            if adraw is not None:
                sync()
                adraws.append(adraw())
                sync()
                sdraws.append(sdraw())

    out = {"gemm": [], "memory": [], "attention": [], "topk": [], "harness": []}
    # The speed probe (validate/probe.py), every rank at once, first: the runner probes its
    # ranks fresh, before their steps, and a process that has computed for a while probes
    # slower (here, 2026-12-02, two calibrations of 2 processes: 8.5-8.9 ms at the start of
    # this worker, 9.0-9.2 ms after its GEMM, memory, attention and top-k benchmarks, where
    # the probe used to be taken; that 2-7 % went straight into the drift factor and put
    # every plan's compute that much low).
    from validate.probe import probe_s
    sync()
    out["probe"] = probe_s(dev, dsync)
    with torch.no_grad():
        # Each family's smallest call through the same timing harness: what a call costs
        # besides its work here (dispatch, the harness's Python), which the fits take out
        # of the samples before fitting rates (validate/calibrate.py). It is less than the
        # runner's per-op cost (the chain below), whose model code runs between its ops.
        one = [torch.ones(1, 1, device=dev) for _ in range(2)]
        out["harness"].append(["gemm", timed(_cycling(2, lambda j: torch.nn.functional.linear(one[j], one[1 - j])))])
        out["harness"].append(["bmm", timed(_cycling(2, lambda j: torch.bmm(one[j][None], one[1 - j][None])))])
        g1, b1 = torch.ones(1, device=dev), torch.zeros(1, device=dev)
        for op, f in (("add", lambda: torch.add(one[0], one[1])), ("gelu", lambda: torch.nn.functional.gelu(one[0])),
                      ("layernorm", lambda: torch.nn.functional.layer_norm(one[0], (1,), g1, b1)),
                      ("softmax", lambda: torch.softmax(one[0], -1))):
            out["harness"].append([f"memory:{op}", timed(f)])
        q1 = torch.ones(1, 1, 1, 1, device=dev)
        out["harness"].append(["attention", timed(lambda: torch.nn.functional.scaled_dot_product_attention(
            q1, q1, q1, is_causal=True))])
        for (m, n, k, b) in cfg.gemm_shapes:
            # As the runner calls them (validate/gpt.py: F.linear, weight [n, k]), cycling
            # through operand sets larger than a core's L2 cache together: a training step's
            # weights come from beyond it (tiny's are 3.5 MB), not from a hot L1. Measured
            # here, 64x512x128: 82 us with one hot torch.mm operand pair, 95 us this way.
            sets = max(1, min(64, math.ceil(GEMM_POOL_BYTES / (4.0 * b * (m * k + k * n)))))
            a = [torch.randn(b, m, k, device=dev) if b > 1 else torch.randn(m, k, device=dev) for _ in range(sets)]
            w = [torch.randn(b, k, n, device=dev) if b > 1 else torch.randn(n, k, device=dev) for _ in range(sets)]
            f = _cycling(sets, (lambda j: torch.bmm(a[j], w[j])) if b > 1
                         else (lambda j: torch.nn.functional.linear(a[j], w[j])))
            out["gemm"].append([m, n, k, b, timed(f)])
        chain_draw()
        for op in MEMORY_OPS:
            for elems in cfg.mem_sizes:
                row = 128 if elems % 128 == 0 else 1
                x = torch.randn(elems // row, row, device=dev)
                y = torch.randn(elems // row, row, device=dev)
                g, bta = torch.ones(row, device=dev), torch.zeros(row, device=dev)
                f = {
                    "add": lambda: torch.add(x, y),
                    "gelu": lambda: torch.nn.functional.gelu(x),
                    "layernorm": lambda: torch.nn.functional.layer_norm(x, (row,), g, bta),
                    "softmax": lambda: torch.softmax(x, -1),
                }[op]
                out["memory"].append([op, elems, memory_op_bytes(op, elems, 4, row), timed(f)])
        chain_draw(with_regions=True)
        for (bh, sq, d) in cfg.attn_shapes:
            q, k, v = (torch.randn(1, bh, sq, d, device=dev) for _ in range(3))
            f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
            out["attention"].append([bh, sq, d, timed(f)])
        from validate.topk import SelectBuffers, select
        gap = gemm_gap(torch, dev) if cfg.topk else None
        for (elems, frac) in cfg.topk:
            # A stream of selections as error feedback makes them (each step's fresh
            # gradient plus the residual the previous selection left), every rank at once
            # after a barrier, as a plan's replicas select: the time depends on the data
            # (one fixed random bucket misses that spread), so each selection is kept.
            # Between two selections a step computes (the backward whose last layers
            # fill the bucket, the optimizer, the next forward): each selection here
            # follows TOPK_GAP_S of GEMMs, as in a step, not the previous selection.
            grads = [torch.randn(elems, device=dev) for _ in range(TOPK_STREAM_GRADS)]
            k = max(1, math.ceil(frac * elems))
            residual, times, bufs = None, [], SelectBuffers.like(grads[0], k)
            for i in range(TOPK_STREAM_WARMUP + TOPK_STREAM_STEPS):
                gap()
                if dsync:
                    dsync()
                sync()
                t0 = time.perf_counter()
                _, _, residual = select(grads[i % len(grads)], residual, k, bufs)
                if dsync:
                    dsync()
                if i >= TOPK_STREAM_WARMUP:
                    times.append(time.perf_counter() - t0)
            out["topk"].append([elems, frac, times])
        chain_draw()
    chain_draw(with_regions=True)
    # Four draws (after the GEMMs, the memory ops, attention and top-k, and once more at
    # the end), [plain s, train s] each; validate/microbench.py takes each draw's median
    # over the ranks and the figure's median over the draws: one draw moved with the host
    # (4 calibrations of 2026-12-03: kernel_overhead_us 17.5-22.7, host_overhead_us
    # 7.2-14.5 at 2 processes, the plans' predicted dp=2 step 120-145 ms against 125-138
    # measured, the two moving together), where the probe's median of nine was steady.
    # Each collective launch adds one more (microbench._pool_overhead_draws).
    assert len(draws) == WORKER_CHAIN_DRAWS  # what --compute-from reuses (microbench.reused_compute)
    out["overhead_draws"] = draws
    out["recompute_draws"] = rdraws  # [none s, full s, selective s] per draw (recompute_drawer)
    out["fsdp_draws"] = fdraws  # [plain s, zero=3 s] per FSDP_MODELS model, per draw (fsdp_drawer)
    out["alive_draws"] = adraws  # [s at each of ALIVE_DEPTHS] per draw (alive_drawer); [] when not measured
    out["split_draws"] = sdraws  # [forward s, backward s] a microbatch, [optimizer s] a step, per draw (split_drawer); [] when not measured
    out["microbatch_draws"] = mdraws  # [s, s] at MICROBATCH_SHAPES per draw (microbatch_drawer)
    return out


# The top-k selection stream (compute_worker): error-feedback steps before timing (the
# residual builds up), timed steps, and distinct fresh gradients cycled through.
TOPK_STREAM_WARMUP = 2
TOPK_STREAM_STEPS = 12
TOPK_STREAM_GRADS = 4
# Seconds of GEMMs ([256, 1024] x [1024, 1024] fp32) before each selection of the stream.
# Back to back, a selection finds its residual and magnitude buffers where the last one
# left them; in a step they were last touched a whole step earlier. Measured here
# (2026-12-06, benchmarks/topk_gap.py: two processes selecting 867,072 elements x 0.1 at
# once, medians of 16): back to back 8.5-9.1 ms; after 5 ms of GEMMs 9.7-10.0; after 20
# or 40 ms 10.9-12.2; after a 20 ms sleep 12.3-12.4 (so it is the time since the buffers
# were used, not the GEMMs' cache traffic). The runner's own selections in the session-24
# validation runs (tiny dp=2 top-k:0.1, the same bucket) took 10.4-11.1 ms a step where
# this stream, back to back, had measured 7.9-9.8 in the same runs. 20 ms: about where the
# slowdown stopped growing (docs/validation-cpu.md, mechanism 56).
TOPK_GAP_S = 0.020
TOPK_GAP_GEMM = (256, 1024, 1024)  # m, k, n


def gemm_gap(torch, dev, seconds: float = TOPK_GAP_S):
    """A function that computes TOPK_GAP_GEMM GEMMs on ``dev`` for ``seconds`` (issue time:
    the caller syncs a device)."""
    m, k, n = TOPK_GAP_GEMM
    a, w = torch.randn(m, k, device=dev), torch.randn(k, n, device=dev)

    def gap():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, w)
    return gap
