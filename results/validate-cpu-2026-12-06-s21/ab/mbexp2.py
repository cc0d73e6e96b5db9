import sys, mbw, subprocess
from validate.launch import launch
from validate.microbench import worker_threads_env
def main():
    configs = [(4, 4), (4, 8), (4, 16), (3, 8), (3, 16), (2, 8), (2, 16), (2, 32)]
    res = {c: [] for c in configs}
    for r in range(int(sys.argv[2])):
        with worker_threads_env(2):
            rows = launch(mbw.worker, 2, (configs, int(sys.argv[1])), timeout_s=600, backend="gloo")
        for c, a, b in zip(configs, rows[0], rows[1]):
            res[c].append((a + b) / 2)
    import statistics
    for c in configs:
        pred = float(subprocess.run(["/tmp/s21/pred.sh", sys.argv[3], str(c[0]), str(c[1])], capture_output=True, text=True, cwd="/work/main").stdout)
        m = statistics.median(res[c]) * 1e3
        print(f"L={c[0]} mb={c[1]:2d} actions {2*c[1]:3d}: measured {m:7.2f} ms (launches {['%.1f' % (x*1e3) for x in res[c]]}) predicted {pred:7.2f}  meas/pred {m/pred:.3f}  diff {m-pred:+.2f} ms  per action {(m-pred)/(2*c[1]):+.3f}")
if __name__ == "__main__":
    main()
