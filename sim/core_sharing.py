"""Devices that share a host's cores: more worker processes than cores on one machine
(the CPU validator's 4 processes on a 2-core host).

Where every device is a process computing on the host's CPU (runtime.launch_blocking: the
op runs in the issuing thread) and a node runs more such processes than it has cores
(runtime.host_cores), the scheduler time-shares the cores: while more processes are
runnable than there are cores, each computes at cores/runnable of its own speed
(processor sharing; Linux's fair scheduler gives runnable tasks of equal weight equal
shares, kernel/sched/fair.c). A process blocked in a collective or a pipeline receive is
not runnable, so the cores it leaves go to the others.

The model, per node of n processes on c cores: a process computes C seconds of work at
full speed per step and waits W seconds (communication, pipeline neighbours); averaged
over the step, n * f*C / (f*C + W) processes want a core, and when that exceeds c each
one's compute is slowed by f = n*f*C/((f*C + W)*c), i.e.

    f = max(1, n/c - W/C)

(all n computing all the time: f = n/c; waits free the cores for the others). W itself
depends on f (a process waits for slowed peers), so the slowdown is the fixed point of
f <- max(1, n/c - W(f)/C), found by a few damped iterations over full simulations.

A wait is not always idle: over a software transport (gloo's TCP over loopback) a
process in a collective still runs on a core for a share b of the wait (the kernel
copies its messages, its threads wake and poll; runtime.comm_busy_fraction, measured by
plansim calibrate: 0.6-0.7 of the wall time with 2 processes on 2 cores). Each process
then needs C + b W core-seconds per step, and while the cores are saturated,
n (C + b W) = c (f C + W), so

    f = n/c - (1 - b n/c) W/C,   kept within [1, n/c]

which is the formula above for b = 0, and n/c whatever the waits once b n/c >= 1 (the
waits alone keep every core busy). Measured here: tp=2 x dp=2 in 4 processes on 2 cores
computed 60 ms a step where 31 ms was predicted at full speed (f = 1.9), its waits
about 6 times its compute; with b = 0, f came out 1.

The slowdown applies to compute only (the profile's device rates and per-op overheads);
collectives keep the figures calibrated at that process count (plansim calibrate
--world N measures them with N processes at once, their wake-ups included).
"""
from __future__ import annotations

from dataclasses import replace

from costmodel.profile import COLLECTIVE_OPS, Profile

ITERATIONS = 6
DAMPING = 0.5  # share of the new estimate taken per iteration (the map can overshoot)


def processes_per_core(cluster, profile: Profile) -> float:
    """Largest processes-per-core ratio over the cluster's nodes (0 when the profile
    says nothing about the host's cores, or devices are not host processes)."""
    rt = profile.runtime
    if rt.host_cores <= 0 or not rt.launch_blocking:
        return 0.0
    return max(len(node.ranks) for node in cluster.nodes) / rt.host_cores


def cores_saturated(cluster, profile: Profile) -> bool:
    """Whether some host has at least as many computing processes as cores
    (processes_per_core >= 1). A collective started in the background there finds no free
    core for the threads that carry it while its process computes: measured here
    (2026-12-04, 2 gloo processes on 2 cores), a 0.8 MiB all-gather that takes 1.33 ms alone,
    started before 0.5 ms of compute, still needed 1.21 ms after it (it advanced at a fifth
    of its rate) and slowed that compute by 18 %. Overlapping buys nothing; the simulator
    runs such collectives as blocking calls (sim/pipeline_executor._LayerGathers)."""
    return processes_per_core(cluster, profile) >= 1.0


def slowed_profile(profile: Profile, f: float) -> Profile:
    """The profile of a device computing at 1/f of its speed: every rate divided by f,
    every per-op cost (device and host side) multiplied by f."""
    if f == 1.0:
        return profile
    gpus = {k: replace(g, gemm_eff_max=g.gemm_eff_max / f, attention_eff=g.attention_eff / f,
                       hbm_eff=g.hbm_eff / f, vector_flops_eff=g.vector_flops_eff / f,
                       cache_bw_eff=g.cache_bw_eff / f, kernel_overhead_us=g.kernel_overhead_us * f,
                       topk_select_ns_per_elem=g.topk_select_ns_per_elem * f,
                       topk_select_ns_per_kept=g.topk_select_ns_per_kept * f)
            for k, g in profile.gpus.items()}
    r = profile.runtime
    rt = replace(r, host_overhead_us=r.host_overhead_us * f, checkpoint_full_region_us=r.checkpoint_full_region_us * f,
                 checkpoint_selective_region_us=r.checkpoint_selective_region_us * f,
                 fsdp_unit_us=r.fsdp_unit_us * f, fsdp_unit_us_per_mib=r.fsdp_unit_us_per_mib * f,
                 microbatch_host_us=r.microbatch_host_us * f)
    return replace(profile, gpus=gpus, runtime=rt)


def slowed_calls(profile: Profile, f: float) -> Profile:
    """The profile of a host whose collective calls cost f times what they did at
    calibration: every fabric's per-call software costs (the generic and each
    collective's call cost, the per-rank cost, the fitted per-step latency) multiplied by
    f; bandwidths and the pipeline handoffs' own measured figures unchanged. What the
    validator predicts with when its call probe (validate/probe.call_probe_s) reads f times
    the calibrated one (docs/validation-cpu.md mechanism 59)."""
    if f == 1.0:
        return profile

    def times(x):
        return None if x is None else x * f
    fabrics = {k: replace(fb, call_latency_us=fb.call_latency_us * f, call_us_per_rank=fb.call_us_per_rank * f,
                          hop_latency_us=times(fb.hop_latency_us),
                          **{f"{op}_call_us": times(getattr(fb, f"{op}_call_us")) for op in COLLECTIVE_OPS})
               for k, fb in profile.fabrics.items()}
    return replace(profile, fabrics=fabrics)


def next_slowdown(ratio: float, compute_s: float, wait_s: float, busy: float = 0.0) -> float:
    """min(n/c, max(1, n/c - (1 - b n/c) W/C)) for one process: ``compute_s`` at full speed,
    ``wait_s`` waiting, a share ``busy`` (b) of which still occupies a core (module doc)."""
    if compute_s <= 0:
        return 1.0
    return min(ratio, max(1.0, ratio - max(0.0, 1.0 - busy * ratio) * wait_s / compute_s))


def simulate_shared(run, profile: Profile, ratio: float):
    """Run ``run(profile) -> StepResult`` at the fixed-point slowdown, which the result
    carries as ``core_slowdown``."""
    f = ratio  # start from the fully loaded case
    res = None
    for _ in range(ITERATIONS):
        res = run(slowed_profile(profile, f))
        step = res.step_time_s
        compute = res.breakdown["compute"] / f  # at full speed
        wait = max(0.0, step - res.breakdown["compute"])
        f_new = next_slowdown(ratio, compute, wait, profile.runtime.comm_busy_fraction)
        if abs(f_new - f) < 1e-3 * f:
            f = f_new
            break
        f = f + DAMPING * (f_new - f)
    res = run(slowed_profile(profile, f))
    res.core_slowdown = f
    return res
