"""Run a plan for real: the tiny GPT (validate/gpt.py) trained for a few steps with the
plan's TP, PP and DP on torch.distributed, measured per step and per phase.

    run_plan(model, plan, steps=10, warmup=2) -> RunRecord

On one machine the worker processes are spawned here (validate/launch.py). On several,
start this module with torchrun on every node; e.g. two nodes of 8 GPUs each:

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank NODE \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m validate.runner --model tiny --plan tp=8,dp=2 --steps 10 --out run.json

(NODE is 0 on the first node and 1 on the second; HOST is the first node's address.)
Rank 0 prints the summary and writes the record. On one machine the same path runs as
``torchrun --standalone --nproc-per-node 2 -m validate.runner --model tiny --plan dp=2``.

The runner trains in fp32 whatever the plan's ``precision`` (CPUs have no fast bf16
matmul, and fp32 makes the correctness checks exact to roundoff); simulate the plan with
precision=fp32 to compare like with like. ``allreduce=`` is left to the backend (gloo and
NCCL pick their own algorithms).

Process layout (README "Placement"; specs/plan.py): rank = tp_index + tp * (cp_index + cp *
(stage + pp * dp_index)) for the default tp-pp-dp placement; every TP, DP(-CP), CP and
embedding group is created with new_group by every rank in the same order. Context
parallelism (cp=N) runs ring attention (validate/cp.py); zero=3 runs FSDP
(validate/fsdp.py); docs/validate-cp-fsdp.md.
"""
from __future__ import annotations

import argparse
import resource  # POSIX getrusage: peak RSS and per-step host counters
import sys
from dataclasses import dataclass

from costmodel.errors import InputError
from costmodel.shapes import ModelSpec
from sim.program import BUCKET_BYTES
from specs.plan import Plan
from validate.backend import pick_backend
from validate.launch import launch, local_rank
from validate.probe import call_probe_groups, call_probe_s, probe_in_rounds
from validate.record import RunRecord
from validate.saved_bytes import SavedBytes


@dataclass(frozen=True)
class RunConfig:
    steps: int
    warmup: int
    seed: int
    backend: str | None
    bucket_bytes: float = BUCKET_BYTES
    capture: bool = False  # return the first step's reduced gradients and final weights (tests)
    # Measure the first step's saved activations (validate/saved_bytes.py): its hooks cost a
    # Python call per saved tensor, so plansim validate asks only when that step is a warm-up.
    saved_bytes: bool = False
    # Time the host's speed and the collectives' call cost before and after the steps
    # (validate/probe.py), which only the validator's prediction uses: the correctness
    # tests turn them off (about 1 s a run of 2 processes here: two call probes of
    # 0.32-0.56 s and two speed probes).
    probes: bool = True


def coords(plan: Plan, rank: int) -> tuple[int, int, int]:
    """(dp_index, stage, tp_index) of a global rank: the inverse of Plan.rank."""
    return coords_cp(plan, rank)[:3]


def coords_cp(plan: Plan, rank: int) -> tuple[int, int, int, int]:
    """(dp_index, stage, tp_index, cp_index) of a global rank: the inverse of Plan.rank,
    read off its mixed-radix digits (tp fastest, then cp, then pp and dp in the order the
    placement gives), in O(1) rather than a search over every coordinate."""
    if not 0 <= rank < plan.num_devices:
        raise ValueError(f"rank {rank} is outside the plan's {plan.num_devices} devices")
    inner, outer = rank % (plan.tp * plan.cp), rank // (plan.tp * plan.cp)
    t, c = inner % plan.tp, inner // plan.tp
    if plan.placement == "tp-pp-dp":
        s, d = outer % plan.pp, outer // plan.pp
    else:  # tp-dp-pp
        d, s = outer % plan.dp, outer // plan.dp
    return d, s, t, c


def vstage_layers(plan: Plan) -> list[list[int]]:
    """Global layer indices of each virtual stage k = chunk * pp + stage, in model order."""
    sizes = {c * plan.pp + s: n for s in range(plan.pp) for c, n in enumerate(plan.chunk_layers(s))}
    out, first = [], 0
    for k in range(plan.pp * plan.vpp):
        out.append(list(range(first, first + sizes[k])))
        first += sizes[k]
    return out


def _groups(plan: Plan, rank: int, rec, tied: bool = True):
    """Create every TP, DP, CP and embedding group (all ranks, same order); return this
    rank's Comm objects and its cp Ring.

    Gradients of replicated weights are summed over the DP and CP ranks together (each
    CP rank saw part of every sequence): the 'dp' group is Megatron-Core's dp-cp group
    (megatron/core/distributed/finalize_model_grads.py reduces over
    get_data_parallel_group(with_context_parallel=True)); with cp=1 it is the DP group."""
    import torch.distributed as dist
    from validate.comm import Comm
    from validate.cp import Ring
    d, s, t, c = coords_cp(plan, rank)
    tp = dp = emb = ring = None

    def group(kind: str, ranks: list[int], mine: bool):
        # new_group is collective over the whole world: every rank creates every group.
        g = dist.new_group(ranks) if len(ranks) > 1 else None
        return Comm(kind, ranks, rank, rec, g) if mine else None

    for dd in range(plan.dp):
        for ss in range(plan.pp):
            for cc in range(plan.cp):
                tp = group("tp", plan.tp_group(dd, ss, cc), (dd, ss, cc) == (d, s, c)) or tp
    for ss in range(plan.pp):
        for tt in range(plan.tp):
            ranks = [plan.rank(dd, ss, tt, cc) for dd in range(plan.dp) for cc in range(plan.cp)]
            dp = group("dp", ranks, (ss, tt) == (s, t)) or dp
    if plan.cp > 1:
        for dd in range(plan.dp):
            for ss in range(plan.pp):
                for tt in range(plan.tp):
                    ranks = plan.cp_group(dd, ss, tt)
                    g = dist.new_group(ranks)
                    if rank in ranks:
                        ring = Ring(ranks, rank, rec, g)
    if plan.pp > 1 and tied:  # first and last stage both hold the tied token embedding
        for dd in range(plan.dp):
            for cc in range(plan.cp):
                for tt in range(plan.tp):
                    ranks = [plan.rank(dd, 0, tt, cc), plan.rank(dd, plan.pp - 1, tt, cc)]
                    g = dist.new_group(ranks)
                    if rank in ranks:
                        emb = Comm("dp", ranks, rank, rec, g, name="embedding")
    return tp, dp, emb, ring


def _reset_peak_memory(kind: str, device) -> None:
    """Start this run's peak afresh (with --shared-launches a process has run other plans
    before this one): torch's allocator on CUDA; on Linux the process's resident
    high-water mark (writing 5 to /proc/self/clear_refs resets VmHWM, proc(5)). Elsewhere
    the CPU figure stays the process's peak since it started."""
    if kind == "cuda":
        import torch
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_memory_bytes(kind: str, device) -> int:
    """This run's peak: torch's allocator on CUDA; on CPU the resident high-water mark
    (VmHWM, reset by _reset_peak_memory where Linux allows), else getrusage's maxrss."""
    if kind == "cuda":
        import torch
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _worker(rank: int, world: int, model: ModelSpec, plan: Plan, cfg: RunConfig) -> dict:
    import torch
    import torch.distributed as dist
    from validate.dp import GradReducer
    from validate.fsdp import FSDP, ShardedChunk
    from validate.gpt import GPTChunk, all_params, batch_tokens, full_weights
    from validate.pp import PipelineStage, pipeline_groups
    from validate.timeline import Recorder

    torch.manual_seed(cfg.seed)
    be = pick_backend(cfg.backend)
    device = be.device_for(local_rank())
    rec = Recorder(cuda=be.kind == "cuda")
    d, s, t, c_idx = coords_cp(plan, rank)
    tp_comm, dp_comm, emb_comm, ring = _groups(plan, rank, rec, model.tie_embeddings)
    p, v = plan.pp, plan.vpp
    layers = vstage_layers(plan)
    weights = full_weights(model, cfg.seed)
    chunk_cls = ShardedChunk if plan.zero >= 3 else GPTChunk
    chunks = {c: chunk_cls(model, layers[c * p + s], c * p + s == 0, c * p + s == p * v - 1, weights,
                           tp_comm, plan.sp, plan.recompute, device, ring) for c in range(v)}
    del weights
    sp = plan.sp and plan.tp > 1
    late = {ps.name for ps in all_params(model) if sp and ps.sp_partial}
    if emb_comm is not None:
        late.add("wte")
    if plan.zero >= 3:  # validate/fsdp.py: weights sharded, gathered layer by layer
        reducer = FSDP(chunks, dp_comm)
    else:
        reducer = GradReducer([(c, ch.params) for c, ch in chunks.items()], dp_comm,
                              bucket_bytes=cfg.bucket_bytes, overlap=plan.overlap_grad_reduce,
                              zero=plan.zero, topk=plan.topk_fraction, late=late)
    seq = model.seq_length // plan.cp
    seq = seq // plan.tp if sp else seq
    pp_groups = (pipeline_groups([[plan.rank(dd, ss, tt, cc) for ss in range(p)] for dd in range(plan.dp)
                                  for tt in range(plan.tp) for cc in range(plan.cp)], rank, v > 1, device)
                 if p > 1 else None)
    stage = PipelineStage(s, p, v, chunks, lambda st: plan.rank(d, st, t, c_idx),
                          (plan.mbs, seq, model.hidden_size), rec, reducer, device, pp_groups)
    m = plan.mb_shares[d]
    acts = stage.actions(plan.schedule, m)
    row0 = sum(plan.mb_shares[:d]) * plan.mbs
    # Each CP rank's loss is the mean over its 1/cp of the tokens: scaled by 1/cp, the sum
    # over the cp group (and the replicas) is the global mean loss.
    loss_scale = plan.mbs / model.global_batch_size / plan.cp
    holds_loss = s == p - 1 and t == 0
    split = ring.split if ring is not None else (lambda x: x)
    steps, losses, grads, saved_peak = [], [], None, 0
    # The host's speed right before and after the steps, every rank at once (validate/probe.py):
    # the validator compares it with the profile's calibration.
    dsync = torch.cuda.synchronize if be.kind == "cuda" else None
    _reset_peak_memory(be.kind, device)
    pairs = call_probe_groups(world)
    probes, calls = [], []

    def take_probes():
        if cfg.probes:
            probes.append(probe_in_rounds(world, be.kind, device, dsync))
            calls.append(call_probe_s(rank, world, device, dsync, pairs))
    take_probes()
    for step in range(cfg.warmup + cfg.steps):
        tokens = batch_tokens(model, step, cfg.seed).to(device)
        mbs = [(split(tokens[row0 + i * plan.mbs: row0 + (i + 1) * plan.mbs, :-1]),
                split(tokens[row0 + i * plan.mbs: row0 + (i + 1) * plan.mbs, 1:])) for i in range(m)]
        dist.barrier()  # every rank starts the step together: step time = slowest rank's
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        rec.begin_step()
        reducer.begin_step()
        if step == 0 and cfg.saved_bytes and plan.zero < 3:  # ZeRO-3's gathered weights are not activations
            meter = SavedBytes([p_ for ch in chunks.values() for p_ in ch.params.values()]
                               + [tokens] + [x for pair in mbs for x in pair])
            with meter.track():
                loss = stage.run(acts, mbs, loss_scale)
            saved_peak = meter.peak
        else:
            loss = stage.run(acts, mbs, loss_scale)
        if sp:  # norms and row-parallel biases saw only this rank's part of the sequence
            names = [n for ch in chunks.values() for n in ch.params if n in late and n != "wte"]
            flat = torch.cat([reducer.grad_view(n).reshape(-1) for n in names])
            tp_comm.all_reduce(flat, "sequence-parallel grads")
            off = 0
            for n in names:
                g = reducer.grad_view(n)
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()
        if emb_comm is not None:  # tied embedding: first-stage and last-stage parts
            emb_comm.all_reduce(reducer.grad_view("wte").reshape(-1), "embedding grads")
        reducer.mark_late_ready()
        reducer.finish()
        if cfg.capture and step == 0 and plan.zero >= 3:
            grads = reducer.gathered_grads()
        elif cfg.capture and step == 0 and plan.zero == 0 and plan.topk_fraction is None:
            grads = {n: reducer.grad_view(n).detach().cpu().numpy().copy()
                     for ch in chunks.values() for n in ch.params}
        reducer.step(step + 1)
        meas = rec.end_step()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        last = step == cfg.warmup + cfg.steps - 1
        steps.append({k: v_ for k, v_ in meas.items() if k != "segments"})
        steps[-1]["host"] = host_counters(ru0, ru1)
        segments = meas["segments"] if last else None
        if holds_loss:
            losses.append(loss)
    take_probes()
    out = {"rank": rank, "stage": s, "tp_rank": t, "dp_rank": d, "cp_rank": c_idx, "steps": steps,
           "probe_s": probes, "call_probe_s": calls,
           "segments": segments, "losses": losses,
           "peak_memory_bytes": _peak_memory_bytes(be.kind, device), "saved_activation_bytes": saved_peak}
    if cfg.capture:
        out["grads"] = grads
        out["weights"] = reducer.gathered_weights() if plan.zero >= 3 else {
            n: prm.detach().cpu().numpy().copy() for ch in chunks.values() for n, prm in ch.params.items()}
    return out


def host_counters(before, after) -> dict[str, int]:
    """What the host did to this process during a step (getrusage of the whole process, its
    communication threads included): minor page faults (fresh memory touched: a
    parameter-sized temporary costs one per 4 KiB, which no cost model prices) and
    involuntary context switches (the scheduler took a core away)."""
    return {"minor_faults": after.ru_minflt - before.ru_minflt,
            "involuntary_switches": after.ru_nivcsw - before.ru_nivcsw}


def check_supported(model: ModelSpec, plan: Plan) -> None:
    """What the runner does not implement is an input error before any process starts."""
    from validate.gpt import check_tp
    check_tp(model, plan.tp)
    if plan.cp > 1 and plan.cp_comm != "ring":
        raise InputError("--plan", "cp_comm", f"the runner implements cp_comm=ring (validate/cp.py), "
                         f"not {plan.cp_comm}")
    if plan.zero >= 3:
        # validate/fsdp.py shards each rank's weights over its dp-cp group. The gradient
        # fix-ups that run after backward on whole gradients (the tied embedding across
        # pipeline ends, sequence-parallel norms) and checkpointed layers that re-read
        # their weights are not written for sharded weights.
        for what, bad in (("pp", plan.pp > 1), ("sp", plan.sp and plan.tp > 1),
                          ("recompute", plan.recompute == "full"), ("compress", plan.topk_fraction is not None)):
            if bad:
                raise InputError("--plan", what, f"the runner's zero=3 (FSDP) runs with dp, cp, tp without "
                                 f"sp, and recompute=none|selective; not with {what}="
                                 f"{getattr(plan, what)}")
    if plan.overlap_step != "none":
        raise InputError("--plan", "overlap_step", f"{plan.overlap_step}: cross-step overlap is simulated "
                         "only (sim/multistep_executor.py); the runner runs overlap_step=none")


def _worker_many(rank: int, world: int, runs: list[tuple[ModelSpec, Plan, RunConfig]]) -> list[dict]:
    """Every run in turn. An error of a run's own (not a peer's failure, which the launch
    blames on the rank that failed first) names the plan, since several share the launch."""
    from validate.launch import _is_peer_failure, _one_line
    out = []
    for model, plan, cfg in runs:
        try:
            out.append(_worker(rank, world, model, plan, cfg))
        except Exception as err:
            if len(runs) == 1 or _is_peer_failure(err):
                raise
            raise RuntimeError(f"plan {plan.to_string()}: {_one_line(err)}") from err
    return out


def run_workers_many(runs: list[tuple[ModelSpec, Plan, RunConfig]], timeout_s: float) -> list[list[dict]] | None:
    """Several (model, plan, config) runs of the same world size one after another in
    one set of processes (saves the process start-up, 2-4 s a launch of 2-4 processes
    here). A later run finds warm processes; each run still sets its seed, builds its own
    groups and takes its own warm-up steps and speed probes, and the measured medians of
    plans run so stayed within the spread of separate launches (docs/validation-cpu.md
    mechanism 31). Returns, per run, every rank's raw measurements."""
    for model, plan, cfg in runs:
        check_supported(model, plan)
    worlds = {plan.num_devices for _, plan, _ in runs}
    backends = {cfg.backend for _, _, cfg in runs}
    if len(worlds) != 1 or len(backends) != 1:
        raise ValueError(f"runs of one launch need one world size and backend, got {worlds}, {backends}")
    per_rank = launch(_worker_many, worlds.pop(), (runs,), timeout_s=timeout_s, backend=backends.pop())
    if per_rank is None:  # a torchrun rank other than 0
        return None
    return [[r[i] for r in per_rank] for i in range(len(runs))]


def run_plans(model: ModelSpec, plans: list[Plan], *, steps: int = 10, warmup: int = 2, seed: int = 0,
              backend: str | None = None, timeout_s: float = 300) -> list[RunRecord] | None:
    """Run ``plans`` (one world size) one after another in one set of processes, each for
    ``warmup + steps`` steps with its own process groups, speed probes and warm-up; their
    records in order. ``timeout_s`` is per plan."""
    if steps < 1 or warmup < 0:
        raise InputError("--steps", "steps", f"need steps >= 1 and warmup >= 0 (got {steps}, {warmup})")
    be = pick_backend(backend)
    # The saved activations are measured in the first step when it is a warm-up (its hooks
    # cost time: validate/saved_bytes.py).
    cfg = RunConfig(steps=steps, warmup=warmup, seed=seed, backend=be.name, saved_bytes=warmup >= 1)
    per_run = run_workers_many([(model, plan, cfg) for plan in plans], timeout_s * len(plans))
    if per_run is None:
        return None
    return [RunRecord.from_workers(workers, model=model.name, plan=plan.to_string(), backend=be.name,
                                   device=be.device_name(), steps=steps, warmup=warmup, seed=seed)
            for plan, workers in zip(plans, per_run)]


def run_plan(model: ModelSpec, plan: Plan, *, steps: int = 10, warmup: int = 2, seed: int = 0,
             backend: str | None = None, timeout_s: float = 300) -> RunRecord | None:
    """Run ``plan`` for ``warmup + steps`` steps in fresh processes; the record of the
    measured ones (None on torchrun ranks other than 0)."""
    recs = run_plans(model, [plan], steps=steps, warmup=warmup, seed=seed, backend=backend, timeout_s=timeout_s)
    return None if recs is None else recs[0]


def main(argv: list[str] | None = None) -> int:
    import os
    from specs.model import load_model
    from specs.plan import plan_world_size, resolve_plan
    from validate.launch import WorkerError, under_torchrun

    ap = argparse.ArgumentParser(prog="python3 -m validate.runner", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--plan", default="dp=1")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    ap.add_argument("--out", help="write the run record (JSON) here")
    a = ap.parse_args(argv)
    try:
        model = load_model(a.model)
        if under_torchrun():
            world = int(os.environ["WORLD_SIZE"])
        else:
            world = plan_world_size(a.plan)
        plan = resolve_plan(a.plan, model, world)
        rec = run_plan(model, plan, steps=a.steps, warmup=a.warmup, seed=a.seed, timeout_s=a.timeout)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except WorkerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if rec is None:
        return 0
    print(f"{rec.model} {rec.plan} on {rec.world} x {rec.device} ({rec.backend}): median step "
          f"{rec.median_step_time_s:.4f} s (p10 {rec.p10_step_time_s:.4f}, p90 {rec.p90_step_time_s:.4f}) "
          f"over {rec.steps} steps; losses " + " ".join(f"{x:.4f}" for x in rec.losses))
    if a.out:
        rec.write_json(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
