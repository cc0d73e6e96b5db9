import sys, statistics, streamw
from validate.launch import launch
from validate.microbench import worker_threads_env

def main():
    launches, rounds, gap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) * 1e-3
    modes = [False, True] * 4
    d = {0: [], 1: []}
    for l in range(launches):
        with worker_threads_env(2):
            res = launch(streamw.worker, 2, (rounds, gap, modes), timeout_s=300, backend="gloo")
        for rank in (0, 1):
            base = statistics.median(v for v, m in zip(res[rank], modes) if not m)
            msg = statistics.median(v for v, m in zip(res[rank], modes) if m)
            d[rank].append((msg - base) * 1e3)
        print(f"launch {l}: sender +{d[0][-1]:.3f} ms/round, receiver +{d[1][-1]:.3f} ms/round (base {base*1e3:.3f})", flush=True)
    for rank in (0, 1):
        print(f"{'sender' if rank == 0 else 'receiver'}: median +{statistics.median(d[rank]):.3f} ms a message")

if __name__ == "__main__":
    main()
