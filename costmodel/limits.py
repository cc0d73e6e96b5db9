"""Bounds on every number an input file or flag may give, and the one check that applies them.

A number outside these bounds is not a cluster or a model anyone runs: it is a typo, a unit
mix-up or a hostile input, and accepting it gives a confident answer that means nothing
(a 1e-300 GB/s link makes a 1e301 s step), hangs the event loop (an infinite latency) or
allocates without bound (a billion nodes) before anything else could fail. Bounds are
generous, one to three orders of magnitude beyond the largest published system, so no real
input is refused. Sizes are checked before anything is allocated.
"""
from __future__ import annotations

import math

# Devices in one cluster: 2**17. The largest published training clusters hold about
# 100k GPUs (e.g. 100k H100s, xAI Colossus, 2024), so 131,072 leaves room above them.
MAX_DEVICES = 131_072
MAX_NODES = MAX_DEVICES  # one GPU per node at the extreme
MAX_GPUS_PER_NODE = 1_024  # an NVL72 rack is 72 GPUs on one NVLink domain
MAX_NICS_PER_NODE = 256  # DGX nodes have 8-10
MAX_LINKS_PER_PAIR = 64  # NVLink links between two GPUs (18 per H100 in total)
MAX_LAYERS = 10_000  # published models have up to ~200 (Llama 3 405B: 126)
MAX_HIDDEN = 2**20  # widths published so far are below 2**15
MAX_HEADS = 2**16
MAX_SEQ = 2**24  # 16M-token context
MAX_VOCAB = 2**24
MAX_GLOBAL_BATCH = 2**16  # sequences per step; Llama 3 405B used 2,048 (Dubey et al. 2024, Sec. 3.4)

# Link bandwidths per direction. GB/s: 1 MB/s to 100 TB/s (HBM3e is ~8 TB/s per GPU);
# Gb/s (NIC line rates): 10 Mb/s to 1 Pb/s.
BW_GBPS_RANGE = (1e-3, 1e5)
BW_GBITPS_RANGE = (1e-2, 1e6)
LATENCY_US_MAX = 1e6  # one second per hop or call; real ones are 0.1-100 us
PEAK_TFLOPS_RANGE = (1e-3, 1e5)  # 1 GFLOP/s to 100 PFLOP/s per GPU
# A measured training step: a microsecond to a day (published iterations take 0.1-100 s).
STEP_TIME_S_RANGE = (1e-6, 86_400.0)
MEM_GIB_RANGE = (1e-3, 1e5)
OVERSUBSCRIPTION_RANGE = (1e-2, 1e3)
TOPK_FRACTION_MIN = 1e-6  # below one entry in a million, every gradient tensor rounds to zero entries


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else f"{x:,}".replace(",", "")


def allowed_range(lo: float, hi: float, integer: bool, lo_open: bool = False, hi_open: bool = False) -> str:
    kind = "an integer" if integer else "a finite number"
    return f"{kind} in {'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if hi_open else ']'}"


def number_problem(value: object, lo: float, hi: float, *, integer: bool = False,
                   lo_open: bool = False, hi_open: bool = False) -> str | None:
    """None if ``value`` is a number in the range, else what is allowed ("must be ...").
    Booleans are not numbers (YAML ``true`` is not 1); an integer field takes no floats."""
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    ok = ok_type and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value)
    if ok:
        ok = (lo < value if lo_open else lo <= value) and (value < hi if hi_open else value <= hi)
    return None if ok else "must be " + allowed_range(lo, hi, integer, lo_open, hi_open)

# Sweeps (specs/sweep.py). Each cell of a sweep is one plan search: seconds on small
# clusters, up to tens of seconds at 16k GPUs. 64 values per axis and 4,096 cells (days of
# search on one machine, hours on a Ray cluster) are beyond any study one report can show;
# a larger grid is a mistake (a range written out by a script gone wrong).
MAX_SWEEP_AXIS = 64
MAX_SWEEP_CELLS = 4_096

# Multi-step simulation (plansim simulate --steps, specs/scenario.py). A simulated step of
# a 1,024-GPU plan costs ~0.2 s of CPU here, so 10,000 steps is already a half-hour run;
# events per scenario are bounded the same way.
MAX_SIM_STEPS = 10_000
MAX_SCENARIO_EVENTS = 10_000
# A compute-speed or bandwidth scale: 0.001x (a part throttled to a crawl) to 1000x; 0 is
# not a speed (a device that stops is `stall` or `node_lost`).
SCALE_FACTOR_RANGE = (1e-3, 1e3)
# A stall or an event time: up to one day of simulated seconds.
MAX_SCENARIO_S = 86_400.0

# Microbenchmark calibration (plansim calibrate TOPOLOGY). Each measurement is the median
# of --repeats timed runs (default 5, --quick 3): 1,000 is already hours of collectives. The
# collective sweep doubles from 4 KiB to --max-bytes (default 64 MiB) and allocates buffers
# of that size in every process: 16 GiB is beyond any bandwidth plateau and within one GPU.
MAX_BENCH_REPEATS = 1_000
MIN_COLLECTIVE_BYTES = 4_096
MAX_COLLECTIVE_BYTES = 2**34
