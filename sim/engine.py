"""The SimPy engine: runs a Program (schedule action lists + per-chunk work) on the
cluster's flow network and measures one training step.

Three parts share one SimPy environment and one flow network:
- the pipeline executor (sim/pipeline_executor.py): per simulated device, a compute
  stream that executes its pipeline rank's action list in order (tensor-parallel
  collectives sit on it, on the critical path), with pipeline sends as flows beside it;
- the gradient reducer (sim/gradient_reducer.py): one data-parallel stream per pipeline
  stage that reduces gradient buckets as backward produces them (overlapping earlier
  layers' backward), shared by every simulated replica of that stage, and ZeRO's and
  top-k's collectives;
- the accountant (sim/accountant.py): where each device's time goes (the breakdown sums
  to the step time), the timeline segments, when each rank finished.
"""
from __future__ import annotations

import functools

import simpy

from sim.accountant import RankKey, StepAccountant
from sim.flownet import FlowNetwork
from sim.gradient_reducer import GradientReducer
from sim.pipeline_executor import PipelineExecutor
from sim.program import Program
from sim.result import Segment


def bw_efficiency(profile):
    """Per link class, the achievable fraction of its line rate (profile
    ``fabrics.<kind>.bw_eff``): flows share what a collective can really use of a link,
    not its datasheet rate. The flow network applies it to each link it touches."""
    return lambda kind: profile.fabric(kind).bw_eff


def hop_latency(profile):
    """Per link class, the fitted device-to-device latency in seconds (profile
    ``fabrics.<kind>.hop_latency_us``, written by ``plansim calibrate``) that replaces the
    topology's figure, or None where the profile leaves the topology's latency."""
    @functools.lru_cache(maxsize=None)  # asked once per touched edge: memoise per class
    def of(kind: str) -> float | None:
        us = profile.fabric(kind).hop_latency_us
        return None if us is None else us * 1e-6
    return of


class Engine:
    """One step of ``program``: ``run()`` returns the step time; then ``totals``,
    ``segments`` (when ``record``), ``done_at`` and ``net`` describe it.
    ``symmetric_dp=False`` simulates every data-parallel flow explicitly (the reference
    the symmetric collectives are tested against)."""

    def __init__(self, program: Program, record: bool = False, symmetric_dp: bool = True):
        self.prog = program
        self.plan = program.plan
        self.cluster = program.cluster
        self.record = record
        self.env = simpy.Environment()
        self.net = FlowNetwork(self.env, self.cluster.links, record=record,
                              bw_scale=bw_efficiency(program.profile),
                              hop_latency=hop_latency(program.profile))
        self.accountant = StepAccountant(self.env, [pipe.ranks for pipe in program.pipelines],
                                         self.plan.pp, record)
        self.reducer = GradientReducer(self.env, self.net, program, self.accountant, symmetric=symmetric_dp)
        self.executor = PipelineExecutor(self.env, self.net, program, self.accountant, self.reducer)

    @property
    def totals(self) -> dict[RankKey, dict[str, float]]:
        return self.accountant.totals

    @property
    def segments(self) -> list[Segment]:
        return self.accountant.segments

    @property
    def done_at(self) -> dict[RankKey, float]:
        return self.accountant.done_at

    def run(self) -> float:
        p = self.plan.pp
        for s in range(p):
            self.env.process(self.reducer.dp_stream(s))
        for pi in range(len(self.prog.pipelines)):
            for s in range(p):
                self.env.process(self.executor.compute_stream(pi, s))
        self.env.run()
        if len(self.done_at) != len(self.prog.pipelines) * p:
            raise RuntimeError("simulation deadlocked: some pipeline ranks never finished")
        return max(self.done_at.values())
