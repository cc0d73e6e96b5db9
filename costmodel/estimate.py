"""Fast analytic estimate of one training step, for ranking plans in a search.

Pure arithmetic on small records (no SimPy, no sim imports): the caller (search/costs.py)
turns a plan into per-stage costs with the same costmodel functions the simulator uses, and
this module combines them with closed forms of the pipeline schedules:

* Pipeline flush (GPipe and 1F1B) with stage times t_s = f_s + b_s per microbatch and m
  microbatches: (m - 1) * max_s t_s + sum_s t_s, which for equal stages is the
  (m + p - 1) * t of Narayanan et al. 2021 (bubble (p-1)/m, docs/facts.md "Pipeline
  bubble"). Interleaved with v chunks per rank: m * max_s t_s + (sum_s t_s - max_s t_s) / v,
  i.e. bubble (p-1)/(v m) for equal stages.
* Point-to-point transfers of c seconds on the critical path. Counted by running the
  schedules' action lists with a communication delay (sim.schedules.list_schedule_makespan;
  tests/test_estimate.py checks these counts against it): GPipe 2(p-1) transfers; 1F1B
  2(p-1) m / p + 2(p-2) (its steady state has no slack, so a round trip shows up in every
  cycle); interleaved 2(v p - 1) (its deeper warm-up hides the steady-state transfers).
* Data-parallel gradient reduction overlapped with the last microbatch's backward: K
  equal buckets become ready every b/K seconds and are reduced one after another in d
  seconds each; the reduction ends at r0 + max(K d, (K - 1) b/K + d) after the first bucket
  is ready at r0 (a single-server queue with evenly spaced arrivals). The step's last
  bucket arrives ``straggler_s`` late (the replica that ended backward last).

An estimate within ~15 % of the simulation is plenty for ranking; the search re-scores the
best candidates with the full discrete-event simulation.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class ChunkGrads:
    """Gradient reduction of one model chunk: ``buckets`` equal buckets, each reduced (or
    compressed, gathered and decompressed) in ``bucket_s`` seconds on the DP group."""

    buckets: int
    bucket_s: float


def closing_straggler_s(straggler_us: float, grad_degree: int, zero: int) -> float:
    """Seconds the gradient reduction that closes a backward waits for the replica that
    ended it last (runtime.straggler_us): only where gradients are reduced across replicas
    in buckets after the backward (grad_degree > 1); not under ZeRO-3, which
    reduce-scatters each layer's gradients as its backward ends. The simulator
    (sim/gradient_reducer.py) and the analytic estimate (search/costs.py) both use it;
    the simulator's tied-embedding all-reduce between first and last stage, which closes
    their backward too, calls it with its group of two (sim/pipeline_executor.py)."""
    return straggler_us * 1e-6 if grad_degree > 1 and zero < 3 else 0.0


@dataclass(frozen=True)
class StageCost:
    """One pipeline rank of one replica class; times per microbatch summed over its chunks."""

    fwd_s: float  # forward compute + tensor-parallel collectives
    bwd_s: float  # backward compute (recompute included) + tensor-parallel collectives
    tp_s: float  # the tensor-parallel part of fwd_s + bwd_s (for the breakdown)
    p2p_s: float  # one activation transfer to the next stage (0 on the last stage)
    grads: tuple[ChunkGrads, ...] = ()  # per chunk, in chunk order; () without DP reduction
    optimizer_s: float = 0.0
    gather_s: float = 0.0  # ZeRO-1/2 parameter all-gather after the optimizer step
    zero3_gather_s: float = 0.0  # ZeRO-3: one layer's weight all-gather (before it runs F and B)
    zero3_rs_s: float = 0.0  # ZeRO-3: one layer's gradient reduce-scatter (after its B)
    vpp: int = 1
    layers: float = 1.0  # layers per chunk (ZeRO-3 gathers one layer at a time)
    # Delay of the last bucket's reduction, the one that waits for the replica that ended
    # backward last (runtime.straggler_us; sim/gradient_reducer.py)
    straggler_s: float = 0.0

    @property
    def t_s(self) -> float:
        """Time per microbatch. Under ZeRO-3 each layer's weights are gathered while the
        previous layer computes (one ahead, sim/pipeline_executor._LayerGathers), so a
        layer takes the longer of its compute and its gather, and all gathers and
        reduce-scatters share the DP links."""
        if self.zero3_gather_s <= 0:
            return self.fwd_s + self.bwd_s
        g, k = self.zero3_gather_s, self.vpp * self.layers
        per_layer = max(max(self.fwd_s / k, g) + max(self.bwd_s / k, g), 2 * g + self.zero3_rs_s)
        return k * per_layer


@dataclass(frozen=True)
class PipelineCost:
    """One class of identical data-parallel replicas."""

    stages: tuple[StageCost, ...]
    microbatches: int
    vpp: int = 1
    schedule: str = "1f1b"
    replicas: int = 1  # replicas this class stands for (weights the breakdown)


@dataclass(frozen=True)
class StepEstimate:
    step_s: float
    pipeline_s: float  # slowest replica's forward/backward phase, bubble and p2p included
    compute_s: float  # compute per step on the busiest stage (TP excluded)
    tp_s: float
    bubble_s: float
    pp_s: float
    dp_s: float  # exposed data-parallel time (after the last backward)
    optimizer_s: float

    @property
    def breakdown(self) -> dict[str, float]:
        return {"compute": self.compute_s, "tp": self.tp_s, "pp": self.pp_s, "dp": self.dp_s,
                "bubble": self.bubble_s, "optimizer": self.optimizer_s}

    @property
    def bottleneck(self) -> str:
        """The largest non-compute share, as sim.result.StepResult.bottleneck names it."""
        parts = {k: v for k, v in self.breakdown.items() if k not in ("compute", "optimizer")}
        if max(parts.values()) < 0.05 * self.step_s:
            return "compute"
        return max(sorted(parts), key=lambda k: parts[k])


def p2p_transfers_on_path(schedule: str, p: int, m: int, v: int = 1) -> float:
    """Point-to-point transfers on the critical path of one step (see the module docstring)."""
    if p < 2:
        return 0.0
    if schedule == "gpipe":
        return 2.0 * (p - 1)
    if schedule == "1f1b":
        return 2.0 * (p - 1) * m / p + 2.0 * (p - 2)
    if schedule == "interleaved":
        return 2.0 * (v * p - 1)
    raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")


def flush_time_s(stage_t_s: list[float] | tuple[float, ...], m: int, v: int = 1) -> float:
    """Forward/backward phase of m microbatches through stages with per-microbatch times
    ``stage_t_s``, no communication: m*max + (sum - max)/v (module docstring)."""
    tmax = max(stage_t_s)
    return m * tmax + (sum(stage_t_s) - tmax) / v


def reduction_end_s(ready_s: float, interval_s: float, buckets: int, bucket_s: float,
                    free_s: float = 0.0) -> float:
    """When a single DP stream that is free from ``free_s`` finishes ``buckets`` buckets
    arriving at ready_s, ready_s + interval_s, ..., each taking ``bucket_s``."""
    if buckets <= 0:
        return free_s
    return max(free_s + buckets * bucket_s, ready_s + buckets * bucket_s,
               ready_s + (buckets - 1) * interval_s + bucket_s)


def _stage_ends(pipe: PipelineCost, total_s: float, p2p_s: list[float]) -> list[float]:
    """When each rank finishes its last backward: stage 0 runs the step's last backward;
    stage s finished its own one chunk-backward and one transfer earlier than stage s-1."""
    v = pipe.vpp
    ends = [total_s]
    for s in range(1, len(pipe.stages)):
        ends.append(ends[-1] - pipe.stages[s - 1].bwd_s / v - p2p_s[s - 1])
    return ends


def estimate_step(pipes: list[PipelineCost]) -> StepEstimate:
    """Step time of data-parallel replica classes that reduce gradients together."""
    if not pipes:
        raise ValueError("estimate_step needs at least one pipeline")
    p = len(pipes[0].stages)
    info = []
    for pipe in pipes:
        if len(pipe.stages) != p:
            raise ValueError("every replica class needs the same number of stages")
        ts = [st.t_s for st in pipe.stages]
        flush = flush_time_s(ts, pipe.microbatches, pipe.vpp)
        links = [st.p2p_s for st in pipe.stages[:-1]]
        c = sum(links) / len(links) if links else 0.0
        pp = p2p_transfers_on_path(pipe.schedule, p, pipe.microbatches, pipe.vpp) * c
        # ZeRO-3: the first action's weights are gathered before anything can start.
        total = flush + pp + max(st.zero3_gather_s for st in pipe.stages)
        info.append((pipe, ts, flush, pp, total, _stage_ends(pipe, total, links + [0.0])))

    # Gradient reduction per stage: bucket j of chunk c is ready once every class has it.
    done = 0.0
    dp_exposed = 0.0
    for s in range(p):
        end_s = max(ends[s] for (_, _, _, _, _, ends) in info)
        free = 0.0
        ready_all = []
        for pipe, _, _, _, _, ends in info:
            st = pipe.stages[s]
            b_chunk = st.bwd_s / pipe.vpp
            # Chunk c's last backward ends about c*p chunk-backwards before chunk 0's
            # (interleaved drains chunks v-1, ..., 0 in groups of p microbatches).
            ready_all.append([(ends[s] - c * p * b_chunk - b_chunk, b_chunk) for c in range(pipe.vpp)])
        grads = pipes[0].stages[s].grads
        red_end = 0.0
        order = [c for c in sorted(range(len(grads)), key=lambda c: -c) if grads[c].buckets > 0]
        for c in order:  # chunk v-1 is reduced first
            g = grads[c]
            start = max(r[c][0] for r in ready_all)
            b_chunk = max(r[c][1] for r in ready_all)
            interval = b_chunk / g.buckets
            lag = max(pipe.stages[s].straggler_s for pipe in pipes) if c == order[-1] else 0.0
            if lag > 0:  # the step's last bucket waits for the last replica: queued after the others
                free = reduction_end_s(start + interval, interval, g.buckets - 1, g.bucket_s, free)
                free = max(free, start + g.buckets * interval + lag) + g.bucket_s
            else:
                free = reduction_end_s(start + interval, interval, g.buckets, g.bucket_s, free)
            red_end = free
        st0 = pipes[0].stages[s]
        after = max(end_s, red_end)
        dp_exposed = max(dp_exposed, after - end_s)
        done = max(done, after + max(pipe.stages[s].optimizer_s for pipe in pipes) + st0.gather_s)

    # Breakdown on the slowest class's busiest stage.
    pipe, ts, flush, pp, total, _ = max(info, key=lambda x: x[4])
    k = max(range(p), key=lambda s: ts[s])
    st = pipe.stages[k]
    m = pipe.microbatches
    compute = m * (st.fwd_s + st.bwd_s - st.tp_s)
    tp = m * st.tp_s
    bubble = max(0.0, flush - m * (st.fwd_s + st.bwd_s))
    opt = max(pp_.stages[s].optimizer_s + pp_.stages[s].gather_s for pp_ in pipes for s in range(p))
    return StepEstimate(step_s=done, pipeline_s=total, compute_s=compute, tp_s=tp, bubble_s=bubble,
                        pp_s=pp, dp_s=dp_exposed, optimizer_s=opt)
