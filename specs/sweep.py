"""The sweep grid (``plansim sweep GRID.yaml``): models x topologies x node counts (x sequence
lengths x hardware profiles x framework runtimes), each cell one plan search.

    name: GPT-3 125M-350M on 1-2 nodes     # report title (optional)
    models: [gpt3-125m, gpt3-350m]         # presets or model YAML files
    topologies:                            # bundled names or topology YAML files, each either
      - dgx-a100                           #   a name (scaled to every count in `nodes`)
      - {name: hetero-a100-v100}           #   or a mapping with its own `nodes` (or none:
                                           #   the file's own size, e.g. heterogeneous ones)
    nodes: [1, 2]                          # node counts (optional; default the file's size)
    seq_lengths: [1024, 2048]              # override the models' sequence length (optional)
    profiles: [null, my-profile.yaml]      # hardware profiles (optional; null = the topology's)
    runtimes: [megatron-core, torchtitan]  # framework runtimes (optional; default megatron-core)
    top: 3                                 # ranked plans kept per cell (optional, default 3)

Relative file paths are read from the grid file's folder. Everything is validated here,
before any search runs: the grid's own fields (unknown keys, types, bounds from
costmodel/limits.py, duplicates), every model, topology and profile it names, every node
count against its topology, and the number of cells. Errors are one-line InputErrors naming
the grid file and the field (or the named file and its field when that file is at fault).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator

from costmodel.errors import InputError
from costmodel.limits import MAX_NODES, MAX_SEQ, MAX_SWEEP_AXIS, MAX_SWEEP_CELLS
from costmodel.profile import DEFAULT_RUNTIME, RUNTIMES, bundled_profiles, load_profile
from costmodel.shapes import ModelSpec
from costmodel.yamlio import load_yaml
from specs.model import PRESETS, load_model
from specs.topology import TopologyFileRead, list_topologies
from specs.validation import Int, Strict, short, validate

MAX_TOP_PER_CELL = 100  # plans kept per cell; a search simulates at least 10

Name = Annotated[str, Field(min_length=1, max_length=1000)]
Nodes = Annotated[list[Int(1, MAX_NODES)], Field(min_length=1, max_length=MAX_SWEEP_AXIS)]


def _no_duplicates(values: list, what: str) -> list:
    seen = set()
    for v in values:
        key = repr(v)
        if key in seen:
            raise ValueError(f"{short(v)} is listed twice; each {what} once")
        seen.add(key)
    return values


def _entry(value):
    """A topology given as a bare name is the mapping {name: NAME}."""
    return {"name": value} if isinstance(value, str) else value


class TopologyEntry(Strict):
    name: Name
    nodes: Nodes | None = None  # None: the grid's `nodes`, else the file's own size

    @field_validator("nodes")
    @classmethod
    def _unique(cls, v):
        return None if v is None else _no_duplicates(v, "node count")


class SweepFile(Strict):
    """The grid YAML: exactly these fields (unknown keys are rejected)."""

    name: str = Field(default="sweep", max_length=200)
    models: Annotated[list[Name], Field(min_length=1, max_length=MAX_SWEEP_AXIS)]
    topologies: Annotated[list[Annotated[TopologyEntry, BeforeValidator(_entry)]],
                          Field(min_length=1, max_length=MAX_SWEEP_AXIS)]
    nodes: Nodes | None = None
    seq_lengths: Annotated[list[Int(1, MAX_SEQ)], Field(min_length=1, max_length=MAX_SWEEP_AXIS)] | None = None
    profiles: Annotated[list[Name | None], Field(min_length=1, max_length=MAX_SWEEP_AXIS)] | None = None
    runtimes: Annotated[list[Literal[tuple(RUNTIMES)]], Field(min_length=1, max_length=MAX_SWEEP_AXIS)] | None = None
    top: Int(1, MAX_TOP_PER_CELL) = 3

    @field_validator("models", "nodes", "seq_lengths", "profiles", "runtimes")
    @classmethod
    def _unique(cls, v, info):
        return None if v is None else _no_duplicates(v, info.field_name.rstrip("s").replace("_", " "))

    @field_validator("topologies")
    @classmethod
    def _unique_topologies(cls, v):
        _no_duplicates([(t.name, tuple(t.nodes or ())) for t in v], "topology")
        return v


@dataclass(frozen=True)
class Cell:
    """One search of the sweep. ``model`` carries the cell's sequence length; the labels are
    the names as the grid wrote them (for tables); ``topology`` and ``profile`` are what the
    loaders take (bundled names or resolved paths)."""

    model: ModelSpec
    model_label: str
    topology: str
    topology_label: str
    nodes: int | None
    num_devices: int
    profile: str | None
    profile_label: str
    runtime: str
    top: int

    @property
    def key(self) -> tuple:
        """Identity of the cell (grid order is the order of cells)."""
        return (self.model_label, self.topology_label, self.num_devices, self.model.seq_length, self.profile_label,
                self.runtime)


@dataclass(frozen=True)
class SweepGrid:
    name: str
    source: str
    cells: tuple[Cell, ...]


def _resolve(value: str, bundled, folder: Path) -> str:
    """A bundled name as written; a file path relative to the grid's folder."""
    if value in bundled:
        return value
    p = Path(value)
    return str(p if p.is_absolute() else folder / p)


def _model(value: str, folder: Path, source: str, field: str) -> ModelSpec:
    if value in PRESETS:
        return PRESETS[value]
    path = Path(_resolve(value, PRESETS, folder))
    if not path.is_file():
        raise InputError(source, field, f"{short(value)}: no such model preset or file "
                                        f"(paths are relative to the grid's folder); presets: {', '.join(PRESETS)}")
    return load_model(str(path))


def _read_topology(entry: TopologyEntry, topo: str, source: str, field: str) -> TopologyFileRead:
    """The entry's topology file, read and validated once for all its node counts."""
    if not (entry.name in list_topologies() or Path(topo).is_file()):
        raise InputError(source, f"{field}.name", f"{short(entry.name)}: no bundled topology or file "
                                                  f"(paths are relative to the grid's folder); bundled: "
                                                  f"{', '.join(list_topologies())}")
    return TopologyFileRead(topo)  # a bad topology file: the error names that file


def _devices(entry: TopologyEntry, read: TopologyFileRead, nodes: int | None, source: str, field: str) -> int:
    try:
        return read.devices(nodes)
    except InputError as err:  # the grid's node count does not suit this topology
        where = f"{field}.nodes" if entry.nodes else "nodes"
        raise InputError(source, where, f"{nodes} for {short(entry.name)}: {err.message}") from None


def load_grid(path: str | Path) -> SweepGrid:
    """Read, validate and expand a sweep grid file into its cells (module docstring)."""
    source = str(path)
    data = load_yaml(path, source, "sweep grid")
    grid = validate(SweepFile, data, source)
    folder = Path(path).resolve().parent
    models = [(m, _model(m, folder, source, f"models.{i}")) for i, m in enumerate(grid.models)]
    profiles = []
    for i, prof in enumerate(grid.profiles or [None]):
        if prof is None:
            profiles.append((None, "topology's"))
            continue
        resolved = _resolve(prof, bundled_profiles(), folder)
        if resolved == str(folder / prof) and not Path(resolved).is_file():
            raise InputError(source, f"profiles.{i}", f"{short(prof)}: no such profile file (paths are relative "
                                                       f"to the grid's folder); bundled: {', '.join(bundled_profiles())}")
        load_profile(resolved)  # a bad profile file: the error names that file
        profiles.append((resolved, prof))
    topologies = []
    for i, entry in enumerate(grid.topologies):
        topo = _resolve(entry.name, list_topologies(), folder)
        read = _read_topology(entry, topo, source, f"topologies.{i}")
        for nodes in entry.nodes or grid.nodes or [None]:
            topologies.append((entry, topo, nodes, _devices(entry, read, nodes, source, f"topologies.{i}")))
    runtimes = grid.runtimes or [DEFAULT_RUNTIME]
    n_cells = len(models) * len(topologies) * len(grid.seq_lengths or [None]) * len(profiles) * len(runtimes)
    if n_cells > MAX_SWEEP_CELLS:
        raise InputError(source, None, f"{n_cells:,} cells (models x topologies x nodes x seq_lengths x profiles "
                                       f"x runtimes); "
                                       f"a sweep may have at most {MAX_SWEEP_CELLS:,}")
    cells = []
    for label, model in models:
        for entry, topo, nodes, devices in topologies:
            for seq in grid.seq_lengths or [None]:
                m = model if seq is None else replace(model, seq_length=seq)
                for prof, prof_label in profiles:
                    for runtime in runtimes:
                        cells.append(Cell(m, label, topo, entry.name, nodes, devices, prof, prof_label, runtime,
                                          grid.top))
    if len({c.key for c in cells}) != len(cells):  # e.g. dgx-a100 and {name: dgx-a100, nodes: [16]}
        raise InputError(source, "topologies", "two entries give the same cluster; list each once")
    return SweepGrid(name=grid.name, source=source, cells=tuple(cells))
