"""Executors (search/executor.py): results identical whichever runs the tasks (in-process,
a local process pool, a local Ray instance), and a worker that dies is retried, not dropped.

The Ray tests share one local instance (module-scoped; ray.init takes a few seconds) and
skip when Ray is not installed (`pip install 'plansim[ray]'`)."""
from __future__ import annotations

import os
import sys

import pytest

from plansim.cli import main
from search.executor import ExecutorSpec, WorkerLost, ray_init_kwargs, run_tasks
from search.search import simulate_plans
from search.sweep import run_cell, run_sweep
from specs.model import PRESETS
from specs.sweep import load_grid
from specs.topology import load_topology
from costmodel.profile import load_profile

# Three cells of the tiny model, about a second of search each.
GRID = "name: three tiny cells\nmodels: [tiny]\ntopologies: [dgx-a100, pcie-l40s, dgx-h100]\nnodes: [1]\ntop: 2\n"


def _die_once(marker: str, cell):
    """A task whose first attempt (over all tasks and processes) kills its worker process:
    exclusive creation of ``marker`` succeeds exactly once."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return run_cell(None, cell)
    os._exit(17)  # no cleanup, no exception: what a worker killed for memory looks like


def _always_die(_context, _item):
    os._exit(17)


def rows(result) -> list[dict]:
    return [c.row() | {"ranked": [r.to_dict() | {"sim_wall_s": 0.0} for r in c.ranked]} for c in result.cells]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    path = tmp_path_factory.mktemp("grid") / "grid.yaml"
    path.write_text(GRID)
    return load_grid(path)


@pytest.fixture(scope="module")
def inline(grid):
    """The reference: every cell searched in this process, one after another."""
    return run_sweep(grid, ExecutorSpec("local", jobs=1), progress=False)


def test_pool_equals_inline(grid, inline):
    """Two local worker processes give the same cells, in grid order, with the same ranked
    plans and numbers (wall-clock times aside) as searching them in this process."""
    pooled = run_sweep(grid, ExecutorSpec("local", jobs=2), progress=False)
    assert [c.cell for c in pooled.cells] == list(grid.cells)
    assert rows(pooled) == rows(inline)


def test_local_worker_death_is_retried(grid, inline, tmp_path):
    """A worker process that dies (os._exit in its first task) breaks the pool; the tasks
    without a result are resubmitted once to a fresh pool and the sweep comes back complete
    and identical to the in-process one."""
    marker = tmp_path / "died"
    cells = run_tasks(_die_once, str(marker), grid.cells, ExecutorSpec("local", jobs=2), progress=False)
    assert marker.exists()  # a worker did die
    assert len(cells) == len(grid.cells) and all(c.best for c in cells)
    assert [c.row() for c in cells] == [c.row() for c in inline.cells]


def test_local_worker_dying_every_time_is_reported(tmp_path):
    """A task that kills its worker on every attempt is not dropped: after one resubmit the
    run fails with a one-line WorkerLost (exit 2 on the command line)."""
    with pytest.raises(WorkerLost, match="a worker process died 2 times; 2 of 2 tasks have no result"):
        run_tasks(_always_die, None, [1, 2], ExecutorSpec("local", jobs=2), progress=False)


def test_local_pool_broken_before_every_task_is_submitted(monkeypatch):
    """The race CI once hit: the first task kills its worker before the second is submitted,
    so submit itself raises BrokenProcessPool. Forced here by a pool whose later submits wait
    until it is broken; the run still ends in the one-line WorkerLost, every task counted."""
    import time
    from concurrent.futures import ProcessPoolExecutor

    import search.executor as ex

    class LatePool(ProcessPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            if getattr(self, "_submitted", 0):
                deadline = time.monotonic() + 30
                while not self._broken and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert self._broken, "the first task did not break the pool within 30 s"
            self._submitted = getattr(self, "_submitted", 0) + 1
            return super().submit(fn, *args, **kwargs)
    monkeypatch.setattr(ex, "ProcessPoolExecutor", LatePool)
    with pytest.raises(WorkerLost, match="a worker process died 2 times; 3 of 3 tasks have no result"):
        run_tasks(_always_die, None, [1, 2, 3], ExecutorSpec("local", jobs=2), progress=False)


def test_search_executor_ray_without_ray(monkeypatch, capsys):
    """Without Ray installed, `--executor ray` exits 2 before any work, saying how to install it."""
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    code = main(["search", "dgx-a100", "--nodes", "1", "--model", "tiny", "--executor", "ray"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == "plansim: error: --executor ray: Ray is not installed; install it with " \
                  "pip install 'plansim[ray]' (or: pip install 'ray>=2.9')\n"


def test_address_needs_ray(capsys):
    """--address only means something for Ray: refused with the local executor."""
    code = main(["search", "dgx-a100", "--nodes", "1", "--model", "tiny", "--address", "auto"])
    assert code == 2 and "--address: only meaningful with --executor ray" in capsys.readouterr().err


# ------------------------------------------------------------------------------- Ray

@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'plansim[ray]'")
    if ray.is_initialized():
        ray.shutdown()
    # The executor's own settings for a local instance (2 CPUs, no dashboard, this checkout
    # on the workers' import path if needed); run_tasks reuses an instance that is already running.
    ray.init(**ray_init_kwargs(ExecutorSpec("ray", jobs=2)))
    # Test functions (_die_once) travel by value: the workers do not import tests/.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


def test_ray_sweep_equals_local(ray_local, grid, inline, tmp_path, capsys):
    """`plansim sweep --executor ray` on a local Ray instance returns the same cells in grid
    order with the same ranked plans and numbers as the in-process sweep, and its report
    (HTML, Markdown, CSV, plot) is byte for byte the one the in-process result renders."""
    import json

    from reports.sweep import render

    code = main(["sweep", grid.source, "--executor", "ray", "--jobs", "2", "--json", "--report", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["executor"] == "ray"
    strip = lambda cells: [{k: v for k, v in c.items() if k != "wall_s"} | {"ranked": [r | {"sim_wall_s": 0.0}
                           for r in c["ranked"]]} for c in cells]
    assert strip(doc["cells"]) == strip([c.to_dict() for c in inline.cells])
    expected = render(inline)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == expected


def test_ray_worker_death_is_retried(ray_local, grid, inline, tmp_path):
    """A Ray worker that dies in its first task is retried (the task's max_retries) and the
    result is complete and identical to the local one."""
    marker = tmp_path / "died"
    cells = run_tasks(_die_once, str(marker), grid.cells, ExecutorSpec("ray", jobs=2), progress=False)
    assert marker.exists()
    assert [c.row() for c in cells] == [c.row() for c in inline.cells]


def test_ray_search_simulations_equal_local(ray_local):
    """`search --executor ray` fans its simulations out as Ray tasks: the same plans give
    the same StepResults as simulating them in this process."""
    model, cluster = PRESETS["tiny"], load_topology("dgx-a100", nodes=1)
    profile = load_profile(None, bundled=cluster.profiles)
    plans = ["tp=1,pp=1,dp=8,mbs=2", "tp=2,pp=2,dp=2,mbs=1", "tp=1,pp=4,dp=2,mbs=1,vpp=1"]
    here = simulate_plans(model, cluster, profile, plans, progress=False)
    there = simulate_plans(model, cluster, profile, plans, progress=False, executor=ExecutorSpec("ray", jobs=2))
    strip = lambda rs: [r.to_dict() | {"sim_wall_s": 0.0} for r in rs]
    assert strip(there) == strip(here)
