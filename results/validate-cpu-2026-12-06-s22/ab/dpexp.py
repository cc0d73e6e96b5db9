import sys, statistics, fakew
from specs.model import load_model
from specs.plan import resolve_plan
from validate.launch import launch
from validate.microbench import worker_threads_env
from validate.runner import RunConfig
def main():
    m = load_model("tiny")
    cfg = RunConfig(steps=7, warmup=2, seed=0, backend="gloo", saved_bytes=False)
    plans = []
    runs = [(m, resolve_plan(f"tp=1,pp=2,dp=1,mbs=1,schedule={s},precision=fp32", m, 2), cfg, fake) for s, fake in plans]
    runs += [(m, resolve_plan(f"tp=1,pp=1,dp=2,mbs=1,schedule={s},precision=fp32", m, 2), cfg, False) for s in ("1f1b", "gpipe")]
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    acc = {}
    for r in range(reps):
        order = runs if r % 2 == 0 else runs[::-1]
        with worker_threads_env(2):
            per_rank = launch(fakew.worker, 2, (order,), timeout_s=600, backend="gloo")
        for i, (_, plan, _, fake) in enumerate(order):
            key = (plan.schedule + ('' if plan.pp > 1 else '-dp2'), fake)
            for rank in (0, 1):
                wall, det = summarize(per_rank[rank][i])
                import statistics as _st
                flt = _st.median(x.get("host", {}).get("minor_faults", 0) for x in per_rank[rank][i]["steps"])
                acc.setdefault(key + (rank,), []).append((wall, det.get("forward", 0), det.get("backward", 0), flt))
    for (sched, fake, rank), v in sorted(acc.items()):
        med = lambda j: statistics.median(x[j] for x in v) * 1e3
        print(f"{sched:5s} {'no comm' if fake else 'real   '} stage {rank}: wall {med(0):6.1f} ms  forward {med(1):5.1f}  backward {med(2):5.1f}  compute {med(1)+med(2):5.1f}  minor faults/step {statistics.median(x[3] for x in v):.0f}  launches {['%.1f' % ((x[1]+x[2])*1e3) for x in v]}")

def summarize(rank_rec):
    import statistics
    st = rank_rec["steps"]
    keys = sorted({k for s in st for k in (s.get("detail_s") or {})})
    wall = statistics.median(s["wall_s"] for s in st)
    det = {k: statistics.median((s.get("detail_s") or {}).get(k, 0.0) for s in st) for k in keys}
    return wall, det


if __name__ == "__main__":
    main()
