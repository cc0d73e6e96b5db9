"""Many training steps back to back in one SimPy run, under a scenario, optionally
re-planned as it runs (``plansim simulate --steps N [--scenario FILE] [--adaptive]``).

One SimPy environment and one flow network carry every step, so what crosses a step
boundary is simulated, not assumed: a stage that finishes its step early starts the next
one while slower stages and the previous step's gradient collectives are still running,
and flows of consecutive steps share the links. Each step has its own Program (the plan
in force, with the scenario's slowed or stalled devices as replica classes of their own,
sim/scenario_events.py), accountant, gradient reducer and executor
(sim/multistep_executor.py: the plan's cross-step overlap). A pipeline rank starts step
t+1 when the ranks of step t it depends on (the same stage of the replicas it stands for)
are done; the events of step t+1 and the controller's next decision are taken when the
first rank finishes step t, from the steps already complete then (a real loop reads the
previous step's timers while the current one runs: decisions lag by about one step).

Step t ends when its last rank is done; its time is that end minus the previous step's.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import simpy

from sim.accountant import RankKey, StepAccountant
from sim.adaptive_control import SimController, layer_state_bytes
from sim.engine import bw_efficiency, hop_latency
from sim.flownet import FlowNetwork
from sim.gradient_reducer import GradientReducer
from sim.multistep_executor import StepExecutor
from sim.program import Program, build_program
from sim.result import CATEGORIES
from sim.scenario_events import ScenarioClock, StepConditions, apply_conditions, stage_stall
from specs.scenario import Scenario, empty_scenario


@dataclass
class DeviceStep:
    rank: int  # representative device (TP index 0)
    stage: int
    pipeline: str  # the simulated replica class
    represents: int  # devices it stands for
    busy_s: float  # compute + TP collectives in this step
    breakdown_s: dict[str, float]  # CATEGORIES -> seconds of this step's compute stream
    replicas: list[int] = field(default_factory=list)  # DP indices of the replicas it stands for


@dataclass
class StepRecord:
    step: int  # from 1
    start_s: float
    end_s: float
    step_time_s: float
    tokens_per_s: float
    mb_shares: list[int]  # the allocation used in this step
    layers: list[int]
    events: list[str]  # scenario events that took effect at this step
    decision: str  # the controller's move before this step ('' if none)
    migration_s: float  # seconds the layer migration before this step took (0 if none)
    devices: list[DeviceStep]


@dataclass
class RunResult:
    topology: str
    model: str
    plan: str  # the plan the run started with
    scenario: str
    adaptive: bool
    steps_requested: int
    steps: list[StepRecord]
    stopped: str | None  # why the run ended early (a lost node), else None
    total_time_s: float
    tokens_per_s: float  # tokens of all simulated steps / their total time
    sim_wall_s: float = 0.0
    sim_cpu_s: float = 0.0
    final_plan: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Step:
    index: int
    plan: object
    prog: Program
    cond: StepConditions
    acct: StepAccountant
    reducer: GradientReducer
    executor: StepExecutor
    done: dict[RankKey, simpy.Event]
    decision: str = ""
    migration: simpy.Event | None = None
    migration_s: float = 0.0
    fed: bool = False


class MultiStepEngine:
    def __init__(self, model, plan, cluster, profile, steps: int, scenario: Scenario | None = None,
                 controller: SimController | None = None, symmetric_dp: bool = True, program_fn=None):
        """``program_fn(plan) -> Program``, if given, replaces build_program (tests set
        per-chunk work by hand)."""
        self.program_fn = program_fn or (lambda p: build_program(model, p, cluster, profile))
        self.model, self.plan0, self.cluster, self.profile = model, plan, cluster, profile
        self.n_steps = steps
        self.scenario = scenario or empty_scenario()
        self.clock = ScenarioClock(self.scenario, cluster)
        self.controller = controller
        self.symmetric_dp = symmetric_dp
        self.env = simpy.Environment()
        self.net = FlowNetwork(self.env, cluster.links, bw_scale=bw_efficiency(profile),
                               hop_latency=hop_latency(profile))
        self.steps: list[_Step] = []
        self.stopped: str | None = None
        self._plan = plan
        self._link_scale: dict = {}
        self._programs: dict[tuple, Program] = {}

    # ------------------------------------------------------------ building steps
    def _program(self, plan, cond: StepConditions) -> Program:
        key = (plan.mb_shares, plan.layers)
        base = self._programs.get(key)
        if base is None:
            base = self._programs[key] = self.program_fn(plan)
        return apply_conditions(base, cond.speed, cond.stalls)

    def _apply_links(self, scale: dict) -> None:
        changed = False
        for e in sorted(set(scale) | set(self._link_scale)):
            f = scale.get(e, 1.0)
            if f != self._link_scale.get(e, 1.0):
                self.net.scale_edge(e, f)
                changed = True
        self._link_scale = {e: f for e, f in scale.items() if f != 1.0}
        if changed:
            # Symmetric collectives' flow classes depend on link bandwidths: recompute them.
            self.net.cache.pop("symmetric_representatives", None)

    def _begin(self, t: int) -> None:
        """Create step t (when the first rank finishes step t-1, or at time 0)."""
        if t > self.n_steps or len(self.steps) >= t or self.stopped:
            return
        cond = self.clock.conditions(t, self.env.now)
        if cond.lost:
            self.stopped = lost_report(self.cluster, self._plan, cond.lost, t)
            return
        self._apply_links(cond.link_scale)
        prev = self.steps[-1] if self.steps else None
        decision, moved = "", False
        if self.controller is not None and prev is not None:
            self._feed()
            new_plan, dec, moved = self.controller.decide(self._plan)
            if dec is not None:
                decision = dec.reason
                old_plan, self._plan = self._plan, new_plan
        plan = self._plan
        prog = self._program(plan, cond)
        acct = StepAccountant(self.env, [pipe.ranks for pipe in prog.pipelines], plan.pp, False)
        if self.steps:  # gradient collectives of one step slow the next step's compute too
            acct.share_dp_busy(self.steps[0].acct)
        reducer = GradientReducer(self.env, self.net, prog, acct, symmetric=self.symmetric_dp)
        mode = plan.overlap_step
        gates = prev.executor.updates if (prev is not None and mode == "layerwise" and not moved
                                          and prev.executor.updates is not None) else None
        executor = StepExecutor(self.env, self.net, prog, acct, reducer, mode=mode, gates=gates,
                                prev_reducer=prev.reducer if (prev is not None and mode == "delayed") else None,
                                last=t == self.n_steps)
        done = {RankKey(pi, s): self.env.event() for pi in range(len(prog.pipelines)) for s in range(plan.pp)}
        st = _Step(t, plan, prog, cond, acct, reducer, executor, done, decision)
        self.steps.append(st)
        if moved:
            st.migration = self.env.process(self._migrate(prev, old_plan.layers, plan.layers, plan))
        for s in range(plan.pp):
            self.env.process(reducer.dp_stream(s))
        for pi, pipe in enumerate(prog.pipelines):
            for s in range(plan.pp):
                deps = self._deps(prev, pipe.dp_indices, s)
                stall = stage_stall(plan, cond.stalls, pipe.dp_indices[0], s)
                self.env.process(self._rank(st, pi, s, deps, stall))

    def _deps(self, prev: _Step | None, members: tuple[int, ...], s: int) -> list[RankKey]:
        """The ranks of the previous step that rank (members, stage s) continues from."""
        if prev is None:
            return []
        want = set(members)
        return [RankKey(qi, s) for qi, q in enumerate(prev.prog.pipelines) if want & set(q.dp_indices)]

    def _rank(self, st: _Step, pi: int, s: int, deps: list[RankKey], stall_s: float):
        key = RankKey(pi, s)
        t0 = self.env.now
        prev = self.steps[st.index - 2] if st.index > 1 else None
        waits = [prev.done[k] for k in deps if not prev.done[k].triggered]
        if st.migration is not None:
            waits.append(st.migration)
        if waits:
            yield self.env.all_of(waits)
        if deps:
            # Waiting starts when this device's own previous step ended (its first
            # dependency); the time before that is booked in the previous step.
            t0 = max(t0, min(prev.acct.done_at[k] for k in deps))
        st.acct.seg(key, "compute", "idle", t0, self.env.now, "wait previous step")
        if stall_s > 0:
            t1 = self.env.now
            yield self.env.timeout(stall_s)
            st.acct.seg(key, "compute", "idle", t1, self.env.now, "stall")
        yield from st.executor.compute_stream(pi, s)
        st.done[key].succeed()
        self._begin(st.index + 1)

    def _migrate(self, prev: _Step, old: tuple[int, ...], new: tuple[int, ...], plan):
        """Move layers between neighbouring stages once step t-1 is done everywhere (and
        its layer updates): every replica and TP index sends its share at once, as flows."""
        yield self.env.all_of(list(prev.done.values()) + list(prev.executor.side))
        t0 = self.env.now
        per_layer = layer_state_bytes(self.model, plan)
        flows, shift = [], 0
        for b in range(plan.pp - 1):
            shift += new[b] - old[b]  # > 0: stage b takes layers from stage b+1
            if shift == 0:
                continue
            src, dst = (b + 1, b) if shift > 0 else (b, b + 1)
            for d in range(plan.dp):
                for tp in range(plan.tp):
                    a, z = plan.rank(d, src, tp), plan.rank(d, dst, tp)
                    flows.append(self.net.transfer(self.cluster.route(a, z), abs(shift) * per_layer,
                                                   label=f"migrate {abs(shift)} layers s{src}->s{dst}"))
        if flows:
            yield self.env.all_of(flows)
        self.steps[prev.index].migration_s = self.env.now - t0

    # ------------------------------------------------------------ observing
    def _feed(self) -> None:
        """Give the controller every complete step it has not seen, in order."""
        for st in self.steps:
            if st.fed:
                continue
            if not all(ev.triggered for ev in st.done.values()):
                break
            st.fed = True
            classes = [(pipe.dp_indices, [self._busy(st, pi, s) for s in range(st.plan.pp)])
                       for pi, pipe in enumerate(st.prog.pipelines)]
            self.controller.observe(st.plan, classes)

    @staticmethod
    def _busy(st: _Step, pi: int, s: int) -> float:
        tot = st.acct.totals[RankKey(pi, s)]
        return tot["compute"] + tot["tp"]

    # ------------------------------------------------------------ running
    def run(self) -> RunResult:
        t_wall, t_cpu = time.perf_counter(), time.process_time()
        self._begin(1)
        self.env.run()
        return self._result(time.perf_counter() - t_wall, time.process_time() - t_cpu)

    def _result(self, wall_s: float, cpu_s: float) -> RunResult:
        tokens = self.model.global_batch_size * self.model.seq_length
        records, prev_end = [], 0.0
        for st in self.steps:
            if not all(ev.triggered for ev in st.done.values()):
                raise RuntimeError(f"simulation deadlocked in step {st.index}: some pipeline ranks never finished")
            end = max(st.acct.done_at.values())
            devices = []
            for pi, pipe in enumerate(st.prog.pipelines):
                for s in range(st.plan.pp):
                    tot = st.acct.totals[RankKey(pi, s)]
                    devices.append(DeviceStep(pipe.ranks[s], s, pipe.name, st.plan.tp * st.plan.cp * len(pipe.dp_indices),
                                              tot["compute"] + tot["tp"], {k: tot[k] for k in CATEGORIES},
                                              list(pipe.dp_indices)))
            dt = end - prev_end
            records.append(StepRecord(
                st.index, prev_end, end, dt, tokens / dt if dt > 0 else 0.0, list(st.plan.mb_shares),
                list(st.plan.layers), [ev.describe() for ev in st.cond.started], st.decision,
                st.migration_s, devices))
            prev_end = end
        total = prev_end
        return RunResult(
            topology=self.cluster.name, model=self.model.name, plan=self.plan0.to_string(),
            scenario=self.scenario.name, adaptive=self.controller is not None, steps_requested=self.n_steps,
            steps=records, stopped=self.stopped, total_time_s=total,
            tokens_per_s=tokens * len(records) / total if total > 0 else 0.0,
            sim_wall_s=wall_s, sim_cpu_s=cpu_s, final_plan=self._plan.to_string())


def lost_report(cluster, plan, lost, step: int) -> str:
    """One line: which node was lost, what it held, and why the run stops there."""
    parts = []
    for ev in lost:
        held = sorted({(d, s) for d in range(plan.dp) for s in range(plan.pp)
                       if set(plan.tp_group(d, s)) & set(ev.ranks)})
        what = ", ".join(f"replica {d} stage {s}" for d, s in held[:8]) + (" ..." if len(held) > 8 else "")
        parts.append(f"node {ev.node} (devices {ev.ranks[0]}-{ev.ranks[-1]}: {what})")
    return (f"stopped before step {step}: lost {'; '.join(parts)}; every pipeline stage of every replica "
            "is needed by this plan (continuing on fewer replicas is not simulated), so training stops here")


def simulate_steps(model, plan, cluster, profile, steps: int, scenario: Scenario | None = None,
                   controller: SimController | None = None, symmetric_dp: bool = True,
                   program_fn=None) -> RunResult:
    """Simulate ``steps`` consecutive training steps (see the module docstring)."""
    return MultiStepEngine(model, plan, cluster, profile, steps, scenario, controller, symmetric_dp,
                           program_fn).run()


@dataclass
class Comparison:
    """An adaptive run against the fixed plan under the same scenario and the cluster as
    its topology file describes it, over the steps from the first scenario event on
    (``from_step``): throughput = tokens of those steps / their simulated time, so the
    transition steps and any migration are counted (net of migration)."""

    from_step: int
    unslowed_tokens_per_s: float
    fixed_tokens_per_s: float
    adaptive_tokens_per_s: float
    recovered_frac: float | None  # (adaptive - fixed) / (unslowed - fixed); None if nothing was lost
    fixed_steps_tokens_per_s: list[float] = field(default_factory=list)  # per step, for the report

    def to_dict(self) -> dict:
        return asdict(self)


def window_tokens_per_s(res: RunResult, first: int, last: int, tokens: float) -> float:
    """Throughput of steps first..last (from 1, inclusive) of ``res``."""
    steps = [s for s in res.steps if first <= s.step <= last]
    total = sum(s.step_time_s for s in steps)
    return tokens * len(steps) / total if total > 0 else 0.0


def compare_runs(adaptive: RunResult, fixed: RunResult, unslowed: RunResult, scenario: Scenario) -> Comparison:
    with_events = [s.step for s in fixed.steps if s.events]
    first = with_events[0] if with_events else 1
    last = min(len(adaptive.steps), len(fixed.steps))
    tokens = adaptive.steps[0].tokens_per_s * adaptive.steps[0].step_time_s if adaptive.steps else 0.0
    ref = unslowed.steps[-1].tokens_per_s if unslowed.steps else 0.0
    fx = window_tokens_per_s(fixed, first, last, tokens)
    ad = window_tokens_per_s(adaptive, first, last, tokens)
    lost = ref - fx
    rec = (ad - fx) / lost if lost > 1e-9 * ref else None
    return Comparison(first, ref, fx, ad, rec, [s.tokens_per_s for s in fixed.steps])


# ---------------------------------------------------------------- one plan's steady step
# Steps simulated to price a plan with cross-step overlap: step 1 has no previous step to
# overlap with and the last drains, so the middle step of three is the steady state.
STEADY_STEPS = 3


def steady_state_result(model, plan, cluster, profile, record: bool = False, symmetric_dp: bool = True):
    """StepResult of a plan with ``overlap_step`` != none: the steady step of a
    STEADY_STEPS-step run (what the overlap changes), with the single-step simulation's
    memory, links and timeline (a synchronous step's) around it. The breakdown is the
    middle step's per-device accounting, scaled to sum to its step time. With ``delayed``
    a device also holds the reduced gradients of the previous step beside the buffer the
    current step accumulates into: its gradient memory doubles."""
    from dataclasses import replace as _replace

    from sim.engine import Engine
    from sim.metrics import summarize

    sync = _replace(plan, overlap_step="none")
    prog = build_program(model, sync, cluster, profile)
    eng = Engine(prog, record=record, symmetric_dp=symmetric_dp)
    res = summarize(prog, eng, eng.run())
    run = simulate_steps(model, plan, cluster, profile, STEADY_STEPS, symmetric_dp=symmetric_dp)
    mid = run.steps[STEADY_STEPS // 2]
    step = mid.step_time_s
    ratio = res.step_time_s / step
    weights = sum(d.represents for d in mid.devices)
    bd = {k: sum(d.breakdown_s[k] * d.represents for d in mid.devices) / weights for k in CATEGORIES}
    total = sum(bd.values())
    if total < step:
        bd["idle"] += step - total
    elif total > 0:
        bd = {k: v * step / total for k, v in bd.items()}
    devices = res.devices
    if plan.overlap_step == "delayed":
        devices = []
        for d in res.devices:
            mem = dict(d.memory_gib)
            mem["grads"] = round(2 * mem.get("grads", 0.0), 4)
            peak = d.peak_memory_gib + d.memory_gib.get("grads", 0.0)
            devices.append(_replace(d, memory_gib=mem, peak_memory_gib=peak, fits_memory=peak <= d.capacity_gib))
    shortfall = max(0.0, max(d.peak_memory_gib - d.capacity_gib for d in devices))
    return _replace(
        res, plan=plan.to_string(), step_time_s=step, tokens_per_s=res.tokens_per_s * ratio,
        model_tflops_per_gpu=res.model_tflops_per_gpu * ratio,
        hardware_tflops_per_gpu=res.hardware_tflops_per_gpu * ratio, mfu=res.mfu * ratio, hfu=res.hfu * ratio,
        peak_memory_gib=max(d.peak_memory_gib for d in devices), fits_memory=all(d.fits_memory for d in devices),
        memory_shortfall_gib=shortfall, bubble_fraction=bd["bubble"] / step,
        exposed_comm_s={k: bd[k] for k in ("tp", "pp", "dp")}, breakdown=bd, devices=devices)
