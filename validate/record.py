"""The run record of one real run (JSON), and its timeline in the simulator's trace layout.

``RunRecord.from_workers`` turns what every worker measured into the record the
contract (VALIDATOR.md) fixes: the slowest rank's wall time per step, its median and
spread after warm-up, per-phase times in the simulator's categories (sim/result.py
CATEGORIES, ``cp`` included) so measured and predicted pair one to one, per-rank peak memory, saved activations
and bytes sent, losses, and the last step's segments.

``timeline(record)`` gives an object with the attributes reports/trace.trace_events
reads from a simulated StepResult (devices with rank/stage/gpu/pipeline/represents,
segments, link_samples, busiest_links), so a measured Chrome trace is written by the same
code, with the same process and thread naming, as a simulated one.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from sim.result import CATEGORIES, Segment
from validate.probe import run_probe_s


def _step_statistics(step_times) -> dict:
    """The record's step-time fields: every step time, their median, p10 and p90, seconds."""
    times = np.asarray(step_times, dtype=float)
    return {"step_times_s": [float(t) for t in times], "median_step_time_s": float(np.median(times)),
            "p10_step_time_s": float(np.percentile(times, 10)), "p90_step_time_s": float(np.percentile(times, 90))}


def _median_over_steps(per_step: list[dict]) -> dict[str, float]:
    keys = sorted({k for d in per_step for k in d})
    return {k: float(statistics.median(d.get(k, 0.0) for d in per_step)) for k in keys}


@dataclass
class RunRecord:
    model: str
    plan: str
    world: int
    backend: str
    device: str
    steps: int
    warmup: int
    seed: int
    created_utc: str
    step_times_s: list[float]
    median_step_time_s: float
    p10_step_time_s: float
    p90_step_time_s: float
    phases_s: dict[str, float]
    detail_s: dict[str, float]
    per_rank: list[dict]
    losses: list[float]
    segments: list[dict] = field(default_factory=list)
    # The host's speed during the run, seconds of validate/probe.py's probe: the median of
    # every launch's probes before and after its steps (probe.run_probe_s; each the median
    # over ranks), or the probe before the steps where a record has no launch probes; 0 in
    # records written before the probe.
    speed_probe_s: float = 0.0
    launches: int = 1  # separate launches of fresh processes whose steps this record pools
    # Each launch's median step time, seconds, in launch order: a launch is one draw of
    # where the processes and their threads land, and the same plan's launches can differ
    # by more than the model's error ([] in records written before it).
    launch_medians_s: list[float] = field(default_factory=list)
    # Each launch's probe (median over ranks), seconds, before and after its steps, in
    # launch order: whether a launch's step time follows the host's speed at its start
    # ([] in records written before it).
    launch_probes_s: list[list[float]] = field(default_factory=list)
    # Each launch's call probe [before, after] its steps (validate/probe.call_probe_s: the
    # median over the pairs of ranks); [] for an odd world or a record without them.
    launch_call_probes_s: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunRecord":
        return cls(**d)

    def write_json(self, path: str | Path) -> None:
        """Atomically: a reader never sees a half-written record."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)

    @classmethod
    def read_json(cls, path: str | Path) -> "RunRecord":
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def pooled(cls, records: list["RunRecord"]) -> "RunRecord":
        """One record of the same plan run in several launches (fresh processes each): the
        step times pooled, so the median and percentiles are over every measured step;
        per-phase figures (each launch's median over its steps) and each rank's, weighted by
        steps; the speed probe, the mean of the launches'; peak memory, the largest;
        losses, bytes and the timeline, the first launch's; each launch's median kept."""
        if not records:
            raise ValueError("pooled() needs at least one record")
        if len(records) == 1:
            return records[0]
        first = records[0]
        w = np.asarray([r.steps for r in records], dtype=float)
        w = w / w.sum()

        def mean_of(dicts: list[dict]) -> dict[str, float]:
            keys = sorted({k for d in dicts for k in d})
            return {k: float(sum(wi * d.get(k, 0.0) for wi, d in zip(w, dicts))) for k in keys}
        per_rank = []
        for i, pr in enumerate(first.per_rank):
            ranks = [r.per_rank[i] for r in records]
            per_rank.append({**pr, "phases_s": mean_of([x["phases_s"] for x in ranks]),
                             "host_per_step": mean_of([x.get("host_per_step", {}) for x in ranks]),
                             "peak_memory_bytes": max(int(x["peak_memory_bytes"]) for x in ranks),
                             "saved_activation_bytes": max(int(x.get("saved_activation_bytes", 0)) for x in ranks)})
        probes = [r.speed_probe_s for r in records]
        launch_probes = [p for r in records for p in r.launch_probes_s]
        return replace(
            first, steps=sum(r.steps for r in records), created_utc=records[-1].created_utc,
            **_step_statistics([t for r in records for t in r.step_times_s]),
            phases_s=mean_of([r.phases_s for r in records]), detail_s=mean_of([r.detail_s for r in records]),
            per_rank=per_rank, speed_probe_s=(run_probe_s(launch_probes) if all(r.launch_probes_s for r in records)
                                              else float(statistics.fmean(probes)) if all(probes) else 0.0),
            launches=sum(r.launches for r in records),
            launch_medians_s=[m for r in records for m in (r.launch_medians_s or [r.median_step_time_s])],
            launch_probes_s=launch_probes,
            launch_call_probes_s=[p for r in records for p in r.launch_call_probes_s])

    @classmethod
    def from_workers(cls, workers: list[dict], *, model: str, plan: str, backend: str, device: str,
                     steps: int, warmup: int, seed: int) -> "RunRecord":
        """workers[r]: what rank r returned (see validate/runner.py ``_worker``): its
        coordinates, 'steps' (per step: wall_s, phases_s, detail_s, bytes_sent), the last
        step's 'segments', 'peak_memory_bytes' and 'losses' (replica loss per step, on
        the rank that computes it). ``losses`` of the record cover every step, warm-up
        included; everything else only the measured steps."""
        measured = range(warmup, warmup + steps)
        step_times = [max(w["steps"][j]["wall_s"] for w in workers) for j in measured]
        per_rank, mean_phases, mean_detail = [], [], []
        for w in workers:
            ph_steps = []
            for j, t in zip(measured, step_times):
                ph = {c: w["steps"][j]["phases_s"].get(c, 0.0) for c in CATEGORIES}
                # Whatever of the slowest rank's step this rank spent neither working nor
                # in a timed wait (start skew after the barrier, Python between spans).
                ph["idle"] = max(0.0, t - sum(v for c, v in ph.items() if c != "idle"))
                ph_steps.append(ph)
            per_rank.append({
                "rank": w["rank"], "stage": w["stage"], "tp_rank": w["tp_rank"], "dp_rank": w["dp_rank"],
                "cp_rank": w.get("cp_rank", 0),
                "phases_s": _median_over_steps(ph_steps),
                "peak_memory_bytes": int(w["peak_memory_bytes"]),
                # the first step's peak of tensors saved for backward (validate/saved_bytes.py;
                # 0: not measured)
                "saved_activation_bytes": int(w.get("saved_activation_bytes", 0)),
                # median over the measured steps (validate/runner.host_counters)
                "host_per_step": _median_over_steps([w["steps"][j].get("host", {}) for j in measured]),
                "bytes_sent": {k: float(w["steps"][measured[-1]]["bytes_sent"].get(k, 0.0))
                               for k in ("dp", "tp", "pp", "cp")},
            })
            mean_phases.append(ph_steps)
            mean_detail.append([w["steps"][j]["detail_s"] for j in measured])
        n = len(workers)
        phases_per_step = [{c: sum(r[i][c] for r in mean_phases) / n for c in CATEGORIES}
                           for i in range(steps)]
        detail_keys = sorted({k for r in mean_detail for d in r for k in d})
        detail_per_step = [{k: sum(r[i].get(k, 0.0) for r in mean_detail) / n for k in detail_keys}
                           for i in range(steps)]
        # Replica losses are already scaled by their share of the global batch: their sum
        # is the global mean loss of the step.
        n_steps = len(workers[0]["steps"])
        losses = [sum(w["losses"][j] for w in workers if w["losses"]) for j in range(n_steps)]
        segments = []
        for w in workers:
            segments += [dict(s, device=w["rank"]) for s in w["segments"]]
        stats = _step_statistics(step_times)
        launch_probes = ([[float(statistics.median(w["probe_s"][i] for w in workers)) for i in (0, 1)]]
                         if all(len(w.get("probe_s") or []) > 1 for w in workers) else [])
        return cls(
            model=model, plan=plan, world=n, backend=backend, device=device, steps=steps,
            warmup=warmup, seed=seed, created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **stats,
            phases_s=_median_over_steps(phases_per_step), detail_s=_median_over_steps(detail_per_step),
            per_rank=per_rank, losses=losses, segments=segments,
            speed_probe_s=(run_probe_s(launch_probes) if launch_probes
                           else float(statistics.median(w["probe_s"][0] for w in workers))
                           if all(w.get("probe_s") for w in workers) else 0.0),
            launch_medians_s=[stats["median_step_time_s"]],
            launch_probes_s=launch_probes,
            launch_call_probes_s=([[float(statistics.median(w["call_probe_s"][i] for w in workers)) for i in (0, 1)]]
                                  if n % 2 == 0 and all(len(w.get("call_probe_s") or []) > 1 for w in workers) else []),
        )


@dataclass
class MeasuredDevice:
    """The fields of sim.result.DeviceResult that a trace names a process by."""

    rank: int
    stage: int
    gpu: str
    pipeline: str = "measured"
    represents: int = 1


@dataclass
class MeasuredTimeline:
    """A measured step shaped like the parts of sim.result.StepResult that
    reports/trace.trace_events reads."""

    devices: list[MeasuredDevice]
    segments: list[Segment]
    link_samples: list = field(default_factory=list)  # not measured: no network counters
    busiest_links: list = field(default_factory=list)


def timeline(rec: RunRecord) -> MeasuredTimeline:
    """The last measured step of ``rec`` as a trace-ready timeline (one device per rank)."""
    devices = [MeasuredDevice(r["rank"], r["stage"], rec.device) for r in rec.per_rank]
    segs = [Segment(s["device"], s["stream"], s["cat"], s["start_s"], s["end_s"], s["label"])
            for s in rec.segments]
    return MeasuredTimeline(devices, segs)
