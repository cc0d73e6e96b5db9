"""The host's speed now against its speed at calibration: a short fixed compute probe.

A profile is fitted to microbenchmarks taken at one moment; a plan validated minutes later
may meet a host that computes at another speed. On this project's 2-vCPU virtual machine
the same forward-and-backward loop in one process took 42.9 and 43.1 ms in two launches,
and 49.0 and 49.9 ms in two launches ten minutes later, no other job running: the VM's neighbours and clocks
move under it. Any cluster drifts the same way (a node throttled, a neighbour busy).

So calibration times a probe (``probe_s``) in every compute worker, and the validator's
runner times the same probe in every rank right before its steps and right after them; the
run's figure is the median of those of all its launches (run_probe_s). The
ratio, run over calibration, is how much slower the host computes now; the validator
predicts with the profile's compute slowed by that factor (sim/core_sharing.slowed_profile:
every rate divided, every per-op cost multiplied), prints it, and can be told not to
(``plansim validate --no-drift-correction``).

The probe is the two things a small plan's compute is made of: the runner's own training
code on a model of width 8 (the per-op host cost, validate/host_draws.CHAIN_MODEL) and
GEMMs at a transformer layer's shape (64 tokens, 128 -> 512) cycled through operands
beyond L2, each a fixed amount of work; its time is the median of PROBE_REPEATS repeats.
It never runs the plan's model, so the prediction stays a prediction.

Calibration's baseline is the median over several draws taken across the calibration: the
compute worker's, and one at the start of every collective launch (fresh processes each,
as the runner's ranks are), so a calibration spans up to 9 draws over its minutes (the
compute launch, 3 after-compute launches and 5 handoff launches at an even world). One
probe is one moment: on a third host (an AMD EPYC 2-vCPU guest, 2026-12-02) a one-second
median of the same GEMM loop moved 8.1-13.4 ms within 20 s, the probe read 10.8-18.0 ms in
consecutive calls of one process, and a calibration whose single probe caught a fast
moment (9.83 ms against 14.2 in the next) set a drift factor of 1.5-1.7 on every
2-process plan and over-predicted them by 16-37 %.

The collectives drift too, and not with the compute: on the seventh host type the
calibration's 32 KiB 2-rank all-reduce after compute moved between calibrations by about
twice what its own launches scatter, and not with the speed probe (scaling call costs by the
compute's factor made tp=2 worse, session 27). So the runner also times that row itself
beside each plan's steps (call_probe_s), and the validator scales the fabric's call costs
by its ratio to the calibrated figure, one factor per profile (call_drift;
docs/validation-cpu.md mechanism 59).
"""
from __future__ import annotations

import statistics
import time

PROBE_REPEATS = 25
PROBE_GEMM = (64, 512, 128)  # m tokens, n outputs, k inputs: one MLP up-projection of width 128
PROBE_GEMM_SETS = 16  # 16 x (64x128 + 512x128) fp32 = 4.7 MB of operands, beyond a core's L2
# The ratio is used within these bounds; beyond them the probe is not measuring drift
# (another program took the host, or the run is on another machine than the profile's).
DRIFT_MIN, DRIFT_MAX = 0.5, 2.0


def probe_s(dev=None, dsync=None) -> float:
    """One probe on this process: median seconds of (the chain's training step, then
    PROBE_GEMM_SETS GEMMs) over PROBE_REPEATS repeats, after two unmeasured ones."""
    import torch

    from validate.host_draws import chain_functions
    dev = dev if dev is not None else torch.device("cpu")
    _, train = chain_functions(torch, dev)
    m, n, k = PROBE_GEMM
    gen = torch.Generator().manual_seed(0)
    a = [torch.randn(m, k, generator=gen).to(dev) for _ in range(PROBE_GEMM_SETS)]
    w = [torch.randn(n, k, generator=gen).to(dev) for _ in range(PROBE_GEMM_SETS)]

    def unit():
        train()
        with torch.no_grad():
            for x, y in zip(a, w):
                torch.nn.functional.linear(x, y)
        if dsync is not None:
            dsync()

    times = []
    for i in range(PROBE_REPEATS + 2):
        t0 = time.perf_counter()
        unit()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_in_rounds(world: int, kind: str, device=None, dsync=None) -> float:
    """probe_s on this rank, taken as calibration's compute is (in_rounds). Every rank of
    the world must call it."""
    return in_rounds(world, kind, lambda: probe_s(device, dsync))


def in_rounds(world: int, kind: str, fn):
    """fn() on this rank, run as calibration's compute is: at most as many processes of
    this host at once as calibration ran its compute in (microbench.compute_processes),
    the host's ranks in rounds (each rank in one), every rank at each round's barrier. (All 4 ranks of a 4-process plan on 2
    cores at once would time the cores' sharing, twice the calibrated probe, not the
    host's speed.) Every rank of the world must call it."""
    import os

    import torch.distributed as dist

    from validate.launch import local_rank
    from validate.microbench import compute_processes
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    at_once = compute_processes(local, kind)
    got = None
    for r in range(-(-local // at_once)):
        dist.barrier()
        if local_rank() // at_once == r:
            got = fn()
    dist.barrier()
    return got


# The call probe: what a 2-rank all-reduce of tiny's tensor-parallel activation (mbs 1 x
# seq 64 x hidden 128 fp32 = 32 KiB) adds to a round of about 1 ms of the runner's layer
# code, as calibration times it (contention_bench.after_compute_rows; the row its handoff
# launches repeat, microbench.HANDOFF_LAUNCH_CALLS rounds a stream). Taken right before and
# after a plan's steps, beside the speed probe, in every pair of consecutive ranks at once.
CALL_PROBE_BYTES = 32 * 1024
CALL_PROBE_ROUNDS = 50


def call_probe_s(rank: int, world: int, dev=None, dsync=None, groups=None) -> float:
    """Seconds one 2-rank all-reduce of CALL_PROBE_BYTES adds to a round of the runner's
    layer code on this rank's pair (ranks 2i, 2i+1; ``groups`` their process groups, made
    by call_probe_groups), the slower rank's mean over CALL_PROBE_ROUNDS rounds; 0.0 when
    the world is odd. Every rank of the world must call it."""
    if world < 2 or world % 2:
        return 0.0
    from validate.collective_bench import CollectiveConfig
    from validate.contention_bench import after_compute_rows
    group = None if world == 2 else groups[rank // 2]
    first = rank // 2 * 2
    cfg = CollectiveConfig(sizes=(), ops=(), group_sizes=(2,), after_compute_sizes=(CALL_PROBE_BYTES,),
                           after_compute_ops=("all_reduce",), after_compute_calls=CALL_PROBE_ROUNDS,
                           after_compute_min_calls=CALL_PROBE_ROUNDS)
    other = first + 1 - (rank - first)
    rows = after_compute_rows(cfg, 2, group, first, other, other, dev, dsync)
    return float(rows[0][3])


def call_probe_figure(res) -> float:
    """The calibration's figure for the call probe, seconds: its after-compute row of a
    CALL_PROBE_BYTES 2-rank all-reduce (the median over its launches, microbench), from a
    validate/bench_record.MicrobenchResult; 0.0 when it has none (a world of 1 or 3)."""
    from validate.collective_bench import AFTER_COMPUTE_SUFFIX
    return next((float(c.seconds) for c in res.collectives if c.op == "all_reduce" + AFTER_COMPUTE_SUFFIX
                 and c.n == 2 and c.nbytes == CALL_PROBE_BYTES), 0.0)


def call_probe_groups(world: int):
    """The pairs' process groups for call_probe_s (None for a world of 2 or an odd one).
    Every rank of the world must call it, in the same order."""
    if world <= 2 or world % 2:
        return None
    import torch.distributed as dist
    return [dist.new_group([i, i + 1]) for i in range(0, world, 2)]


def run_probe_s(launch_probes: list) -> float:
    """The host's speed during a plan's run, seconds of probe: the median of every probe its
    launches took, before and after their steps ([[before, after], ...], each already the
    median over ranks); 0.0 when there are none. Why both and the median
    (docs/validation-cpu.md mechanism 42): one probe is one moment of a host whose speed
    moves by a third within minutes, and over 1,032 launches of 2026-12-01..03 the probe
    after the steps read the same host as the one before (after/before median 1.007, 0.989
    to 1.038 by plan): twice the draws, and the median against the one that caught a fast or
    slow moment."""
    got = sorted(float(x) for pair in launch_probes for x in pair if x > 0)
    return float(statistics.median(got)) if got else 0.0


def call_drift(plans: list) -> list[float | None]:
    """Each plan's call-cost factor: the median, over every call probe taken by the plans
    calibrated to the same figure (one profile: the plans of one process count), of probe
    over that figure; ``plans`` is [(launch call probes [[before, after], ...], calibrated
    call_probe_us)]. None for a plan without probes or figure, or a factor outside
    [DRIFT_MIN, DRIFT_MAX]. Pooled over the plans for the reason validation_drift is: one
    probe is a short stream (CALL_PROBE_ROUNDS rounds, 0.32-0.56 s measured), and the
    2-process plans' own read 0.71-1.05 of the calibrated figure within one validation
    (session 28, `q-3`)."""
    by_figure: dict[float, list[float]] = {}
    for launches, calibrated_us in plans:
        if calibrated_us > 0:
            by_figure.setdefault(calibrated_us, []).extend(
                float(x) / (calibrated_us * 1e-6) for pair in launches for x in pair if x > 0)
    out = []
    for launches, calibrated_us in plans:
        ratios = by_figure.get(calibrated_us) if calibrated_us > 0 and launches else None
        f = float(statistics.median(ratios)) if ratios else None
        out.append(f if f is not None and DRIFT_MIN <= f <= DRIFT_MAX else None)
    return out


def call_probe_price_s(profile, cluster) -> tuple[float, float]:
    """(the profile's price of the call probe's row, the part of it that
    sim/core_sharing.slowed_calls leaves unscaled), seconds: one CALL_PROBE_BYTES 2-rank
    all-reduce on the first node's own fabric as the cost model gives it
    (validate/calibrate.collective_time_s: the simulator's ring formula plus the call), and
    the same with every per-call cost at 0 (its bandwidth term). (0.0, 0.0) where the
    profile was calibrated without the probe's row (call_probe_us 0)."""
    if profile.runtime.call_probe_us <= 0:
        return 0.0, 0.0
    from sim.core_sharing import slowed_calls
    from validate.calibrate import collective_time_s
    node = cluster.nodes[0]

    def price(p) -> float:
        return collective_time_s("all_reduce", CALL_PROBE_BYTES, 2, node.intra_bw_Bps, node.intra_latency_s,
                                 p.fabric(node.intra_kind))
    return price(profile), price(slowed_calls(profile, 0.0))


def anchored_call_factor(f: float | None, calibrated_us: float, priced_s: float, fixed_s: float) -> float | None:
    """The factor slowed_calls takes so that the model prices the call probe's row at what
    the probes read during the run (f x the calibrated figure, f from call_drift): (f x
    calibrated - fixed) / (priced - fixed), ``priced_s`` and ``fixed_s`` from
    call_probe_price_s. Why not f itself (docs/validation-cpu.md mechanism 61): the
    profile's call costs are one least-squares fit over four sizes, and on the seventh host
    type it priced this very row 16 % above what calibration timed (1,922 us against 1,660
    in session 32's `a-1`): scaling that fit by the drift carried the fit's miss into every
    tensor-parallel call, and tp=2's calls are this row. ``f`` unchanged where there is no
    price, and where the anchor alone (the factor over f) would be outside [DRIFT_MIN,
    DRIFT_MAX]: a fit that far off its own row is not one this can mend. None stays None."""
    if f is None or calibrated_us <= 0 or priced_s <= fixed_s:
        return f
    got = (f * calibrated_us * 1e-6 - fixed_s) / (priced_s - fixed_s)
    return got if got > 0 and DRIFT_MIN <= got / f <= DRIFT_MAX else f


def call_factors(plans: list, anchor: bool = True) -> list[tuple[float | None, float]]:
    """(factor, price) per plan: the factor the validator scales the plan's call costs by
    (call_drift over the plans of its profile, anchored by anchored_call_factor unless
    ``anchor`` is False) and its profile's price of the probe's row in seconds
    (call_probe_price_s; 0.0 without one); ``plans`` is [(launch call probes [[before,
    after], ...], profile, cluster)]. The one place plansim validate and
    benchmarks/repredict.py take them from."""
    ratios = call_drift([(launches, profile.runtime.call_probe_us) for launches, profile, _ in plans])
    out = []
    for f, (_, profile, cluster) in zip(ratios, plans):
        priced, fixed = call_probe_price_s(profile, cluster)
        out.append((anchored_call_factor(f, profile.runtime.call_probe_us, priced, fixed) if anchor else f, priced))
    return out


def validation_drift(plans: list) -> float | None:
    """One drift factor for every plan of a validation: the median, over all the probes
    every plan's launches took (before and after their steps), of probe over the
    calibrated probe of that plan's profile; ``plans`` is [(launch probes [[before,
    after], ...], calibrated probe us)]. None when a plan lacks either, or the factor is
    outside [DRIFT_MIN, DRIFT_MAX]. Why one for the run and not one per plan
    (docs/validation-cpu.md mechanism 42): over the two minutes of a validation the
    probes of consecutive plans moved by more than their steps did (`v-1` of 2026-12-03,
    session 11: per-plan factors 0.84-1.18 on 2-process plans whose steps ran 113-134 ms;
    GPipe -17.3 %, top-k -14.2 %, dp=2 +13.6 %), so a plan's own probes are mostly noise
    about the host's speed through the run."""
    ratios = []
    for launches, calibrated_us in plans:
        got = [float(x) for pair in launches for x in pair if x > 0]
        if not got or calibrated_us <= 0:
            return None
        ratios += [x / (calibrated_us * 1e-6) for x in got]
    if not ratios:
        return None
    f = float(statistics.median(ratios))
    return f if DRIFT_MIN <= f <= DRIFT_MAX else None


def drift_factor(run_probe_s: float, calibrated_probe_us: float) -> float | None:
    """How much slower the host computes now than at calibration (run probe over calibrated
    probe); None when either is unknown (0) or the ratio is outside [DRIFT_MIN, DRIFT_MAX]."""
    if run_probe_s <= 0 or calibrated_probe_us <= 0:
        return None
    f = run_probe_s / (calibrated_probe_us * 1e-6)
    return f if DRIFT_MIN <= f <= DRIFT_MAX else None
