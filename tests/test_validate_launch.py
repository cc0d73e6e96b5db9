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


def _sleeps(rank, world, seconds):
    time.sleep(seconds)
    return rank


def _prints(rank, world):
    print(f"<rank {rank} was here>", end="")  # no newline: it sits in the buffer at exit
    return rank


def _children(pid: int, needle: str) -> list[int]:
    """Live (or zombie) children of ``pid`` whose command line contains ``needle``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid and needle in cmd:
                out.append(int(d.name))
    return sorted(out)


def _workers_of(pid: int) -> list[int]:
    """The worker processes ``pid`` started, however launch started them: its children
    that are multiprocessing spawn workers, and the children of its forkserver (the
    forkserver and the resource tracker, which outlive runs by design, are not workers)."""
    servers = _children(pid, "forkserver")
    return sorted(_children(pid, "spawn_main") + [w for s in servers for w in _children(s, "")])


def _worker_children() -> list[int]:
    """The workers this process started that are still there (or zombies)."""
    return _workers_of(os.getpid())


def test_workers_are_found_under_either_start_method():
    """The orphan checks below can fail: while a run is in progress, _workers_of finds its
    two workers under the start method launch uses (validate.launch.start_method)."""
    import threading
    seen: list[list[int]] = []
    t = threading.Thread(target=lambda: launch(_sleeps, 2, (3.0,), timeout_s=60))
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(seen[-1] if seen else []) < 2:
        time.sleep(0.1)
        seen.append(_worker_children())
    t.join()
    assert len(seen[-1]) == 2
    assert _worker_children() == []


def test_allreduce_sums_over_two_processes():
    """Two gloo ranks all-reduce (base+rank): each sees 10+11 = 21 in every element, the
    results come back in rank order, and the workers are gone afterwards."""
    out = launch(_allreduce, 2, (10,), timeout_s=60)
    assert [o[0] for o in out] == [0, 1]
    assert all(o[1] == 2 and o[3] == "gloo" for o in out)
    assert all(o[2] == [21.0] * 4 for o in out)
    assert _worker_children() == []


def test_worker_output_survives_the_quick_exit(capfd, monkeypatch):
    """Workers end with os._exit (launch._leave) instead of a full interpreter teardown;
    what each printed without a newline (still buffered when it returned: the workers run
    without PYTHONUNBUFFERED) reaches the parent's stdout, the results come back in rank
    order, and no worker is left. Spawned workers: they write to this process's stdout as
    it is now (capfd's), where forked ones write to the forkserver's, which is the stdout
    of the first launch in this process (validate/launch.py)."""
    from validate.launch import START_METHOD_ENV
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    assert launch(_prints, 2, timeout_s=60) == [0, 1]
    out = capfd.readouterr().out
    assert "<rank 0 was here>" in out and "<rank 1 was here>" in out
    assert _worker_children() == []


@pytest.mark.parametrize("fn, cause, timeout_s", [
    (_raises, "raised ValueError: boom on purpose", 60),
    (_hangs, "did not finish within 10 s", 10),
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


def test_killed_worker_ends_the_runner_without_output(tmp_path):
    """End to end: `python3 -m validate.runner --out F` with a worker SIGKILLed mid-run
    exits 1 with one line naming the killed rank, writes no F (not even a partial one),
    and leaves none of its worker processes alive."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "validate.runner", "--model", "tiny", "--plan", "dp=2",
                             "--steps", "500", "--out", str(out)], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _workers_of(proc.pid)
        assert len(workers) == 2, "the runner did not start two workers"
        time.sleep(3.0)  # let them get into the training loop
        os.kill(workers[-1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: rank ") and "killed by SIGKILL" in line, err
    assert not out.exists() and list(tmp_path.iterdir()) == []
    time.sleep(0.5)
    alive = [p for p in workers if Path(f"/proc/{p}").exists()
             and (Path(f"/proc/{p}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert alive == []


def test_port_taken_before_rendezvous_is_retried(monkeypatch):
    """If the port picked for the rendezvous is taken by the time rank 0 binds it (here:
    the test listens on it first), launch starts again on another port and succeeds."""
    import socket
    import validate.launch as vl
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = iter([busy.getsockname()[1]])
    real = vl.free_port
    monkeypatch.setattr(vl, "free_port", lambda: next(ports, None) or real())
    try:
        out = launch(_allreduce, 2, (0,), timeout_s=60)
    finally:
        busy.close()
    assert [o[2] for o in out] == [[1.0] * 4] * 2


def test_start_method_env_is_checked(monkeypatch):
    """$PLANSIM_START_METHOD picks how workers start; a value other than spawn or
    forkserver is an input error naming the variable, and unset means forkserver where the
    platform has it (Linux, macOS), else spawn."""
    import multiprocessing as mp

    from costmodel.errors import InputError
    from validate.launch import START_METHOD_ENV, start_method
    monkeypatch.setenv(START_METHOD_ENV, "fork")
    with pytest.raises(InputError) as info:
        start_method()
    assert START_METHOD_ENV in str(info.value) and "'fork'" in str(info.value)
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    assert start_method() == "spawn"
    monkeypatch.delenv(START_METHOD_ENV)
    assert start_method() == ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")


def test_spawn_start_gives_the_same_result_and_leaves_no_worker(monkeypatch):
    """The opt-out start method: with PLANSIM_START_METHOD=spawn the two-rank all-reduce
    gives the same 10+11 = 21 in rank order as forked workers do, and no worker is left
    afterwards."""
    from validate.launch import START_METHOD_ENV
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    out = launch(_allreduce, 2, (10,), timeout_s=60)
    assert [o[0] for o in out] == [0, 1]
    assert all(o[2] == [21.0] * 4 for o in out)
    assert _worker_children() == []
