"""The runner's own dp=2 plan of tiny (validate/runner._worker) in 1F1B's order and in
GPipe's, two processes, REPS launches of 7 steps after 2 warm-up, heap kept (the workers'
default since mechanism 54). MODE: 'plain'; 'noopt' runs each order twice, the second
time with the optimizer step replaced by a no-op; 'fixbatch' the second time with the
first batch every step. Prints each order's median forward + backward per rank.

    PYTHONPATH=<tree>:<this dir> python3 orderexp.py MODE REPS

(Session 21's ab/fakeexp.py, run unchanged with the heap kept, gave the pp=2 rows of
outputs.txt.)"""
import statistics
import sys


def worker(rank, world, runs):
    import validate.dp as vdp
    import validate.gpt as vg
    import validate.runner as vr
    real_step, real_batch = vdp.GradReducer.step, vg.batch_tokens
    out = []
    for model, plan, cfg, mode in runs:
        if mode == "noopt":
            vdp.GradReducer.step = lambda self, step: None
        elif mode == "fixbatch":
            vg.batch_tokens = lambda model, step, seed: real_batch(model, 0, seed)
        try:
            out.append(vr._worker(rank, world, model, plan, cfg))
        finally:
            vdp.GradReducer.step, vg.batch_tokens = real_step, real_batch
    return out


def main():
    from specs.model import load_model
    from specs.plan import resolve_plan
    from validate.launch import launch
    from validate.microbench import worker_threads_env
    from validate.runner import RunConfig
    mode, reps = sys.argv[1], int(sys.argv[2])
    m = load_model("tiny")
    cfg = RunConfig(steps=7, warmup=2, seed=0, backend="gloo", saved_bytes=False)
    variants = ("plain",) if mode == "plain" else ("plain", mode)
    runs = [(m, resolve_plan(f"tp=1,pp=1,dp=2,mbs=1,schedule={s},precision=fp32", m, 2), cfg, v)
            for s in ("1f1b", "gpipe") for v in variants]
    acc = {}
    for r in range(reps):
        order = runs if r % 2 == 0 else runs[::-1]
        with worker_threads_env(2):
            per_rank = launch(worker, 2, (order,), timeout_s=600, backend="gloo")
        for i, (_, plan, _, v) in enumerate(order):
            for rank in (0, 1):
                st = per_rank[rank][i]["steps"]
                f = statistics.median(s["detail_s"].get("forward", 0.0) for s in st)
                b = statistics.median(s["detail_s"].get("backward", 0.0) for s in st)
                acc.setdefault((plan.schedule, v, rank), []).append(f + b)
    for (sched, v, rank), xs in sorted(acc.items()):
        print(f"{sched:5s} {v:8s} rank {rank}: compute {statistics.median(xs) * 1e3:5.1f} ms  "
              f"launches {['%.1f' % (x * 1e3) for x in xs]}")


if __name__ == "__main__":
    main()
