"""Where each simulated device's step time goes: the accountant of one engine run.

It books every interval of a compute stream under one of result.CATEGORIES (so a
device's breakdown sums to the step time), keeps the timeline segments of every stream
when recording (traces and Gantt charts), the time each pipeline rank finished, and how
long each stage's gradient collectives have been running (the busy time the compute
stream's slowdown by overlapping communication is charged against).
"""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import simpy

from sim.result import CATEGORIES, Segment


class RankKey(NamedTuple):
    """One simulated pipeline rank: simulated replica class ``pipeline``, stage ``stage``."""

    pipeline: int
    stage: int


class StepAccountant:
    def __init__(self, env: simpy.Environment, ranks: list[tuple[int, ...]], stages: int, record: bool):
        """``ranks[pi][s]`` is the representative device of class pi's stage s (for the
        segments' device); ``stages`` pipeline stages each have their own DP busy time."""
        self.env = env
        self.record = record
        self._ranks = ranks
        # Seconds per category of each rank's compute stream.
        self.totals: dict[RankKey, dict[str, float]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0.0))
        self.segments: list[Segment] = []
        self.done_at: dict[RankKey, float] = {}
        # Gradient collectives per stage: start time of the one running (None if none)
        # and the total time of those finished, seconds.
        self._dp_inflight: list[float | None] = [None] * stages
        self._dp_busy_s = [0.0] * stages
        self._dp_running = [0] * stages  # collectives running now (ZeRO-3's gathers and reduce-scatters overlap)

    def seg(self, key: RankKey, stream: str, cat: str, t0: float, t1: float, label: str) -> None:
        """Book [t0, t1] of ``key``'s ``stream`` under ``cat``; only the compute stream
        counts towards the breakdown (the comm streams run beside it)."""
        if t1 <= t0:
            return
        if stream == "compute":
            self.totals[key][cat] += t1 - t0
        if self.record:
            self.segments.append(Segment(self._ranks[key[0]][key[1]], stream, cat, t0, t1, label))

    def finished(self, key: RankKey) -> None:
        """``key``'s compute stream is done with the step (now)."""
        self.done_at[key] = self.env.now

    # ------------------------------------------------------------ DP busy time
    def dp_started(self, stage: int) -> float:
        """A gradient collective of ``stage`` starts now; returns now."""
        t0 = self.env.now
        if self._dp_running[stage] == 0:
            self._dp_inflight[stage] = t0
        self._dp_running[stage] += 1
        return t0

    def dp_finished(self, stage: int, t0: float) -> None:
        """A collective of ``stage`` (started at ``t0``) ends now; the busy time counts
        while at least one runs."""
        self._dp_running[stage] -= 1
        if self._dp_running[stage] == 0:
            self._dp_busy_s[stage] += self.env.now - self._dp_inflight[stage]
            self._dp_inflight[stage] = None

    def share_dp_busy(self, other: "StepAccountant") -> None:
        """Count gradient-collective time in ``other``'s counters: consecutive steps of one
        multi-step run (sim/multistep.py), where one step's collectives overlap and slow
        the next step's compute."""
        # the running count guards the start time: all three are one shared state
        self._dp_inflight, self._dp_busy_s, self._dp_running = other._dp_inflight, other._dp_busy_s, other._dp_running

    def dp_busy_s(self, stage: int, t: float) -> float:
        """Seconds ``stage``'s gradient collectives have run up to time t (t = now)."""
        busy = self._dp_busy_s[stage]
        if self._dp_inflight[stage] is not None:
            busy += t - self._dp_inflight[stage]
        return busy
