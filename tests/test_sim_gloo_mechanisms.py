"""Two simulator mechanisms the CPU validator needs: rendezvous pipeline sends (gloo's
TCP transport) and the tied-embedding gradient all-reduce between first and last stage."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from costmodel.profile import FabricEfficiency, GpuEfficiency, Profile, RuntimeSettings
from costmodel.shapes import ModelSpec
from engine_fixtures import fixed_program, run_engine
from sim.program import build_program
from specs.plan import resolve_plan
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"
CALL_S = 50e-6


def _prog(m: int, rendezvous: bool, p2p: float = 1e8, busy_us: float | None = None, idle_us: float | None = None,
          preposted_us: float | None = None, preposted_call_us: float | None = None):
    # two-nodes.yaml: pp=2 puts one stage per node; 1e8 B over a 10 GB/s NIC path.
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("t", 4, 1024, 16, 512, 32000, 2 * m)
    prog = fixed_program(cluster, model, "tp=2,pp=2,mbs=2,schedule=gpipe", 0.02, 0.04, p2p=p2p)
    prog.p2p_rendezvous = rendezvous
    # Full line rate, a per-call cost, so c = call + latency + bytes/bw.
    prog.profile = Profile(gpus={"default": GpuEfficiency()},
                           fabrics={"default": FabricEfficiency(bw_eff=1.0, call_latency_us=CALL_S * 1e6,
                                                                send_recv_posted_busy_us=busy_us,
                                                                send_recv_posted_idle_us=idle_us,
                                                                send_recv_preposted_us=preposted_us,
                                                                send_recv_preposted_call_us=preposted_call_us)})
    return prog, cluster


def test_rendezvous_send_waits_for_the_receive():
    """GPipe, p=2, m=2, forward f, backward b, transfer c (call + one path latency L +
    bytes/bw). Eager sends: step 3f + 3b + 2c. Rendezvous: stage 1 posts its receive of
    F1's activation at 2f + c, after stage 0 sent it at 2f, so the bytes leave only then
    and pay a notification hop first (c + L), F1 runs 2f+2c+L .. 3f+2c+L; stage 0 posted
    B0's receive long before, B0's gradient arrives one c after it is sent, B0 ends at
    3f+3c+L+2b, after stage 1 sent B1's gradient (3f+2c+L+2b): again c + L. The step
    grows by exactly 2(c + L); with m = 1 (every receive posted first) not at all."""
    base1, _ = run_engine(_prog(1, False)[0])
    rdv1, _ = run_engine(_prog(1, True)[0])
    assert rdv1 == pytest.approx(base1, rel=1e-12)
    f, b = 0.02, 0.04
    c = (base1 - 2 * f - 2 * b) / 2  # m = 1: step = 2f + 2b + 2c
    assert c > 0.01 + CALL_S * 0.999  # the 1e8 B / 10 GB/s and the call
    prog, cluster = _prog(2, False)
    base2, _ = run_engine(prog)
    rdv2, res = run_engine(_prog(2, True)[0])
    path = cluster.route(prog.pipelines[0].ranks[0], prog.pipelines[0].ranks[1])
    L = cluster.path_latency_s(path)
    assert rdv2 - base2 == pytest.approx(2 * (c + L), rel=1e-9)
    assert res.breakdown["pp"] > 0


def test_posted_first_receive_costs_what_its_blocked_sender_measured():
    """The same GPipe step (p=2, m=2) with the posted-first receive measured whole: stage 1
    asks for F1's activation at 2f + c, when stage 0 has sent it (2f) and blocks on B0's
    gradient; stage 0 asks for B1's gradient after stage 1's last action. Both senders
    are blocked, so each of the two receives costs the idle figure Y plus the bytes (B =
    1e8 B / 10 GB/s) in place of c + L: the step is base + 2(Y + B), whatever the busy
    figure (0.5 s here: never used)."""
    base, _ = run_engine(_prog(2, False)[0])
    base1, _ = run_engine(_prog(1, False)[0])
    f, b = 0.02, 0.04
    c = (base1 - 2 * f - 2 * b) / 2
    prog, cluster = _prog(2, False)
    L = cluster.path_latency_s(cluster.route(prog.pipelines[0].ranks[0], prog.pipelines[0].ranks[1]))
    nbytes_s = c - CALL_S - L
    assert nbytes_s == pytest.approx(0.01, rel=1e-3)
    y = 2e-3
    got, _ = run_engine(_prog(2, True, busy_us=5e5, idle_us=y * 1e6)[0])
    assert got - base == pytest.approx(2 * (y + nbytes_s), rel=1e-9)
    same, _ = run_engine(_prog(2, True, busy_us=1e3, idle_us=y * 1e6)[0])
    assert same == pytest.approx(got, rel=1e-12)


def test_posted_first_receive_from_a_computing_sender_costs_the_busy_figure():
    """GPipe, p=2, m=3, c < f < b: stage 1 asks for F1's activation at 2f + c while stage 0
    computes F2 (2f..3f), and stage 0 asks for the second gradient at T + c + b while stage
    1 still computes its third backward (T + b .. T + 2b, T its first gradient's send):
    two receives from a computing sender on the step's path. Changing the busy figure from
    X2 to X1 moves the step by exactly 2 (X1 - X2); the other late receives find their
    sender blocked or done in both runs (X1 = 0.5 s, X2 = 1 ms, idle 1 ms)."""
    x1, x2 = 0.5, 1e-3
    slow, _ = run_engine(_prog(3, True, busy_us=x1 * 1e6, idle_us=1e3)[0])
    fast, _ = run_engine(_prog(3, True, busy_us=x2 * 1e6, idle_us=1e3)[0])
    assert slow - fast == pytest.approx(2 * (x1 - x2), rel=1e-9)


def test_preposted_handoff_replaces_the_call_and_the_path_latency():
    """Every receive posted before its send (validate/pp.py; no rendezvous): a handoff
    measured whole as P (FabricEfficiency.send_recv_preposted_us) takes the place of the
    send's call cost and path latency, the bytes still crossing the link. GPipe, p=2,
    m=1: step = 2f + 2b + 2(call + L + B) without it, 2f + 2b + 2(P + B) with it, so the
    two differ by exactly 2(call + L - P). With m=2 the step is 3f + 3b + 2c (F0's
    activation and B1's gradient on its path; F1's arrives at 2f + c, as F0 ends on stage
    1, B0's while stage 0 runs B1), so again 2(call + L - P)."""
    p_s = 3e-3
    for m in (1, 2):
        prog, cluster = _prog(m, False)
        L = cluster.path_latency_s(cluster.route(prog.pipelines[0].ranks[0], prog.pipelines[0].ranks[1]))
        base, _ = run_engine(prog)
        pre, _ = run_engine(_prog(m, False, preposted_us=p_s * 1e6)[0])
        assert base - pre == pytest.approx(2 * (CALL_S + L - p_s), rel=1e-9)


def test_preposted_handoff_sender_call_on_the_sender_stream():
    """The sender's isend call C (send_recv_preposted_call_us) out of a handoff P: the
    sender's stream is busy C after each send, the message still arrives P (+ bytes) after
    the send began. GPipe p=2, f=0.02, b=0.04, c = P + bytes. m=1: stage 1's only send is
    its last act and stage 0's send overlaps stage 1's wait, so the step is unchanged. m=2
    (worked by hand): stage 0 ends F1 and its send at 2f+2C; F1's activation arrives at
    2f+C+c, so stage 1 runs F1 from there, B0 from 3f+C+c, sends (C), B1 from
    3f+2C+c+b; B1's gradient reaches stage 0 at 3f+2b+2C+2c, after B0 there; stage 0's B1
    ends at 3f+3b+2C+2c: the step grows by exactly 2C."""
    p_s, c_s = 3e-3, 1e-3
    for m, grows in ((1, 0.0), (2, 2 * c_s)):
        whole, _ = run_engine(_prog(m, False, preposted_us=p_s * 1e6)[0])
        split, _ = run_engine(_prog(m, False, preposted_us=p_s * 1e6, preposted_call_us=c_s * 1e6)[0])
        assert split - whole == pytest.approx(grows, abs=1e-12)


def test_preposted_call_must_not_exceed_the_handoff(tmp_path):
    """A profile whose sender's share exceeds the whole handoff (or has no handoff) is
    refused at load, naming the field."""
    from costmodel.errors import InputError
    from costmodel.profile import load_profile
    bad = tmp_path / "p.yaml"
    bad.write_text("fabrics:\n  default:\n    send_recv_preposted_us: 100\n    send_recv_preposted_call_us: 150\n")
    with pytest.raises(InputError, match="send_recv_preposted_call_us"):
        load_profile(str(bad))
    bad.write_text("fabrics:\n  default:\n    send_recv_preposted_call_us: 50\n")
    with pytest.raises(InputError, match="send_recv_preposted_call_us"):
        load_profile(str(bad))


def test_tied_embedding_allreduce_on_first_and_last_stage():
    """pp=2: after backward the first and last stages all-reduce the tied embedding's
    gradient, V*h/t fp32 values over 2 ranks: by the ring formula S/bw + 2 alpha + call
    (worked by hand on localhost-cpu: 512*128*4 B = 262144 B at 10 GB/s x bw_eff 0.5,
    alpha 10 us, call 50 us). In a GPipe step with m = 1 the last stage finishes first
    and waits; both then spend that time, so the step grows by it."""
    cluster2 = load_topology("localhost-cpu", gpus_per_node=2)
    prof = Profile(gpus={"default": GpuEfficiency()},
                   fabrics={"default": FabricEfficiency(bw_eff=0.5, call_latency_us=CALL_S * 1e6)},
                   runtime=RuntimeSettings(grad_reduce_dtype="fp32"))
    model = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)
    plan = resolve_plan("pp=2,precision=fp32", model, 2)
    prog = build_program(model, plan, cluster2, prof)
    expected = 512 * 128 * 4 / (10e9 * 0.5) + 2 * 10e-6 + CALL_S
    assert prog.pipelines[0].embedding_sync_s == pytest.approx(expected, rel=1e-9)
    assert build_program(model, resolve_plan("dp=2,precision=fp32", model, 2), cluster2,
                         prof).pipelines[0].embedding_sync_s == 0.0
    # An untied output layer (Llama) has no second copy to keep in step.
    untied = replace(model, tie_embeddings=False)
    assert build_program(untied, resolve_plan("pp=2,precision=fp32", untied, 2), cluster2,
                         prof).pipelines[0].embedding_sync_s == 0.0
    # In the engine: fixed compute, then the sync added by hand.
    fixed, _ = _prog(1, False)
    step0, _ = run_engine(fixed)
    e = 0.003
    fixed.pipelines[0].embedding_sync_s = e
    step1, res = run_engine(fixed)
    assert step1 - step0 == pytest.approx(e, rel=1e-9)
    assert res.exposed_comm_s["dp"] >= e * (1 - 1e-9)


def test_embedding_allreduce_waits_for_the_drifted_stage():
    """The tied embedding's all-reduce closes both stages' backward, so, like the bucket
    reduction that closes a replica's, it waits runtime.straggler_us for the stage that
    drifted behind (costmodel/estimate.closing_straggler_s over a group of 2). Fixed
    compute, GPipe p=2 m=1, a 3 ms sync by hand, dp=1 (no gradient reduction to carry
    it): 2 ms of straggle adds exactly 2 ms to the step, all of it exposed 'dp'; with
    no embedding sync (pp=1's case) the straggle adds nothing."""
    from dataclasses import replace as _replace
    fixed, _ = _prog(1, False)
    fixed.pipelines[0].embedding_sync_s = 0.003
    step0, res0 = run_engine(fixed)
    fixed.profile = _replace(fixed.profile, runtime=_replace(fixed.profile.runtime, straggler_us=2000.0))
    step1, res1 = run_engine(fixed)
    assert step1 - step0 == pytest.approx(0.002, rel=1e-9)
    assert res1.exposed_comm_s["dp"] - res0.exposed_comm_s["dp"] == pytest.approx(0.002, rel=1e-6)
    fixed.pipelines[0].embedding_sync_s = 0.0
    step2, _ = run_engine(fixed)
    fixed.profile = _replace(fixed.profile, runtime=_replace(fixed.profile.runtime, straggler_us=0.0))
    step3, _ = run_engine(fixed)
    assert step2 == pytest.approx(step3, rel=1e-12)


def test_each_collective_pays_its_own_call_cost():
    """A fabric's per-collective call cost replaces the generic one for that collective
    only. tiny at tp=2 on localhost-cpu without SP and without the backward overlap: a
    layer's forward has 2 all-reduces and its backward 2, each the ring formula plus the
    call. Raising all_reduce_call_us from the generic 50 us to 1250 us adds 2 x 1200 us
    to each direction; all-gather's own figure (the pipeline and SP paths) is untouched;
    an unset op (broadcast, None) pays call_latency_us."""
    from sim.tp_comm import tp_layer_comm_s
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    base = FabricEfficiency(bw_eff=0.5, call_latency_us=50.0)
    dear = FabricEfficiency(bw_eff=0.5, call_latency_us=50.0, all_reduce_call_us=1250.0)
    assert dear.call_s("all_reduce") == pytest.approx(1250e-6)
    assert dear.call_s("all_gather") == dear.call_s(None) == dear.call_s("broadcast") == pytest.approx(50e-6)
    rt = RuntimeSettings(tp_bwd_overlap=False)
    out = []
    for fab in (base, dear):
        prof = Profile(gpus={"default": GpuEfficiency()}, fabrics={"default": fab}, runtime=rt)
        out.append(tp_layer_comm_s(cluster, prof, [0, 1], 64 * 128 * 4, False, "none", [], None, None, "fp32"))
    (f0, b0), (f1, b1) = out
    assert f1 - f0 == pytest.approx(2 * 1200e-6, rel=1e-9)
    assert b1 - b0 == pytest.approx(2 * 1200e-6, rel=1e-9)
    # SP: all-gathers and reduce-scatters only, so the all-reduce's figure changes nothing.
    sp = [tp_layer_comm_s(cluster, Profile(gpus={"default": GpuEfficiency()}, fabrics={"default": fab}, runtime=rt),
                          [0, 1], 64 * 128 * 4, True, "none", [], None, None, "fp32") for fab in (base, dear)]
    assert sp[0] == sp[1]


def test_bigger_groups_pay_the_per_rank_call_cost():
    """call_us_per_rank adds to every call per rank beyond two: tiny's TP layer (no SP, no
    backward overlap: 2 all-reduces each way) at tp=4 pays 2 x 2 x 700 us more each way with
    700 us per rank; at tp=2 nothing changes. The generic call cost and pairs alike."""
    from sim.tp_comm import tp_layer_comm_s
    cluster = load_topology("localhost-cpu", gpus_per_node=4)
    base = FabricEfficiency(bw_eff=0.5, call_latency_us=50.0)
    dear = FabricEfficiency(bw_eff=0.5, call_latency_us=50.0, call_us_per_rank=700.0)
    assert dear.call_s("all_reduce", 4) == pytest.approx((50 + 2 * 700) * 1e-6)
    assert dear.call_s("send_recv", 2) == dear.call_s(None) == pytest.approx(50e-6)
    rt = RuntimeSettings(tp_bwd_overlap=False)
    for ranks, extra in (([0, 1, 2, 3], 2 * 2 * 700e-6), ([0, 1], 0.0)):
        (f0, b0), (f1, b1) = [tp_layer_comm_s(cluster, Profile(gpus={"default": GpuEfficiency()},
                                                               fabrics={"default": fab}, runtime=rt),
                                              ranks, 64 * 128 * 4, False, "none", [], None, None, "fp32")
                              for fab in (base, dear)]
        assert f1 - f0 == pytest.approx(extra, abs=1e-12)
        assert b1 - b0 == pytest.approx(extra, abs=1e-12)


def test_pipeline_send_pays_the_send_recv_call_cost():
    """The engine charges a pipeline send the fabric's send_recv_call_us: GPipe p=2, m=1
    has 2 sends on the critical path (one activation, one gradient), so raising the
    send/recv call cost by 1 ms (generic 50 us -> 1050 us) lengthens the step by 2 ms."""
    prog, _ = _prog(1, False)
    step0, _ = run_engine(prog)
    prog2, _ = _prog(1, False)
    prog2.profile = Profile(gpus={"default": GpuEfficiency()},
                            fabrics={"default": FabricEfficiency(bw_eff=1.0, call_latency_us=CALL_S * 1e6,
                                                                 send_recv_call_us=CALL_S * 1e6 + 1000.0)})
    step1, _ = run_engine(prog2)
    assert step1 - step0 == pytest.approx(2e-3, rel=1e-9)


def test_straggler_delays_the_reduction_that_closes_backward():
    """runtime.straggler_us delays only the last gradient bucket's reduction of a step (the
    one that waits for the replica that finished backward last): tp=2 x dp=2 with two small
    buckets, fixed compute; 3 ms of straggle lengthens the step by exactly 3 ms and the
    exposed DP time by as much. With one replica (pp=2, no data parallelism) there is no
    reduction to wait for and the step is unchanged (tp=2 x pp=2 on the 4 devices)."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("t", 4, 1024, 16, 512, 32000, 8)
    out = {}
    for plan_text in ("tp=2,dp=2,mbs=2", "tp=2,pp=2,mbs=2"):
        for lag_us in (0.0, 3000.0):
            prog = fixed_program(cluster, model, plan_text, 0.02, 0.04, grad_bytes=(1e6, 1e6))
            prog.profile = Profile(gpus={"default": GpuEfficiency()}, fabrics={"default": FabricEfficiency()},
                                   runtime=RuntimeSettings(straggler_us=lag_us))
            out[(plan_text, lag_us)] = run_engine(prog)
    (s0, r0), (s1, r1) = out[("tp=2,dp=2,mbs=2", 0.0)], out[("tp=2,dp=2,mbs=2", 3000.0)]
    assert s1 - s0 == pytest.approx(3e-3, rel=1e-9)
    assert r1.exposed_comm_s["dp"] - r0.exposed_comm_s["dp"] == pytest.approx(3e-3, rel=1e-6)
    assert out[("tp=2,pp=2,mbs=2", 3000.0)][0] == pytest.approx(out[("tp=2,pp=2,mbs=2", 0.0)][0], rel=1e-12)
