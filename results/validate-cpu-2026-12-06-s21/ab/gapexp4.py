import sys, statistics, gapw4
from validate.launch import launch
from validate.microbench import worker_threads_env
def main():
    reps = int(sys.argv[1]); kinds = sys.argv[2].split(",")
    res = {}
    for r in range(reps):
        k = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        with worker_threads_env(2):
            rows = launch(gapw4.worker, 2, (k, 100), timeout_s=300, backend="gloo")
        for kind, a, c in rows[0]:
            res.setdefault(kind, []).append((a, c))
    for kind in kinds:
        v = res[kind]
        print(f"{kind:7s}: gap a call {statistics.median(x[0] for x in v)*1e3:.3f} ms, cost a call {statistics.median(x[1] for x in v)*1e3:.3f} ms  draws {['%.2f' % (x[1]*1e3) for x in v]}")
if __name__ == "__main__":
    main()
