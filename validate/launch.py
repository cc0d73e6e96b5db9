"""Start the worker processes of a real run and collect what each returns.

``launch(fn, world, args, timeout_s=...)`` runs ``fn(rank, world, *args)`` in ``world``
processes that share one torch.distributed process group (backend from
validate/backend.py) and returns their return values in rank order.

Two ways to start:
- On one machine, ``launch`` starts the processes itself and rendezvouses them over TCP
  on 127.0.0.1 at a free port. By default it forks them from multiprocessing's
  forkserver, a server process that imported torch once and never touches a device (CUDA
  allows forkserver as it does spawn; fork would not be safe once a parent has used CUDA):
  0.4-0.8 s a launch of 2 to 4 processes on a 2-core host against 1.7-4.3 s for
  "spawn", a fresh interpreter per rank importing torch (2026-12-01); on a slower host
  the CPU validation benchmark, 24 launches, ran 352 s spawned against 259-310 s forked
  (benchmarks/validate_cpu.sh, 2026-12-03).
  Forked workers are fresh processes all the same (their own PIDs, placement, threads
  and group); what they share with the server is torch's already-imported code, and its
  standard streams: what a worker prints goes where this process's stdout and stderr went
  when the server started (the first launch), not where they point now.
  $PLANSIM_START_METHOD=spawn starts fresh interpreters instead, and is what platforms
  without forkserver get. (Forked launches were opt-in until 2026-12-03: on the first
  host, over six forked runs against seven spawned, tp=2 came out +13 % on average
  against -1 %; docs/validation-cpu.md mechanisms 18 and 38 for what the fourth host
  showed.)
- On several machines, the processes are started by torchrun, which sets RANK,
  WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. ``launch`` then runs ``fn`` in
  this process only and gathers every rank's result to rank 0 (other ranks get None).
  For two nodes of 8 GPUs, run on each node (NODE = 0 on the first, 1 on the second;
  HOST = the first node's address reachable from the second):

      torchrun --nnodes 2 --nproc-per-node 8 --node-rank NODE \\
          --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
          -m validate.runner --model tiny --plan tp=8,dp=2 --steps 10 --out run.json

Faults (processes started here): a rank that raises, exits, is killed, or has not
returned within ``timeout_s`` ends the whole run with one ``WorkerError`` naming the rank
and the cause; every worker is killed and reaped before it is raised, so no process is
left behind.
Under torchrun, torchrun's own agent does that job.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from costmodel.errors import InputError, RunError
from validate.backend import (check_worker_env, configure_cpu_heap, configure_cpu_placement, configure_cpu_threads,
                              pick_backend, require_torch)

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# Seconds a worker gets to exit after being asked (SIGTERM) before SIGKILL.
_TERM_GRACE_S = 2.0
# Seconds to keep listening after a first failure, to find the rank that caused it.
_FAILURE_GRACE_S = 1.0
_PORT_ATTEMPTS = 3
START_METHOD_ENV = "PLANSIM_START_METHOD"


class WorkerError(RunError):
    """One worker process failed; the message (one line) names the rank and the cause."""

    def __init__(self, rank: int, cause: str):
        self.rank = rank
        self.cause = cause
        super().__init__(f"rank {rank}: {cause}".replace("\n", " "))


def under_torchrun() -> bool:
    """True when torchrun (or any launcher that sets its variables) started this process."""
    return all(k in os.environ for k in TORCHRUN_ENV)


def local_rank() -> int:
    """This worker's index on its machine (LOCAL_RANK, set by torchrun or by launch)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size(world: int) -> int:
    """Workers on this machine: LOCAL_WORLD_SIZE where torchrun set it, else ``world``
    (launch starts every rank on this machine)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(err: BaseException) -> str:
    """'ValueError: message (file.py:12)': the innermost frame says where it happened."""
    tb = traceback.extract_tb(err.__traceback__)
    where = f" ({os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
    return f"{type(err).__name__}: {err}{where}".replace("\n", " ")


def _init_group(backend_name: str | None, rank: int, world: int, init_method: str | None,
                timeout_s: float):
    torch = require_torch()
    import torch.distributed as dist

    be = pick_backend(backend_name)
    if be.kind == "cuda":
        torch.cuda.set_device(be.device_for(local_rank()))
    else:
        configure_cpu_threads()
        configure_cpu_heap()
        configure_cpu_placement(local_rank(), local_world_size(world))
    if not dist.is_initialized():
        dist.init_process_group(be.name, init_method=init_method, rank=rank, world_size=world,
                                timeout=timedelta(seconds=max(1.0, timeout_s)))
    return dist


def _is_peer_failure(err: BaseException) -> bool:
    """A collective that failed because another rank went away (gloo/NCCL transport
    errors, collective timeouts): a consequence, not the root cause of a run's failure."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err)
    return any(k in text for k in ("gloo", "NCCL", "Connection closed by peer", "Timed out"))


def _worker(rank: int, world: int, port: int, backend_name: str | None, fn: Callable,
            args: tuple, conn, timeout_s: float) -> None:
    """Body of one spawned process: join the group, run fn, send ('ok', value),
    ('err', one line) or ('peer', one line) to the parent. The error is sent before the
    group is torn down, so the parent hears the failing rank first."""
    os.environ["LOCAL_RANK"] = str(rank)
    dist = None
    try:
        try:
            dist = _init_group(backend_name, rank, world, f"tcp://127.0.0.1:{port}", timeout_s)
        except Exception as err:  # noqa: BLE001
            conn.send(("init", _one_line(err)))
            return
        out = fn(rank, world, *args)
        conn.send(("ok", out))
    except BaseException as err:  # noqa: BLE001 - every failure must reach the parent
        conn.send(("peer" if _is_peer_failure(err) else "err", _one_line(err)))
    finally:
        conn.close()
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()
        _leave()


def _leave() -> None:
    """End a spawned worker at once, as multiprocessing ends a forked one (os._exit after
    its target returns), instead of the spawned interpreter's full teardown. Everything
    the worker owes has gone by then (its result over the pipe, the group destroyed); what
    is left is unloading torch, which took 0.3 s a launch of 2 processes and 0.65-0.8 s
    of 4 here (2026-12-01, launches of a no-op: 1.1-3.2 s in all, against 0.04-0.06 s
    for this exit). A CPU validation makes about 34 launches. stdout and stderr are
    flushed first so that nothing a worker printed is lost."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to keep
            pass
    os._exit(0)


def start_method() -> str:
    """How launch starts its workers (module docstring): $PLANSIM_START_METHOD ("spawn" or
    "forkserver" where this platform has it), else "forkserver" where the platform has it,
    else "spawn"."""
    import multiprocessing as mp

    have = mp.get_all_start_methods()
    raw = os.environ.get(START_METHOD_ENV, "")
    if raw:
        if raw not in ("spawn", "forkserver") or raw not in have:
            allowed = " or ".join(m for m in ("spawn", "forkserver") if m in have)
            raise InputError(START_METHOD_ENV, "start method", f"must be {allowed} (got {raw!r})")
        return raw
    return "forkserver" if "forkserver" in have else "spawn"


def _exit_cause(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})"
    return f"exited with code {code} before returning a result"


def _reap(procs) -> None:
    """Stop every worker still alive: SIGTERM, then SIGKILL after a grace period."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _TERM_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _spawn(fn: Callable, world: int, args: tuple, timeout_s: float,
           backend: str | None) -> list:
    import multiprocessing.connection as mpc

    require_torch()
    import torch.multiprocessing as tmp

    ctx = tmp.get_context(start_method())
    if ctx.get_start_method() == "forkserver":  # read when the server starts (first launch)
        ctx.set_forkserver_preload(["torch", "torch.distributed", fn.__module__])
    port = free_port()
    procs, conns = [], []
    try:
        for r in range(world):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, name=f"plansim-rank{r}", daemon=True,
                            args=(r, world, port, backend, fn, args, send, timeout_s))
            p.start()
            send.close()  # the parent keeps only the read end, so EOF means the child is gone
            procs.append(p)
            conns.append(recv)
        deadline = time.monotonic() + timeout_s
        results: dict[int, Any] = {}
        # rank -> (priority, cause). When one rank fails the others usually fail soon
        # after because of it (their collectives lose a peer); collect for a short grace
        # period and blame the root cause: a death (3) over an exception of the program
        # (2) over a communication failure caused by a peer (1).
        failures: dict[int, tuple[int, str]] = {}
        timed_out = False
        while len(results) + len(failures) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = not failures
                break
            pending = [r for r in range(world) if r not in results and r not in failures]
            waitables = {conns[r]: r for r in pending}
            waitables.update({procs[r].sentinel: r for r in pending})
            for obj in mpc.wait(list(waitables), timeout=left):
                r = waitables[obj]
                if r in results or r in failures:
                    continue
                conn = conns[r]
                # A child that finished may have both sent its result and exited: read first.
                msg = None
                if conn.poll():
                    try:
                        msg = conn.recv()
                    except EOFError:
                        procs[r].join(1.0)
                elif procs[r].is_alive():
                    continue
                if msg is None:
                    procs[r].join(1.0)
                    failures[r] = (3, _exit_cause(procs[r].exitcode))
                elif msg[0] == "ok":
                    results[r] = msg[1]
                elif msg[0] == "init":
                    failures[r] = (2, f"could not join the process group: {msg[1]}")
                else:
                    failures[r] = (2 if msg[0] == "err" else 1, f"raised {msg[1]}")
                if failures:
                    deadline = min(deadline, time.monotonic() + _FAILURE_GRACE_S)
        if failures:
            rank = max(sorted(failures), key=lambda r: failures[r][0])
            raise WorkerError(rank, failures[rank][1])
        if timed_out:
            pending = [r for r in range(world) if r not in results]
            raise WorkerError(pending[0], f"did not finish within {timeout_s:g} s "
                              f"(ranks still running: {', '.join(map(str, pending))})")
        for p in procs:
            p.join(_TERM_GRACE_S)
        return [results[r] for r in range(world)]
    finally:
        _reap(procs)
        for c in conns:
            c.close()


def _torchrun(fn: Callable, world: int, args: tuple, timeout_s: float,
              backend: str | None) -> list | None:
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world:
        raise InputError("torchrun", "WORLD_SIZE",
                         f"the plan needs {world} processes but torchrun started {env_world}")
    rank = int(os.environ["RANK"])
    dist = _init_group(backend, rank, world, None, timeout_s)  # env:// from torchrun
    try:
        out = fn(rank, world, *args)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(out, gathered, dst=0)
        # Leave together: a rank that exits while its peer still reads from the gloo
        # connection can die with SIGABRT in the interpreter's teardown of the group.
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return gathered


def launch(fn: Callable, world: int, args: tuple = (), *, timeout_s: float,
           backend: str | None = None) -> list | None:
    """Run ``fn(rank, world, *args)`` on ``world`` ranks; their return values in rank
    order (under torchrun: on rank 0; None on the others). ``fn`` must be a module-level
    function and its arguments and result picklable (they cross process boundaries)."""
    if not isinstance(world, int) or world < 1:
        raise InputError("--world", "world", f"world={world!r} must be an integer >= 1")
    check_worker_env()
    if under_torchrun():
        return _torchrun(fn, world, args, timeout_s, backend)
    for attempt in range(_PORT_ATTEMPTS):
        try:
            return _spawn(fn, world, args, timeout_s, backend)
        except WorkerError as err:
            # The free port was taken between our probe and rank 0's bind (other jobs
            # on the machine): nothing ran yet, so start again on a new port.
            taken = "could not join" in err.cause and "address already in use" in err.cause.lower()
            if not taken or attempt == _PORT_ATTEMPTS - 1:
                raise
