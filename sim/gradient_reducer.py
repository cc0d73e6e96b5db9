"""The data-parallel side of one engine run: gradient buckets reduced as backward
produces them, ZeRO's reduce-scatters and all-gathers, and top-k compressed exchange.

One DP stream per pipeline stage reduces that stage's buckets in the order they become
ready on every simulated replica class, over the dp*cp ranks that hold the same weights
(plan.grad_group); it stands for every DP group of the stage (TP
index t > 0 sends alongside as unsimulated replicas). The pipeline executor reports
ready buckets (bucket_ready), waits for a stage's reduction (stage_reduced), and starts
ZeRO-3's per-microbatch gathers and reduce-scatters and ZeRO-1/2's parameter gather.
"""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import simpy

from costmodel import efficiency as ce
from costmodel.errors import InputError
from costmodel.estimate import closing_straggler_s
from sim import collective_flows as cf
from sim.accountant import RankKey, StepAccountant
from sim.calls import EnginePart
from sim.flownet import FlowNetwork
from costmodel.dtypes import grad_reduce_bytes, param_gather_bytes, topk_entry_bytes
from sim.program import ChunkWork, Program


class BucketId(NamedTuple):
    """Gradient bucket ``bucket`` of model chunk ``chunk`` on pipeline stage ``stage``."""

    stage: int
    chunk: int
    bucket: int


class GradientReducer(EnginePart):
    def __init__(self, env: simpy.Environment, net: FlowNetwork, program: Program, accountant: StepAccountant,
                 symmetric: bool = True):
        super().__init__(env, net, program, accountant)
        p = self.plan.pp
        self.n_classes = len(program.pipelines)
        if self.plan.zero == 3 and self.n_classes > 1:
            raise InputError("--plan", "zero", "zero=3 is simulated only when all data-parallel replicas "
                             "are identical (one GPU type per stage and equal mb_shares)")
        self._queue = [simpy.Store(env) for _ in range(p)]      # ready (chunk, bucket) per stage
        self._ready_count: dict[BucketId, int] = defaultdict(int)  # classes that have the bucket
        self._done = [env.event() for _ in range(p)]            # stage's reduction finished
        self._started: dict[int, float] = {}                    # stage -> first bucket's start
        self._gathered = [env.event() for _ in range(p)]        # ZeRO-1/2 parameter gather done
        self._optimized = [0] * p                               # classes past the optimizer
        self._early_gather: dict[tuple[int, int, int], simpy.Process] = {}  # overlapped param gather
        self._call_s: dict[tuple[int, str], float] = {}  # (stage, op) -> one call's software cost
        groups = self._groups = [self.plan.grad_group(s, 0) for s in range(p)]
        self._phase_cache: dict[tuple[int, float, str], list[cf.Phase]] = {}
        # The DP groups of TP indices 1..tp-1 per stage, built once (tuples: run_phases
        # takes them as they are): TP index t's group is index 0's shifted by t times the
        # TP stride (Plan.rank_strides: rank() is affine), thousands of ranks at 16k GPUs.
        st = self.plan.rank_strides()[2]
        self._replicas = [tuple(tuple(map((st * t).__add__, g)) for t in range(1, self.plan.tp)) for g in groups]
        # A stage's DP collectives run as representative flows (sim/symmetric_collective.py)
        # when its replicas are identical and on one GPU type; otherwise flow by flow.
        devices = self.cluster.devices
        self._symmetric = [symmetric and self.n_classes == 1 and len({devices[r].gpu.name for r in g}) == 1
                           for g in groups]

    # ------------------------------------------------------------ the executor's side
    def bucket_elements(self, stage: int, chunk: int) -> float:
        w = self.prog.pipelines[0].chunks[(stage, chunk)]
        return w.params / len(w.grad_buckets)

    def compress_time_s(self, key: RankKey, stage: int, chunk: int) -> float:
        """Top-k selection of one bucket on ``key``'s GPU (error-feedback residual added,
        top k selected): GPU kernels that run on the compute stream."""
        gpu = self.cluster.devices[self.prog.pipelines[key[0]].ranks[key[1]]].gpu
        elems = self.bucket_elements(stage, chunk)
        return ce.topk_compress_time_s(elems, gpu, self.prog.profile.gpu(gpu.name), self.plan.grad_degree,
                                       max(1.0, self.plan.topk_fraction * elems))

    def bucket_ready(self, stage: int, chunk: int, j: int) -> None:
        """One simulated class has bucket j of (stage, chunk); the DP stream may reduce it
        once every class has it."""
        k = BucketId(stage, chunk, j)
        self._ready_count[k] += 1
        if self._ready_count[k] == self.n_classes:
            self._queue[stage].put((chunk, j))

    def stage_reduced(self, stage: int) -> simpy.Event:
        """Succeeds when every gradient bucket of ``stage`` is reduced."""
        return self._done[stage]

    def first_start(self, stage: int, default: float) -> float:
        """When ``stage``'s first bucket reduction started (``default`` if none did)."""
        return self._started.get(stage, default)

    def optimizer_done(self, pi: int, stage: int) -> simpy.Event:
        """Class ``pi`` has updated its shard of ``stage`` (ZeRO-1/2); once every class
        has, the updated weights are all-gathered. Returns the gather's end."""
        self._optimized[stage] += 1
        if self._optimized[stage] == self.n_classes:
            self.env.process(self._param_gather(stage))
        return self._gathered[stage]

    def param_gather_bucket(self, stage: int, chunk: int, j: int) -> simpy.Process:
        """Overlapped parameter gather (Program.overlap_param_gather): the all-gather of
        bucket ``j`` of model chunk ``chunk``'s updated weights, started by the first
        replica class that asks (every class needs the same gather). Megatron-Core
        dispatches bucket 0 before the forward and bucket j+1 when the forward reaches
        bucket j (megatron/core/optimizer/distrib_optimizer.py, _make_forward_pre_hook and
        _finish_param_sync_helper), so the caller asks for j+1 as it starts bucket j."""
        key = (stage, chunk, j)
        got = self._early_gather.get(key)
        if got is None:
            w = self.prog.pipelines[0].chunks[(stage, chunk)]
            k = max(1, len(w.grad_buckets))
            nbytes = w.params / k * param_gather_bytes(self.plan.precision, self.prog.profile.runtime)
            got = self._early_gather[key] = self._run(stage, self._phases(stage, nbytes, "all_gather"),
                                                      f"param all-gather c{chunk}b{j}", "all_gather")
        return got

    def param_gather(self, stage: int, nbytes: float, label: str) -> simpy.Process:
        """All-gather ``nbytes`` of updated weights over ``stage``'s DP groups (one
        call; the multi-step engine's layer-by-layer gathers use it)."""
        return self._run(stage, self._phases(stage, nbytes, "all_gather"), label, "all_gather")

    def zero3_gather_layer(self, stage: int, w: ChunkWork, fraction: float, label: str) -> simpy.Process:
        """ZeRO-3 / FSDP: all-gather ``fraction`` of chunk ``w``'s weights (one layer)."""
        nbytes = w.params * fraction * param_gather_bytes(self.plan.precision, self.prog.profile.runtime)
        return self._busy_call(stage, self._phases(stage, nbytes, "all_gather"), label, "all_gather")

    def zero3_reduce_scatter(self, stage: int, w: ChunkWork, fraction: float = 1.0) -> simpy.Process:
        """ZeRO-3: reduce-scatter one microbatch's gradients of ``fraction`` of chunk ``w``."""
        nbytes = w.params * fraction * grad_reduce_bytes(self.plan.precision, self.prog.profile.runtime)
        return self._busy_call(stage, self._phases(stage, nbytes, "reduce_scatter"), "zero3 reduce-scatter",
                               "reduce_scatter")

    def _busy_call(self, s: int, phases: list[cf.Phase], label: str, op: str) -> simpy.Process:
        """A ZeRO-3 collective that counts as DP busy time while it runs, so the compute it
        overlaps is slowed by the fabric's compute_slowdown as the gradient buckets' is."""
        def proc():
            t0 = self.acct.dp_started(s)
            yield self._run(s, phases, label, op)
            self.acct.dp_finished(s, t0)
        return self.env.process(proc())

    # ------------------------------------------------------------ the DP stream
    def dp_stream(self, s: int):
        """Reduce each gradient bucket of stage `s` as soon as every replica has it."""
        pipe = self.prog.pipelines[0]
        total = sum(len(pipe.chunks[(s, c)].grad_buckets) for c in range(self.plan.vpp))
        if self.plan.zero == 3:
            total = 0  # ZeRO-3 reduce-scatters per microbatch instead (zero3_reduce_scatter)
        frac = self.plan.topk_fraction
        gpu = self.cluster.devices[pipe.ranks[s]].gpu
        eff = self.prog.profile.gpu(gpu.name)
        dpn = self.plan.grad_degree
        entry = topk_entry_bytes(self.plan.precision, self.prog.profile.runtime)  # top-k bytes per kept entry
        # The replicas' drift over the backward (runtime.straggler_us): the last bucket's
        # reduction waits for the replica that finished last.
        straggle = closing_straggler_s(self.prog.profile.runtime.straggler_us, dpn, self.plan.zero)
        for i in range(total):
            chunk, j = yield self._queue[s].get()
            if i == 0:
                self._started[s] = self.env.now
            nbytes = pipe.chunks[(s, chunk)].grad_buckets[j]
            t0 = self.acct.dp_started(s)
            if i == total - 1 and straggle > 0:  # the reduction that closes the backward
                yield self.env.timeout(straggle)
            if frac is not None:
                elems = self.bucket_elements(s, chunk)
                nnz = max(1.0, frac * elems)
                yield self._run(s, cf.sparse_allgather(self.plan.grad_group(s, 0), nnz, entry),
                                f"topk c{chunk}b{j}", "all_gather")
                yield self.env.timeout(ce.topk_decompress_time_s(elems, dpn * nnz, entry, gpu, eff))
            else:
                reduce_all = self.plan.zero == 0 or self.prog.zero_grad_all_reduce
                op = "all_reduce" if reduce_all else "reduce_scatter"
                yield self._run(s, self._phases(s, nbytes, op), f"{op} c{chunk}b{j}", op)
            self.acct.dp_finished(s, t0)
            if self.acct.record:
                for pi in range(self.n_classes):
                    self.acct.seg(RankKey(pi, s), "dp", "collective", t0, self.env.now, f"grad c{chunk}b{j}")
        self._done[s].succeed()

    def _param_gather(self, s: int):
        pipe = self.prog.pipelines[0]
        params = sum(pipe.chunks[(s, c)].params for c in range(self.plan.vpp))
        nbytes = params * param_gather_bytes(self.plan.precision, self.prog.profile.runtime)
        t0 = self.env.now
        yield self._run(s, self._phases(s, nbytes, "all_gather"), "param all-gather", "all_gather")
        if self.acct.record:
            for q in range(self.n_classes):
                self.acct.seg(RankKey(q, s), "dp", "collective", t0, self.env.now, "param all-gather")
        self._gathered[s].succeed()

    # ------------------------------------------------------------ collectives
    def _phases(self, s: int, nbytes: float, op: str) -> list[cf.Phase]:
        """The phases of one DP collective of stage s; built once per (stage, bytes, op):
        gradient buckets repeat a few sizes, and phases are immutable."""
        key = (s, nbytes, op)
        phases = self._phase_cache.get(key)
        if phases is None:
            phases = self._phase_cache[key] = self._build_phases(s, nbytes, op)
        return phases

    def _build_phases(self, s: int, nbytes: float, op: str) -> list[cf.Phase]:
        group = self.plan.grad_group(s, 0)
        algo = self.prog.dp_algorithm[s]
        if op == "all_reduce":
            return cf.build(algo, "all_reduce", group, nbytes, node_of=self.cluster.node_of)
        # Reduce-scatter and all-gather have ring and hierarchical forms (no tree); both
        # spread the inter-node traffic over every local member's NIC (a ring over several
        # members per node is priced hierarchically: collective_flows.several_per_node).
        return cf.build("hierarchical" if algo == "hierarchical" else "ring", op, group, nbytes,
                        node_of=self.cluster.node_of)

    def _run(self, s: int, phases: list[cf.Phase], label: str, op: str) -> simpy.Process:
        """One data-parallel collective ``op`` of stage s; the DP groups of TP indices
        1..tp-1 run the same call alongside (unsimulated replicas)."""
        call_s = self._call_s.get((s, op))
        if call_s is None:
            call_s = self._call_s[(s, op)] = (self.call_latency_s(self._groups[s], op)
                                              if self.plan.grad_degree > 1 else 0.0)
        return self.call(phases, self._replicas[s], label, call_s, self._symmetric[s])
