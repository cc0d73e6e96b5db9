"""Hardware profiles: the achievable-efficiency parameters of the cost model.

A profile is a YAML file a person can read and edit. ``gpus`` holds compute
parameters per GPU type (``default`` applies to types not listed), ``fabrics`` holds
communication parameters per link class (``nvswitch``, ``nvlink``, ``pcie``,
``loopback``, ``network``). Every entry carries a ``source`` string saying where its
numbers came from (datasheet, published figure, or a fit with date and device).
``--profile FILE`` merges a user's file over the bundled default, key by key.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

import yaml

from costmodel.errors import InputError


@dataclass(frozen=True)
class GpuEfficiency:
    """How close one GPU type gets to its datasheet peaks."""

    gemm_eff_max: float = 0.75  # fraction of dense peak a large, well-shaped GEMM reaches
    gemm_dim_half: float = 64.0  # a GEMM dimension of this size halves efficiency (saturating factor d/(d+half))
    attention_eff: float = 0.5  # fraction of peak for the core-attention batched matmuls
    hbm_eff: float = 0.8  # fraction of datasheet HBM bandwidth that memory-bound kernels reach
    kernel_overhead_us: float = 4.0  # fixed cost per kernel launch, microseconds
    source: str = "built-in default"


@dataclass(frozen=True)
class FabricEfficiency:
    """Achievable share of a link class's line rate for collectives, and per-call cost."""

    bw_eff: float = 0.8  # achievable bus bandwidth / line rate
    call_latency_us: float = 10.0  # software cost of one collective call, microseconds
    source: str = "built-in default"


# Edge kinds of sim/topology's graph that belong to the inter-node network.
NETWORK_KINDS = ("network", "nic", "leaf_spine", "explicit")


@dataclass(frozen=True)
class Profile:
    gpus: dict[str, GpuEfficiency]
    fabrics: dict[str, FabricEfficiency]
    name: str = "default"
    source: str = ""

    def gpu(self, name: str) -> GpuEfficiency:
        return self.gpus.get(name) or self.gpus.get("default") or GpuEfficiency()

    def fabric(self, kind: str) -> FabricEfficiency:
        """Parameters of a link class. Graph edge kinds of the inter-node fabric (nic,
        leaf_spine, explicit) fall back to the 'network' entry, everything to 'default'."""
        got = self.fabrics.get(kind)
        if got is None and kind in NETWORK_KINDS:
            got = self.fabrics.get("network")
        return got or self.fabrics.get("default") or FabricEfficiency()


def _record(cls, data, source: str, where: str):
    if not isinstance(data, dict):
        raise InputError(source, where, "expected a mapping")
    allowed = {f.name for f in fields(cls)}
    for key, value in data.items():
        if key not in allowed:
            raise InputError(source, f"{where}.{key}", f"unknown field; allowed: {', '.join(sorted(allowed))}")
        if key != "source":
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise InputError(source, f"{where}.{key}", f"must be a non-negative number (got {value!r})")
            if key.endswith("_eff") or key.endswith("_eff_max"):
                if not 0 < value <= 1:
                    raise InputError(source, f"{where}.{key}", f"must be in (0, 1] (got {value!r})")
    return data


def _merge(base: Profile, data: dict, source: str) -> Profile:
    if not isinstance(data, dict):
        raise InputError(source, None, "expected a mapping with 'gpus' and/or 'fabrics'")
    unknown = set(data) - {"gpus", "fabrics", "name", "source"}
    if unknown:
        raise InputError(source, sorted(unknown)[0], "unknown field; allowed: name, source, gpus, fabrics")
    gpus = dict(base.gpus)
    for key, entry in (data.get("gpus") or {}).items():
        _record(GpuEfficiency, entry, source, f"gpus.{key}")
        gpus[key] = replace(gpus.get(key, gpus.get("default", GpuEfficiency())), **entry)
    fabrics = dict(base.fabrics)
    for key, entry in (data.get("fabrics") or {}).items():
        _record(FabricEfficiency, entry, source, f"fabrics.{key}")
        fabrics[key] = replace(fabrics.get(key, fabrics.get("default", FabricEfficiency())), **entry)
    return Profile(gpus=gpus, fabrics=fabrics, name=data.get("name", base.name),
                   source=", ".join(filter(None, [base.source, source])))


def _read_yaml(path: Path, source: str) -> dict:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise InputError(source, None, f"malformed YAML: {getattr(err, 'problem', err)}") from None


def default_profile() -> Profile:
    """The bundled profile (costmodel/profiles/default.yaml)."""
    text = resources.files("costmodel").joinpath("profiles/default.yaml")
    data = yaml.safe_load(text.read_text())
    return _merge(Profile(gpus={"default": GpuEfficiency()}, fabrics={"default": FabricEfficiency()}),
                  data, "costmodel/profiles/default.yaml")


def load_profile(path: str | None) -> Profile:
    """The default profile, with the user's file (if any) merged over it."""
    base = default_profile()
    if not path:
        return base
    p = Path(path)
    if not p.is_file():
        raise InputError(path, "--profile", "no such profile file")
    return _merge(base, _read_yaml(p, path), path)


def profile_to_dict(profile: Profile) -> dict:
    """The YAML form of a profile (what calibration writes)."""
    return {
        "name": profile.name,
        "gpus": {k: {f.name: getattr(v, f.name) for f in fields(v)} for k, v in profile.gpus.items()},
        "fabrics": {k: {f.name: getattr(v, f.name) for f in fields(v)} for k, v in profile.fabrics.items()},
    }
