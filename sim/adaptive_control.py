"""The adaptive engine of ``plansim simulate --adaptive``: the controller of
costmodel/rebalance.py (the one the real runner uses) fed with what a real training loop
can observe, and its decisions turned into plans.

What it sees: per simulated device, the busy time (compute and TP collectives) of each
finished step, times a seeded measurement noise factor 1 + noise * N(0, 1) (timer jitter,
clock skew between ranks); never the scenario's speed factors. Two levers:

- data parallel: microbatches per replica (the plan's ``mb_shares``). A replica's busy time
  is its slowest stage's (in a pipeline the bottleneck stage sets the pace); moving
  microbatches moves no state (the data loader hands out other samples), so it is free.
- pipeline: layers per stage (the plan's ``layers``), the same split on every replica. A
  stage's time is its busy time per microbatch on its fastest replica (a stage slow on one
  replica only is the data-parallel lever's to fix);
  moving a layer moves its weights and optimizer state between neighbouring stages over
  the network, priced per layer for the hysteresis from the link's nominal bandwidth and
  paid for real by the engine (sim/multistep.py simulates the transfers as flows).

The data-parallel lever is asked first each step; the pipeline lever only when it holds.
Interleaved schedules need shares divisible by pp, so they use the pipeline lever only.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from costmodel import memory as mem
from costmodel.dtypes import optimizer_state_bytes, working_bytes
from costmodel.rebalance import Decision, Rebalancer
from sim.tp_comm import group_kind


@dataclass(frozen=True)
class ControllerSettings:
    noise: float = 0.02  # relative standard deviation of a timing measurement
    seed: int = 0
    horizon_steps: int = 10  # K: a move must pay for itself within K steps
    # Weight of history in the per-unit EWMA: 0.3 follows a change within ~2 steps and
    # leaves 0.73 of one measurement's noise (sqrt((1-a)/(1+a))).
    smoothing: float = 0.3
    # A move must promise at least 3 % of the step (see gain_threshold).
    min_gain_frac: float = 0.03
    settle_steps: int = 1  # steps observed under the current allocation before a decision


def layer_state_bytes(model, plan) -> float:
    """Bytes one device sends when one layer leaves its stage: the layer's weights in the
    working dtype and its optimizer state (master copy, Adam moments; sharded over dp*cp
    under ZeRO >= 1). Gradients are not moved: the buffer is zeroed every step."""
    params = mem.stage_params(model, 1, plan.tp, False, False)
    opt = optimizer_state_bytes(plan.precision) / (plan.grad_degree if plan.zero >= 1 else 1)
    return params * (working_bytes(plan.precision) + opt)


def layer_move_s(model, plan, cluster, profile) -> float:
    """Nominal seconds to move one layer between neighbouring stages (replica 0's TP
    index 0, stage 0 -> 1): bytes over the route's bottleneck at the fabric's efficiency."""
    if plan.pp < 2:
        return 0.0
    a, b = plan.rank(0, 0, 0), plan.rank(0, 1, 0)
    path = cluster.route(a, b)
    bw = cluster.path_bw_Bps(path) * profile.fabric(group_kind(cluster, [a, b])).bw_eff
    return layer_state_bytes(model, plan) / bw if bw > 0 else math.inf


def gain_threshold(settings: ControllerSettings) -> float:
    """The smallest predicted gain (fraction of the step) worth a move: the larger of
    ``min_gain_frac`` and 3 standard deviations of a smoothed per-unit estimate, the
    timer noise times sqrt((1-a)/(1+a)) for EWMA weight a (a loop knows its timers' jitter
    from warm-up; it does not know the cluster's speeds). Below it, noise alone would
    move units back and forth."""
    sd = settings.noise * math.sqrt((1.0 - settings.smoothing) / (1.0 + settings.smoothing))
    return min(0.5, max(settings.min_gain_frac, 3.0 * sd))


class SimController:
    def __init__(self, model, plan, cluster, profile, settings: ControllerSettings = ControllerSettings()):
        self.settings = settings
        self.rng = random.Random(settings.seed)
        common = dict(horizon_steps=settings.horizon_steps, smoothing=settings.smoothing,
                      min_gain_frac=gain_threshold(settings))
        self._common = common
        self.dp = self._dp_lever(plan) if plan.dp > 1 and plan.schedule != "interleaved" else None
        self.move_s = layer_move_s(model, plan, cluster, profile)
        self.pp = self._pp_lever(plan) if plan.pp > 1 else None
        self.decisions: list[Decision] = []
        self._seen = 0  # steps observed under the current allocation

    def _dp_lever(self, plan) -> Rebalancer:
        return Rebalancer(plan.mb_shares, min_units=1, **self._common)

    def _pp_lever(self, plan) -> Rebalancer:
        return Rebalancer(plan.layers, min_units=plan.vpp, contiguous=True,
                          cost_per_unit_moved_s=self.move_s, **self._common)

    def _measured(self, t: float) -> float:
        return max(0.0, t * (1.0 + self.settings.noise * self.rng.gauss(0.0, 1.0)))

    def observe(self, plan, classes: list[tuple[tuple[int, ...], list[float]]]) -> None:
        """One finished step run under ``plan``: per replica class, (its DP indices, busy
        seconds per stage). A step run under an allocation the controller has since left
        still tells the per-unit times (busy / units, the controller's linear model): it
        is handed over as the busy time those per-unit times give the current units."""
        busy = {}  # dp index -> busy per stage, measured (with noise) on that replica
        for members, per_stage in classes:
            for d in members:
                busy[d] = [self._measured(b) for b in per_stage]
        self._seen += 1
        if self.dp is not None:
            now = self.dp.units
            self.dp.observe([max(busy[d]) / plan.mb_shares[d] * now[d] for d in range(plan.dp)])
        if self.pp is not None:
            # A stage's time per microbatch on its fastest replica (times the mean share):
            # what every replica pays for the stage. A stage slow on one replica only is
            # the data-parallel lever's to fix (moving layers would slow all the others).
            now, mean_m = self.pp.units, sum(plan.mb_shares) / plan.dp
            self.pp.observe([min(busy[d][s] / plan.mb_shares[d] for d in range(plan.dp)) * mean_m
                             / plan.layers[s] * now[s] for s in range(plan.pp)])

    def decide(self, plan):
        """(plan for the next step, the decision taken or None, whether layers moved).
        After a move of one lever the other's estimates describe an allocation that is
        gone, so it starts afresh; neither decides again until ``settle_steps`` steps
        have been observed under the new allocation."""
        if self._seen < self.settings.settle_steps:
            return plan, None, False
        if self.dp is not None:
            dec = self.dp.decide()
            if dec.act:
                self.decisions.append(dec)
                new = replace(plan, mb_shares=dec.units, explicit_shares=True)
                self.pp = self._pp_lever(new) if self.pp is not None else None
                self._seen = 0
                return new, dec, False
        if self.pp is not None:
            dec = self.pp.decide()
            if dec.act:
                self.decisions.append(dec)
                new = replace(plan, layers=dec.units, explicit_layers=True)
                self.dp = self._dp_lever(new) if self.dp is not None else None
                self._seen = 0
                return new, dec, True
        return plan, None, False
