"""What a scenario (specs/scenario.py) means for one simulated step: the conditions in
force (device speeds, link bandwidth scales, stalls, lost nodes), and the step's Program
with the slowed devices' work stretched.

Speed enters the Program, not the engine: a data-parallel replica holding a slowed device
no longer runs like its twins, so it becomes a replica class of its own (the engine
simulates one pipeline per class), whose chunks on the slowed stage take 1/factor as long
(forward, backward, optimizer: compute kernels; TP collectives keep their time, the
fabric is not slower). A TP group runs in lock step, so its slowest member sets the pace.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.flownet import Edge
from sim.program import PipelineProgram, Program
from specs.scenario import Scenario, ScenarioEvent


@dataclass
class StepConditions:
    """The cluster during one step: rank -> compute speed factor (only those != 1), directed
    edge -> bandwidth factor, rank -> stall seconds at the step's start, the events that
    took effect at this step (for the report) and the node_lost events that end the run."""

    speed: dict[int, float] = field(default_factory=dict)
    link_scale: dict[Edge, float] = field(default_factory=dict)
    stalls: dict[int, float] = field(default_factory=dict)
    started: list[ScenarioEvent] = field(default_factory=list)
    lost: list[ScenarioEvent] = field(default_factory=list)


class ScenarioClock:
    """Turns a scenario into per-step conditions. An event given by ``time_s`` starts at
    the first step that starts at or after that time; ``conditions(step, start_s)`` must be
    asked for steps in order (it remembers when each timed event started)."""

    def __init__(self, scenario: Scenario, cluster):
        self.scenario = scenario
        self.cluster = cluster
        self._began: dict[int, int] = {}  # event index -> step it took effect

    def _start_step(self, ev: ScenarioEvent, step: int, start_s: float) -> int | None:
        if ev.step is not None:
            return ev.step
        if ev.index not in self._began and start_s >= ev.time_s:
            self._began[ev.index] = step
        return self._began.get(ev.index)

    def conditions(self, step: int, start_s: float) -> StepConditions:
        c = StepConditions()
        for ev in self.scenario.events:  # file order: a later event on a target replaces an earlier one
            first = self._start_step(ev, step, start_s)
            if first is None or step < first:
                continue
            if first == step:
                c.started.append(ev)
            if ev.kind == "node_lost":
                c.lost.append(ev)
            elif ev.kind == "stall":
                if first == step:
                    for r in ev.ranks:
                        c.stalls[r] = c.stalls.get(r, 0.0) + ev.duration_s
            elif ev.last_step is None or step <= ev.last_step:
                if ev.kind == "compute_speed":
                    for r in ev.ranks:
                        c.speed[r] = ev.factor
                else:
                    for e in event_edges(self.cluster, ev):
                        c.link_scale[e] = ev.factor
        c.speed = {r: f for r, f in c.speed.items() if f != 1.0}
        return c


def event_edges(cluster, ev: ScenarioEvent) -> list[Edge]:
    """Directed edges a link_bandwidth event scales: for a node, every link between its
    NICs and the network (both directions; not the PCIe hop inside the node); for a
    device, every link of its GPU vertex (fabric port, PCIe hop to its NIC)."""
    g = cluster.graph
    if ev.node is not None:
        nics = {v for v, d in g.nodes(data=True) if d.get("role") == "nic" and d.get("node") == ev.node}
        edges = [(u, v) for n in sorted(nics) for u, v in list(g.out_edges(n)) + list(g.in_edges(n))
                 if g.edges[u, v].get("kind") != "pcie"]
    else:
        vert = cluster.devices[ev.ranks[0]].vertex
        edges = list(g.out_edges(vert)) + list(g.in_edges(vert))
    return sorted(set(edges))


def stage_speed(plan, speed: dict[int, float], d: int, s: int) -> float:
    """Speed factor of replica ``d``'s stage ``s``: its TP group's slowest member."""
    if not speed:
        return 1.0
    return min(speed.get(r, 1.0) for r in plan.tp_group(d, s))


def stage_stall(plan, stalls: dict[int, float], d: int, s: int) -> float:
    """Stall (seconds) of replica ``d``'s stage ``s`` at the step's start: its TP group
    waits for its longest-stalled member."""
    if not stalls:
        return 0.0
    return max(stalls.get(r, 0.0) for r in plan.tp_group(d, s))


def apply_conditions(prog: Program, speed: dict[int, float], stalls: dict[int, float] | None = None) -> Program:
    """``prog`` with replica classes split by their stages' speed factors and stalls, and
    the slowed stages' compute stretched (forward, backward and optimizer time divided by
    the factor). Returns ``prog`` itself when no device is slowed or stalled."""
    stalls = stalls or {}
    if not speed and not stalls:
        return prog
    plan = prog.plan
    pipelines: list[PipelineProgram] = []
    for pipe in prog.pipelines:
        by_sig: dict[tuple, list[int]] = {}
        for d in pipe.dp_indices:
            sig = tuple((stage_speed(plan, speed, d, s), stage_stall(plan, stalls, d, s)) for s in range(plan.pp))
            by_sig.setdefault(sig, []).append(d)
        for sig, members in by_sig.items():
            ranks = tuple(plan.rank(members[0], s, 0) for s in range(plan.pp))
            if all(f == 1.0 for f, _ in sig):
                name = pipe.name if len(by_sig) == 1 else f"{pipe.name} r{members[0]}"
                pipelines.append(replace(pipe, name=name, dp_indices=tuple(members), ranks=ranks))
                continue
            chunks = {(s, c): (w if sig[s][0] == 1.0 else
                               replace(w, fwd_s=w.fwd_s / sig[s][0], bwd_s=w.bwd_s / sig[s][0]))
                      for (s, c), w in pipe.chunks.items()}
            slow = ",".join(f"s{s}@{f:.0%}" for s, (f, _) in enumerate(sig) if f != 1.0)
            pipelines.append(replace(
                pipe, name=f"{pipe.name} r{members[0]} {slow}", dp_indices=tuple(members), ranks=ranks,
                chunks=chunks, optimizer_s=tuple(t / f for t, (f, _) in zip(pipe.optimizer_s, sig))))
    pipelines.sort(key=lambda p: p.dp_indices[0])
    return replace(prog, pipelines=pipelines)
