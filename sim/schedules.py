"""Pipeline schedules as data: per pipeline rank, the ordered list of actions it runs.

An action is (model chunk, F or B, microbatch). With ``v`` chunks per rank, chunk ``c``
on rank ``r`` is virtual stage ``c * p + r`` (Megatron's interleaved layout: rank 0 holds
stages 0, p, 2p, ...). The engine (``sim/engine.py``) and the real runner both execute
these lists; ``list_schedule_makespan`` is a small independent executor used as the
reference that the engine is tested against.

Bubble fractions checked in the tests come from Narayanan et al. 2021 (SC21), as quoted
in docs/facts.md, "Pipeline bubble"; the interleaved activation factor
comes from Korthikanti et al. 2022 (same file, "Activation memory").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, Union

from costmodel.errors import InputError
from costmodel.limits import number_problem

__all__ = [
    "Action", "ScheduleError", "gpipe", "one_f_one_b", "interleaved", "make_schedule",
    "SCHEDULE_NAMES", "virtual_stage", "dependencies", "peak_inflight",
    "peak_inflight_total", "inflight_peaks", "mean_alive", "list_schedule_makespan",
]

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved")


class ScheduleError(InputError, ValueError):
    """Bad schedule parameters. An ``InputError`` (one line for the CLI) that is also a
    ``ValueError`` so that plain Python callers can catch it as one."""


@dataclass(frozen=True, order=True)
class Action:
    """One unit of pipeline work on one rank.

    chunk: model chunk index on this rank, 0..v-1 (virtual stage = chunk * p + rank).
    kind: 'F' (forward) or 'B' (backward, input and weight gradients together).
    mb: microbatch index 0..m-1.
    """
    chunk: int
    kind: str
    mb: int

    def __str__(self) -> str:  # compact form for traces and error messages: F1.3 = chunk 1, mb 3
        return f"{self.kind}{self.chunk}.{self.mb}"


def _check(p: int, m: int, v: int = 1) -> None:
    for name, val in (("p", p), ("m", m), ("v", v)):
        problem = number_problem(val, 1, math.inf, integer=True, hi_open=True)
        if problem:
            raise ScheduleError("plan", f"schedule.{name}", f"{name}={val!r}: {problem}")


def gpipe(p: int, m: int) -> list[list[Action]]:
    """GPipe (Huang et al. 2019) with a flush: every rank runs all m forwards, then all m
    backwards. Backwards run in forward order (mb 0 first), as PyTorch's ScheduleGPipe
    does; for equal stage times the makespan, (m + p - 1)(f + b), is the same for either
    order, and every rank holds all m microbatches' activations at the peak."""
    _check(p, m)
    return [[Action(0, "F", i) for i in range(m)] + [Action(0, "B", i) for i in range(m)]
            for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """PipeDream-flush / Megatron 1F1B (Narayanan et al. 2021): rank r runs
    min(p - r - 1, m) warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. At most min(p - r, m) microbatches are in flight."""
    _check(p, m)
    out = []
    for r in range(p):
        warm = min(p - r - 1, m)
        acts = [Action(0, "F", i) for i in range(warm)]
        for i in range(m - warm):              # steady state: F of mb warm+i, then B of mb i
            acts.append(Action(0, "F", warm + i))
            acts.append(Action(0, "B", i))
        acts += [Action(0, "B", i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def interleaved(p: int, m: int, v: int) -> list[list[Action]]:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2): each rank holds v model
    chunks; the pipeline is v*p virtual stages deep.

    Work order on every rank: microbatches go in groups of p. Forwards take a group
    through chunk 0, then the same group through chunk 1, ..., chunk v-1, then the next
    group. Backwards take the same groups but through chunks v-1 down to 0. So the k-th
    forward (k = 0..m*v-1) is chunk (k // p) % v of microbatch (k // (p*v)) * p + k % p,
    and the k-th backward the same with the chunk mirrored (v-1-chunk).

    Rank r first runs W = min((v-1)*p + 2*(p-r-1), m*v) forwards. (v-1)*p is what fills
    the later chunks before the first microbatch can come back; 2*(p-r-1) covers the
    round trip of that first microbatch down to the last rank and its backward back up.
    Then it alternates forward k+W and backward k, and drains the last W backwards.
    Requires m % p == 0 so every group is full.
    """
    _check(p, m, v)
    if m % p != 0:
        raise ScheduleError("plan", "schedule.m",
                            f"interleaved schedule needs the number of microbatches m={m} "
                            f"to be a multiple of the pipeline size p={p}")
    if v < 2:
        raise ScheduleError("plan", "schedule.v",
                            f"interleaved schedule needs v >= 2 chunks per rank, got v={v}; "
                            "use '1f1b' for one chunk")
    total = m * v

    def fwd(k: int) -> Action:
        return Action((k // p) % v, "F", (k // (p * v)) * p + k % p)

    def bwd(k: int) -> Action:
        return Action(v - 1 - (k // p) % v, "B", (k // (p * v)) * p + k % p)

    out = []
    for r in range(p):
        warm = min((v - 1) * p + 2 * (p - r - 1), total)
        acts = [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            acts.append(fwd(k + warm))
            acts.append(bwd(k))
        acts += [bwd(k) for k in range(total - warm, total)]
        out.append(acts)
    return out


def make_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Dispatch by name: 'gpipe' | '1f1b' | 'interleaved' (v chunks per rank)."""
    key = str(name).lower()
    if key == "gpipe" or key == "1f1b":
        if v != 1:
            raise ScheduleError("plan", "schedule.v",
                                f"schedule {name!r} runs one chunk per rank, got v={v}; "
                                "use 'interleaved' for v > 1")
        return gpipe(p, m) if key == "gpipe" else one_f_one_b(p, m)
    if key == "interleaved":
        return interleaved(p, m, v)
    raise ScheduleError("plan", "schedule.name",
                        f"unknown schedule {name!r}; allowed: {', '.join(SCHEDULE_NAMES)}")


def virtual_stage(a: Action, rank: int, p: int) -> int:
    """Index of the virtual pipeline stage that runs ``a`` on ``rank``: chunk * p + rank."""
    return a.chunk * p + rank


def dependencies(a: Action, rank: int, p: int, v: int) -> tuple[int, Action] | None:
    """The action on another virtual stage that must finish before ``a`` may start:
    F of stage k needs F of stage k-1 (same microbatch); B of stage k needs B of k+1.
    F of stage 0 has none; B of the last stage needs only its own F, which is earlier in
    the same rank's list, so it has no cross-stage dependency (None).
    Returns (rank, action) of the dependency. With p == 1 and v > 1 the dependency is on
    the same rank (the executor then adds no communication time)."""
    k = virtual_stage(a, rank, p)
    if a.kind == "F":
        if k == 0:
            return None
        j = k - 1
    elif a.kind == "B":
        if k == p * v - 1:
            return None
        j = k + 1
    else:
        raise ValueError(f"action kind must be 'F' or 'B', got {a.kind!r}")
    return j % p, Action(j // p, a.kind, a.mb)


def _inflight_trace(actions: Sequence[Action]):
    live: dict[int, int] = {}
    for a in actions:
        live[a.chunk] = live.get(a.chunk, 0) + (1 if a.kind == "F" else -1)
        yield a.chunk, live


def peak_inflight(actions: Sequence[Action]) -> dict[int, int]:
    """Per chunk, the largest number of microbatches whose F has run and whose B has not,
    over one rank's action list: the activations that rank must hold for that chunk."""
    peak: dict[int, int] = {}
    for c, live in _inflight_trace(actions):
        peak[c] = max(peak.get(c, 0), live[c])
    return dict(sorted(peak.items()))


def peak_inflight_total(actions: Sequence[Action]) -> int:
    """Largest number of (chunk, microbatch) activations held at once on one rank, summed
    over chunks at the same moment (not the sum of per-chunk peaks). One chunk holds 1/v of
    the rank's layers, so divide by v to get stage-sized activation sets."""
    best = 0
    for _, live in _inflight_trace(actions):
        best = max(best, sum(live.values()))
    return best


def inflight_peaks(actions: Sequence[Action], v: int) -> tuple[tuple[int, ...], ...]:
    """The moments one rank's held activations can peak, as per-chunk in-flight counts
    (v entries each): the counts right after every forward (a backward only frees), less
    those another moment's counts bound entry by entry. With any non-negative bytes per
    chunk, the peak of held bytes is the largest of these moments' weighted sums, whatever
    the chunks' sizes (uneven layer splits included); costmodel/device_memory.py takes them."""
    moments = set()
    for a, (_, live) in zip(actions, _inflight_trace(actions)):
        if a.kind == "F":
            moments.add(tuple(live.get(c, 0) for c in range(v)))
    kept: list[tuple[int, ...]] = []
    # Only a moment with at least as many in flight in total can bound another: visit
    # them by falling total and compare with those already kept.
    for m in sorted(moments, key=lambda m: (-sum(m), m)):
        if not any(all(x <= y for x, y in zip(m, o)) for o in kept):
            kept.append(m)
    return tuple(sorted(kept))


def mean_alive(actions: Sequence[Action], chunk_bytes: Sequence[float]) -> float:
    """Bytes of activations held for backward when an action of one rank's list starts,
    averaged over its actions: microbatches whose forward has run and whose backward has
    not, each chunk c's at ``chunk_bytes[c]`` a microbatch. How much a stage keeps alive
    through its step, one number for any schedule; the calibration computes it for its
    synthetic orders and the program for each stage (costmodel/profile.RuntimeSettings.
    alive_factor). 0 for an empty list."""
    live = [0] * len(chunk_bytes)
    total = 0.0
    for a in actions:
        total += sum(n * b for n, b in zip(live, chunk_bytes))
        live[a.chunk] += 1 if a.kind == "F" else -1
    return total / len(actions) if actions else 0.0


TimeFn = Union[float, Callable[[int, Action], float]]


def list_schedule_makespan(schedule: Sequence[Sequence[Action]], p: int, v: int,
                           f_time: TimeFn, b_time: TimeFn,
                           comm_time: float = 0.0) -> tuple[float, list[float]]:
    """Execute the per-rank lists with no SimPy: each rank runs its list in order; an
    action starts when its rank is free and its cross-stage dependency has finished, plus
    ``comm_time`` seconds when that dependency ran on another rank. ``f_time``/``b_time``
    are seconds per action (one chunk), or functions (rank, action) -> seconds.

    Returns (makespan, busy seconds per rank). Raises RuntimeError on deadlock (some rank's
    next action waits on an action that can never run)."""
    if len(schedule) != p:
        raise ValueError(f"schedule has {len(schedule)} rank lists, expected p={p}")

    def dur(t: TimeFn, r: int, a: Action) -> float:
        return t(r, a) if callable(t) else t

    finish: dict[tuple[int, Action], float] = {}
    nxt = [0] * p
    # Plain 0 (not 0.0) so exact inputs (Fraction) stay exact through the sums.
    free = [0] * p
    busy = [0] * p
    remaining = sum(len(s) for s in schedule)
    while remaining:
        progressed = False
        for r in range(p):
            while nxt[r] < len(schedule[r]):
                a = schedule[r][nxt[r]]
                dep = dependencies(a, r, p, v)
                ready = 0
                if dep is not None:
                    if dep not in finish:
                        break
                    ready = finish[dep]
                    if dep[0] != r and comm_time:
                        ready = ready + comm_time
                d = dur(f_time if a.kind == "F" else b_time, r, a)
                start = max(free[r], ready)
                free[r] = start + d
                busy[r] += d
                finish[(r, a)] = free[r]
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(f"rank {r}: {schedule[r][nxt[r]]}" for r in range(p)
                              if nxt[r] < len(schedule[r]))
            raise RuntimeError(f"schedule deadlocks; waiting actions: {stuck}")
    return max(free, default=0), busy
