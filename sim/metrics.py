"""From an engine run to a StepResult: throughput, FLOP rates, MFU, memory, breakdown."""
from __future__ import annotations

import gc
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
    see Engine)."""
    t_wall = time.perf_counter()
    if plan.overlap_step != "none":  # cross-step overlap: priced over consecutive steps
        from sim.multistep import steady_state_result
        res = steady_state_result(model, plan, cluster, profile, record, symmetric_dp)
        res.sim_wall_s = time.perf_counter() - t_wall
        return res
    prog = build_program(model, plan, cluster, profile)
    eng = Engine(prog, record=record, symmetric_dp=symmetric_dp)
    # The cluster graph (~100k edges at 16k GPUs), the program and their caches live
    # through the run: freezing them keeps the cyclic collector's full passes, triggered
    # by the run's many short-lived events, from walking them again and again.
    gc.freeze()
    try:
        step = eng.run()
    finally:
        gc.unfreeze()
    res = summarize(prog, eng, step)
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
            represents = plan.tp * len(pipe.dp_indices)
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
    peak_sum = sum(d.gpu.peak_flops(plan.precision) for d in cluster.devices)
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
        exposed_comm_s={k: breakdown[k] for k in ("tp", "pp", "dp")},
        breakdown=breakdown, devices=devices, busiest_links=links,
        dp_algorithm=list(prog.dp_algorithm),
        segments=eng.segments, link_samples=list(eng.net.samples) if eng.record else [],
    )


def busiest_links(eng: Engine, step: float, top: int = 10) -> list[dict]:
    g = eng.cluster.graph
    rows = []
    for (u, v), nbytes in eng.net.bytes_carried.items():
        if nbytes <= 0:
            continue
        bw = g.edges[u, v]["bw_Bps"]
        rows.append({"link": f"{u}->{v}", "kind": g.edges[u, v].get("kind", ""),
                     "bytes": nbytes, "utilisation": nbytes / (bw * step) if step > 0 else 0.0})
    rows.sort(key=lambda r: (-r["utilisation"], r["link"]))
    return rows[:top]
