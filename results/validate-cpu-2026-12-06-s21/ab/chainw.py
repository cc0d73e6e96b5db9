"""Worker: the overhead chain's training step (CHAIN_MODEL, width 8) at several (layers,
microbatches), interleaved windows (compute_bench._interleaved_drawer), median per config."""
import torch
from dataclasses import replace
from validate.compute_bench import CHAIN_MODEL, stage_trainer, _interleaved_drawer

def worker(rank, world, configs, windows):
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    fns = [stage_trainer(replace(CHAIN_MODEL, num_layers=L, global_batch_size=max(mb, 2)), L, mb, dev)[2]
           for L, mb in configs]
    draw = _interleaved_drawer(torch, fns, windows, None)
    return draw()
