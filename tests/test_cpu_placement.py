"""validate/backend.core_for_rank and configure_cpu_placement: where CPU workers run when they
outnumber the cores.

The layout is worked by hand for a few hosts; a real launch checks that each worker ends
up on the core the layout names (its affinity mask as the worker reads it), and that with
the setting off it keeps the whole mask.
"""
from __future__ import annotations

import os

import pytest

from costmodel.errors import InputError
from validate.backend import ENV_PIN_CORES, core_for_rank, pin_cores_setting


def test_consecutive_ranks_share_a_core_when_oversubscribed():
    """4 ranks on 2 cores: 0,1 on the first, 2,3 on the second (a TP pair per core);
    8 ranks on 2 cores: four to a core; 6 ranks on cores [2, 4, 6]: two to a core."""
    assert [core_for_rank(r, 4, [0, 1]) for r in range(4)] == [0, 0, 1, 1]
    assert [core_for_rank(r, 8, [0, 1]) for r in range(8)] == [0] * 4 + [1] * 4
    assert [core_for_rank(r, 6, [2, 4, 6]) for r in range(6)] == [2, 2, 4, 4, 6, 6]


def test_left_to_the_scheduler_otherwise():
    """A core per rank or more (2 ranks on 2 cores, 1 on 2), an uneven split (3 on 2), a
    rank outside the world or no cores: None, nothing pinned."""
    assert [core_for_rank(r, 2, [0, 1]) for r in range(2)] == [None, None]
    assert core_for_rank(0, 1, [4, 5]) is None
    assert core_for_rank(0, 3, [0, 1]) is None
    assert core_for_rank(4, 4, [0, 1]) is None
    assert core_for_rank(0, 2, []) is None


def test_setting_is_checked(monkeypatch):
    """$PLANSIM_PIN_CORES other than 0 or 1 is refused, naming the variable."""
    monkeypatch.setenv(ENV_PIN_CORES, "yes")
    with pytest.raises(InputError, match=ENV_PIN_CORES):
        pin_cores_setting()
    monkeypatch.setenv(ENV_PIN_CORES, "0")
    assert pin_cores_setting() is False


def _affinity(rank, world):
    return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) != 2,
                    reason="needs sched_getaffinity and exactly 2 cores (4 workers oversubscribe them)")
@pytest.mark.parametrize("pin", ["1", "0"])
def test_workers_run_where_the_layout_says(monkeypatch, pin):
    """Four gloo workers on a 2-core mask, pinning on: ranks 0 and 1 see only the first
    core, 2 and 3 only the second; pinning off: each keeps the whole mask. Spawned, not
    forked from the launcher's server: a forked worker has the server's environment, set
    when the first launch of this process started it."""
    pytest.importorskip("torch")
    from validate.launch import START_METHOD_ENV, launch
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    monkeypatch.setenv(ENV_PIN_CORES, pin)
    mask = sorted(os.sched_getaffinity(0))
    got = launch(_affinity, 4, timeout_s=120)
    if pin == "1":
        assert got == [[mask[0]], [mask[0]], [mask[1]], [mask[1]]]
    else:
        assert got == [mask] * 4
