import sys, time, statistics as st
sys.path.insert(0, '/work/main')
import torch
torch.set_num_threads(1)
from validate.compute_bench import stage_trainer
from specs.model import load_model
from torch.profiler import profile, ProfilerActivity
model = load_model('tiny')
chunk, mbs, train = stage_trainer(model, 4, 8, torch.device('cpu'))
mode = sys.argv[1]
def fwd():
    if mode == 'plain':
        with torch.no_grad():
            for x in mbs: chunk.forward(*x)
    else:
        train()
for _ in range(5): fwd()
with profile(activities=[ProfilerActivity.CPU]) as p:
    for _ in range(10): fwd()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
