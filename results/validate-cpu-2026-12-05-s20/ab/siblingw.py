"""Does a process compute slower while the other vCPU computes? Rank 0 times windows of
GEMMs (64x128 @ 128x512, tiny's MLP shape) and of tiny's 2-layer stage step; rank 1 either
sleeps or runs the same work during each window (alternating, agreed by barrier)."""
import time


def worker(rank, world, windows):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    from specs.model import load_model
    from validate.compute_bench import stage_trainer
    from sim.schedules import make_schedule
    a, w = torch.randn(64, 128), torch.randn(512, 128)
    gemm = lambda: [torch.nn.functional.linear(a, w) for _ in range(50)]
    step = stage_trainer(load_model("tiny"), 2, 4, torch.device("cpu"), actions=make_schedule("1f1b", 2, 4)[0])[2]
    big = torch.randn(4 << 20)
    stream = lambda: [big.add_(1.0) for _ in range(2)]
    out = {}
    for name, fn in (("gemm", gemm), ("step", step), ("stream", stream)):
        fn(); fn()
        for busy in (False, True) * windows:
            dist.barrier()
            if rank == 0:
                t0 = time.perf_counter()
                for _ in range(10):
                    fn()
                out.setdefault((name, busy), []).append((time.perf_counter() - t0) / 10)
                dist.barrier()
            else:
                if busy:
                    # compute until rank 0 is done (its barrier arrives)
                    work = dist.barrier(async_op=True)
                    while not work.is_completed():
                        fn()
                    work.wait()
                else:
                    dist.barrier()
    return out
