"""Pipeline schedules: structure, no deadlock, bubble and activation-memory closed forms.

Closed forms: Narayanan et al. 2021 (bubble (p-1)/m, interleaved (p-1)/(v*m)) and
Korthikanti et al. 2022 (interleaved first-stage activation factor), both quoted in
docs/facts.md.
"""
from collections import Counter
from fractions import Fraction

import pytest

from costmodel.errors import InputError
from sim.schedules import (Action, dependencies, gpipe, interleaved, list_schedule_makespan,
                           make_schedule, one_f_one_b, peak_inflight, peak_inflight_total,
                           virtual_stage)

CASES = [("gpipe", p, m, 1) for p, m in [(1, 1), (2, 3), (4, 8), (4, 2)]] + \
        [("1f1b", p, m, 1) for p, m in [(1, 3), (2, 3), (4, 8), (4, 2), (8, 5)]] + \
        [("interleaved", p, m, v) for p, m, v in [(1, 2, 2), (2, 2, 2), (2, 4, 2), (4, 4, 2),
                                                   (4, 8, 3), (3, 6, 4), (8, 16, 2)]]


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_every_chunk_microbatch_once_and_forward_before_backward(name, p, m, v):
    """Each rank runs every (chunk, mb) exactly once as F and once as B, and F comes first."""
    sched = make_schedule(name, p, m, v)
    assert len(sched) == p
    for acts in sched:
        counts = Counter(acts)
        assert set(counts.values()) == {1}
        expected = {Action(c, k, i) for c in range(v) for k in "FB" for i in range(m)}
        assert set(acts) == expected
        pos = {a: i for i, a in enumerate(acts)}
        for c in range(v):
            for i in range(m):
                assert pos[Action(c, "F", i)] < pos[Action(c, "B", i)]


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_unit_times_makespan_matches_bubble_closed_form(name, p, m, v):
    """With free communication and per-chunk times f/v, b/v, the executor finishes (no
    deadlock) at ideal m(f+b) plus bubble (p-1)(f+b)/v: bubble/ideal = (p-1)/(v*m), which
    for v = 1 is the GPipe/1F1B (p-1)/m. Checked for b = f and b = 2f (exact fractions)."""
    for f, b in [(Fraction(1), Fraction(1)), (Fraction(1), Fraction(2))]:
        makespan, busy = list_schedule_makespan(make_schedule(name, p, m, v), p, v,
                                                f / v, b / v)
        ideal = m * (f + b)
        assert makespan == ideal + (p - 1) * (f + b) / v
        assert (makespan - ideal) / ideal == Fraction(p - 1, v * m)
        assert busy == [ideal] * p


def test_gpipe_makespan_with_communication_hand_count():
    """GPipe, p=4, m=8, f=1, b=2, comm 0.5 per cross-rank hop: the forward wave reaches the
    last rank after 3*(1+0.5), it runs 8 F and 8 B, and the backward wave goes back up
    3*(2+0.5): 4.5 + 24 + 7.5 = 36."""
    makespan, _ = list_schedule_makespan(gpipe(4, 8), 4, 1, 1.0, 2.0, comm_time=0.5)
    assert makespan == pytest.approx(36.0)


def test_one_f_one_b_small_case_by_hand():
    """1F1B, p=2, m=3: rank 0 warms up with one forward; the lists are written out by hand."""
    F = lambda i: Action(0, "F", i)
    B = lambda i: Action(0, "B", i)
    assert one_f_one_b(2, 3) == [[F(0), F(1), B(0), F(2), B(1), B(2)],
                                 [F(0), B(0), F(1), B(1), F(2), B(2)]]


def test_interleaved_small_case_by_hand():
    """Interleaved, p=2, m=2, v=2: rank 0 warms up (v-1)p + 2(p-1) = 4 forwards, i.e. all
    of them (mbs 0,1 through chunk 0, then through chunk 1); rank 1 warms up 2, then
    alternates; backwards go chunk 1 first. Written out by hand."""
    F = lambda c, i: Action(c, "F", i)
    B = lambda c, i: Action(c, "B", i)
    s = interleaved(2, 2, 2)
    assert s[0] == [F(0, 0), F(0, 1), F(1, 0), F(1, 1), B(1, 0), B(1, 1), B(0, 0), B(0, 1)]
    assert s[1] == [F(0, 0), F(0, 1), F(1, 0), B(1, 0), F(1, 1), B(1, 1), B(0, 0), B(0, 1)]


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (3, 3), (1, 4)])
def test_peak_inflight_1f1b_and_gpipe(p, m):
    """Activations held: 1F1B rank r holds min(p - r, m) microbatches; GPipe holds all m."""
    for r, acts in enumerate(one_f_one_b(p, m)):
        assert peak_inflight(acts) == {0: min(p - r, m)}
    for acts in gpipe(p, m):
        assert peak_inflight(acts) == {0: m}


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (3, 6, 4), (8, 16, 2)])
def test_interleaved_first_rank_activation_factor(p, m, v):
    """Hand count: rank 0 runs (v-1)p + 2(p-1) warm-up forwards and then one more F before
    its first B, so it holds vp + p - 1 chunk activations (e.g. p=4, v=2: 11). A chunk is 1/v
    of the rank's layers, so in stage units that is p + (p-1)/v, i.e. 1F1B's p times
    (1 + (p-1)/(p*v)): Korthikanti et al. 2022's factor (their 'm' is the number of
    interleaved chunks, our v). Holds when m >= 2p, so the warm-up is not cut short."""
    acts = interleaved(p, m, v)[0]
    held = peak_inflight_total(acts)
    assert held == v * p + p - 1
    one_f_one_b_peak = max(peak_inflight(one_f_one_b(p, m)[0]).values())
    assert Fraction(held, v) / one_f_one_b_peak == 1 + Fraction(p - 1, p * v)


def test_peak_inflight_total_is_simultaneous_not_sum_of_peaks():
    """Per chunk peaks and the simultaneous total differ: F0.0 B0.0 F1.0 B1.0 never holds
    more than one, though each chunk peaks at one."""
    acts = [Action(0, "F", 0), Action(0, "B", 0), Action(1, "F", 0), Action(1, "B", 0)]
    assert peak_inflight(acts) == {0: 1, 1: 1}
    assert peak_inflight_total(acts) == 1


def test_virtual_stage_and_dependencies():
    """Virtual stage is chunk*p + rank; F needs F of the previous virtual stage (wrapping
    from the last rank to rank 0 of the next chunk); B needs B of the next one; F of stage 0
    and B of the last stage have no cross-stage dependency."""
    p, v = 4, 2
    assert virtual_stage(Action(1, "F", 0), 2, p) == 6
    assert dependencies(Action(0, "F", 3), 0, p, v) is None
    assert dependencies(Action(0, "F", 3), 2, p, v) == (1, Action(0, "F", 3))
    assert dependencies(Action(1, "F", 3), 0, p, v) == (3, Action(0, "F", 3))
    assert dependencies(Action(1, "B", 3), 3, p, v) is None
    assert dependencies(Action(0, "B", 3), 3, p, v) == (0, Action(1, "B", 3))
    assert dependencies(Action(1, "B", 5), 1, p, v) == (2, Action(1, "B", 5))


def test_executor_detects_deadlock():
    """A schedule whose rank 0 waits for a backward before running the forward that the
    backward depends on is reported as a deadlock rather than looping."""
    bad = [[Action(0, "B", 0), Action(0, "F", 0)], [Action(0, "F", 0), Action(0, "B", 0)]]
    with pytest.raises(RuntimeError, match="deadlock"):
        list_schedule_makespan(bad, 2, 1, 1.0, 1.0)


def test_bad_inputs_raise_one_line_errors():
    """m not a multiple of p for interleaved, v != 1 for 1f1b and unknown names are
    rejected with messages naming the value; they are both InputError and ValueError."""
    with pytest.raises(ValueError, match="multiple of the pipeline size p=4"):
        interleaved(4, 6, 2)
    with pytest.raises(InputError, match="v=2"):
        make_schedule("1f1b", 4, 8, 2)
    with pytest.raises(InputError, match="unknown schedule 'zb'; allowed: gpipe, 1f1b"):
        make_schedule("zb", 4, 8)
    with pytest.raises(ValueError, match="m=0"):
        gpipe(2, 0)


def test_bad_schedule_parameters_one_line():
    """p, m or v below 1 (or not an integer) is refused in one line naming schedule.<name>,
    with costmodel/limits.number_problem's wording."""
    with pytest.raises(InputError) as err:
        gpipe(0, 2)
    assert str(err.value) == "plan: schedule.p: p=0: must be an integer in [1, inf)"
    with pytest.raises(ValueError, match=r"schedule\.m: m=True: must be an integer"):
        gpipe(2, True)
