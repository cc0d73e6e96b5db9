"""From an engine run to a StepResult: throughput, FLOP rates, MFU, memory, breakdown."""
from __future__ import annotations

import gc
import heapq
import time

from costmodel import flops as fl
from costmodel.profile import Profile
from costmodel.shapes import ModelSpec
from sim.engine import Engine
from specs.plan import Plan
from sim.program import Program, build_program
from sim.result import CATEGORIES, DeviceResult, StepResult
from specs.topology import Cluster

GIB = 2.0 ** 30


def simulate(model: ModelSpec, plan: Plan, cluster: Cluster, profile: Profile,
             record: bool = False, symmetric_dp: bool = True) -> StepResult:
    """Simulate one training step of `model` under `plan` on `cluster` (``symmetric_dp``:
    see Engine). Host processes sharing fewer cores: sim/core_sharing.py."""
    from sim.core_sharing import processes_per_core, simulate_shared
    ratio = processes_per_core(cluster, profile)
    if ratio > 1.0:
        return simulate_shared(lambda prof: _simulate(model, plan, cluster, prof, record, symmetric_dp),
                               profile, ratio)
    return _simulate(model, plan, cluster, profile, record, symmetric_dp)


def _simulate(model: ModelSpec, plan: Plan, cluster: Cluster, profile: Profile,
              record: bool, symmetric_dp: bool) -> StepResult:
    t_wall = time.perf_counter()
    if plan.overlap_step != "none":  # cross-step overlap: priced over consecutive steps
        from sim.multistep import steady_state_result
        res = steady_state_result(model, plan, cluster, profile, record, symmetric_dp)
        res.sim_wall_s = time.perf_counter() - t_wall
        return res
    # The cluster (16k-100k devices and their routes), the program and the run's caches
    # all live through the call: the cyclic collector's passes, triggered by the run's
    # many short-lived objects, would walk them again and again (a fifth of a 16k-GPU
    # simulation). The collector is paused for the call and restored after; what
    # reference counting cannot free of it is collected then.
    enabled = gc.isenabled()
    gc.disable()
    try:
        prog = build_program(model, plan, cluster, profile)
        eng = Engine(prog, record=record, symmetric_dp=symmetric_dp)
        step = eng.run()
        res = summarize(prog, eng, step)
    finally:
        if enabled:
            gc.enable()
    res.sim_wall_s = time.perf_counter() - t_wall
    return res


def summarize(prog: Program, eng: Engine, step: float) -> StepResult:
    model, plan, cluster = prog.model, prog.plan, prog.cluster
    n = cluster.num_devices
    devices: list[DeviceResult] = []
    weights = []
    for pi, pipe in enumerate(prog.pipelines):
        for s, rank in enumerate(pipe.ranks):
            tot = dict(eng.totals[(pi, s)])
            # Time after this rank finished until the step's end: the pipeline's tail
            # (bubble) up to the end of its own replica, idle beyond (slower replicas).
            own_end = max(eng.done_at[(pi, q)] for q in range(plan.pp))
            tot["bubble"] += own_end - eng.done_at[(pi, s)]
            tot["idle"] += step - own_end
            gpu = cluster.devices[rank].gpu
            m = {k: v / GIB for k, v in pipe.memory[s].items()}
            peak = sum(m.values())
            cap = gpu.mem_bytes / GIB
            represents = plan.tp * plan.cp * len(pipe.dp_indices)
            devices.append(DeviceResult(
                rank=rank, stage=s, pipeline=pipe.name, gpu=gpu.name, represents=represents,
                breakdown_s={k: tot[k] for k in CATEGORIES}, busy_s=tot["compute"] + tot["tp"],
                memory_gib={k: round(v, 4) for k, v in m.items()}, peak_memory_gib=peak,
                capacity_gib=cap, fits_memory=peak <= cap,
            ))
            weights.append(represents)
    wsum = float(sum(weights))
    breakdown = {k: sum(d.breakdown_s[k] * w for d, w in zip(devices, weights)) / wsum for k in CATEGORIES}

    tokens = model.global_batch_size * model.seq_length
    model_flops = fl.model_flops_per_iteration(model)
    hw_flops = fl.hardware_flops_per_iteration(model, plan.recompute)
    peak_of: dict[int, float] = {}      # per GPU spec object: 16k devices share a few
    for d in cluster.devices:
        if id(d.gpu) not in peak_of:
            peak_of[id(d.gpu)] = d.gpu.peak_flops(plan.precision)
    peak_sum = sum(peak_of[id(d.gpu)] for d in cluster.devices)
    shortfall = max(0.0, max(d.peak_memory_gib - d.capacity_gib for d in devices))
    fits = all(d.fits_memory for d in devices)
    links = busiest_links(eng, step)
    return StepResult(
        topology=cluster.name, model=model.name, plan=plan.to_string(), num_devices=n,
        step_time_s=step, tokens_per_s=tokens / step,
        model_tflops_per_gpu=model_flops / step / n / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / n / 1e12,
        mfu=model_flops / step / peak_sum, hfu=hw_flops / step / peak_sum,
        peak_memory_gib=max(d.peak_memory_gib for d in devices), fits_memory=fits,
        memory_shortfall_gib=shortfall,
        bubble_fraction=breakdown["bubble"] / step,
        exposed_comm_s={k: breakdown[k] for k in ("tp", "cp", "pp", "dp")},
        breakdown=breakdown, devices=devices, busiest_links=links,
        dp_algorithm=list(prog.dp_algorithm),
        segments=eng.segments, link_samples=list(eng.net.samples) if eng.record else [],
    )


def busiest_links(eng: Engine, step: float, top: int = 10) -> list[dict]:
    """The ``top`` links by utilisation (bytes carried / (bandwidth x step)), ties in link
    name order."""
    g = eng.cluster.links  # no graph build: the links are looked up by name
    carried = eng.net.bytes_carried
    floor_Bps = getattr(g, "min_bw_Bps", None)
    if floor_Bps is not None and step > 0 and floor_Bps > 0:
        return _busiest_pruned(g, carried, step, top, floor_Bps)
    util = []
    for e, nbytes in carried.items():
        if nbytes <= 0:
            continue
        bw = g.edges[e]["bw_Bps"]
        util.append((nbytes / (bw * step) if step > 0 else 0.0, e, nbytes))
    # Rows only for links at least as busy as the top-th (ties kept for the name order):
    # at 16k GPUs ten thousand links carry bytes.
    cut = heapq.nlargest(top, (x[0] for x in util))[-1] if len(util) > top else None
    rows = [{"link": f"{u}->{v}", "kind": g.edges[u, v].get("kind", ""), "bytes": nbytes, "utilisation": x}
            for x, (u, v), nbytes in util if cut is None or x >= cut]
    rows.sort(key=lambda r: (-r["utilisation"], r["link"]))
    return rows[:top]


def _busiest_pruned(g, carried: dict, step: float, top: int, floor_Bps: float) -> list[dict]:
    """The same rows, looking up only the links that can be among them: links in order
    of bytes, stopping once bytes / (floor_Bps x step), a bound on any later link's
    utilisation (no link is slower than ``floor_Bps``; rounding is monotone, so the
    bound holds in floats too), falls below the top-th utilisation found. At 16k GPUs
    most of the ten thousand links that carry bytes are never looked up."""
    order = sorted(((nbytes, e) for e, nbytes in carried.items() if nbytes > 0),
                   key=lambda x: x[0], reverse=True)
    kept: list[tuple[float, str, float, tuple]] = []   # (-utilisation, link name, bytes, edge)
    worst = None
    bound_Bps = floor_Bps * step
    for nbytes, (u, v) in order:
        if worst is not None and nbytes / bound_Bps < -worst[0]:
            break
        key = (-(nbytes / (g.edges[u, v]["bw_Bps"] * step)), f"{u}->{v}", nbytes, (u, v))
        if len(kept) < top:
            kept.append(key)
            if len(kept) == top:
                worst = max(kept)
        elif key < worst:
            kept.remove(worst)
            kept.append(key)
            worst = max(kept)
    kept.sort()
    return [{"link": name, "kind": g.edges[e].get("kind", ""), "bytes": nbytes, "utilisation": -neg}
            for neg, name, nbytes, e in kept]
