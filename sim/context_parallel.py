"""Context parallelism in the engine: the K/V exchange of ring attention (and the
all-to-alls of the Ulysses variant) as flows on the cluster's network, overlapped with
the block attention on the compute stream (docs/context-parallelism.md).

The simulated device stands for its CP group: every rank of the group sends its block to
its ring successor at the same time, so one exchange is one phase of cp flows (the ring
over the group, ranks in plan.cp_group order); the CP groups of the other TP indices and
of the identical replicas run the same exchange alongside (unsimulated replicas, as the
gradient reducer's DP groups do). Per chunk and microbatch the exchange of all the chunk's
layers is one transfer per ring step: the layers are identical, so the exposed time of L
layers, L * max(0, x - a), equals that of one aggregated step, max(0, L*x - L*a).
"""
from __future__ import annotations

import simpy

from sim import collective_flows as cf
from sim.accountant import RankKey
from sim.calls import EnginePart


def ring_step(group: tuple[int, ...], nbytes: float) -> list[cf.Phase]:
    """One ring-attention step: every rank sends ``nbytes`` to its successor, one hop."""
    n = len(group)
    if n < 2:
        return []
    return [cf.Phase(tuple(cf.Flow(group[i], group[(i + 1) % n], nbytes) for i in range(n)), 1, group)]


def all_to_all(group: tuple[int, ...], nbytes_sent: float) -> list[cf.Phase]:
    """Every rank sends ``nbytes_sent`` in total, split evenly over the other n-1 ranks,
    all flows at once (one latency hop each)."""
    n = len(group)
    if n < 2:
        return []
    per = nbytes_sent / (n - 1)
    return [cf.Phase(tuple(cf.Flow(a, b, per) for a in group for b in group if a != b), 1, group)]


class ContextParallelExchange(EnginePart):
    """Starts the CP exchanges of one engine run (the pipeline executor waits for them)."""

    def __init__(self, env: simpy.Environment, net, program, accountant):
        super().__init__(env, net, program, accountant)
        plan = self.plan
        self.ring = plan.cp_comm == "ring"
        self._groups: dict[tuple[int, int], tuple] = {}  # (pipeline, stage) -> (group, replicas, call_s)
        self._phases: dict[tuple, list[cf.Phase]] = {}

    def _group(self, pi: int, stage: int) -> tuple:
        got = self._groups.get((pi, stage))
        if got is None:
            plan = self.plan
            members = self.prog.pipelines[pi].dp_indices
            d0 = members[0]
            group = tuple(plan.cp_group(d0, stage, 0))
            replicas = tuple(tuple(plan.cp_group(d, stage, t)) for d in members for t in range(plan.tp)
                             if (d, t) != (d0, 0))
            # A ring step is every member's send/receive at once; a2a has no own figure.
            op = "send_recv" if plan.cp_comm == "ring" else None
            got = self._groups[(pi, stage)] = (group, replicas, self.call_latency_s(list(group), op))
        return got

    def exchange(self, pi: int, stage: int, nbytes: float, label: str) -> simpy.Process:
        """One ring step (or, for a2a, one all-to-all) of class ``pi``'s stage."""
        group, replicas, call_s = self._group(pi, stage)
        key = (group, nbytes)
        phases = self._phases.get(key)
        if phases is None:
            phases = self._phases[key] = (ring_step if self.ring else all_to_all)(group, nbytes)
        t0 = self.env.now
        proc = self.call(phases, replicas, label, call_s, symmetric=True)
        if self.acct.record:
            key_r = RankKey(pi, stage)
            proc.callbacks.append(lambda _e: self.acct.seg(key_r, "cp", "send", t0, self.env.now, label))
        return proc
