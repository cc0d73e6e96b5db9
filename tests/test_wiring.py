"""Tests that catch wrong wiring (issue 8): each pins one behaviour end to end, through the
engine run that ``simulate`` does or through the search, to a number worked out by hand
or to an independent computation, so that a one-token change to the source fails here.

Mutations each test was checked against (applied by hand, test run, reverted):
- weighted max-min: ``used += w * level`` -> ``used += level`` in sim/flownet.py;
- top-k entry bytes 6 -> 8;
- gradient-reduction dtype for bf16 (fp32, 4 B) -> 2 B;
- the search's out-of-memory prune threshold;
- the recompute-dominance prune inverted (prunes the plan with less recompute);
and the search's best against every plan of a small space simulated.
"""
from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest
import simpy

from costmodel.gpus import get_gpu
from costmodel.profile import GpuEfficiency, Profile, load_profile
from costmodel.shapes import ModelSpec
from engine_fixtures import IDEAL, fixed_program, run_engine
from search import search as S
from sim.flownet import FlowNetwork
from sim.metrics import simulate
from specs.plan import resolve_plan
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"
GIB = 2.0 ** 30


# ------------------------------------------------------------------ weighted max-min
def test_weighted_max_min_by_hand():
    """Edges A (12 B/s) and B (4 B/s). Flow f1 crosses A and B with multiplicity 2 on both
    (it stands for two identical flows); flow f2 crosses only A, multiplicity 1.
    Progressive filling: B's fair share is 4 / 2 = 2, A's is 12 / (2 + 1) = 4, so B binds
    first and f1 freezes at 2 B/s per copy. Its two copies take 2 x 2 = 4 B/s of A, leaving
    12 - 4 = 8 B/s for f2. With f1 = 4 B and f2 = 16 B both finish at t = 2 s.
    (Counting f1 once on A would give f2 10 B/s and a finish at 1.6 s.)"""
    g = nx.DiGraph()
    g.add_edge("a0", "a1", bw_Bps=12.0, latency_s=0.0)
    g.add_edge("a1", "b1", bw_Bps=4.0, latency_s=0.0)
    env = simpy.Environment()
    net = FlowNetwork(env, g)
    done = {}

    def go(name, path, nbytes, mult):
        yield net.transfer(path, nbytes, mult, label=name)
        done[name] = env.now

    env.process(go("f1", [("a0", "a1"), ("a1", "b1")], 4.0, {("a0", "a1"): 2, ("a1", "b1"): 2}))
    env.process(go("f2", [("a0", "a1")], 16.0, None))
    env.run()
    assert done == {"f1": pytest.approx(2.0, rel=1e-12), "f2": pytest.approx(2.0, rel=1e-12)}
    # Bytes carried count every copy: 2 x 4 B of f1 plus 16 B of f2 on A.
    assert net.bytes_carried[("a0", "a1")] == pytest.approx(24.0)


def _three_node_cluster(tmp_path):
    """Node a: 3 GPUs behind one 10 GB/s NIC; node b: 1 GPU, one 10 GB/s NIC; node c: 2 GPUs
    behind one 4 GB/s NIC; PCIe 50 GB/s, NVSwitch 100 GB/s, one leaf, no latency."""
    def nt(gpus, gbps):
        return (f"{{gpu: A100-SXM4-80GB, gpus_per_node: {gpus}, intra: {{kind: nvswitch, bw_GBps: 100, "
                f"latency_us: 0}}, pcie: {{bw_GBps: 50, latency_us: 0}}, nics: {{count: 1, bw_gbps: {gbps}, "
                "latency_us: 0}}")
    f = tmp_path / "three-nodes.yaml"
    f.write_text("name: three-nodes\nnode_types:\n"
                 f"  a: {nt(3, 80)}\n  b: {nt(1, 80)}\n  c: {nt(2, 32)}\n"
                 "groups:\n  - {name: ga, node_type: a, nodes: 1}\n  - {name: gb, node_type: b, nodes: 1}\n"
                 "  - {name: gc, node_type: c, nodes: 1}\n"
                 "network: {kind: fat_tree, nodes_per_leaf: 4, oversubscription: 1.0, switch_latency_us: 0}\n")
    return load_topology(str(f))


def test_weighted_sharing_sets_the_step_time(tmp_path):
    """pp=2, dp=3, placement tp-dp-pp on the three-node cluster: stage 0 of all replicas on
    node a (ranks 0-2), stage 1 on ranks 3 (node b), 4, 5 (node c). mb_shares 2:1:1 makes
    two simulated classes: replica 0 (2 microbatches, sends 0 -> 3) and replicas 1, 2 (one
    microbatch, simulated as 1 -> 4 with multiplicity 2 on the NIC links).
    f = 1 s, b = 2 s, P = 1.2 GB per send. At t = 1 both classes send their first
    activation out of node a's NIC (10 GB/s). Class 1-2 is bound by node c's NIC: 4 / 2 =
    2 GB/s per copy, taking 2 x 2 = 4 GB/s of node a's NIC, so replica 0's send gets the
    other 6 GB/s: P / 6 = 0.2 s. Its later sends run alone at 10 GB/s: P / 10 = 0.12 s.
    Replica 0 (1F1B, p = 2, m = 2) is the critical path:
    F0(s0) + act0 + F0 B0 F1 B1 (s1) + grad1 + B1(s0) = 1 + 0.2 + 6 + 0.12 + 2 = 9.32 s;
    class 1-2 takes 2f + 2b + 2 x P / 2 GB/s = 7.2 s."""
    cluster = _three_node_cluster(tmp_path)
    model = ModelSpec("tiny", 4, 1024, 16, 512, 32000, 4)
    prog = fixed_program(cluster, model, "pp=2,dp=3,mbs=1,placement=tp-dp-pp,mb_shares=2:1:1",
                         1.0, 2.0, (), 1.2e9)
    assert [p.dp_indices for p in prog.pipelines] == [(0,), (1, 2)]
    step, res = run_engine(prog)
    assert step == pytest.approx(9.32, rel=1e-9)
    assert res.step_time_s == pytest.approx(9.32, rel=1e-9)


# ------------------------------------------------------------------ top-k entry bytes
def test_topk_exchange_time_by_hand():
    """compress=topk:0.01 on the two-node cluster (each GPU its own 10 GB/s NIC), tp=2, dp=2
    across the nodes, no overlap, one gradient bucket of E = 1e9 elements. Each rank keeps
    nnz = 0.01 E = 1e7 entries of 8 B (int32 index + the value in the bf16 plan's fp32
    main-gradient buffer) and the 2-rank ring all-gather sends (n - 1) nnz x 8 B = 8e7 B:
    8 ms at 10 GB/s. Then the dense buffer is rebuilt: zero 4 B per element and scatter-add
    every gathered entry, both ranks' (2 nnz; read 8 B, read-modify-write one fp32, 8 B):
    (4 E + 2 nnz (8 + 8)) / HBM = 4.32e9 B / 2.039 TB/s
    (A100-80GB datasheet, HBM at full rate in this profile, no kernel overhead).
    Exposed 'dp' is their sum; backward and forward are 0 so the rest is top-k selection."""
    hbm = Profile(gpus={"default": GpuEfficiency(hbm_eff=1.0, kernel_overhead_us=0.0)},
                  fabrics=IDEAL.fabrics)
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("tiny", 4, 1024, 16, 512, 32000, 4)
    E = 1e9
    prog = fixed_program(cluster, model, "tp=2,dp=2,mbs=2,compress=topk:0.01,overlap_grad_reduce=false",
                         0.0, 0.0, (4 * E,), 0.0, params=E)
    prog.profile = hbm
    step, res = run_engine(prog)
    hbm_Bps = get_gpu("A100-SXM4-80GB").mem_bw_Bps
    assert hbm_Bps == pytest.approx(2039e9)
    dp = 8e7 / 1e10 + (4 * E + 2 * 1e7 * (8 + 8)) / hbm_Bps
    assert res.exposed_comm_s["dp"] == pytest.approx(dp, rel=1e-9)
    assert step == pytest.approx(res.breakdown["compute"] + dp, rel=1e-9)


def test_topk_selection_waits_for_the_slowest_replica():
    """The same plan (one bucket of E = 1e9 elements, dp=2, no overlap) with 1 ns/element of
    selection: 1 s per selection. With topk_select_cv = 0.5 the sparse all-gather starts
    when the slower of the 2 replicas has selected, on average 1 s x (1 + 0.5 x e2) with
    e2 = Phi^-1(1.625 / 2.25) = 0.5895 (Blom's expected maximum of 2 standard normals), so
    the step grows by exactly 0.5 x 0.5895 s against cv = 0 and nothing else moves."""
    from statistics import NormalDist
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("tiny", 4, 1024, 16, 512, 32000, 4)
    E = 1e9
    steps = []
    for cv in (0.0, 0.5):
        prog = fixed_program(cluster, model, "tp=2,dp=2,mbs=2,compress=topk:0.01,overlap_grad_reduce=false",
                             0.0, 0.0, (4 * E,), 0.0, params=E)
        prog.profile = Profile(gpus={"default": GpuEfficiency(hbm_eff=1.0, kernel_overhead_us=0.0,
                                                              topk_select_ns_per_elem=1.0, topk_select_cv=cv)},
                               fabrics=IDEAL.fabrics)
        steps.append(run_engine(prog)[0])
    e2 = NormalDist().inv_cdf(1.625 / 2.25)
    assert e2 == pytest.approx(0.5895, abs=1e-4)
    assert steps[1] - steps[0] == pytest.approx(0.5 * e2 * 1.0, rel=1e-9)


# ------------------------------------------------------------------ gradient dtype
def test_bf16_gradients_are_reduced_in_fp32_end_to_end():
    """simulate (real program, ideal links) of tp=2, dp=2 across the two-node cluster in
    bf16, no overlap: the gradients are all-reduced in fp32 (Megatron-LM's default
    accumulate_allreduce_grads_in_fp32 for bf16), 4 B per parameter, twice the 2 B bf16
    weights. A 2-rank ring all-reduce sends the whole buffer S once each way, over one GPU's
    own 10 GB/s NIC: the NIC link carries S = 2 x weight bytes and the exposed 'dp' time is
    S / 10 GB/s. fp16 training reduces fp16 gradients: S = weight bytes."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("tiny", 4, 1024, 16, 512, 32000, 8)
    for precision, grad_per_weight in (("bf16", 2.0), ("fp16", 1.0)):
        plan = resolve_plan(f"tp=2,dp=2,mbs=2,overlap_grad_reduce=false,precision={precision}", model, 4)
        res = simulate(model, plan, cluster, IDEAL)
        weights = res.devices[0].memory_gib["weights"] * GIB  # 2 B per parameter
        S = grad_per_weight * weights
        nic = {r["link"]: r["bytes"] for r in res.busiest_links}["n0.nic0->leaf0"]
        # memory_gib is rounded to 1e-4 GiB: S is known to +- 1e-4 GiB (0.06 % here).
        assert nic == pytest.approx(S, abs=1e-4 * GIB), precision
        assert res.exposed_comm_s["dp"] == pytest.approx(S / 1e10, abs=1e-4 * GIB / 1e10), precision


# ------------------------------------------------------------------ the search
PROFILE = load_profile(None)
# Small enough to simulate every plan of a restricted space on one 8-GPU node in seconds.
SMALL = ModelSpec("small", 8, 1024, 16, 1024, 32000, 16)
# 7.6 B parameters (24 layers, hidden 5120): without sharding the weights, fp32 gradients
# and Adam states (18 B/parameter) do not fit in 80 GiB, so memory and recompute matter.
MID = ModelSpec("mid", 24, 5120, 40, 2048, 32000, 16)


def _space(**kw):
    base = dict(mbs=(1, 2), schedules=("1f1b",), vpp=(2,), recompute=("none", "selective", "full"),
                zero=(0, 1), compress=("none",), allreduce=("ring",),
                overlap_step=())  # synchronous plans only: the space these tests enumerate by hand
    base.update(kw)
    return S.SearchSpace(**base)


def _peak_of(model, plan_text, cluster):
    return simulate(model, resolve_plan(plan_text, model, cluster.num_devices), cluster, PROFILE).peak_memory_gib


def test_out_of_memory_prune_at_the_capacity():
    """Two models that differ by one vocabulary entry, found by bisection so that the
    simulator puts plain data parallelism of the one just under 80 GiB and of the other
    just over (within 0.01 GiB; the embedding and its gradient and Adam states grow with
    the vocabulary): the search keeps and simulates the first as fitting, and prunes the
    second as 'out of memory'. A prune threshold moved by any slack fails one side."""
    cluster = load_topology("dgx-a100", nodes=1)
    plan = "tp=1,pp=1,dp=8,mbs=1"
    space = _space(mbs=(1,), recompute=("none",), zero=(0,), tp=(1,), pp=(1,))

    def model(vocab):
        return ModelSpec("edge", 2, 4096, 32, 2048, vocab, 8)

    cap = get_gpu("A100-SXM4-80GB").mem_bytes / GIB
    lo, hi = 1000, 4_000_000
    assert _peak_of(model(lo), plan, cluster) < cap < _peak_of(model(hi), plan, cluster)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _peak_of(model(mid), plan, cluster) <= cap:
            lo = mid
        else:
            hi = mid
    below, above = _peak_of(model(lo), plan, cluster), _peak_of(model(hi), plan, cluster)
    assert cap - 0.01 < below <= cap < above < cap + 0.01
    fits = S.search(model(lo), cluster, PROFILE, progress=False, space=space)
    # (The ranked list also holds the compressed variants the compression note simulates.)
    assert fits.ranked[0].plan == resolve_plan(plan, model(lo), 8).to_string()
    assert fits.ranked[0].fits_memory and S.R_OOM not in fits.pruned
    with pytest.raises(S.NoPlanFits) as oom:
        S.search(model(hi), cluster, PROFILE, progress=False, space=space)
    assert oom.value.pruned == {S.R_OOM: 1}
    assert oom.value.closest == resolve_plan(plan, model(hi), 8).to_string()
    assert 0 < oom.value.shortfall_gib < 0.01


def test_search_prefers_no_recompute_when_it_fits():
    """SMALL fits on one node without recompute, so recomputation only adds backward work:
    the search's best has recompute=none, every recompute=selective/full plan is pruned as
    dominated, and the best is faster than the same plan with full recompute."""
    cluster = load_topology("dgx-a100", nodes=1)
    res = S.search(SMALL, cluster, PROFILE, progress=False, space=_space())
    best = res.ranked[0]
    assert "recompute=" not in best.plan
    assert all("recompute=" not in r.plan for r in res.ranked)
    assert res.pruned[S.R_RECOMPUTE] > 0
    full = simulate(SMALL, resolve_plan(best.plan + ",recompute=full", SMALL, 8), cluster, PROFILE)
    assert full.fits_memory and full.step_time_s > best.step_time_s


def _all_plans(model, n, space):
    """Every plan string of the space that the plan parser accepts (independent of the
    search's enumeration and pruning)."""
    from costmodel.errors import InputError
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if n % (tp * pp):
                continue
            for mbs in space.mbs:
                for rc in space.recompute:
                    for zero in space.zero:
                        for sp in ((False, True) if tp > 1 else (False,)):
                            text = f"tp={tp},pp={pp},mbs={mbs},recompute={rc},zero={zero},sp={str(sp).lower()}"
                            try:
                                out.append(resolve_plan(text, model, n))
                            except InputError:
                                pass
    return out


def test_search_best_is_the_true_best_of_the_space():
    """On one 8-GPU node, every plan of the space (tp, pp in 1..8, mbs 1-2, 1F1B, sp,
    recompute none/selective/full, ZeRO 0-1) of MID is simulated, 192 plans of which
    some do not fit; the search's best plan has the smallest step time of all that fit
    (ties within 1e-9 relative)."""
    cluster = load_topology("dgx-a100", nodes=1)
    space = _space()
    res = S.search(MID, cluster, PROFILE, progress=False, space=space)
    plans = _all_plans(MID, 8, space)
    assert len(plans) == 192
    results = [simulate(MID, p, cluster, PROFILE) for p in plans]
    fitting = [r for r in results if r.fits_memory]
    assert 0 < len(fitting) < len(results)
    true_best = min(fitting, key=lambda r: (r.step_time_s, r.plan))
    assert res.ranked[0].step_time_s == pytest.approx(true_best.step_time_s, rel=1e-9), \
        (res.ranked[0].plan, true_best.plan)
