"""Does a burst of compute run faster when the process sleeps between bursts than when it
computes (or spins) back to back? Two processes at once (as calibration times compute on
2 cores), each: rounds of modes interleaved; per mode, a burst of a fixed op chain is timed
12 times; between bursts the process either goes straight on ('busy'), sleeps 2x the
burst ('sleep'), or spins 2x the burst ('spin'). Prints each mode's median burst (ms) per
round, process 0's and 1's."""
import multiprocessing as mp, statistics, sys, time

def worker(rank, rounds, q):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    a = torch.randn(128, 512); b = torch.randn(512, 128); x = torch.randn(64, 4096)
    def burst():
        for _ in range(6):
            y = a @ b
            z = torch.nn.functional.gelu(x)
            w = torch.nn.functional.layer_norm(x, (4096,))
        return y, z, w
    for _ in range(20):
        burst()
    out = []
    modes = ("busy", "sleep", "spin")
    for r in range(rounds):
        res = {}
        for m in (modes if r % 2 == 0 else modes[::-1]):
            ts = []
            for _ in range(12):
                t0 = time.perf_counter(); burst(); t = time.perf_counter() - t0
                ts.append(t)
                if m == "sleep":
                    time.sleep(2 * t)
                elif m == "spin":
                    end = time.perf_counter() + 2 * t
                    while time.perf_counter() < end:
                        pass
            res[m] = statistics.median(ts) * 1e3
        out.append(res)
    q.put((rank, out))

if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(i, rounds, q)) for i in range(2)]
    [p.start() for p in ps]
    got = dict(q.get() for _ in ps)
    [p.join() for p in ps]
    for r in range(rounds):
        print(f"round {r}: " + "  ".join(f"{m} {got[0][r][m]:.3f}/{got[1][r][m]:.3f}" for m in ("busy", "sleep", "spin")))
    for m in ("busy", "sleep", "spin"):
        v = [got[k][r][m] for k in (0, 1) for r in range(rounds)]
        print(f"{m}: median {statistics.median(v):.3f} ms, range {min(v):.3f}-{max(v):.3f}")
