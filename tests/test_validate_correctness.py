"""The real runner computes what the single-process reference computes.

Every parallel layout of the tiny model runs 3 training steps on real gloo processes
from the same seed and data as validate/reference.py, which runs the whole model on the
whole global batch in one process. Losses and gradients are compared (fp32):
- loss of each step: relative error <= LOSS_RTOL = 1e-5;
- first-step gradient of every weight, reassembled from the TP slices: max abs error
  <= GRAD_TOL = 1e-4 x the largest entry of the reference gradient of that weight,
  + GRAD_ATOL = 1e-9 (the key bias has an exactly zero gradient in exact arithmetic:
  softmax ignores a constant added to every score of a row; both sides hold only
  roundoff there, ~1e-11);
- weights after 3 Adam steps (ZeRO-1 included), normwise: ||w - w_ref|| <= UPDATE_RTOL
  = 1e-3 x ||w_ref - w_init|| (the layout applied the reference's update to 0.1 %).
  Normwise because Adam divides by sqrt(v): an entry whose gradient is ~0 moves by
  +-lr with the sign of its roundoff, so single entries may differ by up to 2 lr; the
  key bias, whose gradient is zero up to roundoff, is skipped for that reason.
The differences come only from summation order (microbatches, TP partial sums, DP sums);
measured here they are ~1e-7 relative on losses.

Plans of one world size run in one launch (process start-up costs seconds here).
"""
from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodel.shapes import ModelSpec  # noqa: E402
from specs.model import load_model  # noqa: E402
from specs.plan import resolve_plan  # noqa: E402
from validate.gpt import all_params, full_weights  # noqa: E402
from validate.reference import reference_run  # noqa: E402
from validate.runner import RunConfig, run_workers_many  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_TOL = 1e-4
GRAD_ATOL = 1e-9
UPDATE_RTOL = 1e-3
STEPS = 3
TOPK_STEPS = 8
# Small buckets so that overlapped reduction really runs many buckets while backward
# continues (the default 25 MB would hold the whole tiny model in one).
SMALL_BUCKET_BYTES = 256 * 1024

MODEL = load_model("tiny")
SPECS = {s.name: s for s in all_params(MODEL)}

PLANS_2 = [
    "dp=2", "dp=2,overlap_grad_reduce=false", "dp=2,zero=1", "dp=2,recompute=full",
    "tp=2", "tp=2,sp=true", "tp=2,recompute=selective",
    "pp=2,schedule=gpipe", "pp=2,schedule=1f1b", "pp=2,vpp=2,schedule=interleaved",
]
PLANS_4 = ["tp=2,pp=2"]
# Llama-style variant of tiny: SwiGLU MLP, grouped-query attention (2 K/V groups for 4
# query heads), RoPE, RMSNorm, no biases and an output layer of its own; split by tp=2
# with sequence parallelism, by dp=2, and by pp=2 (no tied embedding to reduce).
GQA = ModelSpec("tiny-gqa", 4, 128, 4, 64, 512, 16, num_query_groups=2, ffn_hidden_size=256,
                activation="swiglu", tie_embeddings=False, position_embedding="rope", linear_bias=False,
                normalization="rmsnorm")
GQA_PLAN = "tp=2,sp=true"


@pytest.fixture(scope="module")
def one_thread():
    torch.set_num_threads(1)  # as the workers do (validate/backend.configure_cpu_threads)


def _cfg(steps=STEPS):
    return RunConfig(steps=steps, warmup=0, seed=0, backend="gloo",
                     bucket_bytes=SMALL_BUCKET_BYTES, capture=True, saved_bytes=True,
                     probes=False)  # the probes serve the validator's prediction only


@pytest.fixture(scope="module")
def runs_2(one_thread):
    runs = [(MODEL, resolve_plan(p, MODEL, 2), _cfg()) for p in PLANS_2]
    runs += [(MODEL, resolve_plan("dp=2", MODEL, 2), _cfg(TOPK_STEPS)),
             (MODEL, resolve_plan("dp=2,compress=topk:0.1", MODEL, 2), _cfg(TOPK_STEPS)),
             (GQA, resolve_plan(GQA_PLAN, GQA, 2), _cfg()),
             (GQA, resolve_plan("dp=2", GQA, 2), _cfg()),
             (GQA, resolve_plan("pp=2,schedule=1f1b", GQA, 2), _cfg())]
    out = run_workers_many(runs, timeout_s=240)
    return dict(zip(PLANS_2 + ["dense", "topk", "gqa", "gqa-dp", "gqa-pp"], out))


@pytest.fixture(scope="module")
def runs_4(one_thread):
    runs = [(MODEL, resolve_plan(p, MODEL, 4), _cfg()) for p in PLANS_4]
    return dict(zip(PLANS_4, run_workers_many(runs, timeout_s=240)))


def _losses(workers):
    return [sum(w["losses"][j] for w in workers if w["losses"]) for j in range(len(workers[0]["steps"]))]


def _assemble(workers, key, specs=SPECS):
    """Full tensors from every rank's slices; checks that copies agree exactly enough
    (DP replicas, TP ranks holding a replicated weight, both ends of the tied embedding)."""
    parts: dict[str, dict[int, np.ndarray]] = {}
    for w in sorted(workers, key=lambda w: w["rank"]):
        for name, arr in w[key].items():
            have = parts.setdefault(name, {})
            if w["tp_rank"] in have:
                np.testing.assert_allclose(arr, have[w["tp_rank"]], rtol=0, atol=1e-6 * max(1.0, np.abs(arr).max()),
                                           err_msg=f"copies of {name} disagree")
            else:
                have[w["tp_rank"]] = arr
    out = {}
    for name, by_tp in parts.items():
        dim = specs[name].split_dim
        slices = [by_tp[t] for t in sorted(by_tp)]
        out[name] = slices[0] if dim is None else np.concatenate(slices, axis=dim)
    return out


@functools.lru_cache(maxsize=None)
def _ref(model: ModelSpec, steps: int) -> dict:
    """The single-process reference (losses, first-step gradients, final weights)."""
    torch.set_num_threads(1)  # as the workers do (validate/backend.configure_cpu_threads)
    return reference_run(model, steps)


def _check(workers, plan, model=MODEL, grads=True):
    ref = _ref(model, STEPS)
    specs = {s.name: s for s in all_params(model)}
    np.testing.assert_allclose(_losses(workers), ref["losses"], rtol=LOSS_RTOL, err_msg=plan)
    if grads:
        got = _assemble(workers, "grads", specs)
        assert set(got) == set(specs), plan
        for name, g in got.items():
            r = ref["grads"][name]
            assert np.abs(g - r).max() <= GRAD_TOL * np.abs(r).max() + GRAD_ATOL, f"{plan}: grad of {name}"
    init = {n: t.numpy() for n, t in full_weights(model, 0).items()}
    for name, wt in _assemble(workers, "weights", specs).items():
        if np.abs(ref["grads"][name]).max() <= GRAD_ATOL:
            continue  # zero gradient: Adam's step there is the sign of roundoff
        update = np.linalg.norm(ref["weights"][name] - init[name])
        assert np.linalg.norm(wt - ref["weights"][name]) <= UPDATE_RTOL * update, \
            f"{plan}: weight {name} after {STEPS} steps"


@pytest.mark.parametrize("plan", PLANS_2)
def test_two_process_layouts_match_reference(runs_2, plan):
    """dp=2 (overlap on/off, ZeRO-1, full recompute), tp=2 (with and without sequence
    parallelism, selective recompute), pp=2 under GPipe, 1F1B and interleaved (vpp=2):
    losses, first-step gradients and weights after 3 steps equal the reference's within
    the module's tolerances. (ZeRO-1 holds only a shard of the reduced gradient, so its
    gradients are checked through the weights they produce.)"""
    _check(runs_2[plan], plan, grads="zero" not in plan)


def test_correctness_runs_take_no_probes(runs_2, runs_4):
    """RunConfig(probes=False) skips the speed and call probes the validator needs and
    these runs do not: every worker returns empty probe lists, so the record built from
    them keeps no speed probe (0) and no launch call probes."""
    from validate.record import RunRecord
    for workers in list(runs_2.values()) + list(runs_4.values()):
        assert all(w["probe_s"] == [] and w["call_probe_s"] == [] for w in workers)
    rec = RunRecord.from_workers(runs_2["dp=2"], model="tiny", plan="dp=2", backend="gloo", device="cpu",
                                 steps=STEPS, warmup=0, seed=0)
    assert rec.speed_probe_s == 0.0 and rec.launch_probes_s == [] and rec.launch_call_probes_s == []


@pytest.mark.parametrize("plan", PLANS_4)
def test_four_process_layouts_match_reference(runs_4, plan):
    """tp=2 x pp=2 on 4 processes (TP inside each stage, the tied embedding reduced
    between the pipeline ends) matches the reference."""
    _check(runs_4[plan], plan, grads="zero" not in plan)


def test_swiglu_grouped_query_attention_matches_reference(runs_2):
    """A Llama-style model (SwiGLU, 2 K/V groups for 4 heads, RoPE, RMSNorm, no biases,
    untied output layer) split by tp=2 with sequence parallelism, and by pp=2 (the output
    layer on the last stage only, no embedding all-reduce), matches its own single-process
    reference; it has the parameters the cost model counts."""
    _check(runs_2["gqa"], GQA_PLAN, model=GQA)
    _check(runs_2["gqa-pp"], "pp=2,schedule=1f1b", model=GQA)
    from validate.gpt import all_params
    assert sum(math.prod(p.shape) for p in all_params(GQA)) == GQA.total_params
    assert {"wout"} <= {p.name for p in all_params(GQA)} and "wpe" not in {p.name for p in all_params(GQA)}


def test_topk_sends_under_30pct_and_tracks_dense_loss(runs_2):
    """Top-k (10 % of entries) with error feedback: per step each rank sends at most 30 %
    of the dense run's DP bytes (both counted the same way, validate/comm.py), and after
    8 steps its loss is within 2 % of the dense run's, while the dense run has really
    learned (loss down by more than 5 %; 8 % measured) and the compressed one is not the dense one."""
    dense, topk = runs_2["dense"], runs_2["topk"]
    np.testing.assert_allclose(_losses(dense), _ref(MODEL, TOPK_STEPS)["losses"], rtol=LOSS_RTOL)
    by_hand = _topk_bytes_by_hand()
    for d, t in zip(dense, topk):
        dense_b = d["steps"][-1]["bytes_sent"]["dp"]
        topk_b = t["steps"][-1]["bytes_sent"]["dp"]
        assert topk_b <= 0.30 * dense_b, (topk_b, dense_b)
        assert topk_b == by_hand, (topk_b, by_hand)
        # The selection is timed as compute (as the simulator prices it), nested in the
        # exchange's span and taken out of its 'dp' time; the dense run has none.
        st = t["steps"][-1]
        assert 0 < st["detail_s"]["topk_select"] <= st["phases_s"]["compute"]
        assert "topk_select" not in d["steps"][-1]["detail_s"]
    ld, lt = _losses(dense), _losses(topk)
    assert ld[-1] < 0.95 * ld[0]
    assert lt[-1] != ld[-1]
    assert abs(lt[-1] - ld[-1]) <= 0.02 * ld[-1], (lt, ld)


def _topk_bytes_by_hand() -> float:
    """Bytes one rank of dp=2 sends per step under top-k 0.1: per gradient bucket (the
    reducer's own layout at SMALL_BUCKET_BYTES, each buffer padded to a multiple of 2),
    k = ceil(0.1 x elements) entries of costmodel/dtypes.topk_entry_bytes('fp32') = 4 + 4 B
    from each of the 2 ranks, of which an all-gather sends (n-1)/n."""
    import math
    from costmodel.dtypes import topk_entry_bytes
    from validate.comm import Comm
    from validate.dp import GradReducer
    from validate.gpt import GPTChunk
    from validate.timeline import Recorder
    chunk = GPTChunk(MODEL, list(range(MODEL.num_layers)), True, True, full_weights(MODEL, 0), None, False,
                     "none", torch.device("cpu"))
    red = GradReducer([(0, chunk.params)], Comm("dp", [0], 0, Recorder()), bucket_bytes=SMALL_BUCKET_BYTES,
                      overlap=True, zero=0, topk=None, late=set())
    assert topk_entry_bytes("fp32") == 8
    return sum(0.5 * 2 * math.ceil(0.1 * (-(-b.numel // 2) * 2)) * topk_entry_bytes("fp32") for b in red.buckets)


def test_measurements_are_consistent(runs_2):
    """Each rank's measured categories never add up to more than its wall time (spans are
    counted exclusively), the pipeline ranks wait for each other (bubble > 0 under
    GPipe), and every rank reports a positive peak memory."""
    for plan in ("pp=2,schedule=gpipe", "tp=2", "dp=2"):
        for w in runs_2[plan]:
            for st in w["steps"]:
                assert sum(st["phases_s"].values()) <= st["wall_s"] * (1 + 1e-9)
            assert w["peak_memory_bytes"] > 0
    assert all(w["steps"][-1]["phases_s"]["bubble"] > 0 for w in runs_2["pp=2,schedule=gpipe"])
    assert all(w["steps"][-1]["bytes_sent"]["tp"] > 0 for w in runs_2["tp=2"])


# The cost model's activations leave out LayerNorm's fp32 mean and rstd (16 B a token a norm:
# 1,024 B of tiny's 525,312 B a layer, 0.2 %) and the vocabulary-parallel ends' index and
# mask tensors (1,344 B at tp=2); nothing else of what autograd keeps.
SAVED_RTOL = 0.005


def _saved_pairs(workers, model, plan_text, world):
    """[(measured, predicted)] activations kept for backward on each rank: the runner's
    first step (validate/saved_bytes.py) and the cost model's stage memory with the
    runner's runtime facts (validate/profile_file.runtime_facts: no dropout, the gathered
    SP inputs saved, fused attention)."""
    from dataclasses import replace

    from costmodel.profile import load_profile
    from validate.compare import predicted_saved_bytes
    from validate.profile_file import runtime_facts
    plan = resolve_plan(plan_text + ",precision=fp32", model, world)
    rt = replace(load_profile(None).runtime, **runtime_facts("cpu"))
    pred = predicted_saved_bytes(model, plan, rt, workers)
    return [(w["saved_activation_bytes"], pred[w["rank"]]) for w in workers]


@pytest.mark.parametrize("plan", PLANS_2 + ["gqa", "gqa-dp", "gqa-pp"])
def test_saved_activations_match_the_memory_model(runs_2, plan):
    """What autograd really keeps for backward, at its peak over a step, on every rank of
    every 2-process layout (GPipe holds all 16 microbatches, 1F1B two on the first stage,
    interleaved its own count; recompute keeps layer inputs;
    SP keeps the gathered GEMM inputs; GQA with two K/V groups on a rank keeps a query
    copy) equals the cost model's activations and output end for that stage, up to what the
    model leaves out (SAVED_RTOL): never less, at most 0.5 % more."""
    model, text = {"gqa": (GQA, GQA_PLAN), "gqa-dp": (GQA, "dp=2"),
                   "gqa-pp": (GQA, "pp=2,schedule=1f1b")}.get(plan, (MODEL, plan))
    for measured, predicted in _saved_pairs(runs_2[plan], model, text, 2):
        assert predicted <= measured <= predicted * (1 + SAVED_RTOL), (plan, measured, predicted)


def test_saved_activations_four_processes(runs_4):
    """The same for tp=2 x pp=2 (1F1B): each stage's ranks keep what the model says."""
    for plan in PLANS_4:
        for measured, predicted in _saved_pairs(runs_4[plan], MODEL, plan, 4):
            assert predicted <= measured <= predicted * (1 + SAVED_RTOL), (plan, measured, predicted)


def test_saved_activations_gpipe_by_hand(runs_2):
    """GPipe's last stage keeps every microbatch's output end: tiny (h 128, s 64, V 512,
    fp32, 2 layers a stage, 16 microbatches in flight): 16 x (2 layers x 525,312 + final
    norm input 32,768 + logits GEMM input 32,768 + fp32 softmax 131,072) = 19,955,712 B
    predicted; measured 16 x ((2 x 2 + 1) norms x 512 B of statistics + the loss's 4 B) more."""
    first, last = sorted(runs_2["pp=2,schedule=gpipe"], key=lambda w: w["stage"])
    assert _saved_pairs([last], MODEL, "pp=2,schedule=gpipe", 2)[0][1] == 16 * (2 * 525_312 + 196_608) == 19_955_712
    assert last["saved_activation_bytes"] == 19_955_712 + 16 * (5 * 512 + 4)
    assert first["saved_activation_bytes"] == 16 * 2 * 525_312 + 16 * 4 * 512


def test_tp_bytes_per_step_hand_worked(runs_2):
    """tp=2 of tiny (4 layers, h 128, s 64, vocab 512, 16 microbatches of 1 sequence) sends,
    per microbatch, the activation (64 x 128 fp32 = 32,768 B) in 4 all-reduces per layer
    (2 forward, 2 backward: Megatron's f and g) plus 2 at the ends of the stack (the
    vocabulary-parallel embedding's, forward; the logits input gradient's, backward), and
    the loss's two all-reduces of 64 and 2 x 64 fp32 values: with a 2-rank all-reduce's
    bus factor 2(n-1)/n = 1, 16 x (18 x 32,768 + 256 + 512) = 9,449,472 B a step, on each
    rank. The simulator prices the same calls (sim/tp_comm.tp_layer_comm_s and
    tp_ends_comm_s)."""
    assert (MODEL.num_layers, MODEL.hidden_size, MODEL.seq_length, MODEL.global_batch_size) == (4, 128, 64, 16)
    for w in runs_2["tp=2"]:
        assert w["steps"][-1]["bytes_sent"]["tp"] == 16 * (18 * 32768 + 256 + 512)


def test_torchrun_standalone_two_processes(tmp_path, one_thread):
    """The torchrun path (the one used across nodes) runs: `torchrun --standalone
    --nproc-per-node 2 -m validate.runner` exits 0, prints the summary once (rank 0) and
    writes a record with world 2 whose first loss equals the reference's first loss."""
    out = tmp_path / "run.json"
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "validate.runner", "--model", "tiny", "--plan", "dp=2", "--steps", "2",
           "--warmup", "1", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=180)
    # On failure show the workers' own error lines (torchrun's summary alone hides them).
    why = [ln for ln in res.stderr.splitlines() if any(k in ln for k in ("rror", "terminate", "what()", "Abort"))]
    assert res.returncode == 0, "\n".join(why[:20]) + "\n" + res.stderr[-1500:]
    assert res.stdout.count("median step") == 1, res.stdout
    rec = json.loads(out.read_text())
    assert rec["world"] == 2 and rec["steps"] == 2 and len(rec["losses"]) == 3
    assert rec["losses"][0] == pytest.approx(_ref(MODEL, STEPS)["losses"][0], rel=LOSS_RTOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL)")
def test_cuda_nccl_matches_cpu_reference(one_thread):
    """On CUDA with NCCL (one process per GPU, up to 2), the runner's losses match the CPU
    reference within 1e-3 relative (different kernels, same fp32 math: TF32 is off for
    fp32 matmuls by default in torch) and peak memory comes from the CUDA allocator."""
    from validate.runner import run_plan
    world = min(2, torch.cuda.device_count())
    plan = resolve_plan(f"dp={world}", MODEL, world)
    rec = run_plan(MODEL, plan, steps=2, warmup=1, backend="nccl", timeout_s=300)
    assert rec.backend == "nccl" and rec.device != "cpu"
    np.testing.assert_allclose(rec.losses, _ref(MODEL, 3)["losses"], rtol=1e-3)
    assert all(r["peak_memory_bytes"] > 0 for r in rec.per_rank)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA devices (NCCL pipeline)")
@pytest.mark.parametrize("plan_text", ["pp=2,schedule=1f1b", "pp=2,vpp=2,schedule=interleaved"])
def test_cuda_nccl_pipeline_matches_cpu_reference(one_thread, plan_text):
    """On 2 GPUs with NCCL, which matches point-to-point messages by order and not by tag,
    1F1B and the interleaved schedule (whose activations travel both ways between the two
    ranks, on groups of their own: validate/p2p_order.py) finish, and their losses match
    the CPU reference within 1e-3 relative."""
    from validate.runner import run_plan
    rec = run_plan(MODEL, resolve_plan(plan_text, MODEL, 2), steps=2, warmup=1, backend="nccl", timeout_s=300)
    assert rec.backend == "nccl"
    np.testing.assert_allclose(rec.losses, _ref(MODEL, 3)["losses"], rtol=1e-3)


def _dp_vs_backward(workers):
    """(first DP collective launch, end of the last backward) of each rank's last step."""
    out = []
    for w in workers:
        dp = [s["start_s"] for s in w["segments"] if s["stream"] == "dp"]
        bwd = [s["end_s"] for s in w["segments"] if s["stream"] == "compute" and s["label"].startswith("B")]
        out.append((min(dp), max(bwd)))
    return out


def test_overlap_reduces_buckets_while_backward_runs(runs_2):
    """overlap_grad_reduce=true launches the first gradient bucket's reduction before the
    last backward has finished (the hooks fire during backward); with false, every
    reduction starts after it."""
    assert all(first < last for first, last in _dp_vs_backward(runs_2["dp=2"]))
    assert all(first >= last for first, last in _dp_vs_backward(runs_2["dp=2,overlap_grad_reduce=false"]))


def test_gradients_accumulate_in_place_in_their_buckets():
    """Every parameter's .grad is a view of its slice of the bucket (DDP's
    gradient_as_bucket_view): after two microbatches' backward it still points into the
    bucket (autograd added in place, no fresh tensor), and the bucket holds the sum of the
    two microbatches' gradients as torch.autograd.grad computes them separately, on an
    independent copy of the same weights (to fp32 roundoff)."""
    from validate.comm import Comm
    from validate.dp import GradReducer
    from validate.gpt import GPTChunk, batch_tokens
    from validate.timeline import Recorder
    m = load_model("tiny")
    dev = torch.device("cpu")
    chunk = GPTChunk(m, list(range(m.num_layers)), True, True, full_weights(m, 0), None, False, "none", dev)
    ref = GPTChunk(m, list(range(m.num_layers)), True, True, full_weights(m, 0), None, False, "none", dev)
    reducer = GradReducer([(0, chunk.params)], Comm("dp", [0], 0, Recorder()), bucket_bytes=1e5,
                          overlap=False, zero=0, topk=None, late=set())
    assert len(reducer.buckets) > 1
    tokens = batch_tokens(m, 0, 0)
    reducer.begin_step()
    want = {n: torch.zeros_like(p) for n, p in ref.params.items()}
    for i in range(2):
        x, y = tokens[i:i + 1, :-1], tokens[i:i + 1, 1:]
        chunk.forward(x, y, 0.5).backward()
        names = list(ref.params)
        for n, g in zip(names, torch.autograd.grad(ref.forward(x, y, 0.5), [ref.params[n] for n in names])):
            want[n] += g
    for b in reducer.buckets:
        lo, hi = b.flat_grad.data_ptr(), b.flat_grad.data_ptr() + b.flat_grad.numel() * b.flat_grad.element_size()
        for n, p in zip(b.names, b.params):
            assert lo <= p.grad.data_ptr() < hi, n
            g = reducer.grad_view(n)
            assert torch.allclose(g, want[n], rtol=1e-5, atol=1e-7 * float(want[n].abs().max()) + 1e-12), n
