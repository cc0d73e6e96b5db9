"""Compute against the activations a pipeline stage holds (the alive law, mechanism 49 of
docs/validation-cpu.md) and the model's own stage as the runner trains it (the split
draws, mechanism 57): the draws a calibration's compute worker takes (compute_bench.py)
and the fits that turn them into profile figures.

torch is imported inside the functions only: this module imports without it.
"""
from __future__ import annotations

import math
import statistics

from costmodel.shapes import ModelSpec
from sim.schedules import mean_alive, one_f_one_b
from validate.bench_timing import interleaved_drawer
from validate.collective_bench import MIB
from validate.host_draws import stage_trainer


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
    order (interleaved_drawer's settle): a plan's stage runs one order step after step,
    and the first step of an order right after a deeper one is slower than the next."""
    fns = [stage_trainer(model, ALIVE_LAYERS, ALIVE_MICROBATCHES, dev, actions=one_f_one_b(d, ALIVE_MICROBATCHES)[0])[2]
           for d in ALIVE_DEPTHS]
    return interleaved_drawer(torch, fns, repeats, dsync, settle=True)


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
