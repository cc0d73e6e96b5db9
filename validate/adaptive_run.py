"""Real runs with a slow rank and the adaptive controller (costmodel/rebalance.py) in the loop.

Two modes, both on real torch.distributed processes (gloo on this host):

- ``dp``: data parallelism over ``world`` ranks, each holding the whole tiny model. The
  unit is a microbatch of ``mbs`` samples; rank r takes the next ``units[r]`` microbatches
  of the global batch. Every step each rank measures its busy time (forward, backward and
  the slow rank's extra work, validate/slowdown.py), the ranks all-gather those times, and
  every rank feeds them to its own Rebalancer: the same inputs in the same order give the
  same decision on every rank, so no broadcast is needed. The next step uses the new
  shares. Gradients stay exact: each microbatch's mean loss is scaled by mbs/global_batch,
  so the summed all-reduce is the gradient of the global mean loss whatever the shares
  (sum of per-sample loss gradients / global batch), as the single-process reference.
- ``pp``: a ``world``-stage pipeline (1F1B, validate/pp.py), units = layers per stage. When
  the controller acts, the layers that change stage move for real after the optimizer
  step: weights and Adam moments over send/recv (validate/migrate.py); each rank rebuilds
  its chunk and reducer, and training continues bit-for-bit as the unmoved model would.

Step time is the slowest rank's wall time from the barrier that starts the step to the
end of its optimizer step, as validate/runner.py measures it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.rebalance import Rebalancer, balance
from validate.backend import pick_backend
from validate.launch import launch, local_rank
from validate.slowdown import SLOW_MODES

MODES = ("dp", "pp")


@dataclass(frozen=True)
class AdaptiveConfig:
    mode: str = "dp"  # 'dp': units = microbatches per replica; 'pp': units = layers per stage
    world: int = 2
    steps: int = 12  # measured steps
    warmup: int = 2  # unmeasured steps first, at the initial allocation, not observed
    seed: int = 0
    slow_rank: int | None = None
    speed: float = 1.0  # the slow rank's speed, 0 < speed <= 1 (validate/slowdown.py)
    slow_by: str | None = None  # 'quota' (pause; dp only, its default) or 'work' (extra passes; pp's)
    adaptive: bool = True  # False: keep the initial (equal) allocation
    mbs: int = 1  # dp: samples per microbatch (the unit); pp: samples per pipeline microbatch
    smoothing: float = 0.5  # Rebalancer EWMA weight of history
    min_gain_frac: float = 0.05  # Rebalancer hysteresis: timings here are noisy to several %
    horizon_steps: int = 10
    median_of: int = 3  # Rebalancer: median of the last 3 per-unit samples (one OS stall moves nothing)
    move_gbps: float = 1.0  # pp: link rate (GB/s) pricing a layer move; gloo over loopback does more
    backend: str | None = None
    capture: bool = False  # return the final weights (tests)

    @property
    def slow_mode(self) -> str:
        """How the slow rank is slowed (validate/slowdown.py): slow_by, or the mode's default."""
        return self.slow_by or ("quota" if self.mode == "dp" else "work")


@dataclass
class AdaptiveRecord:
    """One adaptive (or fixed) run: per measured step the slowest rank's time, every rank's
    busy time, the allocation used, the controller's decision; migrations; losses of every
    step (warm-up included)."""

    mode: str
    world: int
    slow_rank: int | None
    speed: float
    adaptive: bool
    mbs: int
    steps: int
    warmup: int
    step_times_s: list[float]
    busy_s: list[list[float]]
    units: list[list[int]]
    decisions: list[dict]
    migrations: list[dict]
    losses: list[float]
    weights: dict | None = None

    def settled_median_s(self, settle: int) -> float:
        """Median step time over the measured steps after the first ``settle``."""
        import statistics
        return float(statistics.median(self.step_times_s[min(settle, len(self.step_times_s) - 1):]))

    def to_dict(self) -> dict:
        from dataclasses import asdict
        d = asdict(self)
        d.pop("weights")
        return d


def _controller(units, cfg: AdaptiveConfig, model) -> Rebalancer:
    cost = 0.0
    if cfg.mode == "pp":
        # A layer move sends the weights and Adam's two moments, fp32 (validate/migrate.py).
        from validate.gpt import layer_params
        layer_bytes = 3 * 4 * sum(math.prod(ps.shape) for ps in layer_params(model, 0))
        cost = layer_bytes / (cfg.move_gbps * 1e9)
    return Rebalancer(units, min_units=1, horizon_steps=cfg.horizon_steps, smoothing=cfg.smoothing,
                      min_gain_frac=cfg.min_gain_frac, cost_per_unit_moved_s=cost,
                      contiguous=cfg.mode == "pp", median_of=cfg.median_of)


def _gather(values: list[float], world: int, device) -> list[list[float]]:
    import torch
    import torch.distributed as dist
    # On the worker's own device (backend.device_for): NCCL gathers device tensors only
    t = torch.tensor(values, dtype=torch.float64, device=device)
    parts = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    return [p.tolist() for p in parts]


def _step_log(cfg, step, units, rows, ctl, log) -> None:
    """After a step: keep its measurements (measured steps only) and let the controller
    observe them and decide. rows[r] = [busy_s, wall_s, loss]."""
    log["losses"].append(sum(r[2] for r in rows))
    if step < cfg.warmup:
        return
    log["step_times_s"].append(max(r[1] for r in rows))
    log["busy_s"].append([r[0] for r in rows])
    log["units"].append(list(units))
    if cfg.adaptive:
        ctl.observe([r[0] for r in rows])
        d = ctl.decide()
        log["decisions"].append({"step": step - cfg.warmup, "act": d.act, "units": list(d.units),
                                 "predicted_step_s": d.predicted_step_s, "current_step_s": d.current_step_s,
                                 "migration_cost_s": d.migration_cost_s, "reason": d.reason})


def _new_log() -> dict:
    return {"step_times_s": [], "busy_s": [], "units": [], "decisions": [], "migrations": [], "losses": []}


def _dp_steps(rank: int, world: int, model, cfg: AdaptiveConfig):
    """Generator: sets up, then runs one step per ``next``; returns the log."""
    import torch
    import torch.distributed as dist
    from sim.program import BUCKET_BYTES
    from validate.comm import Comm
    from validate.dp import GradReducer
    from validate.gpt import GPTChunk, batch_tokens, full_weights
    from validate.slowdown import quota_pause, slow_work
    from validate.timeline import Recorder

    torch.manual_seed(cfg.seed)
    be = pick_backend(cfg.backend)
    device = be.device_for(local_rank())
    rec = Recorder(cuda=be.kind == "cuda")
    comm = Comm("dp", list(range(world)), rank, rec, None)  # None: the default (world) group
    chunk = GPTChunk(model, list(range(model.num_layers)), True, True, full_weights(model, cfg.seed),
                     None, False, "none", device)
    reducer = GradReducer([(0, chunk.params)], comm, bucket_bytes=BUCKET_BYTES, overlap=False, zero=0,
                          topk=None, late=set())
    units = balance([1.0] * world, model.global_batch_size // cfg.mbs)
    ctl = _controller(units, cfg, model)
    speed = cfg.speed if rank == cfg.slow_rank else 1.0
    scale = cfg.mbs / model.global_batch_size
    log = _new_log()
    for step in range(cfg.warmup + cfg.steps):
        tokens = batch_tokens(model, step, cfg.seed).to(device)
        lo = sum(units[:rank]) * cfg.mbs
        mbs = [(tokens[lo + i * cfg.mbs: lo + (i + 1) * cfg.mbs, :-1],
                tokens[lo + i * cfg.mbs: lo + (i + 1) * cfg.mbs, 1:]) for i in range(units[rank])]
        dist.barrier()  # every rank starts the step together: step time = slowest rank's
        rec.begin_step()
        reducer.begin_step()
        loss = 0.0
        for x, y in mbs:
            if speed < 1.0 and cfg.slow_mode == "work":
                with rec.span("compute", "slowdown", "slowdown"):
                    slow_work(chunk, x, y, scale, speed)
            with rec.span("compute", "forward", "forward"):
                out = chunk.forward(x, y, scale)
            with rec.span("compute", "backward", "backward"):
                out.backward()
            loss += float(out.detach())
        if speed < 1.0 and cfg.slow_mode == "quota":
            with rec.span("compute", "slowdown", "slowdown"):
                quota_pause(rec.now() - rec.t0, speed)
        busy = rec.now() - rec.t0
        reducer.finish()
        reducer.step(step + 1)
        wall = rec.end_step()["wall_s"]
        _step_log(cfg, step, units, _gather([busy, wall, loss], world, device), ctl, log)
        units = ctl.units
        yield
    if cfg.capture:
        log["weights"] = {n: p.detach().cpu().numpy().copy() for n, p in chunk.params.items()}
    return log


def _pp_steps(rank: int, world: int, model, cfg: AdaptiveConfig):
    """Generator: sets up, then runs one step per ``next`` (moving layers after it when
    the controller acts); returns the log."""
    import torch
    import torch.distributed as dist
    from sim.program import BUCKET_BYTES
    from specs.plan import resolve_plan
    from validate.dp import GradReducer
    from validate.gpt import GPTChunk, batch_tokens, full_weights
    from validate.migrate import load_reducer_state, move_layers, reducer_state
    from validate.pp import PipelineStage
    from validate.runner import _groups, vstage_layers
    from validate.slowdown import SlowChunk
    from validate.timeline import Recorder

    torch.manual_seed(cfg.seed)
    be = pick_backend(cfg.backend)
    device = be.device_for(local_rank())
    rec = Recorder(cuda=be.kind == "cuda")
    g = model.global_batch_size
    m = g // cfg.mbs

    def plan_for(layers):
        return resolve_plan({"pp": world, "mbs": cfg.mbs, "schedule": "1f1b", "layers": list(layers)},
                            model, world)

    units = balance([1.0] * world, model.num_layers)
    plan = plan_for(units)
    _, dp_comm, emb_comm, _ = _groups(plan, rank, rec, model.tie_embeddings)  # groups do not depend on the layer split
    late = {"wte"} if emb_comm is not None else set()
    speed = cfg.speed if rank == cfg.slow_rank else 1.0
    s = rank  # tp = dp = 1: the rank is the stage

    def build(plan, state, with_adam: bool):
        chunk = GPTChunk(model, vstage_layers(plan)[s], s == 0, s == world - 1, {n: t[0] for n, t in state.items()},
                         None, False, "none", device)
        reducer = GradReducer([(0, chunk.params)], dp_comm, bucket_bytes=BUCKET_BYTES, overlap=False, zero=0,
                              topk=None, late=late)
        if with_adam:
            load_reducer_state(reducer, state)
        runs = SlowChunk(chunk, speed) if speed < 1.0 else chunk
        stage = PipelineStage(s, world, 1, {0: runs}, lambda st: plan.rank(0, st, 0),
                              (cfg.mbs, model.seq_length, model.hidden_size), rec, reducer, device)
        return chunk, reducer, stage

    chunk, reducer, stage = build(plan, {n: (w,) for n, w in full_weights(model, cfg.seed).items()}, False)
    ctl = _controller(units, cfg, model)
    log = _new_log()
    for step in range(cfg.warmup + cfg.steps):
        tokens = batch_tokens(model, step, cfg.seed).to(device)
        mbs = [(tokens[i * cfg.mbs:(i + 1) * cfg.mbs, :-1], tokens[i * cfg.mbs:(i + 1) * cfg.mbs, 1:])
               for i in range(m)]
        dist.barrier()
        rec.begin_step()
        reducer.begin_step()
        loss = stage.run(stage.actions("1f1b", m), mbs, cfg.mbs / g)
        if emb_comm is not None:  # tied embedding: first-stage and last-stage parts
            emb_comm.all_reduce(reducer.grad_view("wte").reshape(-1), "embedding grads")
        reducer.mark_late_ready()
        reducer.finish()
        reducer.step(step + 1)
        meas = rec.end_step()
        busy = sum(meas["detail_s"].get(k, 0.0) for k in ("forward", "backward"))
        _step_log(cfg, step, units, _gather([busy, meas["wall_s"], loss], world, device), ctl, log)
        if ctl.units != tuple(units):  # the controller acted: move the layers now
            t0 = rec.now()
            state, sent = move_layers(model, reducer_state(reducer), units, ctl.units, s,
                                      lambda st: plan.rank(0, st, 0))
            plan = plan_for(ctl.units)
            chunk, reducer, stage = build(plan, state, True)
            moved = _gather([rec.now() - t0, float(sent)], world, device)
            log["migrations"].append({"step": step - cfg.warmup, "from": list(units), "to": list(ctl.units),
                                      "seconds": max(r[0] for r in moved), "bytes": sum(r[1] for r in moved)})
            units = ctl.units
        yield
    if cfg.capture:
        log["weights"] = {n: p.detach().cpu().numpy().copy() for n, p in chunk.params.items()}
    return log


def own_session() -> None:
    """Put this worker in a session of its own, hence (Linux with autogroup scheduling,
    /proc/sys/kernel/sched_autogroup_enabled = 1) in a scheduler group of its own. The
    kernel shares the CPU fairly between sessions, then between a session's processes:
    on a busy host the ranks of one session would share one session's slice, a rank's
    pause would hand its sibling the whole slice, and the run would measure the ranks'
    summed work rather than parallel devices. Its own session makes each rank compete like
    a separate program. No effect on a host with a free core per rank."""
    import os
    try:
        os.setsid()
    except OSError:  # already a session leader (e.g. started by torchrun in its own session)
        pass


def _worker_many(rank: int, world: int, model, cfgs: list[AdaptiveConfig], interleave: bool) -> list[dict]:
    """Every config's steps; interleaved: step i of every run, then step i + 1 (the same
    order on every rank, so their collectives pair up)."""
    own_session()
    runs = [(_dp_steps if c.mode == "dp" else _pp_steps)(rank, world, model, c) for c in cfgs]
    logs: list = [None] * len(runs)
    live = list(range(len(runs)))
    while live:
        for i in list(live) if interleave else live[:1]:
            try:
                next(runs[i])
            except StopIteration as done:
                logs[i] = done.value
                live.remove(i)
    return logs


def run_adaptive_many(model, cfgs: list[AdaptiveConfig], *, timeout_s: float = 600.0,
                      interleave: bool = True) -> list[AdaptiveRecord]:
    """Run the configs in one set of ``world`` processes, by default step by step in turn
    (step i of each, then step i + 1): the runs share the processes and, step for step,
    the host's load, so ratios between them hold on a busy host too."""
    from validate.microbench import worker_threads_env
    check_configs(model, cfgs)
    world = cfgs[0].world
    with worker_threads_env(world):  # the intra-op threads calibration measured with
        per_rank = launch(_worker_many, world, (model, cfgs, interleave), timeout_s=timeout_s, backend=cfgs[0].backend)
    out = []
    for i, cfg in enumerate(cfgs):
        logs = [r[i] for r in per_rank]
        log = logs[0]
        weights = None
        if cfg.capture:
            weights = {}
            for w in logs:
                weights.update(w["weights"])
        out.append(AdaptiveRecord(mode=cfg.mode, world=world, slow_rank=cfg.slow_rank, speed=cfg.speed,
                                  adaptive=cfg.adaptive, mbs=cfg.mbs, steps=cfg.steps, warmup=cfg.warmup,
                                  step_times_s=log["step_times_s"], busy_s=log["busy_s"], units=log["units"],
                                  decisions=log["decisions"], migrations=log["migrations"],
                                  losses=log["losses"], weights=weights))
    return out


def check_configs(model, cfgs: list[AdaptiveConfig]) -> None:
    """What these runs cannot do is an input error before any process starts."""
    from costmodel.errors import InputError
    if not cfgs:
        raise ValueError("no runs given")
    if len({(c.world, c.backend) for c in cfgs}) != 1:
        raise ValueError("runs of one launch need one world size and backend")
    for c in cfgs:
        if c.mode not in MODES:
            raise InputError("--mode", None, f"{c.mode!r}: allowed {', '.join(MODES)}")
        if c.steps < 1 or c.warmup < 0:
            raise InputError("--steps", None, f"need steps >= 1 and warmup >= 0 (got {c.steps}, {c.warmup})")
        if c.world < 2:
            raise InputError("--world", None, f"needs at least 2 processes (got {c.world})")
        if c.slow_mode not in SLOW_MODES or (c.mode == "pp" and c.slow_mode != "work"):
            allowed = "work" if c.mode == "pp" else ", ".join(SLOW_MODES)
            raise InputError("--slow-by", None, f"{c.slow_mode!r}: allowed for {c.mode}: {allowed}")
        if c.slow_rank is not None and not (0 <= c.slow_rank < c.world):
            raise InputError("--slow-rank", None, f"rank {c.slow_rank} is outside the run's {c.world} processes")
        if model.global_batch_size % c.mbs:
            raise InputError("--mbs", None, f"{c.mbs} must divide global_batch_size={model.global_batch_size}")
        units = model.global_batch_size // c.mbs if c.mode == "dp" else model.num_layers
        if units < c.world:
            raise InputError("--world", None, f"{c.world} ranks need at least one unit each; {c.mode} has {units}")
        if c.mode == "pp" and model.global_batch_size // c.mbs < c.world:
            raise InputError("--mbs", None, f"a {c.world}-stage pipeline needs >= {c.world} microbatches")
        # The backend the workers will pick (validate/backend.pick_backend: the config's, else
        # $PLANSIM_BACKEND, else nccl where CUDA is). Moving layers between stages
        # (validate/migrate.py) receives into host buffers, which NCCL cannot fill.
        if c.mode == "pp" and (c.backend or pick_backend(None).name) == "nccl":
            raise InputError("--mode", "pp", "adaptive pipeline runs move layers through host buffers, "
                             "which NCCL cannot fill: gloo only for now; set PLANSIM_BACKEND=gloo")
