import sys, statistics
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/tmp/s17/mod')
from validate.collective_bench import CollectiveConfig
from validate.launch import launch
from gapw import worker
def main():
    res = {}
    for rep in range(4):
        for width, g in [(0, 1e-3), (128, 1e-3), (128, 0.25e-3)]:
            cfg = CollectiveConfig(sizes=(), ops=(), after_compute_sizes=(32768,), after_compute_ops=("all_reduce",), compute_gap_s=g)
            rows = launch(worker, 2, (cfg, width), timeout_s=120, backend="gloo")[0]
            for r in rows:
                res.setdefault((r[0], width, g), []).append(r[3] * 1e3)
    for k in sorted(res):
        print(k, [round(x, 3) for x in res[k]], 'median', round(statistics.median(res[k]), 3), 'mean', round(statistics.mean(res[k]),3))
if __name__ == '__main__':
    main()
