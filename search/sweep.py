"""A sweep: one plan search per cell of a grid (specs/sweep.py), fanned out over an executor.

Each cell is one task (search/executor.py): the worker loads the cell's topology and
profile, runs search.search.search in-process (the cells are the unit of parallelism, so a
cell's own simulations run one after another) and returns the ranked plans. A cell in which
no plan fits is a result too ("no plan fits", with the nearest miss), not a failure of the
sweep. Results come back in grid order whichever executor ran them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from costmodel.profile import for_gpus, load_profile
from search.executor import ExecutorSpec, run_tasks
from search.search import NoPlanFits, search
from sim.result import StepResult
from specs.sweep import Cell, SweepGrid
from specs.topology import load_topology


@dataclass
class CellResult:
    cell: Cell
    ranked: list[StepResult]  # best first, at most cell.top (empty when no plan fits)
    candidates: int = 0  # plans the search enumerated
    estimated: int = 0  # plans ranked by the analytic estimate
    simulated: int = 0  # plans re-scored by the simulation
    no_fit: str | None = None  # why no plan fits (the search's one line), else None
    wall_s: float = 0.0  # this cell's search, wall clock (varies between runs)

    @property
    def best(self) -> StepResult | None:
        return self.ranked[0] if self.ranked else None

    def row(self) -> dict:
        """The cell's line of the comparison table, in SI units; no wall-clock times, so the
        same grid gives the same row on any executor."""
        c, b = self.cell, self.best
        row = {"model": c.model_label, "topology": c.topology_label, "nodes": c.nodes,
               "devices": c.num_devices, "seq_length": c.model.seq_length, "profile": c.profile_label,
               "runtime": c.runtime,
               "best_plan": b.plan if b else "", "step_time_s": b.step_time_s if b else None,
               "tokens_per_s": b.tokens_per_s if b else None,
               "tokens_per_s_per_gpu": b.tokens_per_s / c.num_devices if b else None,
               "mfu": b.mfu if b else None, "model_tflops_per_gpu": b.model_tflops_per_gpu if b else None,
               "peak_memory_gib": b.peak_memory_gib if b else None, "bottleneck": b.bottleneck if b else "",
               "candidates": self.candidates, "simulated": self.simulated, "no_fit": self.no_fit or ""}
        return row

    def to_dict(self) -> dict:
        return {**self.row(), "ranked": [r.to_dict() for r in self.ranked], "wall_s": self.wall_s}


@dataclass
class SweepResult:
    name: str
    source: str
    cells: list[CellResult]
    executor: str = "local"
    wall_s: float = 0.0

    def rows(self) -> list[dict]:
        return [c.row() for c in self.cells]

    def to_dict(self) -> dict:
        return {"name": self.name, "grid": self.source, "executor": self.executor, "wall_s": self.wall_s,
                "cells": [c.to_dict() for c in self.cells]}


def run_cell(_context, cell: Cell) -> CellResult:
    """One cell's search (a task: module-level, its inputs picklable)."""
    t0 = time.perf_counter()
    cluster = load_topology(cell.topology, nodes=cell.nodes)
    # As `plansim search` loads it (plansim/cli.py _load_inputs); tests/test_sweep.py checks
    # that a cell and the search command agree.
    profile = load_profile(cell.profile, bundled=cluster.profiles, runtime=cell.runtime)
    profile = for_gpus(profile, {d.gpu.name for d in cluster.devices})
    try:
        res = search(cell.model, cluster, profile, top=cell.top, workers=1, progress=False, record_best=False)
    except NoPlanFits as err:
        return CellResult(cell, [], no_fit=err.message, wall_s=time.perf_counter() - t0)
    return CellResult(cell, res.ranked[:cell.top], res.candidates, res.estimated, len(res.ranked),
                      wall_s=time.perf_counter() - t0)


def run_sweep(grid: SweepGrid, executor: ExecutorSpec | None = None, progress: bool | None = None) -> SweepResult:
    """Search every cell of ``grid`` on ``executor`` (default: in this process)."""
    t0 = time.perf_counter()
    spec = executor or ExecutorSpec()
    cells = run_tasks(run_cell, None, grid.cells, spec, progress, desc="sweep")
    return SweepResult(grid.name, grid.source, cells, spec.kind, time.perf_counter() - t0)
