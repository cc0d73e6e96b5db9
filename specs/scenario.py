"""Scenarios for multi-step simulation (``plansim simulate --steps N --scenario FILE``):
what changes in the cluster while it trains, as events at given steps or times.

A scenario YAML holds ``name`` (optional), ``description`` (optional) and ``events``, a
list of mappings tagged by ``kind``:

- ``compute_speed``: ``device`` D or ``node`` N computes at ``factor`` times its speed
  (0.6 = 60 %); a TP group runs in lock step, so its slowest member sets its pace.
- ``link_bandwidth``: the links of ``device`` D (its fabric port and its PCIe hop to the
  NIC) or the NICs of ``node`` N (their network links, both directions) carry ``factor``
  times their bandwidth.
- ``stall``: ``device`` D or ``node`` N pauses ``duration_s`` seconds at the start of the
  step (a transient hang: a driver reset, a page-migration storm, a checkpoint write).
- ``node_lost``: ``node`` N leaves the cluster: the run stops before that step with a
  report saying which replicas and stages it held.

Each event starts at ``step`` (steps are numbered from 1) or at ``time_s`` (simulated
seconds from the start; it takes effect at the first step that starts at or after that
time: the engine applies changes at step boundaries). ``compute_speed`` and
``link_bandwidth`` last until ``last_step`` (inclusive) or the end of the run; a later
event on the same target replaces an earlier one.

Shapes, types and ranges are checked here (bounds from costmodel/limits.py) through the
one pydantic translator (specs/validation.py); device and node indices are checked against
the cluster by ``resolve_scenario``, so each error names its own field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from costmodel.errors import InputError
from costmodel.limits import MAX_DEVICES, MAX_NODES, MAX_SCENARIO_EVENTS, MAX_SCENARIO_S, MAX_SIM_STEPS, \
    SCALE_FACTOR_RANGE
from costmodel.yamlio import bundled_file, bundled_names, load_yaml_mapping, not_a_file
from specs.validation import Float, Int, Strict, validate

Step = Int(1, MAX_SIM_STEPS)
Seconds = Float(0.0, MAX_SCENARIO_S)
Factor = Float(*SCALE_FACTOR_RANGE)


class _Event(Strict):
    """When an event starts (exactly one of ``step`` and ``time_s``) and whom it targets."""

    step: Step | None = None
    time_s: Seconds | None = None
    device: Int(0, MAX_DEVICES - 1) | None = None
    node: Int(0, MAX_NODES - 1) | None = None

    @model_validator(mode="after")
    def _when_and_whom(self):
        if (self.step is None) == (self.time_s is None):
            raise ValueError("give exactly one of step (an integer >= 1) and time_s (seconds)")
        if (self.device is None) == (self.node is None):
            raise ValueError("give exactly one of device (a rank) and node (a node index)")
        return self


class _Lasting(_Event):
    factor: Factor
    last_step: Step | None = None

    @model_validator(mode="after")
    def _order(self):
        if self.last_step is not None and self.step is not None and self.last_step < self.step:
            raise ValueError(f"last_step={self.last_step} is before step={self.step}")
        return self


class ComputeSpeed(_Lasting):
    kind: Literal["compute_speed"]


class LinkBandwidth(_Lasting):
    kind: Literal["link_bandwidth"]


class Stall(_Event):
    kind: Literal["stall"]
    duration_s: Float(0.0, MAX_SCENARIO_S, lo_open=True)


class NodeLost(_Event):
    kind: Literal["node_lost"]

    @model_validator(mode="after")
    def _node(self):
        if self.node is None:
            raise ValueError("node_lost needs node (a node index), not device")
        return self


Event = Annotated[Union[ComputeSpeed, LinkBandwidth, Stall, NodeLost], Field(discriminator="kind")]


class ScenarioFile(Strict):
    name: Annotated[str, Field(max_length=200)] = "scenario"
    description: Annotated[str, Field(max_length=2000)] = ""
    events: list[Event] = Field(default_factory=list, max_length=MAX_SCENARIO_EVENTS)


@dataclass(frozen=True)
class ScenarioEvent:
    """One validated event resolved against the cluster: the ranks it touches (a node's
    devices for node events; for link_bandwidth on a node, its NICs), from ``step`` (or from
    ``time_s``) to ``last_step`` (None: the end of the run)."""

    index: int  # position in the file (events[index])
    kind: str
    ranks: tuple[int, ...]
    node: int | None
    step: int | None
    time_s: float | None
    last_step: int | None
    factor: float = 1.0
    duration_s: float = 0.0

    def describe(self) -> str:
        who = f"node {self.node}" if self.node is not None else f"device {self.ranks[0]}"
        when = f"step {self.step}" if self.step is not None else f"t={self.time_s:g} s"
        what = {"compute_speed": f"computes at {self.factor:.0%}",
                "link_bandwidth": f"links at {self.factor:.0%} bandwidth",
                "stall": f"stalls {self.duration_s:g} s",
                "node_lost": "is lost"}[self.kind]
        until = f" to step {self.last_step}" if self.last_step is not None else ""
        return f"{who} {what} from {when}{until}" if self.kind in ("compute_speed", "link_bandwidth") \
            else f"{who} {what} at {when}"


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    events: tuple[ScenarioEvent, ...]


_BUNDLE = "scenarios"


def list_scenarios() -> list[str]:
    """Names of the bundled scenario files (stems of ``scenarios/*.yaml``)."""
    return bundled_names(_BUNDLE)


def scenario_path(name_or_path: str | Path) -> str:
    """A file path as given, or a bundled scenario's name (``slow-node-175b``)."""
    text = str(name_or_path)
    if not Path(text).is_file() and not text.endswith((".yaml", ".yml")) and "/" not in text:
        res = bundled_file(_BUNDLE, text)
        if res is not None:
            return str(res)
        problem = not_a_file(text, "scenario file")
        if problem:
            raise InputError(text, "--scenario", problem)
        raise InputError(text, "--scenario", f"no such file or bundled scenario; bundled: {', '.join(list_scenarios())}")
    return text


def load_scenario_file(path: str | Path) -> ScenarioFile:
    """Read and validate a scenario YAML (shapes and ranges; see resolve_scenario)."""
    src = scenario_path(path)
    data = load_yaml_mapping(src, src, "scenario file", "a mapping with 'events' (and 'name', 'description')")
    return validate(ScenarioFile, data, src)


def resolve_scenario(sf: ScenarioFile, cluster, source: str) -> Scenario:
    """Events with device and node indices checked against ``cluster``."""
    events = []
    n_dev, n_nodes = cluster.num_devices, len(cluster.nodes)
    for i, ev in enumerate(sf.events):
        where = f"events.{i}"
        if ev.device is not None and ev.device >= n_dev:
            raise InputError(source, f"{where}.device", f"{ev.device}: must be a rank in [0, {n_dev - 1}] "
                             f"(the cluster has {n_dev} devices)")
        if ev.node is not None and ev.node >= n_nodes:
            raise InputError(source, f"{where}.node", f"{ev.node}: must be a node index in [0, {n_nodes - 1}] "
                             f"(the cluster has {n_nodes} nodes)")
        if ev.kind == "link_bandwidth" and ev.node is not None and cluster.nodes[ev.node].nic_count == 0:
            raise InputError(source, f"{where}.node", f"{ev.node}: node has no NICs; scale a device's "
                             "links with device: RANK instead")
        ranks = (ev.device,) if ev.device is not None else tuple(cluster.nodes[ev.node].ranks)
        events.append(ScenarioEvent(
            index=i, kind=ev.kind, ranks=ranks, node=ev.node, step=ev.step, time_s=ev.time_s,
            last_step=getattr(ev, "last_step", None), factor=getattr(ev, "factor", 1.0),
            duration_s=getattr(ev, "duration_s", 0.0)))
    return Scenario(sf.name, source, tuple(events))


def load_scenario(path: str | Path, cluster) -> Scenario:
    """A scenario file (or bundled name) validated against ``cluster``; InputError (one
    line) otherwise."""
    return resolve_scenario(load_scenario_file(path), cluster, scenario_path(path))


def empty_scenario() -> Scenario:
    """No events: the cluster as its topology file describes it at every step."""
    return Scenario("none", "", ())
