"""Accuracy against published training runs: simulate every row of a published-runs CSV
with its own configuration and compare with the measured figure.

Each row is turned into inputs the way a user would write them, with nothing fitted per
row: a ModelSpec from the row's shape and batch; a plan string from its parallel layout;
the bundled topology of its network, scaled to its node count; and the bundled profile of
its GPU type and fabric with the runtime overlay of its framework (``NETWORKS``,
``FRAMEWORKS``). What a published configuration leaves unstated takes the framework's
documented default, and each row's ``notes`` say which.

Error = (predicted - published) / published; MAPE = mean of |error| over the rows; the
ranking check is Spearman's rank correlation over the rows of one sweep.
"""
from __future__ import annotations

import csv
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from costmodel.errors import InputError
from costmodel.flops import megatron_flops_per_iteration
from costmodel.limits import (MAX_DEVICES, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_NODES, PEAK_TFLOPS_RANGE,
                               STEP_TIME_S_RANGE, number_problem)
from costmodel.profile import RUNTIMES, Profile, for_gpus, load_profile
from costmodel.shapes import ModelSpec
from costmodel.yamlio import read_text
from sim.metrics import simulate
from specs.plan import resolve_plan
from specs.topology import Cluster, load_topology

# The rows shipped with the project (a copy of the shared data with citations).
DEFAULT_ROWS = Path(__file__).resolve().parent / "data" / "published_runs.csv"

# network column -> (bundled topology, bundled profile of that GPU type and fabric)
NETWORKS: dict[str, tuple[str, str]] = {
    "HDR200x8": ("dgx-a100", "a100-ib-hdr"),
    "OPA100x4": ("jeanzay-a100-opa", "a100-opa"),
    "NDR400x8": ("dgx-h100", "h100-ib-ndr"),
}
# The runtime column names a bundled runtime (costmodel/profile.RUNTIMES), whose overlays
# are merged in order over the fabric profile. CSVs written before runtimes had names carry
# a `framework` column instead; its values map here.
LEGACY_FRAMEWORKS = {"megatron-lm": "megatron-lm-2022", "megatron-deepspeed": "megatron-deepspeed",
                     "megatron-deepspeed-bf16opt": "megatron-deepspeed-bf16opt"}
# iter_time_s: seconds per iteration; hw_tflops_per_gpu: hardware FLOP/s per GPU (recompute
# counted); megatron_tflops_per_gpu: Megatron's num_floating_point_operations per step
# (costmodel/flops.megatron_flops_per_iteration) / (step time x GPUs).
FIGURE_KINDS = ("iter_time_s", "hw_tflops_per_gpu", "megatron_tflops_per_gpu")
# Both frameworks order ranks tensor-parallel innermost, then data-parallel, then pipeline
# (Megatron-LM's initialize_model_parallel; DeepSpeed's PipeModelDataParallelTopology).
PLACEMENT = "tp-dp-pp"
SWEEP_PREFIX = "bloom-sweep-"
# NCCL's rings and trees are topology aware: with several members of a data-parallel group
# on one node, its channels leave the node through the NICs of all those members. The
# hierarchical algorithm (intra-node reduce-scatter, one inter-node ring per local index,
# intra-node all-gather) is the flow-level model of that; with one member per node it is
# the plain ring.
DP_ALGORITHM = "hierarchical"

_INT = ("nodes", "gpus_per_node", "num_layers", "hidden_size", "num_attention_heads", "seq_length",
        "vocab_size", "global_batch_size", "tp", "pp", "dp", "mbs", "vpp", "zero")
_REQUIRED = ("run_id", "source", "gpu", "network", "sp", "recompute", "precision", "figure_kind",
             "figure", "runtime") + _INT


@dataclass(frozen=True)
class RunRow:
    """One published run: its configuration and measured figure."""

    run_id: str
    source: str
    gpu: str
    nodes: int
    gpus_per_node: int
    network: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    global_batch_size: int
    tp: int
    pp: int
    dp: int
    mbs: int
    vpp: int
    sp: bool
    recompute: str
    zero: int
    precision: str
    figure_kind: str
    figure: float
    runtime: str  # a bundled runtime (costmodel/profile.RUNTIMES)
    overlap_grad_reduce: bool = True
    layers_per_stage: str = ""


@dataclass
class RowResult:
    row: RunRow
    predicted: float
    topology: str
    profiles: tuple[str, ...]
    plan: str
    breakdown: dict[str, float]
    notes: list[str] = field(default_factory=list)
    sim_wall_s: float = 0.0

    @property
    def published(self) -> float:
        return self.row.figure

    @property
    def error(self) -> float:
        """Signed relative error, (predicted - published) / published."""
        return (self.predicted - self.published) / self.published

    def to_dict(self) -> dict:
        return {"run_id": self.row.run_id, "source": self.row.source, "figure_kind": self.row.figure_kind,
                "published": self.published, "predicted": self.predicted, "error": self.error,
                "topology": self.topology, "profiles": list(self.profiles), "plan": self.plan,
                "breakdown": dict(self.breakdown), "notes": list(self.notes), "sim_wall_s": self.sim_wall_s}


@dataclass
class AccuracyResult:
    rows: list[RowResult]
    mape: float  # fraction, mean |error| over all rows
    spearman: float | None  # rank correlation over the sweep rows (None with fewer than 2)
    sweep_ids: list[str]
    rows_file: str
    profile: str | None = None  # the user's --profile, merged over every row's profiles
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return {"rows_file": self.rows_file, "profile": self.profile, "mape": self.mape,
                "spearman_sweep": self.spearman, "sweep_rows": list(self.sweep_ids),
                "rows": [r.to_dict() for r in self.rows], "wall_s": self.wall_s}


# ------------------------------------------------------------------ reading rows
def _bool(value: str, src: str, where: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise InputError(src, where, f"got {value!r}; allowed: true, false")


def _row(raw: dict, src: str, line: int, width: int) -> RunRow:
    rid = (raw.get("run_id") or "").strip() or f"line {line}"
    where = f"{rid}"
    if None in raw:  # csv.DictReader files the fields beyond the header under None
        raise InputError(src, where, f"{width + len(raw[None])} fields, the header has {width}")
    if not (raw.get("runtime") or "").strip() and (raw.get("framework") or "").strip():
        old = raw["framework"].strip()
        if old not in LEGACY_FRAMEWORKS:
            raise InputError(src, f"{where}.framework", f"got {old!r}; allowed: {', '.join(LEGACY_FRAMEWORKS)} "
                             f"(or a runtime column: {', '.join(RUNTIMES)})")
        raw = {**raw, "runtime": LEGACY_FRAMEWORKS[old]}
    for key in _REQUIRED:
        if not (raw.get(key) or "").strip():
            raise InputError(src, f"{where}.{key}", "missing value")
    vals: dict = {}
    for key in _INT:
        try:
            vals[key] = int(raw[key])
        except ValueError:
            raise InputError(src, f"{where}.{key}", f"must be an integer (got {raw[key]!r})") from None
    try:
        figure = float(raw["figure"])
    except ValueError:
        raise InputError(src, f"{where}.figure", f"must be a number (got {raw['figure']!r})") from None
    if raw["figure_kind"] not in FIGURE_KINDS:
        raise InputError(src, f"{where}.figure_kind", f"got {raw['figure_kind']!r}; allowed: {', '.join(FIGURE_KINDS)}")
    # Seconds per step, or TFLOP/s per GPU: a figure no run could measure is a typo or a unit mix-up.
    lo, hi = STEP_TIME_S_RANGE if raw["figure_kind"] == "iter_time_s" else PEAK_TFLOPS_RANGE
    problem = number_problem(figure, lo, hi)
    if problem:
        raise InputError(src, f"{where}.figure", f"{raw['figure']!r}: {problem} ({raw['figure_kind']})")
    if raw["network"] not in NETWORKS:
        raise InputError(src, f"{where}.network", f"got {raw['network']!r}; allowed: {', '.join(NETWORKS)}")
    if raw["runtime"] not in RUNTIMES:
        raise InputError(src, f"{where}.runtime", f"got {raw['runtime']!r}; allowed: {', '.join(RUNTIMES)}")
    overlap = raw.get("overlap_grad_reduce") or "true"
    row = RunRow(run_id=rid, source=raw["source"], gpu=raw["gpu"], network=raw["network"],
                  sp=_bool(raw["sp"], src, f"{where}.sp"), recompute=raw["recompute"], precision=raw["precision"],
                  figure_kind=raw["figure_kind"], figure=figure, runtime=raw["runtime"],
                  overlap_grad_reduce=_bool(overlap, src, f"{where}.overlap_grad_reduce"),
                  layers_per_stage=(raw.get("layers_per_stage") or "").strip(), **vals)
    _check_shape(row, src)
    return row


def _check_shape(row: RunRow, src: str) -> None:
    """The row's cluster size, model and plan checked as a topology, model file and plan
    are (bounds, divisibility), before anything is simulated; InputError names the row and
    the column."""
    for key, most in (("nodes", MAX_NODES), ("gpus_per_node", MAX_GPUS_PER_NODE), ("vpp", MAX_LAYERS)):
        problem = number_problem(getattr(row, key), 1, most, integer=True)
        if problem:
            raise InputError(src, f"{row.run_id}.{key}", f"{getattr(row, key)}: {problem}")
    devices = row.nodes * row.gpus_per_node
    if devices > MAX_DEVICES:
        raise InputError(src, f"{row.run_id}.nodes", f"nodes x gpus_per_node = {devices}: at most {MAX_DEVICES} devices")
    for key in ("recompute", "precision", "layers_per_stage"):  # written into the k=v,... plan string
        value = getattr(row, key)
        if any(c in value for c in ",="):
            raise InputError(src, f"{row.run_id}.{key}", f"{value[:60]!r}: a plan value has no ',' or '='")
    from specs.model import model_from_mapping
    try:
        model = model_from_mapping({"name": "row", "num_layers": row.num_layers, "hidden_size": row.hidden_size,
                                    "num_attention_heads": row.num_attention_heads, "seq_length": row.seq_length,
                                    "vocab_size": row.vocab_size, "global_batch_size": row.global_batch_size}, src)
    except InputError as err:
        raise InputError(src, ".".join(filter(None, (row.run_id, err.field))), err.message) from None
    try:
        resolve_plan(row_plan_text(row), model, devices)
    except InputError as err:
        head = (err.field or "plan").split(".")[0]
        column = {"layers": "layers_per_stage", "tp*pp": "tp"}.get(head, head)
        raise InputError(src, f"{row.run_id}.{column}", err.message) from None


# Rows a runs file may hold: accuracy simulates each once, calibrate --runs each many times
# per fold (seconds each at thousands of GPUs), so beyond this a file is a mistake (a log
# dump, the wrong file), not a study.
MAX_RUN_ROWS = 5_000


def load_rows(path: str | Path | None = None) -> list[RunRow]:
    """Rows of a published-runs CSV ('#' lines are comments); InputError names the row
    and column of a bad value."""
    p = Path(path) if path else DEFAULT_ROWS
    src = str(p)
    # The one text reader of every input file: missing, too large, binary or not UTF-8
    # are each refused in one line naming the file.
    text = read_text(p, src, "runs file")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    header = list(reader.fieldnames or ())
    twice = [c for c in header if header.count(c) > 1]
    if twice:
        raise InputError(src, twice[0], "column given twice in the header")
    have = set(header)
    if "framework" in have:
        have.add("runtime")  # a legacy framework column stands for it (LEGACY_FRAMEWORKS)
    missing = [c for c in _REQUIRED if c not in have]
    if lines and missing:
        raise InputError(src, missing[0], f"missing column; required columns: {', '.join(_REQUIRED)}")
    if len(lines) - 1 > MAX_RUN_ROWS:
        raise InputError(src, None, f"{len(lines) - 1:,} rows; a runs file may have at most {MAX_RUN_ROWS:,} "
                                    "(each row is one simulation, and a fold fit simulates every row many times)")
    rows = [_row(raw, src, i + 2, len(header)) for i, raw in enumerate(reader)]
    if not rows:
        raise InputError(src, None, "no rows")
    seen = Counter(r.run_id for r in rows)
    dup = sorted(i for i, n in seen.items() if n > 1)
    if dup:
        raise InputError(src, f"{dup[0]}.run_id", "given twice")
    return rows


# ------------------------------------------------------------------ one row's inputs
def row_model(row: RunRow) -> ModelSpec:
    """The row's transformer (GPT: gelu, ffn = 4h, multi-head attention, learned
    positions), with the row's global batch."""
    return ModelSpec(row.run_id, row.num_layers, row.hidden_size, row.num_attention_heads,
                     row.seq_length, row.vocab_size, row.global_batch_size)


def row_plan_text(row: RunRow) -> str:
    parts = [f"tp={row.tp}", f"pp={row.pp}", f"dp={row.dp}", f"mbs={row.mbs}", f"recompute={row.recompute}",
             f"precision={row.precision}", f"placement={PLACEMENT}", f"allreduce={DP_ALGORITHM}"]
    if row.vpp > 1:
        parts.append(f"vpp={row.vpp}")
    if row.sp:
        parts.append("sp=true")
    if row.zero:
        parts.append(f"zero={row.zero}")
    if not row.overlap_grad_reduce:
        parts.append("overlap_grad_reduce=false")
    if row.layers_per_stage:
        parts.append(f"layers={row.layers_per_stage}")
    return ",".join(parts)


def row_notes(row: RunRow) -> list[str]:
    """The framework defaults this row relies on where its source says nothing."""
    notes = [f"rank order {PLACEMENT} (tensor innermost, then data, then pipeline: the framework's default)"]
    if row.vpp > 1:
        notes.append(f"interleaved 1F1B with {row.vpp} chunks per rank")
    else:
        notes.append("1F1B schedule (Megatron-LM / DeepSpeed default without interleaving)")
    if "not stated" in row.source:
        notes.append(f"source: {row.source}")
    if not row.layers_per_stage:
        notes.append("transformer layers split evenly; embedding on the first stage, output layer on the last")
    notes.append(f"data-parallel collectives: NCCL's topology-aware channels, modelled as allreduce={DP_ALGORITHM}")
    notes.append(f"runtime: {row.runtime}")
    return notes


def row_profile_names(row: RunRow) -> tuple[str, ...]:
    return (NETWORKS[row.network][1],) + RUNTIMES[row.runtime]


def row_profile(row: RunRow, profile: str | None = None) -> Profile:
    """The profile a row is simulated with: its bundled fabric profile and its runtime's
    overlays, then the user's ``profile`` (a file or bundled name) over them."""
    prof = load_profile(profile, bundled=(NETWORKS[row.network][1],), runtime=row.runtime)
    return for_gpus(prof, {row.gpu})


def row_cluster(row: RunRow, src: str = "rows") -> Cluster:
    """The bundled topology of the row's network at its node count; InputError when the
    row's GPU type or GPUs per node do not match it."""
    topo_name = NETWORKS[row.network][0]
    cluster = load_topology(topo_name, nodes=row.nodes)
    if cluster.gpus_per_node != row.gpus_per_node:
        raise InputError(src, f"{row.run_id}.gpus_per_node",
                         f"{row.gpus_per_node} does not match topology {topo_name} ({cluster.gpus_per_node})")
    gpus = {d.gpu.name for d in cluster.devices}
    if gpus != {row.gpu}:
        raise InputError(src, f"{row.run_id}.gpu", f"{row.gpu!r} does not match topology {topo_name} ({sorted(gpus)})")
    return cluster


def simulate_row(row: RunRow, profile: Profile, src: str = "rows") -> RowResult:
    """Simulate one row with ``profile`` (already the row's fabric and runtime profile)."""
    topo_name = NETWORKS[row.network][0]
    cluster = row_cluster(row, src)
    model = row_model(row)
    plan = resolve_plan(row_plan_text(row), model, cluster.num_devices)
    res = simulate(model, plan, cluster, profile)
    if row.figure_kind == "iter_time_s":
        predicted = res.step_time_s
    elif row.figure_kind == "megatron_tflops_per_gpu":
        predicted = megatron_flops_per_iteration(model) / res.step_time_s / cluster.num_devices / 1e12
    else:
        predicted = res.hardware_tflops_per_gpu
    return RowResult(row=row, predicted=predicted, topology=f"{topo_name} --nodes {row.nodes}",
                     profiles=row_profile_names(row), plan=plan.to_string(), breakdown=dict(res.breakdown),
                     notes=row_notes(row), sim_wall_s=res.sim_wall_s)


# ------------------------------------------------------------------ statistics
def mape(errors: Sequence[float]) -> float:
    """Mean absolute (relative) error, as a fraction."""
    if not errors:
        raise ValueError("mape of no errors")
    return sum(abs(e) for e in errors) / len(errors)


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their positions."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (mean ranks for ties)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("spearman needs two equally long sequences of at least 2 values")
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)


# ------------------------------------------------------------------ all rows
def _simulate_task(task: tuple) -> RowResult:
    row, profile, src = task
    return simulate_row(row, profile, src)


def run_accuracy(rows_path: str | Path | None = None, profile: str | None = None,
                 progress: Callable[[RowResult], None] | None = None,
                 sweep_prefix: str = SWEEP_PREFIX, jobs: int = 1, runtime: str | None = None) -> AccuracyResult:
    """Simulate every row; MAPE over all rows, Spearman over the rows whose id starts with
    ``sweep_prefix``. ``profile`` (a file or bundled name) is merged over each row's own.
    ``jobs`` > 1 simulates rows in that many processes (same results, in file order).
    ``runtime`` (a bundled runtime name) replaces every row's runtime column."""
    t0 = time.perf_counter()
    src = str(Path(rows_path) if rows_path else DEFAULT_ROWS)
    rows = load_rows(rows_path)
    if runtime is not None:
        if runtime not in RUNTIMES:
            raise InputError(str(runtime)[:60], "--runtime", f"unknown runtime; allowed: {', '.join(RUNTIMES)}")
        rows = [replace(r, runtime=runtime) for r in rows]
    profiles: dict[tuple[str, ...], Profile] = {}
    tasks = []
    for row in rows:
        names = row_profile_names(row) + (row.gpu,)
        if names not in profiles:
            profiles[names] = row_profile(row, profile)
        tasks.append((row, profiles[names], src))
    results: list[RowResult] = []
    if jobs > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
            for r in pool.map(_simulate_task, tasks):
                results.append(r)
                if progress is not None:
                    progress(r)
    else:
        for task in tasks:
            r = _simulate_task(task)
            results.append(r)
            if progress is not None:
                progress(r)
    sweep = [r for r in results if r.row.run_id.startswith(sweep_prefix)]
    rho = spearman([r.predicted for r in sweep], [r.published for r in sweep]) if len(sweep) >= 2 else None
    return AccuracyResult(rows=results, mape=mape([r.error for r in results]), spearman=rho,
                          sweep_ids=[r.row.run_id for r in sweep], rows_file=src, profile=profile,
                          wall_s=time.perf_counter() - t0)
