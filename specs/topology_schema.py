"""Schema of a topology YAML file (pydantic v2), and the translation of its errors.

This module checks shapes, types and ranges only (positive bandwidths and counts, known
``kind`` names, no unknown keys). Cross-references (GPU names, node types used by groups,
NVLink pair indices, explicit-link vertex names, connectivity) are checked in
``sim/topology.py`` where the cluster is built, so each error can name its own field.

Units are in the field names: ``bw_GBps`` = GB/s (1e9 bytes/s), ``bw_gbps`` = Gb/s
(1e9 bits/s, how NICs are sold), ``latency_us`` = microseconds.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError, model_validator, field_validator
from pydantic_core import PydanticCustomError

from costmodel.errors import InputError
from costmodel.gpus import PRECISIONS

INTRA_KINDS = ("nvswitch", "nvlink_mesh", "pcie", "loopback")
NETWORK_KINDS = ("fat_tree", "rail_optimized", "explicit")


class _Strict(BaseModel):
    """Frozen, and rejects unknown keys with a message that lists the allowed ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise PydanticCustomError(
                        "unknown_key", "unknown key '{key}'; allowed: {allowed}",
                        {"key": str(key), "allowed": ", ".join(cls.model_fields)})
        return data


class GpuOverrides(_Strict):
    """Replace datasheet figures of the node type's GPU (e.g. a power-capped part)."""

    peak_tflops: dict[Literal[PRECISIONS], PositiveFloat] | None = None  # merged key by key
    mem_gib: PositiveFloat | None = None
    mem_bw_GBps: PositiveFloat | None = None


class IntraSpec(_Strict):
    """The fabric inside a node.

    nvswitch / pcie / loopback: a star; ``bw_GBps`` is per GPU, per direction, into the hub.
    nvlink_mesh: direct GPU-GPU links; ``bw_GBps`` is one link, per direction; ``links`` is a
    list of ``[gpu_a, gpu_b, link_count]`` (omitted: every pair joined by one link).
    ``latency_us`` is the one-way GPU-to-GPU latency through the fabric.
    """

    kind: Literal[INTRA_KINDS]
    bw_GBps: PositiveFloat
    latency_us: NonNegativeFloat
    links: list[tuple[int, int, PositiveInt]] | None = None


class PcieSpec(_Strict):
    """The GPU <-> NIC hop (per direction)."""

    bw_GBps: PositiveFloat
    latency_us: NonNegativeFloat


class NicSpec(_Strict):
    """Network adapters of one node: ``count`` NICs of ``bw_gbps`` each, per direction.
    ``latency_us`` is one adapter's share of a message's one-way latency (adapter + cable)."""

    count: PositiveInt
    bw_gbps: PositiveFloat
    latency_us: NonNegativeFloat


class NodeType(_Strict):
    gpu: str
    gpus_per_node: PositiveInt
    gpu_overrides: GpuOverrides = GpuOverrides()
    intra: IntraSpec
    pcie: PcieSpec | None = None  # required when nics is given
    nics: NicSpec | None = None  # required when the cluster has more than one node


class Group(_Strict):
    name: str
    node_type: str
    nodes: PositiveInt


class FatTree(_Strict):
    """Two-level switched tree: one leaf per ``nodes_per_leaf`` consecutive nodes (all NICs of a
    node on its leaf), leaves joined by one aggregate spine. Each leaf's uplink bandwidth is
    (sum of NIC bandwidth under it) / ``oversubscription``."""

    kind: Literal["fat_tree"]
    nodes_per_leaf: PositiveInt
    oversubscription: PositiveFloat = 1.0
    switch_latency_us: NonNegativeFloat


class RailOptimized(_Strict):
    """Rail-optimised tree: nodes are cut into units of ``nodes_per_leaf``; inside a unit NIC i
    of every node shares leaf (rail) i; rail leaves are joined by one aggregate spine with the
    same oversubscription rule as the fat tree."""

    kind: Literal["rail_optimized"]
    nodes_per_leaf: PositiveInt
    oversubscription: PositiveFloat = 1.0
    switch_latency_us: NonNegativeFloat


class ExplicitLink(_Strict):
    """One physical link (both directions) between NIC ``n<node>.nic<i>`` vertices or switches
    named by the file (any name not starting with ``n<digits>.``)."""

    a: str
    b: str
    bw_gbps: PositiveFloat
    latency_us: NonNegativeFloat


class Explicit(_Strict):
    kind: Literal["explicit"]
    links: list[ExplicitLink] = Field(min_length=1)


Network = Annotated[Union[FatTree, RailOptimized, Explicit], Field(discriminator="kind")]


class TopologyFile(_Strict):
    name: str
    description: str = ""
    node_types: dict[str, NodeType] = Field(min_length=1)
    groups: list[Group] = Field(min_length=1)
    network: Network | None = None  # required when the cluster has more than one node
    # Bundled hardware profiles (costmodel/profiles/<name>.yaml) whose link efficiencies
    # match this cluster's fabric; merged over the default before any --profile.
    profiles: list[str] = []

    @field_validator("profiles")
    @classmethod
    def _known_profiles(cls, v: list[str]) -> list[str]:
        from costmodel.profile import bundled_profiles
        known = bundled_profiles()
        for name in v:
            if name not in known:
                raise ValueError(f"unknown bundled profile {name!r}; allowed: {', '.join(known)}")
        return v


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_input_error(err: ValidationError, source: str) -> InputError:
    """The first pydantic error as a one-line InputError naming the dotted field path."""
    first = err.errors()[0]
    parts: list[str] = []
    for i, item in enumerate(first["loc"]):
        if item == "[key]":  # pydantic marks a bad dict key this way; the key is already in loc
            continue
        if i > 0 and first["loc"][i - 1] == "network" and item in NETWORK_KINDS:
            continue  # the discriminated union inserts the tag into the path; users never wrote it
        parts.append(str(item))
    field = ".".join(parts) or None
    kind = first["type"]
    if kind == "unknown_key":
        field = ".".join(parts + [first["ctx"]["key"]])
        return InputError(source, field, first["msg"])
    if kind == "missing":
        return InputError(source, field, "required field is missing")
    if kind == "union_tag_not_found":
        return InputError(source, f"{field}.kind", f"missing; allowed: {', '.join(NETWORK_KINDS)}")
    if kind == "union_tag_invalid":
        return InputError(source, f"{field}.kind", f"unknown kind {first['ctx']['tag']!r}; allowed: {', '.join(NETWORK_KINDS)}")
    return InputError(source, field, f"{first['msg']}; got {_short(first['input'])}")
