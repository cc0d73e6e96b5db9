"""Calibration from microbenchmarks: fit a hardware profile to validate/microbench.py's
measurements, with the cost model's own formulas as the model (costmodel/efficiency.py
for ops, costmodel/collectives.py for collectives), so a fitted parameter means exactly
what the simulator does with it.

Parameters and what fixes each (few, global, physical):
- ``kernel_overhead_us``: the per-op cost of a plain (no autograd) tiny op, measured
  directly (microbench (c), 'plain' chain); every op the cost model lists pays it.
- ``host_overhead_us``: what training adds per op on top (autograd recording in forward,
  the backward engine), from the 'train' chain per cost-model op, less the chain's
  microbatches' share where measured (next), minus the plain cost. On a CPU the device is
  the issuing thread, so ``launch_blocking`` is true: host and device time add
  (costmodel.efficiency.ops_time_s).
- ``microbatch_host_us``: what each microbatch of a chunk costs besides its ops, solved
  from the 'train' chain timed at two shapes of different ops a microbatch
  (validate/host_draws.microbatch_host_fit).
- ``hbm_eff``, ``vector_flops_eff``, ``cache_bw_eff``, ``cache_mib``: least squares over the
  element-wise sweep (add, GELU, layer norm, softmax, 4 Ki to 1 Mi elements),
  t = max(bytes/(bw x share), flops/(peak x vector_flops_eff)) + kernel overhead, the
  share cache_bw_eff up to cache_mib MiB of traffic and hbm_eff beyond, with the FLOPs the
  cost model counts for each op (fit_memory).
- ``gemm_eff_max``, ``gemm_k_half``, ``gemm_dim_half``: least squares over the GEMM shapes
  (the model's TP-sliced ones and a sweep), t = op_time_s(gemm) (roofline + overhead).
- ``bw_eff``, ``hop_latency_us`` of the topology's intra-node link class: least squares
  over all-reduce, all-gather, reduce-scatter and send/recv at every size, back to back,
  with the topology's bandwidth and costmodel/collectives.py's ring formulas, each
  collective with its own call cost beside them (so that one collective's extra cost,
  gloo's small all-reduce, does not inflate every collective's per-step latency).
- ``<op>_call_us`` for each of those four collectives, and ``call_latency_us`` (the
  generic figure, for any other collective: their median): then, with bw_eff and
  hop_latency_us fixed, least squares over each collective's own calls issued in a stream
  of (about 1 ms of the runner's layer code, call) rounds on every rank, as a plan issues them
  (validate/contention_bench.after_compute_rows: the mean cost a call adds to a round).

Residuals are relative (log of predicted / measured), so small and large sizes weigh the
same. Efficiencies are fractions of the GPU catalog's peaks (costmodel/gpus.py); for the
CPU entry those are ceilings, and the measured peaks are written into ``source``.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from costmodel import collectives as cc
from costmodel.dtypes import DTYPE_BYTES
from costmodel.errors import InputError
from costmodel.efficiency import causal_fraction, op_time_s, topk_compress_time_s
from costmodel.flops import ELEMENTWISE_FLOPS_PER_ELEM, Op
from costmodel.gpus import GpuSpec
from costmodel.profile import COLLECTIVE_OPS, EFF_MIN, MEMORY_MODELS, FabricEfficiency, GpuEfficiency
from validate.collective_bench import AFTER_COMPUTE_SUFFIX, CollectiveSample
from validate.bench_record import AttentionSample, GemmSample, MemorySample, MicrobenchResult, TopkSample

FIT_PRECISION = "fp32"  # the microbenchmarks run fp32 tensors
FITTED_COLLECTIVES = COLLECTIVE_OPS  # the collectives a fabric has its own call cost for


@dataclass
class FitResult:
    gpu: GpuEfficiency
    fabric: FabricEfficiency | None
    host_overhead_us: float
    residuals: dict[str, list[tuple[str, float, float]]] = field(default_factory=dict)  # family -> (label, measured s, predicted s)
    measured_peak_flops: float = 0.0
    measured_peak_Bps: float = 0.0

    def rms_pct(self, family: str) -> float:
        rows = self.residuals.get(family, [])
        if not rows:
            return float("nan")
        return 100 * math.sqrt(sum((p / m - 1) ** 2 for _, m, p in rows) / len(rows))


def _gemm_op(g: GemmSample) -> Op:
    kind = "attention" if g.batch > 1 else "gemm"
    nbytes = float(DTYPE_BYTES[FIT_PRECISION]) * g.batch * (g.m * g.k + g.k * g.n + g.m * g.n)
    return Op("gemm", kind, g.flops, nbytes, g.m, g.n, g.k, g.batch)


def _mem_op(s: MemorySample) -> Op:
    # Its arithmetic as the cost model counts it for the same op in a layer (0 for an op the
    # cost model has no count for: traffic alone).
    return Op(s.op, "memory", float(ELEMENTWISE_FLOPS_PER_ELEM.get(s.op, 0) * s.elems), s.bytes)


# One fitted fused-attention efficiency at every shape (no GPU tile-occupancy falloff).
CPU_ATTENTION_SHAPE = {"attention_seq_half": 0.0, "attention_head_dim_half": 0.0}


def _attn_op(a: AttentionSample) -> Op:
    # The microbenchmark's kernel is causal (is_causal=True) and skips the tiles above the
    # diagonal as the simulator's fused attention op does (costmodel/efficiency.causal_fraction).
    return Op("flash_attention", "flash_attention", a.flops * causal_fraction(a.s), a.bytes, a.s, a.s, a.d, a.batch)


# soft_l1 with this scale: a robust loss, so that a few repeats disturbed by other
# processes on a shared host (residuals of a factor 2 and more) do not drag the fit.
_F_SCALE = 0.1


def _least_squares(fun, x0, lo, hi):
    from scipy.optimize import least_squares
    x0 = np.clip(np.asarray(x0, float), np.asarray(lo) + 1e-9, np.asarray(hi) - 1e-9)
    return least_squares(fun, x0, bounds=(lo, hi), method="trf", x_scale="jac", loss="soft_l1", f_scale=_F_SCALE).x


def _robust_cost(resid: list[float]) -> float:
    """The loss _least_squares minimises (scipy's soft_l1 at _F_SCALE), for comparing fits."""
    return sum(2.0 * (math.sqrt(1.0 + (r / _F_SCALE) ** 2) - 1.0) for r in resid)


def per_op_overheads(res: MicrobenchResult) -> tuple[float, float]:
    """(kernel_overhead_us, host_overhead_us) from the tiny-op chains (see module doc); the
    training chain's per-microbatch share, where measured, is not in the per-op figure
    (validate/microbench.train_per_op_s; RuntimeSettings.microbatch_host_us holds it).

    On a CPU an op runs in the thread that issues it (runtime.launch_blocking), and the
    cost model adds its device and host parts: the plain chain's per-op time is the
    device part, the training chain's excess over it (autograd's bookkeeping) the host's.
    On a CUDA device (res.device_kernel_s measured) the host queues kernels and the device
    runs them meanwhile, and the cost model takes the longer of the two
    (costmodel/efficiency.ops_time_s): the whole training chain's per-op time is then the
    host's, and the device's per-kernel part is what it measured itself. Split as on a CPU,
    the host's share under the max would be the autograd excess alone, and a plan of small
    ops, whose step is all host time, would be priced at the plain chain's cost an op."""
    from validate.microbench import train_per_op_s
    by = {o.what: o.per_op_s for o in res.overhead}
    plain = by.get("plain", 0.0) * 1e6
    train = train_per_op_s(res) * 1e6 if "train" in by else plain
    if res.device_kernel_s > 0:
        return res.device_kernel_s * 1e6, train
    return plain, max(0.0, train - plain)


def harness_key(sample) -> str:
    """The harness entry (MicrobenchResult.harness) of a compute sample's family."""
    if isinstance(sample, MemorySample):
        return f"memory:{sample.op}"
    if isinstance(sample, AttentionSample):
        return "attention"
    return "bmm" if sample.batch > 1 else "gemm"


def fit_time_s(op: Op, sample, gpu: GpuSpec, eff: GpuEfficiency, harness: dict | None) -> float:
    """What the cost model gives ``op`` as its microbenchmark ran: its work at ``eff``'s
    rates plus the timing harness's own per-call cost for the sample's family (measured
    with the smallest call, validate/microbench.py), not the runner's per-op cost
    (kernel_overhead_us, which includes the model code between a plan's ops). Fitting with
    the runner's larger figure made small ops look slow and pulled every rate up: measured
    here, the GEMM fit's RMS fell from 26 % to 5-8 % with the harness's 1-2 us, and the
    tiny model's GEMMs went from 3-14 % under their measured times to -8.5..+2 %.
    Records without harness entries keep kernel_overhead_us."""
    s = (harness or {}).get(harness_key(sample))
    if s is not None:
        eff = replace(eff, kernel_overhead_us=s * 1e6)
    return op_time_s(op, gpu, eff, FIT_PRECISION)


# The grid fit_memory starts from: efficiencies 10 points a decade from EFF_MIN to 1;
# vector_flops_eff 0 (traffic alone) and the same points.
_EFF_GRID = tuple(float(v) for v in np.logspace(math.log10(EFF_MIN), 0.0, 10 * int(round(-math.log10(EFF_MIN))) + 1))
_VECTOR_GRID = (0.0,) + _EFF_GRID


@dataclass(frozen=True)
class MemoryFit:
    """The element-wise fit's parameters (GpuEfficiency fields of the same names)."""
    hbm_eff: float
    vector_flops_eff: float = 0.0
    cache_bw_eff: float = 0.0
    cache_mib: float = 0.0


def fit_memory(samples: list[MemorySample], gpu: GpuSpec, base: GpuEfficiency,
               harness: dict | None = None, model: str = "bandwidth") -> MemoryFit:
    """The element-wise ops' rates with the per-call cost fixed (fit_time_s): each op takes
    the longer of its traffic and its arithmetic at vector_flops_eff
    (costmodel/efficiency.op_time_s), its traffic moving at cache_bw_eff where it is at
    most cache_mib MiB and at hbm_eff beyond. cache_mib is tried between every two
    consecutive sample sizes (and not at all: one bandwidth); for each, the rates are
    chosen on a grid by the fits' robust loss and refined by least squares, since max()
    leaves no gradient for a rate that binds no sample and a local fit may stop wherever it
    starts. Which term binds is the samples' to say: an add (1 FLOP per 12 B) is priced by
    its traffic where GELU (8 FLOPs per 8 B) may be priced by its arithmetic. The cache
    level is kept only where it is faster than beyond (cache_bw_eff > hbm_eff) and both
    sides hold samples of at least two sizes.

    ``model`` 'bandwidth' (the default) fits hbm_eff alone: one bandwidth for every op,
    traffic only. 'cache' fits all four. Over the saved runs of three host types the
    'cache' profiles predicted the plans 7-13 points faster than the 'bandwidth' ones, and
    met the validation target less often (docs/validation-cpu.md, mechanism 52), so it is
    not the default."""
    if model not in MEMORY_MODELS:
        raise ValueError(f"memory model {model!r}: allowed {', '.join(MEMORY_MODELS)}")
    cache_level = model == "cache"
    vectors = _VECTOR_GRID if cache_level else (0.0,)

    def resid_at(m: MemoryFit):
        eff = replace(base, **asdict(m))
        return [math.log(fit_time_s(_mem_op(s), s, gpu, eff, harness) / s.seconds) for s in samples]

    # Each sample's time is max(T / bw_eff, A / vector_flops_eff) + c, with T, A and c from
    # the cost model itself (traffic at bandwidth share 1, arithmetic at vector_flops_eff
    # 1, the fixed cost of an op with neither): the grid is evaluated in numpy.
    def at(op, vec):
        return np.array([fit_time_s(op(s), s, gpu, replace(base, hbm_eff=1.0, vector_flops_eff=vec,
                                                              cache_bw_eff=0.0), harness) for s in samples])
    fixed = at(lambda s: Op(s.op, "memory", 0.0, 0.0), 0.0)
    traffic = at(_mem_op, 0.0) - fixed
    arith = at(lambda s: replace(_mem_op(s), bytes=0.0), 1.0) - fixed
    measured = np.array([s.seconds for s in samples])
    nbytes = np.array([s.bytes for s in samples])
    eg = np.array(_EFF_GRID)
    vg = np.array(vectors)
    with np.errstate(divide="ignore"):
        a = np.where(vg[:, None] > 0, arith[None, :] / np.where(vg > 0, vg, 1.0)[:, None], 0.0)  # (vec, sample)

    def grid_cost(inside):
        """Best (cost, hbm, cache_bw, vec) with the samples ``inside`` the cache level."""
        bw_in = eg[:, None, None, None] if inside.any() else eg[:1, None, None, None]  # cache_bw (unused if none)
        bw = np.where(inside[None, None, None, :], bw_in, eg[None, :, None, None])
        r = np.log((np.maximum(traffic / bw, a[None, None, :, :]) + fixed) / measured) / _F_SCALE
        cost = (2.0 * (np.sqrt(1.0 + r * r) - 1.0)).sum(axis=3)  # (cache_bw, hbm, vec)
        if inside.any():
            cost = np.where(eg[:, None, None] > eg[None, :, None], cost, np.inf)  # the cache is the faster
        i, j, k = np.unravel_index(int(np.argmin(cost)), cost.shape)  # first minimum: vec 0 on a tie
        return float(cost[i, j, k]), float(eg[j]), float(eg[i]) if inside.any() else 0.0, float(vg[k])

    sizes = sorted(set(nbytes.tolist()))
    candidates = [0.0] + [math.sqrt(lo * hi) for lo, hi in zip(sizes, sizes[1:])] if cache_level else [0.0]
    best = None
    for c in candidates:
        inside = nbytes <= c
        if c > 0 and (len(set(nbytes[inside].tolist())) < 2 or len(set(nbytes[~inside].tolist())) < 2):
            continue
        cost, hbm, cbw, vec = grid_cost(inside)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, MemoryFit(hbm, vec, cbw, c / 2**20 if c > 0 else 0.0))
    m = best[1]
    free = ["hbm_eff"] + (["vector_flops_eff"] if m.vector_flops_eff > 0 else []) + (["cache_bw_eff"] if m.cache_mib > 0 else [])
    x = _least_squares(lambda x: resid_at(replace(m, **dict(zip(free, x)))), [getattr(m, f) for f in free],
                       [EFF_MIN] * len(free), [1.0] * len(free))
    refined = replace(m, **{f: float(v) for f, v in zip(free, x)})
    if (refined.cache_mib == 0 or refined.cache_bw_eff > refined.hbm_eff) and \
            _robust_cost(resid_at(refined)) <= _robust_cost(resid_at(m)):
        m = refined
    return m


def fit_attention(samples: list[AttentionSample], gpu: GpuSpec, base: GpuEfficiency,
                  harness: dict | None = None) -> float:
    """attention_eff (fused attention's fraction of peak) with the per-call cost fixed."""
    def resid(x):
        eff = replace(base, attention_eff=x[0], **CPU_ATTENTION_SHAPE)
        return [math.log(fit_time_s(_attn_op(a), a, gpu, eff, harness) / a.seconds) for a in samples]
    return float(_least_squares(resid, [0.1], [EFF_MIN], [1.0])[0])


def topk_kept(t: TopkSample) -> int:
    """Entries a selection of ``t`` keeps (validate/topk.TopKCompressor.kept)."""
    return max(1, math.ceil(t.fraction * t.elems))


def fit_topk(samples: list[TopkSample], gpu: GpuSpec, base: GpuEfficiency) -> tuple[float, float]:
    """(topk_select_ns_per_elem, topk_select_ns_per_kept): the selection's compute per
    element and per kept entry on top of the memory traffic and kernel overhead the cost
    model already counts (hbm_eff, overhead fixed). The samples' kept fractions (1, 10,
    30 %) tell the two apart; with one fraction only the per-element cost is fitted."""
    two = len({t.fraction for t in samples}) > 1

    def resid(x):
        eff = replace(base, topk_select_ns_per_elem=x[0], topk_select_ns_per_kept=x[1] if two else 0.0)
        return [math.log(topk_compress_time_s(t.elems, gpu, eff, kept=topk_kept(t)) / t.seconds) for t in samples]
    x = _least_squares(resid, [1.0, 1.0], [0.0, 0.0], [1e4, 1e5])
    return float(x[0]), float(x[1]) if two else 0.0


def topk_cv(samples: list[TopkSample]) -> float:
    """topk_select_cv: the median over bucket sizes of the selections' coefficient of
    variation (each size's error-feedback stream, every rank pooled)."""
    return float(statistics.median(t.cv for t in samples))


def fit_gemm(samples: list[GemmSample], gpu: GpuSpec, base: GpuEfficiency,
             harness: dict | None = None) -> tuple[float, float, float]:
    """(gemm_eff_max, gemm_k_half, gemm_dim_half) with hbm_eff and the per-call cost fixed
    (fit_time_s). Without sm_count the cost model uses the saturating m, n, k factors."""
    def resid(x):
        eff = replace(base, gemm_eff_max=x[0], gemm_k_half=x[1], gemm_dim_half=x[2], sm_count=0.0)
        return [math.log(fit_time_s(_gemm_op(g), g, gpu, eff, harness) / g.seconds) for g in samples]
    x = _least_squares(resid, [0.5, 32.0, 32.0], [EFF_MIN, 0.0, 0.0], [1.0, 8192.0, 8192.0])
    return float(x[0]), float(x[1]), float(x[2])


def collective_time_s(op: str, nbytes: float, n: int, bw_Bps: float, latency_s: float,
                      fab: FabricEfficiency) -> float:
    """Seconds the cost model gives one collective call on a single node's fabric of
    ``bw_Bps`` per rank and ``latency_s`` per hop, with the fabric's efficiency and call
    latency (as sim/program.py's TP collectives: ring formulas, plus the call). An op
    timed right after compute (AFTER_COMPUTE_SUFFIX) has the op's formula."""
    op = op.removesuffix(AFTER_COMPUTE_SUFFIX)
    bw = bw_Bps * fab.bw_eff
    call = fab.call_s(op, 2 if op == "send_recv" else n)  # a send pairs two ranks in any group
    latency_s = fab.hop_latency_s(latency_s)  # the fitted per-step latency replaces the topology's
    if op == "all_reduce":
        return cc.ring_allreduce_s(nbytes, n, bw, latency_s) + call
    if op == "all_gather":
        return cc.allgather_s(nbytes, n, bw, latency_s) + call
    if op == "reduce_scatter":
        return cc.reduce_scatter_s(nbytes, n, bw, latency_s) + call
    if op == "send_recv":
        return cc.p2p_s(nbytes, bw, latency_s) + call
    raise ValueError(f"no cost-model formula for {op}")


def _with_calls(fab: FabricEfficiency, calls_us) -> FabricEfficiency:
    """``fab`` with each FITTED_COLLECTIVES op's own call cost (us, in that order) and the
    generic call_latency_us set to their median (what any other collective pays)."""
    calls = {f"{op}_call_us": float(c) for op, c in zip(FITTED_COLLECTIVES, calls_us)}
    return replace(fab, call_latency_us=float(np.median(list(calls.values()))), **calls)


def _group_sizes(samples: list[CollectiveSample]) -> set[int]:
    """Group sizes of the samples' collectives (pipeline sends are pairs whatever the group)."""
    return {s.n for s in samples if s.op.removesuffix(AFTER_COMPUTE_SUFFIX) != "send_recv"}


def fit_collectives(samples: list[CollectiveSample], bw_Bps: float, latency_s: float,
                    base: FabricEfficiency) -> FabricEfficiency:
    """bw_eff, hop_latency_us, each collective's call cost and (with more than one group
    size) call_us_per_rank over every fitted collective, size and group size, back to
    back. The call cost is paid once per call, the hop latency once per ring step (1 for
    send/recv, n-1 for all-gather and reduce-scatter, 2(n-1) for all-reduce), the per-rank
    cost once per call per rank beyond two: the group sizes (every n dividing the world)
    and the collectives' different step counts tell them apart; with one group size they
    trade off, and only their sum, which the plans of that size pay, is fixed."""
    use = [s for s in samples if s.op in FITTED_COLLECTIVES]
    k = len(FITTED_COLLECTIVES)
    per_rank = len(_group_sizes(use)) > 1

    j = 3 if per_rank else 2  # first call cost in x: [bw_eff, hop_latency_us, (call_us_per_rank,) calls...]

    def fab_of(x):
        fab = replace(base, bw_eff=float(x[0]), hop_latency_us=float(x[1]))
        if per_rank:
            fab = replace(fab, call_us_per_rank=float(x[2]))
        return _with_calls(fab, x[j:])

    def resid(x):
        fab = fab_of(x)
        return [math.log(collective_time_s(s.op, s.nbytes, s.n, bw_Bps, latency_s, fab) / s.seconds) for s in use]
    extra = [0.0] if per_rank else []
    x = _least_squares(resid, [0.5, 50.0] + extra + [50.0] * k, [EFF_MIN, 0.0] + extra + [0.0] * k,
                       [1.0, 1e5] + [1e5] * len(extra) + [1e5] * k)
    return fab_of(x)


def fit_call_latency(samples: list[CollectiveSample], bw_Bps: float, latency_s: float,
                     fab: FabricEfficiency) -> FabricEfficiency:
    """Each collective's call cost from its calls timed in a stream of compute rounds
    (validate/contention_bench.after_compute_rows), bw_eff and hop_latency_us fixed from
    the back-to-back sweep: the per-call cost a plan's collectives pay, all of which are
    issued right after compute (thread wake-ups on busy cores included). Timed in more
    than one group size, the per-step latency and call_us_per_rank are fitted with them
    too (the calls of a bigger group wait for more members to be scheduled): the
    back-to-back sweep's split of the two moved from launch to launch with 4 processes on
    2 cores (per-step latency 499-940 us with the all-reduce's own call cost at 0, a
    2-rank tensor-parallel all-reduce predicted at 1.0-1.9 ms), while the calls after
    compute, averaged over launches, gave 296-459 us. A collective without such calls keeps
    its back-to-back figure."""
    ops = [op for op in FITTED_COLLECTIVES if any(s.op.removesuffix(AFTER_COMPUTE_SUFFIX) == op for s in samples)]
    per_rank = len(_group_sizes(samples)) > 1
    k = len(ops)

    def fab_of(x):
        f = replace(fab, **{f"{op}_call_us": float(v) for op, v in zip(ops, x)})
        if per_rank:  # the per-step latency as plans pay it, and the per-rank cost
            f = replace(f, hop_latency_us=float(x[k]), call_us_per_rank=float(x[k + 1]))
        return f

    def resid(x):
        f = fab_of(x)
        return [math.log(collective_time_s(s.op, s.nbytes, s.n, bw_Bps, latency_s, f) / s.seconds) for s in samples]
    x0 = [max(getattr(fab, f"{op}_call_us") or 0.0, 1.0) for op in ops] + (
        [max(fab.hop_latency_us or 0.0, 1.0), max(fab.call_us_per_rank, 1.0)] if per_rank else [])
    x = _least_squares(resid, x0, [0.0] * len(x0), [1e5] * len(x0))
    got = fab_of(x)
    return _with_calls(got, [getattr(got, f"{op}_call_us") or 0.0 for op in FITTED_COLLECTIVES])


def fit_profile(res: MicrobenchResult, gpu: GpuSpec, base_gpu: GpuEfficiency,
                link: tuple[float, float, str] | None, base_fabric: FabricEfficiency | None,
                memory_model: str = "bandwidth") -> FitResult:
    """Fit every parameter (module doc) in order: overheads, memory, GEMMs, collectives."""
    kern_us, host_us = per_op_overheads(res)
    eff = replace(base_gpu, kernel_overhead_us=kern_us, sm_count=0.0)
    h = res.harness
    if res.memory:
        eff = replace(eff, **asdict(fit_memory(res.memory, gpu, eff, h, memory_model)))
    if res.gemm:
        e_max, k_half, d_half = fit_gemm(res.gemm, gpu, eff, h)
        eff = replace(eff, gemm_eff_max=e_max, gemm_k_half=k_half, gemm_dim_half=d_half)
    if res.attention:
        eff = replace(eff, attention_eff=fit_attention(res.attention, gpu, eff, h), **CPU_ATTENTION_SHAPE)
    if res.topk:
        per_elem, per_kept = fit_topk(res.topk, gpu, eff)
        eff = replace(eff, topk_select_ns_per_elem=per_elem, topk_select_ns_per_kept=per_kept,
                      topk_select_cv=topk_cv(res.topk))
    out = FitResult(gpu=eff, fabric=None, host_overhead_us=host_us)
    out.residuals["gemm"] = [(f"{g.m}x{g.n}x{g.k}" + (f"x{g.batch}" if g.batch > 1 else ""), g.seconds,
                              fit_time_s(_gemm_op(g), g, gpu, eff, h)) for g in res.gemm]
    out.residuals["memory"] = [(f"{s.op} {s.elems}", s.seconds, fit_time_s(_mem_op(s), s, gpu, eff, h))
                               for s in res.memory]
    out.residuals["attention"] = [(f"sdpa {a.batch}x{a.s}x{a.d}", a.seconds, fit_time_s(_attn_op(a), a, gpu, eff, h))
                                  for a in res.attention]
    out.residuals["topk"] = [(f"topk {t.elems} x{t.fraction:g}", t.seconds,
                              topk_compress_time_s(t.elems, gpu, eff, kept=topk_kept(t)))
                             for t in res.topk]
    out.measured_peak_flops = max((g.flops / g.seconds for g in res.gemm), default=0.0)
    out.measured_peak_Bps = max((s.bytes / s.seconds for s in res.memory), default=0.0)
    if link is not None and res.collectives:
        bw, lat, _ = link
        fab = fit_collectives(res.collectives, bw, lat, base_fabric or FabricEfficiency())
        after = [c for c in res.collectives if c.op.endswith(AFTER_COMPUTE_SUFFIX)]
        if after:
            fab = fit_call_latency(after, bw, lat, fab)
            out.residuals["collectives after compute"] = [
                (f"{s.op} {s.nbytes}", s.seconds, collective_time_s(s.op, s.nbytes, s.n, bw, lat, fab))
                for s in after]
        out.fabric = fab
        out.residuals["collectives"] = [
            (f"{s.op} {s.nbytes}", s.seconds, collective_time_s(s.op, s.nbytes, s.n, bw, lat, fab))
            for s in res.collectives if s.op in FITTED_COLLECTIVES]
    return out


# ------------------------------------------------------------------------ the whole run
@dataclass
class Calibration:
    bench: MicrobenchResult
    fit: FitResult
    mapping: dict  # the profile file's content


def calibrate(cluster, model, world: int, *, tps: list[int] | None = None, repeats: int = 5,
              max_bytes: int = 64 * 1024 * 1024, max_gemm_dim: int = 1024, backend: str | None = None,
              progress=None, timeout_s: float = 600.0, compute_from: str | None = None,
              memory_model: str = "bandwidth", stage_scales: bool = False) -> Calibration:
    """Run the microbenchmarks in ``world`` processes on this host and fit the profile of
    the cluster's device type and intra-node link class. ``cluster`` must have ``world``
    devices on one node (load_topology(..., gpus_per_node=world)). Never runs a plan.
    ``compute_from``: a calibration record (.bench.json) whose compute samples to reuse
    (validate/microbench.reused_compute); checked before anything is measured.
    ``memory_model``: how element-wise ops are fitted (fit_memory). ``stage_scales``: write
    the stage scales (stage_scales; measured either way, kept in the record)."""
    from validate.backend import pick_backend
    from costmodel.profile import RuntimeSettings
    from validate.collective_bench import sizes_bytes
    from validate.profile_file import runtime_facts, where_and_when
    from validate.bench_record import load_bench
    from validate.microbench import (TOPK_FRACTIONS, memory_sizes, model_attention_shapes, model_gemm_shapes,
                                     run_microbenchmarks, sweep_gemm_shapes, topk_sizes)

    be = pick_backend() if backend is None else None
    be_name = backend or be.name
    kind = "cuda" if be_name == "nccl" else "cpu"
    tps = tps or [t for t in (1, 2, 4, 8) if world % t == 0 and model.num_attention_heads % t == 0]
    shapes = sorted(set(model_gemm_shapes(model, tps)) | set(sweep_gemm_shapes(max_gemm_dim)))
    gpu = cluster.devices[0].gpu
    floor_s = compute_floor_s(shapes, gpu, repeats, model_attention_shapes(model, tps))
    if floor_s > timeout_s and compute_from is None:  # certain to time out: say so now, not after timeout_s
        raise InputError("--model", None, f"{model.name}: timing its {len(shapes)} GEMM shapes and its attention "
                         f"takes at least {floor_s:.0f} s on {gpu.name} even at its peak ({max(gpu.peak_tflops.values()):g} "
                         f"TFLOP/s), over the {timeout_s:.0f} s a calibration launch may take; calibrate with "
                         "a smaller model (the efficiency curve is fitted against shape), e.g. --model tiny, or "
                         "on the devices the model trains on")
    mem = memory_sizes(model, tps)
    coll = sizes_bytes(4 * 1024, max_bytes)
    runtime = RuntimeSettings(**runtime_facts(kind))
    topk = [(n, f) for n in topk_sizes(model, tps) for f in TOPK_FRACTIONS]
    attn = model_attention_shapes(model, tps)
    # The record is read here and checked by run_microbenchmarks (reused_compute) before
    # anything is measured.
    reuse = (load_bench(compute_from), compute_from) if compute_from is not None else None
    from validate.alive_bench import alive_model
    res = run_microbenchmarks(world, shapes, mem, coll, attn_shapes=attn, topk=topk, runtime=runtime,
                              repeats=repeats, backend=be_name, progress=progress, timeout_s=timeout_s,
                              compute_from=reuse, alive_model=alive_model(model) if kind == "cpu" else None)
    device_name = be.device_name() if be is not None else kind
    where = where_and_when(res, device_name)
    if compute_from is not None:
        where += f"; compute samples and speed probe reused from {compute_from} (same conditions)"
    fit, mapping = profile_from_bench(cluster, res, where, memory_model, stage_scales)
    return Calibration(res, fit, mapping)


def compute_floor_s(shapes, gpu, repeats: int, attn_shapes=()) -> float:
    """Seconds the compute worker needs at least to time ``shapes`` ((m, n, k, batch)) and
    ``attn_shapes`` ((batch x heads, s, head dim)) on ``gpu``: each is called at least
    repeats + 2 times (compute_bench.compute_worker: one warm-up call, one to size the
    window, then ``repeats`` windows of one call or more), a GEMM 2mnk x batch FLOPs, a
    causal attention its two matmuls' 4 s^2 d x batch FLOPs halved by the mask, at the
    device's highest catalog peak of any precision, which no call beats: a lower bound,
    so a calibration refused on it could not have finished."""
    peak = max(gpu.peak_tflops.values()) * 1e12
    flops = sum(2.0 * m * n * k * b for m, n, k, b in shapes) + sum(2.0 * bh * sq * sq * d for bh, sq, d in attn_shapes)
    return (repeats + 2) * flops / peak


def fitted_profile(cluster, mapping: dict, where: str):
    """The Profile the simulator gets from a fitted ``mapping`` on ``cluster``: the
    cluster's bundled profiles with the mapping merged over them, as loading the written
    file with the cluster's profiles does (costmodel.profile.load_profile)."""
    from costmodel.profile import load_profile, overlay_profile
    return overlay_profile(load_profile(None, bundled=cluster.profiles), mapping, where)


def profile_from_bench(cluster, res, where: str, memory_model: str = "bandwidth", with_scales: bool = False):
    """(FitResult, profile mapping) fitted to the microbenchmarks ``res``
    (validate/bench_record.MicrobenchResult) for ``cluster``'s device type and intra-node
    link class; ``where``: where and when they were measured, for the profile's source.
    What calibrate does after measuring, and what a refit of a saved .bench.json does
    (benchmarks/repredict.py --launch-aggregate). ``with_scales``: add the stage scales
    fitted to the record's split draws (stage_scales; not the default: mechanism 57)."""
    from costmodel.profile import load_profile
    from validate.profile_file import profile_mapping

    kind = "cuda" if res.backend == "nccl" else "cpu"
    gpu = cluster.devices[0].gpu
    node = cluster.nodes[0]
    base = load_profile(None, bundled=cluster.profiles)
    link = (node.intra_bw_Bps, node.intra_latency_s, node.intra_kind) if res.world > 1 else None
    fit = fit_profile(res, gpu, base.gpu(gpu.name), link, base.fabric(node.intra_kind), memory_model)
    name = f"calibrated-{cluster.name}-w{res.world}"
    mapping = profile_mapping(fit, res, gpu.name, node.intra_kind if link else None, kind, where, name)
    scales = stage_scales(cluster, res, mapping, where) if with_scales else {}
    if scales:
        mapping["runtime"].update(scales)
        mapping["runtime"]["source"] += (
            " forward_scale, backward_scale, optimizer_scale: the runner's forward and backward of three "
            "layers of the model with both ends, one microbatch in flight, and its Adam closing each step "
            "(validate/alive_bench.split_drawer), over what the simulator prices for them with the fitted "
            "figures above (validate/calibrate.stage_scales).")
    return fit, mapping


# The profile's runtime fields stage_scales fits, in the order of the split draws' spans
# (validate/alive_bench.SPLIT_SPANS: forward, backward, optimizer).
SCALE_FIELDS = ("forward_scale", "backward_scale", "optimizer_scale")


def stage_scales(cluster, res, mapping: dict, where: str) -> dict[str, float]:
    """{'forward_scale': f, 'backward_scale': b, 'optimizer_scale': o}: the median over
    ``res``'s split draws of the alive stage's forward and backward a microbatch and its
    Adam a step (validate/alive_bench.split_drawer), each over what the simulator prices
    for that stage (ALIVE_LAYERS layers of the record's split_model with both ends, a
    one-device fp32 plan, one sequence a microbatch: sim/program.chunk_work and
    costmodel/efficiency.optimizer_time_s of its weights) under ``mapping``'s profile with
    the scales at 1: the one definition of each, so a scale corrects exactly what the
    simulator would have charged. {} where the record has no split draws (GPU workers, a
    model too large, records before session 26)."""
    from costmodel.efficiency import optimizer_time_s
    from costmodel.profile import allowed_range
    from sim.program import chunk_work
    from specs.plan import resolve_plan
    from validate.alive_bench import ALIVE_LAYERS
    from validate.microbench import split_model
    model = split_model(res, where)
    if model is None or not res.split_draws:
        return {}
    runtime = {k: v for k, v in mapping["runtime"].items() if k not in SCALE_FIELDS}
    prof = fitted_profile(cluster, {**mapping, "runtime": runtime}, where)
    plan = resolve_plan("precision=fp32", model, 1)
    work = chunk_work(model, plan, cluster, prof, 0, ALIVE_LAYERS, True, True)
    gpu = cluster.devices[0].gpu
    priced = (work.fwd_s, work.bwd_s, optimizer_time_s(work.params, gpu, prof.gpu(gpu.name), "fp32", prof.runtime))
    out = {}
    for i, key in enumerate(SCALE_FIELDS):
        # held inside the profile's own bounds: beyond them the record or its price is broken
        lo, hi = allowed_range(key)
        out[key] = round(min(hi, max(lo, statistics.median(d[i] for d in res.split_draws) / priced[i])), 4)
    return out
