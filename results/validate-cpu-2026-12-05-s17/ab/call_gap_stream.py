import sys, statistics
sys.path.insert(0, '/work/main')
from validate.collective_bench import CollectiveConfig, collective_worker
from validate.launch import launch
def main():
    res = {}
    gaps = [0.1e-3, 0.2e-3, 0.4e-3, 1e-3]
    for rep in range(4):
        for g in gaps:
            cfg = CollectiveConfig(sizes=(), ops=(), after_compute_sizes=(32768,), after_compute_ops=("all_reduce", "all_gather"), compute_gap_s=g)
            rows = launch(collective_worker, 2, (cfg,), timeout_s=120, backend="gloo")[0]
            for r in rows:
                res.setdefault((r[0], g), []).append(r[3] * 1e3)
    for k in sorted(res):
        print(k, [round(x, 3) for x in res[k]], 'median', round(statistics.median(res[k]), 3))

if __name__ == '__main__':
    main()
