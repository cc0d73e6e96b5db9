"""A communication call of the engine: the software cost of the call on the fabric its
group spans (profile ``fabrics.<kind>.call_latency_us``), then the collective's flows on
the flow network, with the unsimulated identical groups sending alongside; and EnginePart,
what the pipeline executor and the gradient reducer share to make such calls."""
from __future__ import annotations

from typing import Sequence

import simpy

from sim import collective_flows as cf
from sim.accountant import StepAccountant
from sim.flownet import FlowNetwork
from sim.program import Program
from sim.tp_comm import call_latency_s
from specs.topology import Cluster


def run_call(env: simpy.Environment, net: FlowNetwork, cluster: Cluster, phases: list[cf.Phase],
             replicas, label: str, call_s: float, symmetric: bool = False) -> simpy.Process:
    """Start one call: wait ``call_s``, then run ``phases``; the process ends with the call.
    ``symmetric``: see collective_flows.run_phases."""
    return env.process(_call(env, net, cluster, phases, replicas, label, call_s, symmetric))


def _call(env, net, cluster, phases, replicas, label, call_s, symmetric):
    if call_s > 0:
        yield env.timeout(call_s)
    yield cf.run_phases(env, net, cluster.route, phases, replicas=replicas, label=label, symmetric=symmetric)


class EnginePart:
    """One part of an engine run: the SimPy environment, the flow network, the program
    (plan, cluster, profile) and the step's accountant, shared by all parts."""

    def __init__(self, env: simpy.Environment, net: FlowNetwork, program: Program, accountant: StepAccountant):
        self.env = env
        self.net = net
        self.prog = program
        self.plan = program.plan
        self.cluster = program.cluster
        self.acct = accountant

    def call(self, phases: list[cf.Phase], replicas, label: str, call_s: float,
             symmetric: bool = False) -> simpy.Process:
        """Start one communication call (see run_call)."""
        return run_call(self.env, self.net, self.cluster, phases, replicas, label, call_s, symmetric)

    def call_latency_s(self, ranks: Sequence[int], op: str | None = None) -> float:
        """Per-call software latency of collective ``op`` on the fabric ``ranks`` span, seconds."""
        return call_latency_s(self.cluster, self.prog.profile, ranks, op)
