"""Activation checkpointing's own host cost (RuntimeSettings.checkpoint_*_region_us):
what the simulator charges for it, and how calibration derives it from the chain."""
from __future__ import annotations

from dataclasses import replace

import pytest

from costmodel import flops as fl
from costmodel.efficiency import transform_ops
from costmodel.profile import Profile, RuntimeSettings
from costmodel.shapes import ModelSpec
from sim.core_sharing import slowed_profile
from sim.metrics import simulate
from specs.plan import resolve_plan
from specs.topology import load_topology
from validate.host_draws import CHAIN_MICROBATCHES, CHAIN_MODEL, checkpoint_region_us
from engine_fixtures import worker_profile

TINY = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)


def _profile(blocking: bool, full_us: float = 0.0, sel_us: float = 0.0) -> Profile:
    return worker_profile(launch_blocking=blocking, checkpoint_full_region_us=full_us,
                          checkpoint_selective_region_us=sel_us)


@pytest.mark.parametrize("recompute,full_us,sel_us,per_region_us", [
    ("full", 500.0, 0.0, 500.0), ("selective", 0.0, 300.0, 300.0), ("none", 500.0, 300.0, 0.0)])
def test_each_region_adds_its_host_time_to_the_step(recompute, full_us, sel_us, per_region_us):
    """One device issuing its own ops (launch_blocking, as a CPU worker): the step grows by
    layers x microbatches x the region's figure, worked by hand: tiny has 4 layers and
    16 sequences, mbs=1 -> 16 microbatches, so 64 regions: 500 us -> 32 ms for full,
    300 us -> 19.2 ms for selective, nothing without recompute."""
    cluster = load_topology("localhost-cpu", gpus_per_node=1)
    plan = resolve_plan(f"dp=1,mbs=1,precision=fp32,recompute={recompute}", TINY, 1)
    base = simulate(TINY, plan, cluster, _profile(True))
    got = simulate(TINY, plan, cluster, _profile(True, full_us, sel_us))
    assert got.step_time_s - base.step_time_s == pytest.approx(64 * per_region_us * 1e-6, rel=1e-9)


def test_region_hides_under_asynchronous_kernels():
    """With asynchronous launches (a GPU's host runs ahead) a region's host time only
    counts when the host is the bottleneck: an A100's recomputed GEMMs for a 16k-wide layer
    take far longer than 50 us of host work, so the step does not change."""
    big = ModelSpec("wide", 2, 16384, 128, 2048, 51200, 8)
    cluster = load_topology("dgx-a100", nodes=1)
    plan = resolve_plan("dp=8,mbs=1,recompute=full", big, 8)
    assert simulate(big, plan, cluster, _profile(False, 50.0)).step_time_s == pytest.approx(
        simulate(big, plan, cluster, _profile(False)).step_time_s, rel=1e-12)


def test_slowed_profile_scales_region_cost():
    """A device at 1/f speed pays f times a region's host time, as every other per-op cost."""
    slow = slowed_profile(_profile(True, 500.0, 300.0), 1.5)
    assert (slow.runtime.checkpoint_full_region_us, slow.runtime.checkpoint_selective_region_us) == (750.0, 450.0)


def test_calibration_takes_the_recomputed_ops_out():
    """checkpoint_region_us, checked against the formula by hand: the chain (4 layers,
    2 microbatches: 8 regions) steps 3 ms plain, 8 ms full, 5 ms selective; with 8 us per
    training op, a region costs (t - t_none)/8 - n_ops x 8 us, n_ops the cost model's
    recomputed ops of one chain layer (full: a whole layer forward; selective: core
    attention), under the runtime's transforms (fused attention merges the score ops)."""
    rt = RuntimeSettings(flash_attention=True)
    n_full = len(transform_ops(fl.recompute_ops(CHAIN_MODEL, 1, 1, False, "full", 4), rt))
    n_sel = len(transform_ops(fl.recompute_ops(CHAIN_MODEL, 1, 1, False, "selective", 4), rt))
    assert CHAIN_MODEL.num_layers * CHAIN_MICROBATCHES == 8 and n_sel == 1 and n_full > n_sel
    got = checkpoint_region_us([3e-3, 8e-3, 5e-3], 8e-6, rt)
    assert got["full"] == pytest.approx(5e-3 / 8 * 1e6 - n_full * 8.0)
    assert got["selective"] == pytest.approx(2e-3 / 8 * 1e6 - n_sel * 8.0)
    # A step measured faster with checkpointing than without (noise) is no negative cost.
    assert checkpoint_region_us([3e-3, 2.9e-3, 3e-3], 8e-6, replace(rt, flash_attention=False)) == \
        {"full": 0.0, "selective": 0.0}
