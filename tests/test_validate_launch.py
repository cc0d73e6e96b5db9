"""validate/launch.py: real gloo processes, their results, and their faults.

Each fault test checks the three promises of the launcher: one WorkerError whose message
names the failing rank, raised within the timeout, and no worker process left behind.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from validate.launch import WorkerError, launch  # noqa: E402


def _allreduce(rank, world, base):
    import torch.distributed as dist
    t = torch.full((4,), float(base + rank))
    dist.all_reduce(t)
    return rank, world, t.tolist(), dist.get_backend()


def _raises(rank, world):
    import torch.distributed as dist
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.all_reduce(torch.ones(1))  # rank 0 blocks here: rank 1 never joins
    return rank


def _hangs(rank, world):
    import torch.distributed as dist
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        time.sleep(3600)  # rank 0 returns; rank 1 never does
    return rank


def _killed(rank, world):
    import torch.distributed as dist
    dist.all_reduce(torch.ones(1))  # mid-run: the group is up and has communicated
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
    return rank


def _worker_children() -> list[int]:
    """Live (or zombie) children of this process that are multiprocessing spawn workers
    (the spawn resource tracker, which outlives runs by design, is not one)."""
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == me and "spawn_main" in cmd:
            out.append(int(d.name))
    return out


def test_allreduce_sums_over_two_processes():
    """Two gloo ranks all-reduce (base+rank): each sees 10+11 = 21 in every element, the
    results come back in rank order, and the workers are gone afterwards."""
    out = launch(_allreduce, 2, (10,), timeout_s=60)
    assert [o[0] for o in out] == [0, 1]
    assert all(o[1] == 2 and o[3] == "gloo" for o in out)
    assert all(o[2] == [21.0] * 4 for o in out)
    assert _worker_children() == []


@pytest.mark.parametrize("fn, cause, timeout_s", [
    (_raises, "raised ValueError: boom on purpose", 60),
    (_hangs, "did not finish within 6 s", 6),
    (_killed, "killed by SIGKILL", 60),
])
def test_fault_ends_run_naming_the_rank(fn, cause, timeout_s):
    """A rank that raises, hangs past the timeout, or is SIGKILLed mid-run ends the run
    with one WorkerError naming rank 1 and the cause, well before the other rank's gloo
    timeout would, and leaves no worker process behind."""
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(fn, 2, timeout_s=timeout_s)
    elapsed = time.monotonic() - t0
    assert info.value.rank == 1
    assert str(info.value).startswith("rank 1: ")
    assert cause in str(info.value)
    assert "\n" not in str(info.value)
    assert elapsed < (timeout_s + 10 if fn is _hangs else 40)
    assert _worker_children() == []
