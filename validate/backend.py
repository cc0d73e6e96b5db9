"""The one place that picks the torch.distributed backend and the device.

NCCL on CUDA devices when torch sees any, gloo on the CPU otherwise; the environment
variable PLANSIM_BACKEND ('gloo' or 'nccl') overrides the choice. Every other module in
validate/ asks this one, so the same code path runs on this machine and on a GPU cluster.

torch is an optional extra: it is imported here lazily, inside functions, so that
``import plansim`` and ``plansim simulate`` work without it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from costmodel.errors import InputError

BACKENDS = ("gloo", "nccl")
ENV_BACKEND = "PLANSIM_BACKEND"
ENV_THREADS = "PLANSIM_THREADS"
ENV_KEEP_HEAP = "PLANSIM_KEEP_HEAP"
ENV_PIN_CORES = "PLANSIM_PIN_CORES"
# glibc's mallopt(3) parameters (malloc.h): M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# The largest mmap threshold glibc accepts on 64-bit hosts (DEFAULT_MMAP_THRESHOLD_MAX,
# 4 * 1024 * 1024 * sizeof(long) = 32 MiB, malloc/malloc.c); allocations of that size and
# more are still mapped and unmapped one by one.
HEAP_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free memory at the top of the heap that is kept instead of returned to the kernel: more
# than any CPU run here holds (tiny's GPipe stage: 20 MiB of activations).
HEAP_TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024
# Whether CPU workers that outnumber the cores are pinned to them (configure_cpu_placement).
# Off by default: in five runs of benchmarks/validate_cpu.sh with it on (2026-12-07, session
# 34, p-2, p-3, q-1..q-3) tp=2 x dp=2 ran faster and mostly steadier (227-239 ms a step, its
# three launch medians 0.7-14.0 % apart, against 292-379 ms and 6.6-29.1 % in the session's
# 13 runs left free) and was predicted -7.2 to -16.4 % (-15.2 % on average left free).
# On the same host type in a slow state (session 35, four runs each way, alternated) the six
# plans met the target in 0 of 4 runs pinned against 5 of 7 free, pinned runs taking 20-40 s
# longer (docs/validation-cpu.md mechanism 62).
PIN_CORES_DEFAULT = "0"


@dataclass(frozen=True)
class Backend:
    """name: the torch.distributed backend; kind: 'cpu' or 'cuda'; device: torch.device
    of this process (the CUDA device is picked from LOCAL_RANK by ``device_for``)."""

    name: str
    device: Any  # torch.device (typed Any so this module imports without torch)
    kind: str

    def device_for(self, local_rank: int):
        """The device a worker with this local rank (index on its node) computes on."""
        torch = require_torch()
        if self.kind == "cuda":
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    def device_name(self) -> str:
        """'cpu', or the CUDA device's product name (for run records)."""
        if self.kind != "cuda":
            return "cpu"
        torch = require_torch()
        return torch.cuda.get_device_name(self.device)


def require_torch():
    """Import torch or raise the one-line InputError telling the user how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError(
            "--", "torch",
            "plansim validate needs torch: pip install 'plansim[validate]' (install the torch "
            "build you want first, e.g. pip install torch==2.13.0 for CPU)",
        ) from None
    return torch


def pick_backend(name: str | None = None) -> Backend:
    """``name`` (or $PLANSIM_BACKEND) when given, else nccl+cuda if CUDA is available,
    else gloo+cpu. NCCL only runs on CUDA tensors, so asking for it without CUDA is an
    input error rather than a hang later."""
    torch = require_torch()
    name = name or os.environ.get(ENV_BACKEND) or None
    has_cuda = torch.cuda.is_available()
    if name is None:
        name = "nccl" if has_cuda else "gloo"
    if name not in BACKENDS:
        raise InputError(ENV_BACKEND if os.environ.get(ENV_BACKEND) == name else "--backend",
                         "backend", f"unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
    if name == "nccl" and not has_cuda:
        raise InputError("--backend", "backend", "nccl needs CUDA devices and torch sees none; use gloo")
    # gloo on a CUDA machine still computes on the CPU here: one code path, one device kind
    # per backend, so measured gloo runs are CPU runs wherever they happen.
    kind = "cuda" if name == "nccl" else "cpu"
    device = torch.device("cuda") if kind == "cuda" else torch.device("cpu")
    return Backend(name=name, device=device, kind=kind)


def configure_cpu_threads() -> int:
    """Set torch's intra-op threads for a CPU worker: $PLANSIM_THREADS, default 1.

    Each worker process stands for one device, and on a shared CPU several run at once;
    with more than one OpenMP thread each, they spin-wait against each other (measured
    here: a tiny-model step 50x slower with 2 threads per process than with 1 on a busy
    2-core machine). Microbenchmarks and runs both call this, so a profile is calibrated
    under the same threading the plans run with."""
    torch = require_torch()
    n = cpu_threads_setting()
    torch.set_num_threads(n)
    return n


def cpu_threads_setting() -> int:
    """$PLANSIM_THREADS as an integer >= 1 (default 1); InputError naming it otherwise."""
    raw = os.environ.get(ENV_THREADS, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(ENV_THREADS, "threads", f"must be an integer >= 1, got {raw!r}")
    return n


def _flag_setting(env: str, default: str, field: str) -> bool:
    """The 0/1 environment variable ``env`` (``default`` where unset) as a bool; InputError
    naming it otherwise."""
    raw = os.environ.get(env, default)
    if raw not in ("0", "1"):
        raise InputError(env, field, f"must be 0 or 1, got {raw!r}")
    return raw == "1"


def keep_heap_setting() -> bool:
    """$PLANSIM_KEEP_HEAP as a bool ('1', the default, or '0'); InputError naming it otherwise."""
    return _flag_setting(ENV_KEEP_HEAP, "1", "keep heap")


def pin_cores_setting() -> bool:
    """$PLANSIM_PIN_CORES as a bool ('0', the default, or '1'); InputError naming it otherwise."""
    return _flag_setting(ENV_PIN_CORES, PIN_CORES_DEFAULT, "pin cores")


def check_worker_env() -> None:
    """Read the workers' settings from the environment once, in the process that starts
    them, so that a bad one is refused at the edge (InputError, exit 2) rather than by
    every worker as it joins."""
    cpu_threads_setting()
    keep_heap_setting()
    pin_cores_setting()


def core_for_rank(local_rank: int, local_world: int, cores: list[int]) -> int | None:
    """The core a CPU worker of ``local_rank`` (of ``local_world`` on this host) is pinned
    to, from the ``cores`` the host gives the workers (in order), where the workers
    outnumber the cores and divide evenly over them: consecutive ranks share a core,
    ``local_world / len(cores)`` to a core. None (left to the scheduler) otherwise.

    Consecutive ranks are the innermost group of a plan (tensor parallelism varies
    fastest, validate/runner.py), as on a GPU node whose NVLink joins a TP group. Measured
    on a 2-vCPU host (2026-12-07, results/validate-cpu-2026-12-07-s34/ab/pairs3.txt; 4
    gloo processes, a 32 KiB 2-rank all-reduce after ~0.8 ms of small-op compute, four
    launches each): each pair on one core 0.41-0.59 ms a call with the other pair in
    step and 0.34-0.44 with it computing; each pair across the cores 0.76-0.96 and
    1.98-2.05; left to the scheduler 1.35-1.77 and 1.56-2.87, and in two modes from launch
    to launch (ab/pairs2.txt). With one process per core nothing is pinned: pinned so,
    tp=2's two ranks ran 566 ms a step against 442-486 ms left free (run p-1 there), their
    gloo threads then sharing their own rank's core."""
    n = len(cores)
    if n < 1 or local_world <= n or local_world % n or not 0 <= local_rank < local_world:
        return None
    return cores[local_rank // (local_world // n)]


def configure_cpu_placement(local_rank: int, local_world: int) -> int | None:
    """Pin this CPU worker (and the threads it starts after, gloo's among them) to its
    core_for_rank; the core, or None where it is left to the scheduler ($PLANSIM_PIN_CORES=0,
    an uneven split, or a platform without sched_setaffinity). Workers of calibration and
    of the runner both call this before joining their group (validate/launch.py), so a
    profile is measured under the placement the plans run with."""
    if not pin_cores_setting() or not hasattr(os, "sched_setaffinity"):
        return None
    core = core_for_rank(local_rank, local_world, sorted(os.sched_getaffinity(0)))
    if core is not None:
        os.sched_setaffinity(0, {core})
    return core


def configure_cpu_heap() -> bool:
    """Keep the memory a CPU worker frees for its next allocations, as PyTorch's CUDA
    caching allocator keeps device memory between steps (docs/validation-cpu.md, mechanism
    54); True when set. $PLANSIM_KEEP_HEAP=0 leaves the C library's defaults.

    With glibc's defaults, tensors of 128 KiB and more are mapped one by one and the top
    of the heap is handed back whenever 128 KiB of it is free (both thresholds then move
    with what was freed, malloc/malloc.c). A schedule that holds many microbatches grows
    the heap by their activations every step and gives it back as the backwards free them,
    so each step the kernel maps and zeroes those pages again. Measured on a 2-core host
    (2026-12-06, two processes at once, 29-47 draws each): three layers of tiny trained in
    GPipe's order of 12 microbatches took 1.09-1.13 x their depth-1 order with the
    defaults, 1.056-1.071 x with the heap kept; a GPU run pays nothing like it. Workers of
    calibration and of the runner both call this (validate/launch.py), so a profile is
    measured under the heap the plans run with. Other C libraries: left as they are."""
    if not keep_heap_setting():
        return False
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl's and macOS's mallopt differ or are absent
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD_BYTES))
