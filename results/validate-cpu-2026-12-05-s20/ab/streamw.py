"""Both ranks compute rounds; rank 0 isends 32 KiB after each into rank 1's receives posted first.
Returns each rank's compute-loop time per round, with and without the messages."""
import time


def worker(rank, world, rounds, gap_s, modes):
    import torch
    import torch.distributed as dist
    from validate.collective_bench import gap_layers
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    compute = gap_layers(gap_s, dev, None)
    x = torch.ones(8192)
    out = []
    for mode in modes:
        bufs = [torch.empty(8192) for _ in range(rounds)]
        works = []
        if rank == 1 and mode:
            works = [dist.irecv(bufs[r], 0, tag=r) for r in range(rounds)]
        dist.barrier()
        t0 = time.perf_counter()
        for r in range(rounds):
            compute()
            if rank == 0 and mode:
                works.append(dist.isend(x, 1, tag=r))
        t = (time.perf_counter() - t0) / rounds
        for w in works:
            w.wait()
        out.append(t)
    return out
