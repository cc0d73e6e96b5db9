"""The per-microbatch host cost (RuntimeSettings.microbatch_host_us): what the simulator
charges for it, how calibration separates it from the per-op cost, and that the two
agree end to end."""
from __future__ import annotations

import pytest

from costmodel.profile import RuntimeSettings
from costmodel.shapes import ModelSpec
from sim.core_sharing import slowed_profile
from sim.metrics import simulate
from specs.plan import resolve_plan
from specs.topology import load_topology
from validate.bench_record import MicrobenchResult, OverheadSample
from validate.calibrate import per_op_overheads
from validate.host_draws import (CHAIN_MICROBATCHES, MICROBATCH_SHAPES, chain_op_counts, chain_ops,
                                  microbatch_host_fit, microbatch_ops)
from validate.microbench import fit_draw_figures, train_per_op_s
from validate.profile_file import runtime_facts
from engine_fixtures import worker_profile

TINY = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)
# The runtime calibration counts the chain's ops under on a CPU (validate/calibrate.py).
CPU_RT = RuntimeSettings(**runtime_facts("cpu"))


@pytest.mark.parametrize("plan_text,chunk_microbatches", [
    ("dp=1,mbs=1,precision=fp32", 16),  # one chunk, 16 sequences of mbs 1
    ("dp=1,mbs=4,precision=fp32", 4),  # the same sequences in 4 microbatches
])
def test_each_microbatch_adds_its_host_time_to_the_step(plan_text, chunk_microbatches):
    """One device issuing its own ops (launch_blocking, as a CPU worker), one chunk: the
    step grows by microbatches x the figure, by hand: tiny's 16 sequences at mbs=1 are 16
    microbatches, 250 us each -> 4 ms; at mbs=4, 4 microbatches -> 1 ms (the cost is per
    microbatch, not per sequence)."""
    cluster = load_topology("localhost-cpu", gpus_per_node=1)
    plan = resolve_plan(plan_text, TINY, 1)
    base = simulate(TINY, plan, cluster, worker_profile(launch_blocking=True))
    got = simulate(TINY, plan, cluster, worker_profile(launch_blocking=True, microbatch_host_us=250.0))
    assert got.step_time_s - base.step_time_s == pytest.approx(chunk_microbatches * 250e-6, rel=1e-9)


def test_every_chunk_of_an_interleaved_stage_pays_it():
    """Interleaving gives each stage vpp chunks, each run once per microbatch: with pp=2,
    vpp=2 (one layer a chunk) a stage runs 2 x 16 chunk-microbatches, twice the calls of
    1F1B's one chunk, so the figure adds more to the interleaved step than to 1F1B's
    (the critical path crosses both stages, so the exact sum is the schedule's; the
    ordering is what the mechanism says)."""
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    prof0, prof1 = worker_profile(launch_blocking=True), worker_profile(launch_blocking=True, microbatch_host_us=500.0)
    grow = {}
    for sched, extra in (("1f1b", ""), ("interleaved", ",vpp=2")):
        plan = resolve_plan(f"pp=2,mbs=1,schedule={sched}{extra},precision=fp32", TINY, 2)
        grow[sched] = simulate(TINY, plan, cluster, prof1).step_time_s - simulate(TINY, plan, cluster, prof0).step_time_s
    assert grow["1f1b"] >= 16 * 500e-6 * (1 - 1e-9)
    assert grow["interleaved"] > grow["1f1b"] * 1.5


def test_it_hides_under_asynchronous_kernels():
    """With asynchronous launches (a GPU's host runs ahead) the per-microbatch host time
    counts only where the host is the bottleneck, as any host time: an A100's layer of a
    16k-wide model takes far longer than 200 us of host work, so the step does not
    change; a launch-blocking device pays it in full."""
    big = ModelSpec("wide", 2, 16384, 128, 2048, 51200, 8)
    cluster = load_topology("dgx-a100", nodes=1)
    plan = resolve_plan("dp=8,mbs=1", big, 8)
    assert simulate(big, plan, cluster, worker_profile(launch_blocking=False, microbatch_host_us=200.0)).step_time_s \
        == pytest.approx(simulate(big, plan, cluster, worker_profile(launch_blocking=False)).step_time_s, rel=1e-12)


def test_slowed_profile_scales_it():
    """A device at 1/f speed pays f times the per-microbatch host time, as every other
    host cost."""
    assert slowed_profile(worker_profile(microbatch_host_us=100.0), 1.5).runtime.microbatch_host_us == 150.0


def test_fit_solves_both_costs_by_hand():
    """microbatch_host_fit against numbers worked by hand: the chain at 4 layers x 2
    microbatches (236 ops) and 1 layer x 8 (320 ops), 12 us an op and 100 us a microbatch:
    236 x 12 + 2 x 100 = 3,032 us and 320 x 12 + 8 x 100 = 4,640 us."""
    assert MICROBATCH_SHAPES == ((4, 2), (1, 8))
    got = microbatch_host_fit([3032e-6, 4640e-6], [236, 320])
    assert got["us"] == pytest.approx(100.0) and got["per_op_us"] == pytest.approx(12.0)


def test_fit_never_negative():
    """A draw where the shorter chain's microbatches cost nothing extra (4,640 us would
    need -100 us a microbatch at 14.5 us an op) keeps the per-op reading: F = 0, a = the
    first shape's time over its ops."""
    got = microbatch_host_fit([236 * 14.5e-6, 320 * 14.5e-6 - 800e-6], [236, 320])
    assert got["us"] == 0.0 and got["per_op_us"] == pytest.approx(14.5)


def test_shapes_op_counts_are_the_chains():
    """The first shape is the overhead chain itself (chain_op_counts), and under the CPU
    runtime the two shapes' steps count 236 and 320 ops: 118 and 40 a microbatch, the
    figures the session-21 chain experiment counted with its own copy of the op lists
    (results/validate-cpu-2026-12-06-s21/ab/chainexp.py, chain-out.txt)."""
    assert microbatch_ops(CPU_RT)[0] == chain_op_counts(CPU_RT)[1]
    assert microbatch_ops(CPU_RT) == [236, 320]
    assert (chain_ops(4, 1, CPU_RT)[1], chain_ops(1, 1, CPU_RT)[1]) == (118, 40)


def _record(train_s: float, plain_s: float, draws: list) -> MicrobenchResult:
    n_fwd, n_train = chain_op_counts(CPU_RT)
    return MicrobenchResult(world=2, backend="gloo", threads=1,
                            overhead=[OverheadSample("plain", n_fwd, plain_s), OverheadSample("train", n_train, train_s)],
                            microbatch_draws=draws, microbatch_ops=microbatch_ops(CPU_RT))


def test_calibration_takes_the_microbatches_out_of_the_per_op_cost():
    """With the per-microbatch figure measured, host_overhead_us is the training chain's
    per-op cost less its CHAIN_MICROBATCHES microbatches' share, less the plain per-op
    cost, by hand: 236 ops in 3,300 us with 100 us a microbatch -> (3,300 - 2 x 100) / 236
    = 13.136 us an op; 46 plain ops in 368 us -> 8 us; host 5.136 us. Without the draws,
    as before: 3,300 / 236 - 8 = 5.983 us."""
    n_fwd, n_train = chain_op_counts(CPU_RT)
    assert (n_fwd, n_train) == (46, 236) and CHAIN_MICROBATCHES == 2
    n_a, n_b = microbatch_ops(CPU_RT)
    assert (n_a, n_b) == (236, 320)
    draws = [[n_a * 12e-6 + 2 * 100e-6, n_b * 12e-6 + 8 * 100e-6]] * 3
    res = fit_draw_figures(_record(3300e-6, 46 * 8e-6, draws))
    assert res.microbatch_host["us"] == pytest.approx(100.0)
    assert train_per_op_s(res) * 1e6 == pytest.approx((3300 - 200) / 236)
    kern, host = per_op_overheads(res)
    assert kern == pytest.approx(8.0) and host == pytest.approx((3300 - 200) / 236 - 8.0)
    old = fit_draw_figures(_record(3300e-6, 46 * 8e-6, []))
    assert old.microbatch_host == {} and per_op_overheads(old)[1] == pytest.approx(3300 / 236 - 8.0)


def test_cuda_calibration_gives_the_host_its_whole_per_op_cost():
    """On a CUDA device (the record's device_kernel_s measured) the host issues kernels
    asynchronously and the cost model takes the longer of device and host time
    (costmodel/efficiency.ops_time_s), so the host's per-op figure is the training chain's
    whole per-op cost and the device's the kernel time it measured. By hand, the record of
    test_calibration_takes_the_microbatches_out_of_the_per_op_cost with a 3 us kernel:
    kernel 3 us, host (3,300 - 200) / 236 = 13.136 us an op. Priced back, 100 work-free
    ops cost 1,313.6 us on the GPU's asynchronous runtime, the same as on the CPU's
    blocking one with the CPU record's split (8 us + 5.136 us): the chain costs what the
    host measured either way."""
    from dataclasses import replace

    from costmodel.efficiency import GpuEfficiency, ops_time_s
    from costmodel.flops import Op
    from costmodel.gpus import GPU_CATALOG
    n_a, n_b = microbatch_ops(CPU_RT)
    draws = [[n_a * 12e-6 + 2 * 100e-6, n_b * 12e-6 + 8 * 100e-6]] * 3
    cpu = fit_draw_figures(_record(3300e-6, 46 * 8e-6, draws))
    cuda = replace(cpu, backend="nccl", device_kernel_s=3e-6)
    kern, host = per_op_overheads(cuda)
    assert kern == pytest.approx(3.0) and host == pytest.approx((3300 - 200) / 236)
    ops = [Op("tiny", "memory", 0.0, 0.0)] * 100
    gpu = GPU_CATALOG["H100-SXM5-80GB"]
    priced = {}
    for name, rec in (("cpu", cpu), ("cuda", cuda)):
        k, h = per_op_overheads(rec)
        rt = RuntimeSettings(**{**runtime_facts(name), "host_overhead_us": h})
        priced[name] = ops_time_s(ops, gpu, GpuEfficiency(kernel_overhead_us=k), "fp32", rt)
    assert priced["cuda"] == pytest.approx(100 * (3300 - 200) / 236 * 1e-6)
    assert priced["cpu"] == pytest.approx(priced["cuda"])


def test_calibration_inverts_what_the_simulator_charges():
    """Two independent computations agree: the simulator's step for the chain's two
    shapes on one launch-blocking device, with a per-op cost and a per-microbatch cost
    (and nothing else charged per op), fed back through microbatch_host_fit, gives back
    the per-microbatch figure it was built with."""
    from dataclasses import replace

    from validate.host_draws import CHAIN_MODEL
    cluster = load_topology("localhost-cpu", gpus_per_node=1)
    prof = worker_profile(launch_blocking=True, microbatch_host_us=180.0, host_overhead_us=9.0)
    steps = []
    for L, mb in MICROBATCH_SHAPES:
        m = replace(CHAIN_MODEL, num_layers=L, global_batch_size=mb)
        plan = resolve_plan("dp=1,mbs=1,precision=fp32", m, 1)
        base = simulate(m, plan, cluster, replace(prof, runtime=replace(prof.runtime, microbatch_host_us=0.0,
                                                                        host_overhead_us=0.0)))
        got = simulate(m, plan, cluster, prof)
        steps.append(got.step_time_s - base.step_time_s)  # what the host costs add
    ops = microbatch_ops(prof.runtime)
    fit = microbatch_host_fit(steps, ops)
    assert fit["us"] == pytest.approx(180.0, rel=1e-6)
    assert fit["per_op_us"] == pytest.approx(9.0, rel=1e-6)
