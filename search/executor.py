"""Where independent tasks run: local worker processes or a Ray cluster, results in input order.

``run_tasks(fn, context, items, spec)`` returns ``[fn(context, item) for item in items]``
whichever executor computes them, so the caller's output cannot depend on the executor, on
the number of workers or on the order in which tasks finish (plansim's simulation and search
are deterministic: they draw no random numbers, so there is no seed to carry).

- ``local`` (the default): ``jobs == 1`` runs in this process; more jobs use a
  ``concurrent.futures.ProcessPoolExecutor`` whose initializer installs ``context`` once per
  worker process (the cluster graph is pickled once per worker, not once per task). A worker
  that dies (killed for memory, a crash) breaks the whole pool; the tasks that had not
  returned are resubmitted to a fresh pool, at most ``retries`` times, so no result is
  silently dropped.
- ``ray``: each item is a Ray task (``max_retries=retries``: Ray reruns a task whose worker
  process died), ``context`` is put in the object store once. ``address`` (for example
  ``auto``) joins a running cluster and ships plansim's own packages to it as a runtime
  environment (``py_modules``), so the cluster computes with the driver's code; without an
  address a local Ray instance with ``jobs`` CPUs is started (and stopped afterwards). Ray
  is an optional extra (``pip install 'plansim[ray]'``), imported only here and only when
  asked for.
"""
from __future__ import annotations

import importlib
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from costmodel.errors import InputError

EXECUTORS = ("local", "ray")
# Attempts beyond the first for a task whose worker died. One is enough for the usual cause
# (a worker killed once, by the OOM killer or a preempted node); a task that kills its
# worker every time is reported rather than retried forever.
DEFAULT_RETRIES = 1
# The packages a task imports (the simulator and the search); shipped to a Ray cluster.
TASK_PACKAGES = ("costmodel", "specs", "sim", "search", "topologies")
RAY_INSTALL = "pip install 'plansim[ray]' (or: pip install 'ray>=2.9')"


@dataclass(frozen=True)
class ExecutorSpec:
    """How to run tasks: ``kind`` local or ray, ``jobs`` processes (local pool size, or the
    CPUs of a local Ray instance), ``address`` of a running Ray cluster (None: local)."""

    kind: str = "local"
    jobs: int = 1
    address: str | None = None
    retries: int = DEFAULT_RETRIES

    def __post_init__(self):
        if self.kind not in EXECUTORS:
            raise InputError("--executor", None, f"{str(self.kind)[:60]!r}: allowed: {', '.join(EXECUTORS)}")
        if self.address is not None and self.kind != "ray":
            raise InputError("--address", None, "only meaningful with --executor ray")


class WorkerLost(InputError):
    """A task's worker process died on every attempt. Not bad input, but reported the same
    way (one line, exit 2): a traceback would say nothing more."""


def bar_off(progress: bool | None) -> bool | None:
    """tqdm's ``disable``: None (the default) shows progress bars only on a terminal, so that
    logs and captured stderr hold nothing but the result or the one-line error."""
    return None if progress is None else not progress


def run_tasks(fn: Callable[[Any, Any], Any], context: Any, items: Sequence, spec: ExecutorSpec | None = None,
              progress: bool | None = None, desc: str = "tasks") -> list:
    """``[fn(context, item) for item in items]`` on the executor ``spec`` says (module
    docstring). ``fn`` must be a module-level function (it is pickled by reference)."""
    spec = spec or ExecutorSpec()
    items = list(items)
    bar = tqdm(total=len(items), desc=desc, unit="task", disable=bar_off(progress), leave=False)
    try:
        if spec.kind == "ray":
            return _run_ray(fn, context, items, spec, bar)
        if spec.jobs > 1 and len(items) > 1:
            return _run_pool(fn, context, items, spec, bar)
        out = []
        for item in items:
            out.append(fn(context, item))
            bar.update(1)
        return out
    finally:
        bar.close()


# ------------------------------------------------------------------------------- local

_STATE: dict = {}


def _install(fn, context) -> None:
    """Pool initializer: the task function and its context, once per worker process."""
    _STATE.update(fn=fn, context=context)


def _call(item):
    return _STATE["fn"](_STATE["context"], item)


def _run_pool(fn, context, items: list, spec: ExecutorSpec, bar) -> list:
    missing = object()
    out: list = [missing] * len(items)
    todo = list(range(len(items)))
    restarts = 0
    while todo:
        lost: list[int] = []
        with ProcessPoolExecutor(max_workers=min(spec.jobs, len(todo)), initializer=_install,
                                 initargs=(fn, context)) as pool:
            futures = {}
            for i in todo:
                try:
                    futures[pool.submit(_call, items[i])] = i
                except BrokenProcessPool:
                    # a task submitted earlier already killed its worker: the pool takes
                    # no more work, so this task is lost with the others
                    lost.append(i)
            for fut in as_completed(futures):
                i = futures[fut]
                try:
                    out[i] = fut.result()
                except BrokenProcessPool:
                    lost.append(i)  # its worker (or another one of this pool) died
                    continue
                bar.update(1)
        if lost and restarts >= spec.retries:
            raise WorkerLost("--executor local", None,
                             f"a worker process died {restarts + 1} times; {len(lost)} of {len(items)} tasks "
                             "have no result (out of memory? try fewer --jobs)")
        restarts += bool(lost)
        todo = sorted(lost)
    return out


# --------------------------------------------------------------------------------- ray

def import_ray():
    """The ray module, or InputError (exit 2) saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise InputError("--executor ray", None, f"Ray is not installed; install it with {RAY_INSTALL}") from None


def code_root() -> Path:
    """The folder holding plansim's packages (this file is search/executor.py)."""
    return Path(__file__).resolve().parents[1]


def _shadowed() -> bool:
    """Whether a local Ray worker would import other copies of plansim's packages than this
    process did: Ray puts the driver's working folder first on its workers' import path
    (and they inherit PYTHONPATH and the installed packages), so only a working folder that
    holds another checkout can shadow this one."""
    cwd = Path.cwd().resolve()
    return cwd != code_root() and any((cwd / name).is_dir() for name in TASK_PACKAGES)


def ray_init_kwargs(spec: ExecutorSpec) -> dict:
    """Arguments of ``ray.init`` for ``spec``. A local instance gets ``jobs`` CPUs, no
    dashboard, and, when the working folder would shadow this checkout, this checkout first
    on its workers' import path (a runtime environment costs seconds of worker start-up,
    so only then); a cluster gets plansim's packages shipped as ``py_modules``."""
    import logging

    kwargs: dict = {"logging_level": logging.WARNING, "log_to_driver": False}
    if spec.address is None:
        # "local": always a new instance, even where `ray start` left a (possibly dead)
        # cluster's address in /tmp/ray (ray.init() alone would try to join that one).
        kwargs.update(address="local", num_cpus=spec.jobs, include_dashboard=False)
        if _shadowed():
            path = os.pathsep.join(filter(None, [str(code_root()), os.environ.get("PYTHONPATH", "")]))
            kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
        return kwargs
    modules = [importlib.import_module(name) for name in TASK_PACKAGES]
    return {**kwargs, "address": spec.address, "runtime_env": {"py_modules": modules}}


def _ray_call(fn, context, item):
    return fn(context, item)


def _run_ray(fn, context, items: list, spec: ExecutorSpec, bar) -> list:
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(**ray_init_kwargs(spec))
        except (ConnectionError, RuntimeError, ValueError) as err:
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise InputError("--address", None, f"{spec.address or 'local'}: cannot start or reach Ray: {first}") \
                from None
    try:
        task = ray.remote(max_retries=spec.retries, retry_exceptions=False)(_ray_call)
        ctx = ray.put(context)
        refs = [task.remote(fn, ctx, item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        out: list = [None] * len(items)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                out[index[ref]] = _ray_result(ray, ref, spec)
                bar.update(1)
        return out
    finally:
        if started:
            ray.shutdown()


def _ray_result(ray, ref, spec: ExecutorSpec):
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, InputError):  # the same one line the local executor would give
            raise InputError(cause.source, cause.field, cause.message) from None
        raise
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as err:
        raise WorkerLost("--executor ray", None, f"a worker died on all {spec.retries + 1} attempts of a task "
                                                 f"({type(err).__name__}); out of memory?") from None
