"""Schema of a topology YAML file (pydantic v2): shapes, types and bounded ranges.

This module checks shapes, types and ranges only (bandwidths, latencies and counts within the
bounds of costmodel/limits.py, known
``kind`` names, no unknown keys). Cross-references (GPU names, node types used by groups,
NVLink pair indices, explicit-link vertex names, connectivity) are checked in
``specs/topology.py`` where the cluster is built, so each error can name its own field.

Units are in the field names: ``bw_GBps`` = GB/s (1e9 bytes/s), ``bw_gbps`` = Gb/s
(1e9 bits/s, how NICs are sold), ``latency_us`` = microseconds.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, field_validator

from costmodel.gpus import PRECISIONS
from costmodel.limits import (BW_GBITPS_RANGE, BW_GBPS_RANGE, LATENCY_US_MAX, MAX_GPUS_PER_NODE,
                              MAX_LINKS_PER_PAIR, MAX_NICS_PER_NODE, MAX_NODES, MEM_GIB_RANGE,
                              OVERSUBSCRIPTION_RANGE, PEAK_TFLOPS_RANGE)
from specs.validation import Float, Int, Strict as _Strict, short

INTRA_KINDS = ("nvswitch", "nvlink_mesh", "pcie", "loopback")
NETWORK_KINDS = ("fat_tree", "rail_optimized", "explicit")

# Bounded number types (costmodel/limits.py says why each bound).
GBps = Float(*BW_GBPS_RANGE)  # GB/s per direction
Gbps = Float(*BW_GBITPS_RANGE)  # Gb/s per direction (NIC line rates)
LatencyUs = Float(0.0, LATENCY_US_MAX)
Nodes = Int(1, MAX_NODES)
Name = Annotated[str, Field(min_length=1, max_length=200)]  # names of GPUs, groups, node types, switches


class GpuOverrides(_Strict):
    """Replace datasheet figures of the node type's GPU (e.g. a power-capped part)."""

    peak_tflops: dict[Literal[PRECISIONS], Float(*PEAK_TFLOPS_RANGE)] | None = None  # merged key by key
    mem_gib: Float(*MEM_GIB_RANGE) | None = None
    mem_bw_GBps: GBps | None = None


class IntraSpec(_Strict):
    """The fabric inside a node.

    nvswitch / pcie / loopback: a star; ``bw_GBps`` is per GPU, per direction, into the hub.
    nvlink_mesh: direct GPU-GPU links; ``bw_GBps`` is one link, per direction; ``links`` is a
    list of ``[gpu_a, gpu_b, link_count]`` (omitted: every pair joined by one link).
    ``latency_us`` is the one-way GPU-to-GPU latency through the fabric.
    """

    kind: Literal[INTRA_KINDS]
    bw_GBps: GBps
    latency_us: LatencyUs
    links: list[tuple[Int(0, MAX_GPUS_PER_NODE - 1), Int(0, MAX_GPUS_PER_NODE - 1), Int(1, MAX_LINKS_PER_PAIR)]] | None = None


class PcieSpec(_Strict):
    """The GPU <-> NIC hop (per direction)."""

    bw_GBps: GBps
    latency_us: LatencyUs


class NicSpec(_Strict):
    """Network adapters of one node: ``count`` NICs of ``bw_gbps`` each, per direction.
    ``latency_us`` is one adapter's share of a message's one-way latency (adapter + cable)."""

    count: Int(1, MAX_NICS_PER_NODE)
    bw_gbps: Gbps
    latency_us: LatencyUs


class NodeType(_Strict):
    gpu: Name
    gpus_per_node: Int(1, MAX_GPUS_PER_NODE)
    gpu_overrides: GpuOverrides = GpuOverrides()
    intra: IntraSpec
    pcie: PcieSpec | None = None  # required when nics is given
    nics: NicSpec | None = None  # required when the cluster has more than one node


class Group(_Strict):
    name: Name
    node_type: Name
    nodes: Nodes


class FatTree(_Strict):
    """Two-level switched tree: one leaf per ``nodes_per_leaf`` consecutive nodes (all NICs of a
    node on its leaf), leaves joined by one aggregate spine. Each leaf's uplink bandwidth is
    (sum of NIC bandwidth under it) / ``oversubscription``."""

    kind: Literal["fat_tree"]
    nodes_per_leaf: Nodes
    oversubscription: Float(*OVERSUBSCRIPTION_RANGE) = 1.0
    switch_latency_us: LatencyUs


class RailOptimized(_Strict):
    """Rail-optimised tree: nodes are cut into units of ``nodes_per_leaf``; inside a unit NIC i
    of every node shares leaf (rail) i; rail leaves are joined by one aggregate spine with the
    same oversubscription rule as the fat tree."""

    kind: Literal["rail_optimized"]
    nodes_per_leaf: Nodes
    oversubscription: Float(*OVERSUBSCRIPTION_RANGE) = 1.0
    switch_latency_us: LatencyUs


class ExplicitLink(_Strict):
    """One physical link (both directions) between NIC ``n<node>.nic<i>`` vertices or switches
    named by the file (any name not starting with ``n<digits>.``)."""

    a: Name
    b: Name
    bw_gbps: Gbps
    latency_us: LatencyUs


class Explicit(_Strict):
    kind: Literal["explicit"]
    links: list[ExplicitLink] = Field(min_length=1)


Network = Annotated[Union[FatTree, RailOptimized, Explicit], Field(discriminator="kind")]


class TopologyFile(_Strict):
    name: Name
    description: str = Field(default="", max_length=10_000)
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
                raise ValueError(f"unknown bundled profile {short(name)}; allowed: {', '.join(known)}")
        return v
