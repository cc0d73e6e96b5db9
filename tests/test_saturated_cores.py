"""Collectives started beside compute on a host whose cores all compute
(sim/core_sharing.cores_saturated: CPU worker processes, as many as cores) make next to
no progress until their rank waits, so the simulator runs them blocking: ZeRO-3's gathers
and reduce-scatters, the context-parallel ring's exchanges. Worked by hand."""
from __future__ import annotations

import pytest

from costmodel.profile import Profile
from costmodel.shapes import ModelSpec
from sim.core_sharing import cores_saturated
from specs.plan import resolve_plan
from specs.topology import load_topology
from engine_fixtures import worker_profile

TINY = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)


def _cpu_profile(host_cores: int) -> Profile:
    """Worker processes on a host of ``host_cores`` cores; collectives cost 1 ms a call plus
    their bytes at the loopback's 10 GB/s, no hop latency, nothing else."""
    return worker_profile(bw_eff=1.0, call_latency_us=1000.0, hop_latency_us=0.0, host_cores=host_cores)


def test_saturated_cores_run_fsdp_collectives_blocking():
    """Two worker processes on two cores (sim/core_sharing.cores_saturated): every ZeRO-3
    gather and reduce-scatter of tiny at dp=2 is exposed, by hand. A 2-rank ring moves half
    the buffer: a layer unit (793,088 B fp32) 1000 + 39.654 us, the outer unit (295,936 B)
    1000 + 14.797 us. A microbatch gathers each of the 5 units forward and backward and
    reduce-scatters each after its backward: 3 x (1014.797 + 4 x 1039.654) = 15,520.2 us;
    8 microbatches a replica: 124.16 ms of exposed 'dp'. With four cores the gathers are
    prefetched behind compute and less is exposed."""
    from sim.metrics import simulate
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    plan = resolve_plan("dp=2,zero=3,precision=fp32", TINY, 2)
    layer = 1000 + 0.5 * 793_088 / 10e9 * 1e6
    outer = 1000 + 0.5 * 295_936 / 10e9 * 1e6
    per_mb = 3 * (outer + 4 * layer)
    assert per_mb == pytest.approx(15_520.2, abs=0.1)
    got = simulate(TINY, plan, cluster, _cpu_profile(2))
    assert got.breakdown["dp"] == pytest.approx(8 * per_mb * 1e-6, rel=1e-6)
    free = simulate(TINY, plan, cluster, _cpu_profile(4))
    assert free.breakdown["dp"] < got.breakdown["dp"] - 0.02


def test_saturated_cores_run_the_cp_ring_blocking():
    """The same rule for context parallelism's ring (sim/pipeline_executor._compute): on two
    cores with two processes each layer's K/V exchange is sent and waited for before its
    block computes, one call per layer and ring step, as the runner makes them. tiny at
    cp=2: a rank holds 32 tokens; a K/V block is 2 x 32 x 128 x 4 B = 32,768 B forward,
    twice that backward (K/V and their gradients); one ring step a layer each way at 1 ms
    a call plus the bytes at 10 GB/s: 4 layers x (1003.2768 + 1006.5536) us a microbatch,
    16 microbatches: 128.63 ms of exposed 'cp', by hand. With four cores it hides behind
    the blocks' compute."""
    from sim.metrics import simulate
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    plan = resolve_plan("cp=2,precision=fp32", TINY, 2)
    per_mb = 4 * ((1000 + 32_768 / 10e9 * 1e6) + (1000 + 65_536 / 10e9 * 1e6))
    assert 16 * per_mb == pytest.approx(128_629.1, abs=0.1)
    got = simulate(TINY, plan, cluster, _cpu_profile(2))
    assert got.breakdown["cp"] == pytest.approx(16 * per_mb * 1e-6, rel=1e-6)
    free = simulate(TINY, plan, cluster, _cpu_profile(4))
    assert free.breakdown["cp"] < got.breakdown["cp"] - 0.05


def test_saturation_needs_as_many_processes_as_cores():
    """Two processes on two cores saturate them, on four they do not; devices that are not
    host processes (no host_cores, or asynchronous launches) never do."""
    two = load_topology("localhost-cpu", gpus_per_node=2)
    assert cores_saturated(two, _cpu_profile(2)) and not cores_saturated(two, _cpu_profile(4))
    assert not cores_saturated(two, _cpu_profile(0))
