import sys, orderw2
from validate.launch import launch
from validate.microbench import worker_threads_env

def main():
    world, launches, steps, layers, micro = (int(x) for x in sys.argv[1:6])
    for l in range(launches):
        with worker_threads_env(world):
            res = launch(orderw2.worker, world, (steps, layers, micro), timeout_s=300, backend="gloo")
        for r, d in enumerate(res):
            a, b = d["1f1b"], d["gpipe"]
            print(f"launch {l} rank {r}: 1f1b F {a['forward']*1e3:.1f} B {a['backward']*1e3:.1f} wall {a['wall']*1e3:.1f} | "
                  f"gpipe F {b['forward']*1e3:.1f} B {b['backward']*1e3:.1f} wall {b['wall']*1e3:.1f} | "
                  f"F x{b['forward']/a['forward']:.3f} B x{b['backward']/a['backward']:.3f}", flush=True)

if __name__ == "__main__":
    main()
