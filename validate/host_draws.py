"""The runner's host costs, drawn in a calibration's compute worker (compute_bench.py):
the overhead chain (the runner's whole GPT at a width where its arithmetic is negligible,
so its time is the cost of issuing its ops), the per-microbatch host cost, activation
checkpointing's own cost and FSDP's per-unit cost, each with the fit that turns its draws
into a profile figure. Every draw trains through the runner's own code
(stage_trainer: validate/pp.PipelineStage, validate/dp.GradReducer, validate/fsdp.FSDP).

torch is imported inside the functions only: this module imports without it.
"""
from __future__ import annotations

from dataclasses import replace

from costmodel import flops as fl
from costmodel.shapes import ModelSpec
from validate.bench_timing import interleaved_drawer


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
    return interleaved_drawer(torch, fns, repeats * 2, dsync)


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
    return interleaved_drawer(torch, [_chain_trainer(dev, r)[2] for r in RECOMPUTE_KINDS], repeats, dsync)


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
    return interleaved_drawer(torch, fns, repeats, dsync)


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


def chain_drawer(torch, dev, dsync, repeats: int):
    """A function that takes one draw of the overhead chain (CHAIN_MODEL) on this process:
    [plain forward s, forward + backward s], each the median of ``repeats`` x 2 windows of
    about COMPUTE_WINDOW_S, both with the runner's own code (so its per-parameter gradient
    hooks are in the figure), their windows interleaved (plain, train, plain, ...) so that
    both see the same host. Calibration takes such draws spread over its compute worker
    and at the start of every collective launch, and its figure is their median, as the
    probe's is over its draws (validate/probe.py, validate/microbench.py)."""
    return interleaved_drawer(torch, chain_functions(torch, dev), repeats * 2, dsync)
