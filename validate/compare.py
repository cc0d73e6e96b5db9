"""Measured vs predicted: one real run (validate/record.RunRecord) beside the simulation of
the same model and plan (sim.result.StepResult), per step and per phase.

Phases are the simulator's categories (sim/result.CATEGORIES): the run record measures
them per rank in the same categories, so they pair one to one. The error is
(predicted - measured) / measured of the median step time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from sim.result import CATEGORIES, StepResult
from validate.accuracy import spearman
from validate.probe import DRIFT_MAX, DRIFT_MIN


@dataclass
class Comparison:
    plan: str
    world: int
    measured_step_time_s: float
    predicted_step_time_s: float
    p10_step_time_s: float
    p90_step_time_s: float
    phases: dict[str, dict[str, float]]  # category -> {measured_s, predicted_s}
    record: dict = field(default_factory=dict)  # the run record (RunRecord.to_dict())
    sim: StepResult | None = None
    # validate/probe.py: the host's compute during the run over at calibration (None: not
    # both measured, or out of bounds), whether the prediction used it, the calibrated probe
    drift: float | None = None
    drift_applied: bool = False
    calibrated_probe_s: float = 0.0
    drift_plans: int = 1  # plans whose probes the factor pools (probe.validation_drift)
    # validate/probe.call_probe_s: the factor on the collectives' call costs that prices the
    # probe's row at what the probes read during the run (probe.call_drift anchored by
    # probe.anchored_call_factor; None: not both measured, or out of bounds), whether the
    # prediction used it, the calibrated figure, the profile's own price of that row
    call_drift: float | None = None
    call_drift_applied: bool = False
    calibrated_call_probe_s: float = 0.0
    priced_call_probe_s: float = 0.0
    # Activations kept for backward, measured on the first step (validate/saved_bytes.py)
    # and predicted by the cost model's memory (costmodel/device_memory.py), per rank.
    saved: dict = field(default_factory=dict)
    # Pipeline plans: per stage, category -> {measured_s, predicted_s} (phases_by_stage)
    stages: dict = field(default_factory=dict)

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_step_time_s / self.measured_step_time_s - 1.0)

    def to_dict(self) -> dict:
        return {"plan": self.plan, "world": self.world,
                "measured_step_time_s": self.measured_step_time_s,
                "predicted_step_time_s": self.predicted_step_time_s,
                "error_pct": self.error_pct,
                "measured_p10_s": self.p10_step_time_s, "measured_p90_s": self.p90_step_time_s,
                "measured_steps": int(self.record.get("steps", 0)), "launches": int(self.record.get("launches", 1)),
                # every measured step (launch after launch) and each launch's median, seconds
                "measured_step_times_s": [float(t) for t in self.record.get("step_times_s", [])],
                "launch_medians_s": [float(t) for t in self.record.get("launch_medians_s", [])],
                "launch_spread_pct": self.launch_spread_pct(),
                "phases": self.phases,
                # the runner's finer measured split (forward, backward, optimizer, each collective)
                "measured_detail_s": dict(self.record.get("detail_s", {})),
                "host_per_step": self.host_per_step(),
                "speed_probe": {"run_s": float(self.record.get("speed_probe_s", 0.0)),
                                # each launch's (before, after its steps), seconds
                                "launches_s": [[float(x) for x in p] for p in self.record.get("launch_probes_s", [])],
                                "calibrated_s": self.calibrated_probe_s, "drift_factor": self.drift,
                                "drift_plans": self.drift_plans, "applied": self.drift_applied},
                # each launch's call probe (before, after its steps), seconds a 32 KiB 2-rank
                # all-reduce adds to a round of layer code (validate/probe.call_probe_s)
                "call_probe": {"launches_s": [[float(x) for x in p]
                                              for p in self.record.get("launch_call_probes_s", [])],
                               "calibrated_s": self.calibrated_call_probe_s, "priced_s": self.priced_call_probe_s,
                               "drift_factor": self.call_drift, "applied": self.call_drift_applied},
                "activation_memory": self.saved,
                "phases_by_stage": {str(s): v for s, v in self.stages.items()}}

    def launch_spread_pct(self) -> float | None:
        """How far apart the launches' medians were: (slowest / fastest - 1) x 100, or None
        with fewer than two launches. Each launch is one draw of where the processes and
        their threads land (docs/validation-cpu.md); a spread wider than the tolerance a
        prediction is judged by says the measurement itself is that uncertain."""
        meds = [float(x) for x in self.record.get("launch_medians_s", [])]
        if len(meds) < 2 or min(meds) <= 0:
            return None
        return 100.0 * (max(meds) / min(meds) - 1.0)

    def host_per_step(self) -> dict[str, float]:
        """The busiest rank's median minor page faults and involuntary context switches
        per measured step (validate/runner.host_counters): where a measured step is slower
        than predicted, these say whether the host (fresh memory, a taken core) was why."""
        ranks = [r.get("host_per_step", {}) for r in self.record.get("per_rank", [])]
        keys = sorted({k for r in ranks for k in r})
        return {k: float(max(r.get(k, 0.0) for r in ranks)) for k in keys}


# Why a plan's measured activations are not the cost model's kind (costmodel/device_memory.py).
_CP_APART = ("context parallelism: the runner's ring attention is autograd's, which keeps every received K/V "
             "block and each block's output; Transformer Engine's, which the cost model follows, exchanges the "
             "blocks again in backward")


def saved_activations(record, predicted: dict[int, float], plan) -> dict:
    """Measured vs predicted activations kept for backward: every rank's pair and the
    busiest measured rank's, with the error (predicted over measured); {} when the run did
    not measure them (no warm-up step)."""
    ranks = [(int(r["rank"]), int(r.get("saved_activation_bytes", 0))) for r in record.per_rank]
    if not ranks or not any(b for _, b in ranks):
        return {}
    rank, got = max(ranks, key=lambda rb: (rb[1], -rb[0]))
    out = {"rank": rank, "measured_bytes": got, "predicted_bytes": float(predicted[rank]),
           "error_pct": 100.0 * (float(predicted[rank]) / got - 1.0) if got else None,
           "per_rank": [[r, b, float(predicted[r])] for r, b in ranks]}
    if plan.cp > 1:
        out["not_comparable"] = _CP_APART
    return out


def predicted_saved_bytes(model, plan, runtime, per_rank: list[dict]) -> dict[int, float]:
    """The cost model's activations kept for backward (layers' and the output end's) on
    each measured rank: sim.program.stage_memory of its stage, with its replica's
    microbatches."""
    from sim.program import stage_memory
    out = {}
    for r in per_rank:
        mem = stage_memory(model, plan, runtime, int(r["stage"]), plan.mb_shares[int(r["dp_rank"])])
        out[int(r["rank"])] = mem["activations"] + mem["logits"]
    return out


def phases_by_stage(per_rank: list[dict], sim: StepResult) -> dict[int, dict[str, dict[str, float]]]:
    """Per pipeline stage, each category's seconds a step: measured, the mean over the
    stage's ranks (RunRecord.per_rank); predicted, the mean over the simulated devices of
    that stage weighted by the devices each stands for (StepResult.devices). Where a
    pipeline's prediction misses, this says which stage and which category (the bubble
    of the stage that waits, or the compute of the one it waits for). {} without a
    pipeline."""
    stages = sorted({int(r["stage"]) for r in per_rank})
    if len(stages) < 2:
        return {}
    out = {}
    for s in stages:
        ranks = [r["phases_s"] for r in per_rank if int(r["stage"]) == s]
        devs = [d for d in sim.devices if d.stage == s]
        w = sum(d.represents for d in devs) or 1
        out[s] = {c: {"measured_s": sum(r.get(c, 0.0) for r in ranks) / len(ranks),
                      "predicted_s": sum(d.breakdown_s.get(c, 0.0) * d.represents for d in devs) / w}
                  for c in CATEGORIES}
    return out


def compare(record, sim: StepResult, *, drift: float | None = None, drift_applied: bool = False,
            calibrated_probe_s: float = 0.0, saved: dict | None = None, drift_plans: int = 1,
            call_drift: float | None = None, call_drift_applied: bool = False,
            calibrated_call_probe_s: float = 0.0, priced_call_probe_s: float = 0.0) -> Comparison:
    """Pair a run record with the simulated step of the same plan (simulated with the
    profile slowed by ``drift`` when ``drift_applied``, its call costs by ``call_drift``
    when ``call_drift_applied``); ``saved``: saved_activations'."""
    measured = dict(record.phases_s)
    phases = {c: {"measured_s": float(measured.get(c, 0.0)), "predicted_s": float(sim.breakdown.get(c, 0.0))}
              for c in CATEGORIES}
    return Comparison(plan=record.plan, world=record.world,
                      measured_step_time_s=float(record.median_step_time_s),
                      predicted_step_time_s=float(sim.step_time_s),
                      p10_step_time_s=float(record.p10_step_time_s), p90_step_time_s=float(record.p90_step_time_s),
                      phases=phases, record=record.to_dict(), sim=sim, drift=drift, drift_applied=drift_applied,
                      calibrated_probe_s=calibrated_probe_s, saved=saved or {}, drift_plans=drift_plans,
                      call_drift=call_drift, call_drift_applied=call_drift_applied,
                      calibrated_call_probe_s=calibrated_call_probe_s, priced_call_probe_s=priced_call_probe_s,
                      stages=phases_by_stage(record.per_rank, sim))


# Fields every plan of benchmarks/validate_cpu.sh shares (mbs=1, degrees of 1, the runner's
# precision; 1F1B without a pipeline): left out where those plans are listed.
_SHARED_FIELDS = {"mbs=1", "tp=1", "pp=1", "dp=1"}


def short_plan(plan: str) -> str:
    """``plan`` without the fields the validation benchmark's plans all share (whole
    fields: pp=12 stays)."""
    fields = plan.split(",")
    pipelined = any(x.startswith("pp=") and x != "pp=1" for x in fields)
    return ",".join(x for x in fields if x not in _SHARED_FIELDS and not x.startswith("precision=")
                    and not (x == "schedule=1f1b" and not pipelined))


@dataclass
class Ranking:
    """Several plans validated together: does the simulator order them as measured?"""

    comparisons: list[Comparison]

    @property
    def spearman(self) -> float | None:
        if len(self.comparisons) < 2:
            return None
        return spearman([c.predicted_step_time_s for c in self.comparisons],
                        [c.measured_step_time_s for c in self.comparisons])

    @property
    def max_abs_error_pct(self) -> float:
        return max(abs(c.error_pct) for c in self.comparisons)

    def same_order(self) -> bool:
        """True when sorting by predicted and by measured step time gives the same plans order."""
        by_p = sorted(range(len(self.comparisons)), key=lambda i: (self.comparisons[i].predicted_step_time_s, i))
        by_m = sorted(range(len(self.comparisons)), key=lambda i: (self.comparisons[i].measured_step_time_s, i))
        return by_p == by_m

    @staticmethod
    def measured_range_s(c: Comparison) -> tuple[float, float]:
        """Where the plan's measured median could have landed: the lowest and highest of
        its launch medians when it ran in two launches or more (a launch is one draw of
        where the processes and their threads land; the same plan's median moves between
        launches far more than between steps), else its steps' p10..p90."""
        meds = [float(x) for x in c.record.get("launch_medians_s", [])]
        if len(meds) >= 2:
            return min(meds), max(meds)
        return c.p10_step_time_s, c.p90_step_time_s

    def told_apart(self, i: int, j: int) -> bool:
        """True when the runs order plans i and j whatever the draw: their measured
        ranges (measured_range_s) do not overlap. Plans whose ranges overlap are a
        measured tie: either order of their predictions is consistent with the runs."""
        (lo_i, hi_i), (lo_j, hi_j) = (self.measured_range_s(self.comparisons[k]) for k in (i, j))
        return hi_i < lo_j or hi_j < lo_i

    def resolved_order(self) -> bool:
        """True when the prediction orders every pair the runs tell apart as measured:
        the ranking's order up to measured ties (strictly: same_order)."""
        return not any(self.told_apart(i, j) for i, j, _ in self.swapped_pairs())

    def ties(self) -> list[tuple[int, int]]:
        """(i, j) for every pair of plans the runs do not tell apart."""
        n = len(self.comparisons)
        return [(i, j) for i in range(n) for j in range(i + 1, n) if not self.told_apart(i, j)]

    def swapped_pairs(self) -> list[tuple[int, int, float]]:
        """(i, j, gap %) for every pair of plans the prediction orders the other way round
        from the measurement, i before j in the given order; gap: how far apart their
        measured medians are, % of the faster one. A swap between plans measured a few %
        apart says less than one between plans measured far apart: their medians move
        that much between launches (the same plan's median over several launches here
        moved by 5-30 %), so the gap is printed beside each swap."""
        cs, out = self.comparisons, []
        for i in range(len(cs)):
            for j in range(i + 1, len(cs)):
                dm = cs[i].measured_step_time_s - cs[j].measured_step_time_s
                dp = cs[i].predicted_step_time_s - cs[j].predicted_step_time_s
                if dm * dp < 0:
                    lo = min(cs[i].measured_step_time_s, cs[j].measured_step_time_s)
                    out.append((i, j, 100.0 * abs(dm) / lo))
        return out

    def to_dict(self) -> dict:
        cs = self.comparisons
        return {"plans": [c.to_dict() for c in cs], "spearman": self.spearman,
                "same_order": self.same_order(), "resolved_order": self.resolved_order(),
                "max_abs_error_pct": self.max_abs_error_pct,
                "measured_ties": [[cs[i].plan, cs[j].plan] for i, j in self.ties()],
                "swapped_pairs": [{"plans": [cs[i].plan, cs[j].plan], "measured_gap_pct": g,
                                   "told_apart": self.told_apart(i, j)} for i, j, g in self.swapped_pairs()]}


# Launch medians further apart than this get a note under the plan: the tolerance the
# validator's target judges a prediction by (issue: within 15 %), so a spread beyond it
# means the measurement alone could decide the verdict.
LAUNCH_SPREAD_NOTE_PCT = 15.0


def _launch_medians(record: dict) -> str:
    """': medians 63.4, 77.7 ms' (each launch's, in order), or '' when not recorded."""
    meds = record.get("launch_medians_s") or []
    return ": medians " + ", ".join(f"{m * 1e3:.1f}" for m in meds) + " ms" if meds else ""


def format_comparison(c: Comparison) -> str:
    lines = [f"plan {c.plan} ({c.world} processes)",
             f"  step time  measured {c.measured_step_time_s * 1e3:8.1f} ms (p10 {c.p10_step_time_s * 1e3:.1f}, "
             f"p90 {c.p90_step_time_s * 1e3:.1f})  predicted {c.predicted_step_time_s * 1e3:8.1f} ms  "
             f"error {c.error_pct:+.1f} %" + (f"  ({c.record.get('steps')} steps in {c.record.get('launches')} launches"
                                              + _launch_medians(c.record) + ")"
                                              if c.record.get("launches", 1) > 1 else ""),
             f"  {'phase':8s} {'measured (ms)':>14} {'predicted (ms)':>15}"]
    for cat, v in c.phases.items():
        lines.append(f"  {cat:8s} {v['measured_s'] * 1e3:>14.2f} {v['predicted_s'] * 1e3:>15.2f}")
    for s, cats in c.stages.items():
        shown = [f"{cat} {v['measured_s'] * 1e3:.1f}/{v['predicted_s'] * 1e3:.1f}" for cat, v in cats.items()
                 if v["measured_s"] > 0 or v["predicted_s"] > 0]
        lines.append(f"  stage {s} (ms measured/predicted): " + ", ".join(shown))
    spread = c.launch_spread_pct()
    if spread is not None and spread > LAUNCH_SPREAD_NOTE_PCT:
        lines.append(f"  launches {spread:.0f} % apart (each launch is one draw of where processes and threads "
                     f"land): the measured median is that uncertain; more --launches narrow it")
    run_probe = float(c.record.get("speed_probe_s", 0.0))
    if run_probe > 0 and c.calibrated_probe_s > 0:
        over = f", the median over the {c.drift_plans} plans' probes" if c.drift_plans > 1 else ""
        how = (f"compute predicted x{c.drift:.3f}{over}" if c.drift_applied else
               "not applied" if c.drift is not None else f"outside {DRIFT_MIN:g}..{DRIFT_MAX:g}, not applied")
        lines.append(f"  host speed probe: {run_probe * 1e3:.2f} ms during the run, {c.calibrated_probe_s * 1e3:.2f} ms "
                     f"at calibration ({how})")
    calls = [x for pair in c.record.get("launch_call_probes_s", []) for x in pair if x > 0]
    if calls and c.calibrated_call_probe_s > 0:
        how = (f"call costs predicted x{c.call_drift:.3f}, from the median over the probes of the plans of "
               f"{c.world} processes" if c.call_drift_applied else
               "not applied" if c.call_drift is not None else f"outside {DRIFT_MIN:g}..{DRIFT_MAX:g}, not applied")
        priced = f", {c.priced_call_probe_s * 1e3:.2f} ms as the profile prices it" if c.priced_call_probe_s > 0 else ""
        lines.append(f"  call probe: {median(calls) * 1e3:.2f} ms a 2-rank all-reduce after compute during the run, "
                     f"{c.calibrated_call_probe_s * 1e3:.2f} ms at calibration{priced} ({how})")
    if c.saved:
        sv = c.saved
        lines.append(f"  activations kept for backward (first step, busiest rank {sv['rank']}): measured "
                     f"{sv['measured_bytes'] / 2**20:.3f} MiB, predicted {sv['predicted_bytes'] / 2**20:.3f} MiB"
                     + (f" ({sv['error_pct']:+.1f} %)" if sv.get("error_pct") is not None else "")
                     + (f"; not the cost model's kind: {sv['not_comparable']}" if sv.get("not_comparable") else ""))
    host = c.host_per_step()
    if host:
        lines.append("  host per step (busiest rank, median): "
                     + ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in host.items()))
    return "\n".join(lines)


def format_ranking(r: Ranking) -> str:
    from tabulate import tabulate
    rows = [[c.plan, c.world, f"{c.measured_step_time_s * 1e3:.1f}", f"{c.predicted_step_time_s * 1e3:.1f}",
             f"{c.error_pct:+.1f} %"] for c in r.comparisons]
    table = tabulate(rows, headers=["plan", "procs", "measured (ms)", "predicted (ms)", "error"],
                     tablefmt="simple", disable_numparse=True)
    rho = "n/a" if r.spearman is None else f"{r.spearman:.3f}"
    swaps = "".join(f"\n  swapped: {r.comparisons[i].plan} / {r.comparisons[j].plan} (measured {g:.1f} % apart"
                    + ("" if r.told_apart(i, j) else "; a measured tie") + ")"
                    for i, j, g in r.swapped_pairs())
    n = len(r.comparisons)
    return (table + f"\n\nSpearman rank correlation (predicted vs measured): {rho}; same order: "
            f"{'yes' if r.same_order() else 'no'}; order of the plans the runs tell apart: "
            f"{'yes' if r.resolved_order() else 'no'} ({len(r.ties())} of {n * (n - 1) // 2} pairs measured as ties); "
            f"largest |error|: {r.max_abs_error_pct:.1f} %" + swaps)
