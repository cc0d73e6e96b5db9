"""The record of a calibration's microbenchmarks (P.bench.json beside the profile P.yaml):
its samples, how it is read back and checked, and how its compute families print.

validate/microbench.py measures and fills it; calibration fits the profile to it
(validate/calibrate.py); plansim validate's report and benchmarks/repredict.py read it
back. Reading checks that the file is such a record (load_bench_dict: a one-line
InputError naming the file and the field otherwise, never a traceback); check_draws and
check_figures check the figures a record lends to another calibration
(validate/microbench.reused_compute).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from costmodel.errors import InputError
from costmodel.limits import number_problem
from validate.collective_bench import CollectiveSample


@dataclass
class GemmSample:
    m: int
    n: int
    k: int
    batch: int
    seconds: float  # per call

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass
class AttentionSample:
    """Fused attention forward (torch's scaled_dot_product_attention) of ``batch`` heads."""

    batch: int  # microbatch x heads on this rank
    s: int
    d: int
    seconds: float

    @property
    def flops(self) -> float:
        """QK^T and attention over V, as costmodel/flops.py counts them: 2 x 2*b*s*s*d."""
        return 4.0 * self.batch * self.s * self.s * self.d

    @property
    def bytes(self) -> float:
        """Q, K, V read and O written once (fp32): the fused kernel's HBM traffic."""
        return 4.0 * 4 * self.batch * self.s * self.d


@dataclass
class MemorySample:
    op: str
    elems: int
    bytes: float  # as costmodel/flops.py counts the op's traffic
    seconds: float


@dataclass
class OverheadSample:
    what: str  # 'plain' (no autograd) or 'train' (forward + backward under autograd)
    model_ops: int  # ops of the chain as the cost model counts them
    seconds: float  # per chain

    @property
    def per_op_s(self) -> float:
        return self.seconds / self.model_ops


@dataclass
class TopkSample:
    """validate/topk.select on a bucket of ``elems`` fp32 gradients keeping ``fraction``."""

    elems: int
    fraction: float
    seconds: float  # mean over the error-feedback stream's selections and the ranks
    cv: float = 0.0  # their coefficient of variation (0 in records written before it)


@dataclass
class MicrobenchResult:
    world: int
    backend: str
    threads: int  # torch intra-op threads per process
    gemm: list[GemmSample] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    attention: list[AttentionSample] = field(default_factory=list)
    overhead: list[OverheadSample] = field(default_factory=list)
    collectives: list[CollectiveSample] = field(default_factory=list)
    topk: list[TopkSample] = field(default_factory=list)
    wall_s: float = 0.0
    # Processes the compute families (a)-(c') ran in at once: min(world, host cores) on
    # a CPU (time-sharing beyond the cores is the simulator's, sim/core_sharing.py),
    # world on GPUs; 0 in records written before this field (then: world).
    compute_world: int = 0
    host_cores: int = 0  # cores this process may run on (0: not recorded)
    # validate/probe.py's probe: the median of probe_draws_s (0: not recorded)
    probe_s: float = 0.0
    # Each draw of the probe, seconds, in order: the compute worker's (median over its
    # processes) first, then one per collective launch (median over its ranks); [] in
    # records written before the draws were kept (their probe_s is the compute draw).
    probe_draws_s: list = field(default_factory=list)
    # Seconds of each family's smallest call in the timing harness ('gemm', 'bmm',
    # 'memory:<op>', 'attention'), median over the compute workers; {} in older records
    harness: dict = field(default_factory=dict)
    # Seconds a tiny kernel takes on a CUDA device itself, back to back
    # (compute_bench.device_kernel_s); 0: not measured (a CPU, or a record before it was)
    device_kernel_s: float = 0.0
    # CPU time per wall second in a stream of small all-reduces (contention_bench.busy_fraction_row); 0: not measured
    comm_busy_fraction: float = 0.0
    # Extra wait of a collective closing a long compute phase (contention_bench.straggler_row),
    # seconds, mean over the group sizes of the median over launches; 0: not measured
    straggler_s: float = 0.0
    # What receiving a message its sender posted earlier adds to a round of compute while
    # the sender computes, and while it is blocked (handoff_bench.posted_rows), seconds,
    # mean over the pairs, first launch only (handoff_bench.posted_rows); 0: not measured
    posted_busy_s: float = 0.0
    posted_idle_s: float = 0.0
    # What one pipeline handoff into a receive posted before its send adds to a ping-pong
    # of compute rounds (handoff_bench.preposted_handoff_s), seconds, mean over the
    # pairs, median over the launches; 0: not measured
    preposted_s: float = 0.0
    # Of that, the sender's own isend call (handoff_bench.preposted_handoff_s), seconds,
    # mean over the pairs, median over the launches; 0: not measured
    preposted_call_s: float = 0.0
    # Every launch's figure of the rows timed in several launches: [op, n, nbytes,
    # [seconds, launch by launch]]; the rows themselves hold the median (the mean in
    # records written before 2026-12-03). [] in older records.
    launch_samples: list = field(default_factory=list)
    # Each draw of the overhead chain, [plain s, train s] (median over the compute
    # processes), in the order taken; ``overhead`` holds their median. [] in records
    # written before 2026-12-03 (one draw, which ``overhead`` holds).
    overhead_draws: list = field(default_factory=list)
    # Each draw of the chain's training step under recompute none, full and selective,
    # [seconds] in that order (host_draws.recompute_drawer; median over the compute
    # processes), and what one checkpointed region adds from their median
    # (host_draws.checkpoint_region_us: {'full': us, 'selective': us}). Empty in records
    # written before 2026-12-04 (then not measured: 0 in the profile).
    recompute_draws: list = field(default_factory=list)
    checkpoint_region_us: dict = field(default_factory=dict)
    # Each draw of the runner's FSDP against plain training, [plain s, zero=3 s] for each of
    # host_draws.FSDP_MODELS (median over the compute processes), and what taking one
    # unit into use adds from their median (host_draws.fsdp_unit_costs: {'us': us,
    # 'us_per_mib': us}). Empty in records written before 2026-12-04 (session 13).
    fsdp_draws: list = field(default_factory=list)
    fsdp_unit: dict = field(default_factory=dict)
    # Each draw of the alive stage's step at each of alive_bench.ALIVE_DEPTHS (seconds,
    # median over the compute processes), and what their median fits
    # (alive_bench.alive_fit: {'knee_mib': MiB, 'per_doubling': share}). Empty where not
    # measured (GPU workers, a model too large for the draws, records before session 14).
    alive_draws: list = field(default_factory=list)
    alive: dict = field(default_factory=dict)
    # The MiB the alive stage holds on average at each depth (alive_bench.alive_held_mib),
    # what the fit set the draws against, so that a refit needs no model; [] in records
    # written before session 16 (a refit then keeps ``alive`` as it was).
    alive_held_mib: list = field(default_factory=list)
    # Each draw of the overhead chain's training step at host_draws.MICROBATCH_SHAPES,
    # [seconds, seconds] (median over the compute processes), the ops the cost model counts
    # for each shape's step (host_draws.microbatch_ops, so that a refit needs no
    # runtime), and what their medians fit (host_draws.microbatch_host_fit: {'us': us a
    # microbatch, 'per_op_us': us an op}). Empty in records written before session 21
    # (then not measured: 0 in the profile, and the per-op figures as before).
    microbatch_draws: list = field(default_factory=list)
    microbatch_ops: list = field(default_factory=list)
    microbatch_host: dict = field(default_factory=dict)
    # Each draw of the alive stage's forward and backward in its shallowest order and the
    # Adam closing each of its steps, [forward s, backward s] a microbatch and [optimizer s]
    # a step (alive_bench.split_drawer; median over the compute processes), and the model it trained (costmodel.shapes.ModelSpec's fields), so that a
    # refit prices that stage again (calibrate.stage_scales). Empty in records written
    # before session 26 and where the alive draws were not taken (then 1 in the profile).
    split_draws: list = field(default_factory=list)
    split_model: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MicrobenchResult":
        return cls(world=d["world"], backend=d["backend"], threads=d["threads"],
                   gemm=[GemmSample(**x) for x in d.get("gemm", [])],
                   memory=[MemorySample(**x) for x in d.get("memory", [])],
                   attention=[AttentionSample(**x) for x in d.get("attention", [])],
                   overhead=[OverheadSample(**x) for x in d.get("overhead", [])],
                   collectives=[CollectiveSample(**x) for x in d.get("collectives", [])],
                   topk=[TopkSample(**x) for x in d.get("topk", [])],
                   wall_s=d.get("wall_s", 0.0), compute_world=d.get("compute_world", 0),
                   host_cores=d.get("host_cores", 0), probe_s=d.get("probe_s", 0.0),
                   probe_draws_s=list(d.get("probe_draws_s", [])),
                   harness=dict(d.get("harness", {})), device_kernel_s=d.get("device_kernel_s", 0.0),
                   comm_busy_fraction=d.get("comm_busy_fraction", 0.0),
                   straggler_s=d.get("straggler_s", 0.0), posted_busy_s=d.get("posted_busy_s", 0.0),
                   posted_idle_s=d.get("posted_idle_s", 0.0), preposted_s=d.get("preposted_s", 0.0),
                   preposted_call_s=d.get("preposted_call_s", 0.0), launch_samples=list(d.get("launch_samples", [])),
                   overhead_draws=list(d.get("overhead_draws", [])),
                   recompute_draws=list(d.get("recompute_draws", [])),
                   checkpoint_region_us=dict(d.get("checkpoint_region_us", {})),
                   fsdp_draws=list(d.get("fsdp_draws", [])), fsdp_unit=dict(d.get("fsdp_unit", {})),
                   alive_draws=list(d.get("alive_draws", [])), alive=dict(d.get("alive", {})),
                   alive_held_mib=list(d.get("alive_held_mib", [])),
                   microbatch_draws=list(d.get("microbatch_draws", [])),
                   microbatch_ops=list(d.get("microbatch_ops", [])),
                   microbatch_host=dict(d.get("microbatch_host", {})),
                   split_draws=list(d.get("split_draws", [])), split_model=dict(d.get("split_model", {})))


def check_draws(source: str, rows, name: str, width: int, what: str, figures: list) -> list:
    """``rows`` checked to be a list of ``width``-long lists (InputError naming ``name``
    otherwise); each entry added to ``figures`` as (where, seconds) for the time check."""
    if not isinstance(rows, list) or any(not isinstance(d, list) or len(d) != width for d in rows):
        raise InputError(source, name, f"expected a list of {what}")
    figures += [(f"{name}[{j}][{i}]", d[i]) for j, d in enumerate(rows) for i in range(width)]
    return rows


US = ("microseconds", 1e6)  # a per-call or per-unit cost in a record: (unit, upper bound)


def check_figures(source: str, got, name: str, bounds: dict[str, tuple[str, float]]) -> dict:
    """``got`` checked to be {} (not measured) or a figure for every key of ``bounds``, each
    in [0, its bound] ({key: (unit, bound)}); InputError naming ``name`` and the key otherwise."""
    if not isinstance(got, dict) or (got and set(got) != set(bounds)):
        short = {"microseconds": "us"}
        raise InputError(source, name, "expected {" + ", ".join(f"'{k}': {short.get(u, 'number')}"
                                                                   for k, (u, _) in bounds.items()) + "}")
    for k, v in got.items():
        unit, hi = bounds[k]
        if number_problem(v, 0.0, hi):
            raise InputError(source, f"{name}.{k}", f"{v!r}: {unit} in [0, {'1e6' if hi == 1e6 else f'{hi:g}'}]")
    return got


def bench_record_path(profile) -> Path:
    """Where plansim calibrate writes a profile's microbenchmarks: P.yaml -> P.bench.json
    (the one definition: calibrate writes it, plansim validate's report reads it)."""
    p = Path(profile)
    return p.with_name(p.stem + ".bench.json")


def load_bench_dict(path, flag: str = "--compute-from") -> dict:
    """A calibration's saved microbenchmarks (P.bench.json, written beside P.yaml) as the
    mapping it holds, checked to be such a record (MicrobenchResult.from_dict reads it,
    and its 'gpu' and 'topology' names, when there, are strings); InputError (one line,
    naming the file and ``flag``) when it is missing, not JSON, nested beyond the
    decoder's depth or not such a record."""
    import json

    from costmodel.yamlio import read_text
    try:
        data = json.loads(read_text(path, what="calibration record (.bench.json)"))
        MicrobenchResult.from_dict(data)
    except RecursionError:  # json's decoder recurses once per nesting level
        raise InputError(str(path), flag, "JSON nested too deeply: not a calibration's microbenchmarks") from None
    except KeyError as e:
        raise InputError(str(path), flag, f"not a calibration's microbenchmarks (no {e} field)") from None
    except (json.JSONDecodeError, TypeError, AttributeError, ValueError) as e:
        raise InputError(str(path), flag, f"not a calibration's microbenchmarks ({type(e).__name__})") from None
    for key in ("gpu", "topology"):
        if key in data and not isinstance(data[key], str):
            raise InputError(str(path), key, f"{data[key]!r}: expected a name")
    return data


def load_bench(path, flag: str = "--compute-from") -> MicrobenchResult:
    """load_bench_dict's record as a MicrobenchResult."""
    return MicrobenchResult.from_dict(load_bench_dict(path, flag))


def format_compute(res: MicrobenchResult) -> str:
    """GEMM GFLOP/s per shape, memory-op GB/s per size, per-op overheads."""
    lines = [f"# GEMM ({res.compute_world or res.world} concurrent processes, {res.threads} thread(s) each)",
             f"{'m':>6} {'n':>6} {'k':>6} {'batch':>5} {'time (us)':>10} {'GFLOP/s':>9}"]
    for g in res.gemm:
        lines.append(f"{g.m:>6} {g.n:>6} {g.k:>6} {g.batch:>5} {g.seconds * 1e6:>10.1f} {g.flops / g.seconds / 1e9:>9.2f}")
    lines += ["# memory-bound ops", f"{'op':>10} {'elements':>10} {'time (us)':>10} {'GB/s':>8}"]
    for s in res.memory:
        lines.append(f"{s.op:>10} {s.elems:>10} {s.seconds * 1e6:>10.1f} {s.bytes / s.seconds / 1e9:>8.2f}")
    lines += ["# fused attention (scaled_dot_product_attention, causal)", f"{'heads':>6} {'s':>5} {'d':>4} {'time (us)':>10} {'GFLOP/s':>9}"]
    for a in res.attention:
        lines.append(f"{a.batch:>6} {a.s:>5} {a.d:>4} {a.seconds * 1e6:>10.1f} {a.flops / a.seconds / 1e9:>9.2f}")
    if res.topk:
        lines += ["# top-k compression (validate/topk.select, error-feedback stream: mean and CV)",
                  f"{'elements':>10} {'kept':>6} {'time (us)':>10} {'ns/elem':>8} {'cv':>6}"]
        for t in res.topk:
            lines.append(f"{t.elems:>10} {t.fraction:>6.2f} {t.seconds * 1e6:>10.1f} {t.seconds / t.elems * 1e9:>8.2f}"
                         f" {t.cv:>6.3f}")
    if res.harness:
        lines.append("# timing harness per call (smallest call of each family; taken out before fitting rates)")
        lines.append("  " + ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in res.harness.items()))
    if res.device_kernel_s > 0:
        lines.append(f"# device time per tiny kernel, back to back (CUDA events): {res.device_kernel_s * 1e6:.2f} us")
    lines.append("# per-op overhead (GPT layer chain at width 8, per op as the cost model counts them)")
    for i, o in enumerate(res.overhead):  # ("plain", "train"), as each draw's pair
        draws = [d[i] / o.model_ops * 1e6 for d in res.overhead_draws]
        each = f"  (median of {len(draws)} draws: {', '.join(f'{x:.2f}' for x in draws)})" if len(draws) > 1 else ""
        lines.append(f"{o.what:>10} {o.model_ops:>4} ops {o.per_op_s * 1e6:>8.2f} us/op{each}")
    if res.microbatch_host:
        from validate.host_draws import MICROBATCH_SHAPES
        shapes = " and ".join(f"{L} layer(s) x {mb} microbatches ({n} ops)"
                              for (L, mb), n in zip(MICROBATCH_SHAPES, res.microbatch_ops or [0, 0]))
        each = "; ".join(f"{a * 1e3:.3f}, {b * 1e3:.3f} ms" for a, b in res.microbatch_draws)
        lines.append(f"# per-microbatch host cost (the chain's training step at {shapes}; draws: {each}): "
                     f"{res.microbatch_host['us']:.1f} us a microbatch + {res.microbatch_host['per_op_us']:.2f} us an op")
    if res.comm_busy_fraction or res.straggler_s:
        lines.append(f"# waits: busy fraction in collectives {res.comm_busy_fraction:.3f}; a collective closing "
                     f"50 ms of compute waits {res.straggler_s * 1e6:.0f} us more than one closing 1 ms")
    if res.posted_busy_s or res.posted_idle_s:
        lines.append(f"# pipeline handoffs: receiving a message posted earlier adds {res.posted_busy_s * 1e6:.0f} us "
                     f"to a round while its sender computes, {res.posted_idle_s * 1e6:.0f} us while it is blocked; "
                     f"a handoff into a receive posted first adds {res.preposted_s * 1e6:.0f} us to a ping-pong "
                     f"(the sender's isend call {res.preposted_call_s * 1e6:.0f} us of it)")
    return "\n".join(lines)


