import validate.collective_bench as cb
from validate.collective_bench import units_in_gap, collective_worker
from specs.model import ModelSpec

def worker(rank, world, cfg, width):
    if width:
        def gap_layers(gap_s, dev, dsync):
            import torch
            from validate.compute_bench import stage_trainer
            m = ModelSpec("gapw", 1, width, 4, 64, 512, 1)
            chunk, mbs, _ = stage_trainer(m, 1, 1, dev, "none")
            def plain():
                with torch.no_grad():
                    chunk.forward(*mbs[0])
            j = units_in_gap(plain, gap_s, dev, dsync)
            def run():
                for _ in range(j):
                    plain()
            return run
        cb.gap_layers = gap_layers
    return collective_worker(rank, world, cfg)
