"""The pipeline executor of one step inside a multi-step run, with cross-step overlap
(the plan's ``overlap_step``):

- ``none``: the step ends as a single step does: gradient reduction, optimizer, ZeRO-1/2
  parameter all-gather; the next step's first forward starts after it.
- ``layerwise``: once the stage's gradients are reduced the rank goes on to the next step
  at once; the optimizer update (and, with ZeRO-1/2, the all-gather of the updated
  weights) runs layer by layer in forward order on a side stream, and the next step's
  first forward of each layer waits only for that layer's update. If the update of one
  layer takes u and its forward f, the first forward's end moves by u + (L-1)*max(0, u-f)
  after the reduction instead of L*u: it hides (L-1)*min(u, f) (tests/test_multistep.py).
  The side stream's optimizer kernels are taken not to slow the forward (they are
  memory-bound element-wise passes; contention between the two is not modelled).
- ``delayed``: one-step-delayed gradient application. The step ends after backward; its
  gradient reduction runs beside the whole next step, whose end applies it (optimizer,
  ZeRO gather). The weights a step uses are one update stale, which changes the
  optimisation: the search ranks such a plan above a synchronous one only when it wins by
  a margin (search.STALE_MARGIN). The last step of a run also applies its own gradients.

Megatron-LM's ``--overlap-param-gather`` (a runtime setting) overlaps the distributed
optimizer's parameter all-gather with the forward inside one step's boundary; this is the
multi-step engine's mechanism, a plan option the search can weigh.
"""
from __future__ import annotations

import simpy

from costmodel.dtypes import WORKING_BYTES as BYTES
from sim.accountant import RankKey
from sim.pipeline_executor import PipelineExecutor


class LayerUpdates:
    """Per (stage, chunk, layer): an event that succeeds when that layer's update (and
    ZeRO-1/2 gather) is done on every replica class: what the next step's forward waits for."""

    def __init__(self, env: simpy.Environment, plan, n_classes: int):
        self.env = env
        self.n_classes = n_classes
        self.events: dict[tuple[int, int, int], simpy.Event] = {}
        self._count: dict[tuple[int, int, int], int] = {}

    def event(self, key: tuple[int, int, int]) -> simpy.Event:
        ev = self.events.get(key)
        if ev is None:
            ev = self.events[key] = self.env.event()
        return ev

    def updated(self, key: tuple[int, int, int]) -> bool:
        """One class has updated layer ``key``; True when all classes have."""
        self._count[key] = self._count.get(key, 0) + 1
        return self._count[key] == self.n_classes


class StepExecutor(PipelineExecutor):
    """PipelineExecutor of step ``index`` of a run. ``gates``: the previous step's
    LayerUpdates (layerwise), ``prev_reducer``: the previous step's GradientReducer
    (delayed), ``last``: the run's final step (drains pending updates)."""

    def __init__(self, env, net, program, accountant, reducer, *, mode: str = "none",
                 gates: LayerUpdates | None = None, prev_reducer=None, last: bool = False):
        super().__init__(env, net, program, accountant, reducer)
        self.mode = mode
        self.gates = gates
        self.prev_reducer = prev_reducer
        self.last = last
        self.updates = LayerUpdates(env, self.plan, len(program.pipelines)) if mode == "layerwise" else None
        self._gated: set[tuple[int, int, int]] = set()  # (pipeline, stage, chunk) whose first forward ran
        self.side: list[simpy.Process] = []  # layer-update processes (the run waits for them)
        self._gather_tail: dict[int, simpy.Process] = {}  # stage -> its latest layer gather

    # ------------------------------------------------------------ the next step's forward
    def _forward(self, key: RankKey, a, w, label: str):
        pi, s = key
        first = (pi, s, a.chunk) not in self._gated
        if self.gates is None or not first or w.layers == 0:
            yield from super()._forward(key, a, w, label)
            return
        self._gated.add((pi, s, a.chunk))
        for j in range(w.layers):
            yield from self._wait(key, self.gates.event((s, a.chunk, j)), "dp", f"wait update layer {j} c{a.chunk}")
            yield from self._busy(key, "compute", w.fwd_s / w.layers, f"{label} layer {j}")

    # ------------------------------------------------------------ the step's tail
    def _finish_step(self, key: RankKey, pi: int, s: int):
        if self.mode == "none" or (self.mode == "layerwise" and self.last):
            yield from super()._finish_step(key, pi, s)
            return
        if self.mode == "layerwise":
            yield from self._wait_reduced(key, self.reducer, s)
            self.side.append(self.env.process(self._update_layers(pi, s)))
            self.acct.finished(key)
            return
        # delayed
        applied = False
        if self.prev_reducer is not None:
            yield from self._wait_reduced(key, self.prev_reducer, s)
            yield from self._busy(key, "compute", self.prog.pipelines[pi].optimizer_s[s], "optimizer (previous step's gradients)")
            applied = True
        if self.last:
            yield from self._wait_reduced(key, self.reducer, s)
            yield from self._busy(key, "compute", self.prog.pipelines[pi].optimizer_s[s], "optimizer")
            applied = True
        if applied and self.plan.zero in (1, 2) and self.plan.dp > 1:
            t0 = self.env.now
            yield self.reducer.optimizer_done(pi, s)
            self.acct.seg(key, "compute", "dp", t0, self.env.now, "param all-gather")
        self.acct.finished(key)

    def _wait_reduced(self, key: RankKey, reducer, s: int):
        """Wait for ``reducer``'s reduction of stage ``s``: time before its first bucket
        started (slower replicas) is idle, the rest exposed DP communication."""
        t0 = self.env.now
        reduced = reducer.stage_reduced(s)
        if not reduced.triggered:
            yield reduced
        first = reducer.first_start(s, self.env.now)
        split = min(max(first, t0), self.env.now)
        self.acct.seg(key, "compute", "idle", t0, split, "wait replicas")
        self.acct.seg(key, "compute", "dp", split, self.env.now, "grad reduce")

    def _update_layers(self, pi: int, s: int):
        """Side stream: the optimizer update of each layer in forward order, then (ZeRO-1/2)
        that layer's all-gather once every class has updated it."""
        pipe = self.prog.pipelines[pi]
        layers = [(c, j) for c in range(self.v) for j in range(pipe.chunks[(s, c)].layers)]
        per_layer = pipe.optimizer_s[s] / max(1, len(layers))
        zero = self.plan.zero in (1, 2) and self.plan.dp > 1
        for c, j in layers:
            yield self.env.timeout(per_layer)
            if self.updates.updated((s, c, j)):
                if zero:
                    # The gathers of one stage run one after another on its DP stream.
                    w = pipe.chunks[(s, c)]
                    nbytes = w.params / w.layers * BYTES[self.plan.precision]
                    self._gather_tail[s] = self.env.process(
                        self._gather_layer(self._gather_tail.get(s), s, c, j, nbytes))
                else:
                    self.updates.event((s, c, j)).succeed()

    def _gather_layer(self, prev: simpy.Process | None, s: int, c: int, j: int, nbytes: float):
        if prev is not None and not prev.triggered:
            yield prev
        yield self.reducer.param_gather(s, nbytes, f"param all-gather layer {j} c{c}")
        self.updates.event((s, c, j)).succeed()
