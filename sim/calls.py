"""A communication call of the engine: the software cost of the call on the fabric its
group spans (profile ``fabrics.<kind>.call_latency_us``), then the collective's flows on
the flow network, with the unsimulated identical groups sending alongside."""
from __future__ import annotations

from typing import Sequence

import simpy

from costmodel.profile import Profile
from sim import collective_flows as cf
from sim.flownet import FlowNetwork
from specs.topology import Cluster


def group_kind(cluster: Cluster, ranks: Sequence[int]) -> str:
    """The link class a group's collective runs on: the node's fabric or the network."""
    nodes = {cluster.node_of(r) for r in ranks}
    return cluster.nodes[next(iter(nodes))].intra_kind if len(nodes) == 1 else "network"


def call_latency_s(cluster: Cluster, profile: Profile, ranks: Sequence[int]) -> float:
    """Per-call software latency of the fabric a group spans, seconds."""
    return profile.fabric(group_kind(cluster, ranks)).call_latency_us * 1e-6


def run_call(env: simpy.Environment, net: FlowNetwork, cluster: Cluster, phases: list[cf.Phase],
             replicas, label: str, call_s: float) -> simpy.Process:
    """Start one call: wait ``call_s``, then run ``phases``; the process ends with the call."""
    return env.process(_call(env, net, cluster, phases, replicas, label, call_s))


def _call(env, net, cluster, phases, replicas, label, call_s):
    if call_s > 0:
        yield env.timeout(call_s)
    yield cf.run_phases(env, net, cluster.route, phases, replicas=replicas, label=label)
