"""Results of one simulated step: the types that reports and the command line read."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

# cp: context parallelism's exposed K/V exchange (ring) or all-to-alls (a2a)
CATEGORIES = ("compute", "tp", "cp", "pp", "dp", "bubble", "idle")


@dataclass
class Segment:
    """One interval on one stream of one simulated device (for traces and Gantt charts)."""

    device: int  # representative rank
    stream: str  # 'compute' | 'dp' | 'pp' | 'cp'
    cat: str  # one of CATEGORIES, or 'send'/'collective' on comm streams
    start_s: float
    end_s: float
    label: str


@dataclass
class DeviceResult:
    rank: int  # representative rank (TP index 0)
    stage: int
    pipeline: str  # the simulated replica class it belongs to
    gpu: str
    represents: int  # how many devices this one stands for (TP and CP peers x identical replicas)
    breakdown_s: dict[str, float]  # CATEGORIES -> seconds; sums to the step time
    busy_s: float  # compute + tp
    memory_gib: dict[str, float]
    peak_memory_gib: float
    capacity_gib: float
    fits_memory: bool


@dataclass
class StepResult:
    topology: str
    model: str
    plan: str
    num_devices: int
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_memory_gib: float
    fits_memory: bool
    memory_shortfall_gib: float
    bubble_fraction: float
    exposed_comm_s: dict[str, float]
    breakdown: dict[str, float]
    devices: list[DeviceResult]
    busiest_links: list[dict] = field(default_factory=list)
    dp_algorithm: list[str] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    link_samples: list[tuple] = field(default_factory=list)
    sim_wall_s: float = 0.0
    # Compute slowdown of host processes time-sharing fewer cores (sim/core_sharing.py); 1: none.
    core_slowdown: float = 1.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("segments")
        d.pop("link_samples")
        return d

    @property
    def bottleneck(self) -> str:
        """The largest non-compute share of the step: what to fix first."""
        parts = {k: v for k, v in self.breakdown.items() if k != "compute"}
        if not self.fits_memory:
            return "memory"
        if not parts or max(parts.values()) < 0.05 * self.step_time_s:
            return "compute"
        return max(sorted(parts), key=lambda k: parts[k])


@dataclass
class SearchResult:
    """What `plansim search` found: simulated plans best first, and what was pruned."""

    topology: str
    model: str
    num_devices: int
    ranked: list[StepResult]  # re-scored by the full simulation, best (highest tokens/s) first
    pruned: dict[str, int]  # reason -> number of candidate plans dropped for it
    pruned_examples: dict[str, str] = field(default_factory=dict)  # reason -> one example plan
    candidates: int = 0  # plans enumerated
    estimated: int = 0  # plans ranked by the analytic estimate
    notes: list[str] = field(default_factory=list)  # findings worth reporting (heterogeneity, compression)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return {
            "topology": self.topology, "model": self.model, "num_devices": self.num_devices,
            "ranked": [r.to_dict() for r in self.ranked], "pruned": dict(self.pruned),
            "pruned_examples": dict(self.pruned_examples), "candidates": self.candidates,
            "estimated": self.estimated, "notes": list(self.notes), "wall_s": self.wall_s,
        }
