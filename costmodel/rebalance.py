"""Adaptive load balancing: re-allocate work units across ranks from measured busy times.

One formula-level component shared by the simulator (``--adaptive``) and the real runner
(validate/adaptive_run.py), so the simulated controller and the real one are the same code.
A *unit* is whatever is divisible between ranks: samples or microbatches per data-parallel
replica, or layers per pipeline stage. The model of a rank is linear: busy time of rank i is
``units[i] * per_unit_s[i]``; the controller estimates ``per_unit_s`` from observed busy
times (busy / units) with an exponentially weighted moving average, and re-allocates so the
slowest rank's predicted time (the step time, as ranks synchronise every step) is smallest.

Hysteresis, so noisy timings do not make it oscillate: it acts only when the predicted gain
is at least ``min_gain_frac`` of the current step AND the gain summed over the next
``horizon_steps`` steps exceeds the cost of moving the units (weights and optimizer state
for layers; ~0 for samples). Pure Python: no SimPy, no torch.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

from costmodel.errors import InputError
from costmodel.limits import number_problem

_SRC = "rebalance"


@dataclass(frozen=True)
class Decision:
    units: tuple[int, ...]  # new allocation (microbatches/samples per replica, or layers per stage)
    act: bool  # False: keep the current allocation
    predicted_step_s: float  # predicted max over ranks with `units`
    current_step_s: float  # predicted max over ranks with the current units
    migration_cost_s: float  # cost of moving from current to `units`
    reason: str  # one line, for reports


def _check_count(value: object, lo: int, field: str) -> None:
    """An integer >= ``lo`` (costmodel/limits.number_problem, the one range check)."""
    problem = number_problem(value, lo, math.inf, integer=True, hi_open=True)
    if problem:
        raise InputError(_SRC, field, f"{value!r}: {problem}")


def _check_units(units: Sequence[int], min_units: int, field: str) -> tuple[int, ...]:
    out = tuple(units)
    if not out:
        raise InputError(_SRC, field, "must list at least one rank")
    for i, u in enumerate(out):
        _check_count(u, min_units, f"{field}[{i}]")
    return out


def _check_times(values: Sequence[float], n: int, field: str, *, positive: bool) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) != n:
        raise InputError(_SRC, field, f"has {len(out)} entries; must have one per rank ({n})")
    for i, v in enumerate(out):
        problem = number_problem(v, 0.0, math.inf, lo_open=positive, hi_open=True)
        if problem:
            raise InputError(_SRC, f"{field}[{i}]", f"{v!r}: {problem} (seconds)")
    return out


def balance(per_unit_s: Sequence[float], total: int, min_units: int = 1) -> tuple[int, ...]:
    """Integer allocation of ``total`` units minimising max_i units[i] * per_unit_s[i].

    Greedy water-filling: every rank starts at ``min_units``; each further unit goes to the
    rank whose time after taking it is smallest. Because each rank's time grows linearly in
    its units, the k-th unit placed this way never raises the max above the optimum (an
    exchange argument: any allocation with a smaller max would have to give some rank fewer
    units while all the candidates are already above that max). Ties go to the lowest rank
    index, so the result is deterministic. Cost O(total * log ranks).
    """
    n = len(per_unit_s)
    if n == 0:
        raise InputError(_SRC, "per_unit_s", "must list at least one rank")
    times = _check_times(per_unit_s, n, "per_unit_s", positive=True)
    _check_count(min_units, 0, "min_units")
    _check_count(total, n * min_units, "total")  # at least ranks x min_units
    units = [min_units] * n
    # Heap of (time after one more unit, rank): the rank index breaks ties deterministically.
    heap = [((min_units + 1) * t, i) for i, t in enumerate(times)]
    heapq.heapify(heap)
    for _ in range(total - n * min_units):
        _, i = heapq.heappop(heap)
        units[i] += 1
        heapq.heappush(heap, ((units[i] + 1) * times[i], i))
    return tuple(units)


def step_time_s(units: Sequence[int], per_unit_s: Sequence[float]) -> float:
    """Predicted step time: the slowest rank's busy time (ranks synchronise every step)."""
    return max(u * t for u, t in zip(units, per_unit_s))


def units_moved(old: Sequence[int], new: Sequence[int], *, contiguous: bool = False) -> int:
    """Units that change rank going from ``old`` to ``new``.

    Free placement (samples, microbatches): the surplus ranks send to the deficit ranks, so
    sum of positive differences. Contiguous placement (pipeline layers in order): every unit
    crossing a stage boundary moves, so the sum over boundaries of how far the boundary moves
    (a layer shifted from stage 3 to stage 1 through stage 2 is counted at each boundary).
    """
    if contiguous:
        moved, shift = 0, 0
        for a, b in zip(old[:-1], new[:-1]):
            shift += b - a
            moved += abs(shift)
        return moved
    return sum(max(b - a, 0) for a, b in zip(old, new))


class Rebalancer:
    """Stateful controller: ``observe`` each step's per-rank busy times, then ``decide``.

    ``smoothing`` is the weight of the history in the EWMA of each rank's per-unit time:
    estimate <- smoothing * estimate + (1 - smoothing) * (busy / units); 0 uses only the
    latest step, values near 1 average over ~1/(1-smoothing) steps. ``cost_per_unit_moved_s``
    prices a migration (e.g. one layer's weights and Adam state over the link, in seconds);
    ``contiguous`` counts moved units as pipeline boundaries do (see ``units_moved``).
    ``median_of`` > 1 feeds the EWMA the median of each rank's last ``median_of`` per-unit
    samples instead of the latest: one step stalled by the OS (a descheduled process on a
    shared host took 5x its usual time here) then moves nothing, at the price of reacting
    a step or two later to a real change.
    """

    def __init__(self, units: Sequence[int], *, min_units: int = 1, horizon_steps: int = 10,
                 smoothing: float = 0.5, min_gain_frac: float = 0.02,
                 cost_per_unit_moved_s: float = 0.0, contiguous: bool = False, median_of: int = 1):
        _check_count(min_units, 0, "min_units")
        self._units = _check_units(units, min_units, "units")
        _check_count(horizon_steps, 1, "horizon_steps")
        _check_count(median_of, 1, "median_of")
        for field, value, hi in (("smoothing", smoothing, 1.0), ("min_gain_frac", min_gain_frac, 1.0),
                                 ("cost_per_unit_moved_s", cost_per_unit_moved_s, math.inf)):
            problem = number_problem(value, 0.0, hi, hi_open=True)
            if problem:
                raise InputError(_SRC, field, f"{value!r}: {problem}")
        self.median_of = median_of
        self._recent: list[list[float]] = [[] for _ in self._units]  # last per-unit samples per rank
        self.min_units = min_units
        self.horizon_steps = horizon_steps
        self.smoothing = smoothing
        self.min_gain_frac = min_gain_frac
        self.cost_per_unit_moved_s = cost_per_unit_moved_s
        self.contiguous = contiguous
        self._per_unit_s: tuple[float, ...] | None = None

    @property
    def units(self) -> tuple[int, ...]:
        return self._units

    @property
    def per_unit_s(self) -> tuple[float, ...] | None:
        """The smoothed per-unit time estimate per rank (None before the first observation)."""
        return self._per_unit_s

    def observe(self, busy_s: Sequence[float]) -> None:
        """Record one step's measured busy time per rank for its current units (seconds)."""
        busy = _check_times(busy_s, len(self._units), "busy_s", positive=False)
        # A rank holding 0 units (min_units=0) says nothing about its speed: keep its estimate.
        sample = [b / u if u > 0 else None for b, u in zip(busy, self._units)]
        if self.median_of > 1:
            for i, x in enumerate(sample):
                if x is not None:
                    recent = self._recent[i]
                    recent.append(x)
                    del recent[:-self.median_of]
                    sample[i] = sorted(recent)[len(recent) // 2]  # upper median of an even count
        if self._per_unit_s is None:
            known = [s for s in sample if s is not None and s > 0]
            fill = min(known) if known else 1.0
            self._per_unit_s = tuple(s if s is not None and s > 0 else fill for s in sample)
            return
        a = self.smoothing
        self._per_unit_s = tuple(
            old if s is None else max(a * old + (1.0 - a) * s, 1e-12)
            for old, s in zip(self._per_unit_s, sample))

    def decide(self) -> Decision:
        """Best allocation for the smoothed per-unit times, adopted only when it pays off."""
        cur = self._units
        if self._per_unit_s is None:
            return Decision(cur, False, 0.0, 0.0, 0.0, "no observations yet")
        t = self._per_unit_s
        best = balance(t, sum(cur), self.min_units)
        current_s = step_time_s(cur, t)
        predicted_s = step_time_s(best, t)
        moved = units_moved(cur, best, contiguous=self.contiguous)
        cost_s = moved * self.cost_per_unit_moved_s
        gain_s = current_s - predicted_s
        if best == cur or gain_s <= 0:
            return Decision(cur, False, current_s, current_s, 0.0, f"balanced: {cur} is already optimal")
        if gain_s <= self.min_gain_frac * current_s:
            return Decision(best, False, predicted_s, current_s, cost_s,
                            f"gain {gain_s:.3g} s/step is <= {self.min_gain_frac:.0%} of {current_s:.3g} s")
        if self.horizon_steps * gain_s <= cost_s:
            return Decision(best, False, predicted_s, current_s, cost_s,
                            f"gain {gain_s:.3g} s/step x {self.horizon_steps} steps <= migration {cost_s:.3g} s")
        self._units = best
        return Decision(best, True, predicted_s, current_s, cost_s,
                        f"move {moved} units {cur} -> {best}: step {current_s:.3g} -> {predicted_s:.3g} s, "
                        f"migration {cost_s:.3g} s")
