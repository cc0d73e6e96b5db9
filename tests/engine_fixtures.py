"""Shared by the engine tests: ideal links and programs whose per-chunk work is set by
hand, so the engine's timing can be checked against hand-worked numbers."""
from __future__ import annotations

from dataclasses import replace

from costmodel.profile import FabricEfficiency, GpuEfficiency, Profile, RuntimeSettings
from sim.engine import Engine
from sim.metrics import summarize
from specs.plan import resolve_plan
from sim.program import build_program

# Ideal links: full line rate, no per-call cost, so times are pure bytes / bandwidth.
IDEAL = Profile(gpus={"default": GpuEfficiency()},
                fabrics={"default": FabricEfficiency(bw_eff=1.0, call_latency_us=0.0)})


def worker_profile(bw_eff: float = 0.5, call_latency_us: float = 5.0, hop_latency_us: float | None = None,
                   **runtime) -> Profile:
    """A small, round profile of CPU-worker-like devices for hand-worked tests: GEMMs at 20 %
    and memory at 10 % of the device's peaks, 5 us a kernel, links at ``bw_eff`` of line
    rate with ``call_latency_us`` a collective call; each op issued by its own process
    (launch_blocking) for 8 us, and ``runtime``'s other settings as given."""
    return Profile(gpus={"default": GpuEfficiency(gemm_eff_max=0.2, hbm_eff=0.1, kernel_overhead_us=5.0)},
                   fabrics={"default": FabricEfficiency(bw_eff=bw_eff, call_latency_us=call_latency_us,
                                                        hop_latency_us=hop_latency_us)},
                   runtime=RuntimeSettings(**{"launch_blocking": True, "host_overhead_us": 8.0, **runtime}))


def fixed_program(cluster, model, plan_text, f, b, grad_bytes=(), p2p=0.0, params=None):
    """A real program whose chunks take f / b seconds forward / backward per microbatch,
    send p2p bytes, reduce the given gradient buckets, and have no TP, optimizer or
    tied-embedding gradient time."""
    plan = resolve_plan(plan_text, model, cluster.num_devices)
    prog = build_program(model, plan, cluster, IDEAL)
    for pipe in prog.pipelines:
        for key, w in pipe.chunks.items():
            pipe.chunks[key] = replace(w, fwd_s=f, bwd_s=b, fwd_tp_s=0.0, bwd_tp_s=0.0, p2p_bytes=p2p,
                                       grad_buckets=tuple(grad_bytes),
                                       params=w.params if params is None else params,
                                       # given params are all the layers' (no outer FSDP unit)
                                       outer_params=w.outer_params if params is None else 0.0)
        pipe.optimizer_s = (0.0,) * plan.pp
        pipe.embedding_sync_s = 0.0
    return prog


def run_engine(prog):
    """(step time, StepResult) of one engine run."""
    eng = Engine(prog)
    step = eng.run()
    return step, summarize(prog, eng, step)
