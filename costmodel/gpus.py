"""GPU catalog: peak dense FLOP/s per precision, memory capacity and memory bandwidth.

Every figure is a vendor datasheet number (dense math, no 2:4 sparsity) and each entry
says where it came from. These are *peaks*: achieved fractions (MFU, bandwidth
efficiency) live in the hardware profiles, not here.

Units: ``peak_tflops`` in TFLOP/s (1e12 FLOP/s), ``mem_gib`` in GiB (2**30 bytes; HBM
stacks are sized in binary units, so "80 GB" parts hold 80 GiB, e.g. nvidia-smi shows
81920 MiB on an A100 80GB), ``mem_bw_GBps`` in GB/s (1e9 bytes/s).
"""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Mapping

from costmodel.dtypes import DTYPE_BYTES
from costmodel.errors import InputError

PRECISIONS = tuple(DTYPE_BYTES)  # the arithmetic formats a datasheet may give a peak for

# When a device lacks a precision's math units, the framework runs that precision on the
# next-best units. Each chain ends at fp32, which every spec must have.
# - fp8 without fp8 tensor cores (A100, V100, MI250X): frameworks keep the GEMM in bf16/fp16.
# - bf16 on V100: Volta tensor cores have fp16 only, and bf16 models are trained there in
#   fp16 mixed precision, so bf16 runs at the fp16 tensor-core rate (125 TFLOP/s).
# - tf32 on devices without TF32 units (V100, MI250X, CPU) is plain fp32 math.
_FALLBACK = {
    "fp8": ("fp8", "bf16", "fp16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
}

_OVERRIDABLE = ("peak_tflops", "mem_gib", "mem_bw_GBps")


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model. Immutable and hashable (``peak_tflops`` is a read-only view)."""

    name: str
    peak_tflops: Mapping[str, float]  # dense TFLOP/s per precision; must contain 'fp32'
    mem_gib: float  # device memory capacity, GiB
    mem_bw_GBps: float  # device memory bandwidth, GB/s (1e9 bytes/s)
    source: str  # datasheet citation

    def __post_init__(self) -> None:
        peaks = dict(self.peak_tflops)
        unknown = sorted(set(peaks) - set(PRECISIONS))
        if unknown:
            raise InputError(None, "peak_tflops", f"unknown precision {unknown[0]!r} for {self.name}; "
                             f"allowed: {', '.join(PRECISIONS)}")
        if "fp32" not in peaks:
            raise InputError(None, "peak_tflops.fp32", f"{self.name} needs an fp32 peak (the fallback of every precision)")
        for key, value in peaks.items():
            if not value > 0:
                raise InputError(None, f"peak_tflops.{key}", f"must be > 0, got {value!r}")
        for field in ("mem_gib", "mem_bw_GBps"):
            if not getattr(self, field) > 0:
                raise InputError(None, field, f"must be > 0, got {getattr(self, field)!r}")
        # Keep a private copy behind a read-only view so the frozen record cannot change.
        object.__setattr__(self, "peak_tflops", types.MappingProxyType(peaks))

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.peak_tflops.items())), self.mem_gib, self.mem_bw_GBps, self.source))

    def peak_flops(self, precision: str) -> float:
        """Peak dense FLOP/s for ``precision``, falling back as documented in ``_FALLBACK``."""
        chain = _FALLBACK.get(precision)
        if chain is None:
            raise InputError(None, "precision", f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
        for p in chain:
            if p in self.peak_tflops:
                return self.peak_tflops[p] * 1e12
        raise AssertionError("unreachable: __post_init__ guarantees an fp32 entry")

    @property
    def mem_bytes(self) -> float:
        return self.mem_gib * 2**30

    @property
    def mem_bw_Bps(self) -> float:
        return self.mem_bw_GBps * 1e9

    def with_overrides(self, **fields) -> GpuSpec:
        """A copy with some fields replaced; ``peak_tflops`` is merged key by key
        (``{'bf16': 280}`` changes only bf16). The name is kept so plans still match it."""
        unknown = sorted(set(fields) - set(_OVERRIDABLE))
        if unknown:
            raise InputError(None, unknown[0], f"not an overridable GPU field; allowed: {', '.join(_OVERRIDABLE)}")
        changes = {k: v for k, v in fields.items() if v is not None}
        if "peak_tflops" in changes:
            changes["peak_tflops"] = {**self.peak_tflops, **changes["peak_tflops"]}
        if not changes:
            return self
        return dataclasses.replace(self, **changes,
                                   source=f"{self.source}; overridden: {', '.join(sorted(changes))}")


def _spec(name: str, mem_gib: float, mem_bw_GBps: float, source: str, **tflops: float) -> GpuSpec:
    return GpuSpec(name=name, peak_tflops=tflops, mem_gib=mem_gib, mem_bw_GBps=mem_bw_GBps, source=source)


GPU_CATALOG: dict[str, GpuSpec] = {s.name: s for s in (
    # docs/facts.md "Datasheet peaks": V100 SXM2 125 TFLOP/s fp16 tensor core, 15.7 fp32,
    # 32 GB HBM2 at 900 GB/s (NVIDIA Tesla V100 datasheet). No bf16/tf32/fp8 units (see _FALLBACK).
    _spec("V100-SXM2-32GB", 32, 900, "NVIDIA Tesla V100 datasheet (SXM2); docs/facts.md",
          fp16=125.0, fp32=15.7),
    # docs/facts.md: A100 SXM 312 bf16/fp16, 156 tf32, 19.5 fp32; 40 GB at 1,555 GB/s
    # (NVIDIA A100 datasheet; docs/facts.md rounds it to 1.6 TB/s).
    _spec("A100-SXM4-40GB", 40, 1555, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB); docs/facts.md",
          bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
    # Same compute; 80 GB HBM2e at 2,039 GB/s (NVIDIA A100 datasheet; "about 2.0 TB/s" in docs/facts.md).
    _spec("A100-SXM4-80GB", 80, 2039, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); docs/facts.md",
          bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
    # docs/facts.md: H100 SXM ~989 bf16/fp16 dense, ~1979 fp8 dense, 80 GB HBM3 at 3.35 TB/s.
    # tf32 494.7 and fp32 67 dense from the NVIDIA H100 Tensor Core GPU datasheet (SXM5).
    _spec("H100-SXM5-80GB", 80, 3350, "NVIDIA H100 Tensor Core GPU datasheet (SXM5); docs/facts.md",
          bf16=989.4, fp16=989.4, fp8=1978.9, tf32=494.7, fp32=67.0),
    # NVIDIA H800 Tensor Core GPU datasheet (SXM): the H100 SXM's tensor throughput (1,979
    # bf16 / 3,958 fp8 TFLOP/s with sparsity: 989.4 / 1,978.9 dense; tf32 494.7, fp32 67),
    # 80 GB HBM3 at 3.35 TB/s; what differs is NVLink (400 GB/s) and FP64, which a topology
    # file and nothing here carry.
    _spec("H800", 80, 3350, "NVIDIA H800 Tensor Core GPU datasheet (SXM)",
          bf16=989.4, fp16=989.4, fp8=1978.9, tf32=494.7, fp32=67.0),
    # NVIDIA H100 datasheet (PCIe): 1,513 bf16 / 3,026 fp8 *with sparsity*, i.e. 756 / 1,513 dense;
    # tf32 378 dense, fp32 51; 80 GB HBM2e at 2.0 TB/s.
    _spec("H100-PCIe", 80, 2000, "NVIDIA H100 Tensor Core GPU datasheet (PCIe, 80GB)",
          bf16=756.5, fp16=756.5, fp8=1513.0, tf32=378.0, fp32=51.2),
    # docs/facts.md: H200 SXM has H100's compute with 141 GB HBM3e at 4.8 TB/s
    # (NVIDIA H200 datasheet). 141 GB is the usable capacity of six 24 GiB stacks.
    _spec("H200", 141, 4800, "NVIDIA H200 Tensor Core GPU datasheet (SXM); docs/facts.md",
          bf16=989.4, fp16=989.4, fp8=1978.9, tf32=494.7, fp32=67.0),
    # NVIDIA L40S datasheet: 733 bf16/fp16 and 1,466 fp8 with sparsity -> 362 / 733 dense;
    # tf32 183 dense, fp32 91.6; 48 GB GDDR6 at 864 GB/s.
    _spec("L40S", 48, 864, "NVIDIA L40S GPU datasheet",
          bf16=362.05, fp16=362.05, fp8=733.0, tf32=183.0, fp32=91.6),
    # AMD Instinct MI250X datasheet: 383 TFLOP/s fp16/bf16 (matrix), 95.7 fp32 matrix (fp32 GEMMs
    # run on the matrix cores), 128 GB HBM2e at 3.2 TB/s (3,276.8 GB/s). No fp8, no tf32 (see _FALLBACK).
    # One MI250X (both dies) is one entry here, as in the datasheet.
    _spec("MI250X", 128, 3276.8, "AMD Instinct MI250X accelerator datasheet",
          bf16=383.0, fp16=383.0, fp32=95.7),
    # AMD Instinct MI300X datasheet: 1,307.4 bf16/fp16 dense, 2,614.9 fp8 dense, 653.7 tf32,
    # 163.4 fp32 (matrix); 192 GB HBM3 at 5.3 TB/s.
    _spec("MI300X", 192, 5300, "AMD Instinct MI300X accelerator datasheet",
          bf16=1307.4, fp16=1307.4, fp8=2614.9, tf32=653.7, fp32=163.4),
    # A generic host-CPU "device" for the localhost validator: one worker process on a host's
    # cores. Not a datasheet part, and not an estimate of any one CPU: CEILINGS that a worker
    # process of a current x86 host stays below, so that calibration (plansim calibrate,
    # validate/calibrate.py) can express what it measures as efficiencies in (0, 1].
    # fp32 0.5 TFLOP/s: two cores of two 512-bit FMA pipes at 4 GHz, 2 x (2 x 16 lanes x
    # 2 FLOP x 4e9) = 512 GFLOP/s. 200 GB/s: the tensors of the validator's tiny model live in
    # the L2 cache, which serves a core on the order of 64 B/cycle (~250 GB/s at 4 GHz), well
    # above DRAM's share. 16 GiB: a share of host RAM. Only fp32 is listed: without AMX,
    # torch's CPU bf16 GEMMs are no faster than fp32.
    _spec("CPU", 16, 200, "ceilings for a worker process on a host CPU (not a datasheet figure; calibrate)",
          fp32=0.5),
)}


def get_gpu(name: str, source: str | None = None, field: str = "gpu") -> GpuSpec:
    """The catalog entry called ``name``; InputError listing the allowed names otherwise."""
    try:
        return GPU_CATALOG[name]
    except (KeyError, TypeError):
        raise InputError(source, field, f"unknown GPU {name!r}; allowed: {', '.join(GPU_CATALOG)}") from None


# The catalog entry of a device by the product name its driver reports
# (torch.cuda.get_device_name: "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-PCIE-40GB",
# ...), first matching rule, case ignored. The NVL boards (H100 NVL, H200 NVL) have clocks and
# memory of their own and no entry: naming them after the SXM parts would price them at
# another part's peak. An A100 PCIe board has the SXM4 part's tensor peaks (NVIDIA A100
# datasheet, one column for both) and its memory size.
_PRODUCT_RULES = (("NVL", None), ("H200", "H200"), ("H800", "H800"), ("H100 PCIe", "H100-PCIe"),
                  ("H100", "H100-SXM5-80GB"), ("A100-SXM4-40GB", "A100-SXM4-40GB"), ("A100-PCIE-40GB", "A100-SXM4-40GB"),
                  ("A100", "A100-SXM4-80GB"), ("L40S", "L40S"), ("V100", "V100-SXM2-32GB"), ("MI300X", "MI300X"),
                  ("MI250X", "MI250X"))


def catalog_name_for_product(product: str) -> str | None:
    """The GPU_CATALOG name for a driver's product name, or None where no entry fits."""
    low = str(product).lower()
    return next((c for key, c in _PRODUCT_RULES if key.lower() in low), None)


# NVLink line rate per GPU and direction, GB/s, of the SXM parts, used where a host's fabric
# must be guessed from the GPU alone (benchmarks/calibrate_cuda.sh without a topology):
# NVLink 4 (H100/H200 SXM): 18 links x 25 GB/s = 450 (NVIDIA H100 and H200 datasheets,
# 900 GB/s both directions); NVLink 3 (A100 SXM4): 12 x 25 = 300 (A100 datasheet, 600 GB/s);
# NVLink 2 (V100 SXM2): 6 x 25 = 150 (V100 datasheet, 300 GB/s); H800 SXM: 400 GB/s both
# directions together (H800 datasheet), 200 each way. PCIe boards and parts not listed get
# PCIe Gen4 x16's 31.5 GB/s a direction (PCI-SIG: 16 GT/s x 16 lanes x 128/130).
_NVLINK_GBPS = {"H200": 450.0, "H100-SXM5-80GB": 450.0, "H800": 200.0, "A100-SXM4-80GB": 300.0,
                "A100-SXM4-40GB": 300.0, "V100-SXM2-32GB": 150.0}
PCIE4_X16_GBPS = 31.5


def intra_link_for_product(product: str) -> dict | None:
    """The intra-node link (topology file's ``intra`` mapping) of one node of ``product`` GPUs:
    NVSwitch at the part's NVLink rate for SXM parts, PCIe Gen4 x16 otherwise; None where the
    product has no catalog entry."""
    cat = catalog_name_for_product(product)
    if cat is None:
        return None
    # "A100-PCIE-40GB" maps to the SXM4 entry for its peaks, but its GPUs talk over PCIe.
    if "pcie" in str(product).lower() or cat not in _NVLINK_GBPS:
        return {"kind": "pcie", "bw_GBps": PCIE4_X16_GBPS, "latency_us": 2.0}
    return {"kind": "nvswitch", "bw_GBps": _NVLINK_GBPS[cat], "latency_us": 1.0}

