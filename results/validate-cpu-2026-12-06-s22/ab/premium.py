"""GPipe-order premium over depth-1 order of the runner's stage (no comm), by shape, in
one process; run two copies at once to mimic calibration's 2 compute processes."""
import sys, time, statistics as st
from dataclasses import replace
sys.path.insert(0, '/work/main')
import torch
torch.set_num_threads(1)
from validate.compute_bench import stage_trainer
from sim.schedules import one_f_one_b, gpipe
from specs.model import load_model
tiny = load_model('tiny')
import os
shapes = [(3, 12), (2, 16), (1, 16), (4, 8)] if os.environ.get('KEEP') != '1' else [(4, 8)]
if os.environ.get('KEEP') == '1':  # as premium2 ran: the heap kept, four layers only
    from validate.backend import configure_cpu_heap
    configure_cpu_heap()
fns = {}
for L, mb in shapes:
    m = replace(tiny, num_layers=L, global_batch_size=mb)
    fns[(L, mb, 'd1')] = stage_trainer(m, L, mb, torch.device('cpu'), actions=one_f_one_b(1, mb)[0])[2]
    fns[(L, mb, 'gp')] = stage_trainer(m, L, mb, torch.device('cpu'), actions=gpipe(1, mb)[0])[2]
for f in fns.values():
    f(); f()
times = {k: [] for k in fns}
t_end = time.time() + float(sys.argv[1])
while time.time() < t_end:
    for k, f in fns.items():
        t0 = time.perf_counter(); f(); times[k].append(time.perf_counter() - t0)
out = []
for L, mb in shapes:
    d1, gp = times[(L, mb, 'd1')], times[(L, mb, 'gp')]
    r = [g / d for g, d in zip(gp, d1)]
    out.append(f"L{L} mb{mb}: gpipe/d1 median {st.median(r):.3f} (n={len(r)}, q25 {sorted(r)[len(r)//4]:.3f} q75 {sorted(r)[3*len(r)//4]:.3f}); d1 {st.median(d1)*1e3:.1f} ms")
print(sys.argv[2], ' | '.join(out), flush=True)
