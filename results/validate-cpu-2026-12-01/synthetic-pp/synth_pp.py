"""A synthetic two-stage pipeline (m = 16) of the runner's layer-code stream
(validate/collective_bench.gap_layers: F about 1 ms, B = 2 F) following the plans' action
lists (sim/schedules.py) with a receive that blocks when its action is reached and isend,
as validate/pp.py does. Question: does its handoff cost track the host state that moved
the 1F1B plan on 2026-12-01? Run from the repository root with the number of launches per
schedule: python3 results/validate-cpu-2026-12-01/synthetic-pp/synth_pp.py 4. An
experiment, not part of plansim; output.txt beside it, docs/validation-cpu.md Known gaps.
"""
import sys, time, statistics
def worker(rank, world, sched_name, m, steps):
    import torch, torch.distributed as dist
    from sim.schedules import make_schedule
    from validate.collective_bench import gap_layers
    dev = torch.device("cpu")
    F = gap_layers(1e-3, dev, None)
    def B():
        F(); F()
    acts = make_schedule(sched_name, 2, m)[rank]
    buf = torch.zeros(8192); out = torch.ones(8192)
    # compute-only timing of F and B
    t = time.perf_counter()
    for _ in range(10): F()
    f_s = (time.perf_counter() - t) / 10
    t = time.perf_counter()
    for _ in range(10): B()
    b_s = (time.perf_counter() - t) / 10
    res = []
    for s in range(steps + 2):
        dist.barrier()
        t0 = time.perf_counter(); pend = []
        for a in acts:
            if a.kind == "F":
                if rank == 1: dist.recv(buf, 0, tag=a.mb)
                F()
                if rank == 0: pend.append(dist.isend(out, 1, tag=a.mb))
            else:
                if rank == 0: dist.recv(buf, 1, tag=1000 + a.mb)
                B()
                if rank == 1: pend.append(dist.isend(out, 0, tag=1000 + a.mb))
        for w in pend: w.wait()
        el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        if s >= 2: res.append(float(el[0]))
    fb = torch.tensor([f_s, b_s], dtype=torch.float64); dist.all_reduce(fb); fb /= 2
    return statistics.median(res), float(fb[0]), float(fb[1])
if __name__ == "__main__":
    sys.path.insert(0, ".")
    from validate.launch import launch
    from validate.microbench import worker_threads_env
    from sim.schedules import make_schedule, list_schedule_makespan
    m = 16
    for rep in range(int(sys.argv[1])):
        for name in ("1f1b", "gpipe"):
            with worker_threads_env(2):
                step, f, b = launch(worker, 2, (name, m, 12), timeout_s=120)[0]
            sch = make_schedule(name, 2, m)
            ideal, _ = list_schedule_makespan(sch, 2, 1, f, b, 0.0)
            lo, hi = 0.0, 0.01
            for _ in range(40):
                mid = (lo + hi) / 2
                if list_schedule_makespan(sch, 2, 1, f, b, mid)[0] < step: lo = mid
                else: hi = mid
            print(f"{name:5s} step {step*1e3:6.2f} ms  F {f*1e3:.3f} B {b*1e3:.3f}  ideal {ideal*1e3:6.2f}  handoff fit {lo*1e6:6.0f} us", flush=True)
