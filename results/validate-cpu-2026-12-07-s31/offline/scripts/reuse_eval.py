"""Offline: what COMPUTE_REUSE would have predicted on saved runs (world 2's compute taken
from world 4's record; each profile then pooled as validate_cpu.sh does)."""
import sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
from validate.bench_record import bench_record_path, load_bench
from validate.microbench import fit_draw_figures, WORKER_CHAIN_DRAWS
from validate.calibrate import fitted_profile, profile_from_bench

MODE = sys.argv[1]
def reuse_res(path, world):
    own = load_bench(bench_record_path(path / f"cpu-w{world}.yaml"), "file")
    w4 = load_bench(bench_record_path(path / "cpu-w4.yaml"), "file")
    if world == 4:
        return fit_draw_figures(own)
    # world 2: w4's compute families and worker draws; w2's own collective launches' draws
    out = replace(own)
    shapes = {(g.m, g.n, g.k, g.batch) for g in own.gemm}
    out.gemm = [g for g in w4.gemm if (g.m, g.n, g.k, g.batch) in shapes]
    mems = {(x.op, x.elems) for x in own.memory}
    out.memory = [x for x in w4.memory if (x.op, x.elems) in mems]
    at = {(a.batch, a.s, a.d) for a in own.attention}
    out.attention = [a for a in w4.attention if (a.batch, a.s, a.d) in at]
    tk = {(t.elems, t.fraction) for t in own.topk}
    out.topk = [t for t in w4.topk if (t.elems, t.fraction) in tk]
    out.harness = dict(w4.harness)
    for name in ("recompute_draws", "fsdp_draws", "alive_draws", "microbatch_draws", "split_draws",
                 "checkpoint_region_us", "alive_held_mib", "split_model", "microbatch_ops"):
        setattr(out, name, getattr(w4, name))
    out.overhead_draws = list(w4.overhead_draws[:WORKER_CHAIN_DRAWS]) + list(own.overhead_draws[WORKER_CHAIN_DRAWS:])
    out.probe_draws_s = list(w4.probe_draws_s[:1]) + list(own.probe_draws_s[1:])
    import statistics
    out.probe_s = statistics.median(out.probe_draws_s)
    out.overhead = [replace(o, seconds=float(statistics.median(d[i] for d in out.overhead_draws))) for i, o in enumerate(own.overhead)]
    return fit_draw_figures(out)

def refit_profile(path, world, aggregate, cluster, memory_model="bandwidth", scales=False, pool=False):
    from validate.pool import pooled_compute
    if MODE == "pool":
        return orig(path, world, aggregate, cluster, memory_model, scales, True)
    res = reuse_res(path, world)
    other = reuse_res(path, 6 - world)
    res = pooled_compute(res, f"w{world}", [(other, f"w{6-world}")])
    _, mapping = profile_from_bench(cluster, res, "reuse", memory_model, scales)
    return fitted_profile(cluster, mapping, "reuse")
orig = rp.refit_profile
rp.refit_profile = refit_profile
rp.main(["--refit"] + sys.argv[2:])
