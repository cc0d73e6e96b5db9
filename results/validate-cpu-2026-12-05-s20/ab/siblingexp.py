import sys, statistics, siblingw
from validate.launch import launch
from validate.microbench import worker_threads_env

def main():
    launches, windows = int(sys.argv[1]), int(sys.argv[2])
    for l in range(launches):
        with worker_threads_env(2):
            res = launch(siblingw.worker, 2, (windows,), timeout_s=300, backend="gloo")[0]
        for name in ("gemm", "step", "stream"):
            idle = statistics.median(res[(name, False)]); busy = statistics.median(res[(name, True)])
            print(f"launch {l} {name}: other idle {idle*1e3:.3f} ms, other busy {busy*1e3:.3f} ms, ratio {busy/idle:.3f}", flush=True)

if __name__ == "__main__":
    main()
