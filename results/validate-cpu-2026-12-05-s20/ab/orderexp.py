import sys, orderw
from validate.launch import launch
from validate.microbench import worker_threads_env

def main():
    world, launches, steps, layers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    for l in range(launches):
        with worker_threads_env(world):
            res = launch(orderw.worker, world, (steps, layers), timeout_s=300, backend="gloo")
        for r, d in enumerate(res):
            print(f"launch {l} rank {r}: 1f1b {d['1f1b']*1e3:.2f} ms gpipe {d['gpipe']*1e3:.2f} ms ratio {d['gpipe']/d['1f1b']:.3f}", flush=True)

if __name__ == "__main__":
    main()
