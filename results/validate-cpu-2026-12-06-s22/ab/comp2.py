import sys, json, statistics as st, time
from dataclasses import replace
sys.path.insert(0,'/work/main')
import torch
torch.set_num_threads(1)
from plansim.cmd_calibrate import resolve_world
from specs.model import load_model
from specs.plan import resolve_plan
from costmodel.profile import load_profile
from sim.program import chunk_work
from validate.compute_bench import stage_trainer
tiny = load_model('tiny')
cl1, _ = resolve_world('localhost-cpu', 1, '--world', '')
prof = load_profile(sys.argv[1], bundled=cl1.profiles)
for L, mb in ((3, 12), (4, 8), (2, 16), (1, 16)):
    m = replace(tiny, num_layers=L, global_batch_size=mb)
    plan = resolve_plan('dp=1', m, 1)
    w = chunk_work(m, plan, cl1, prof, 0, L, True, True)
    chunk, mbs, train = stage_trainer(m, L, mb, torch.device('cpu'))
    rec = [c.cell_contents for c in train.__closure__ if type(c.cell_contents).__name__ == 'Recorder'][0]
    for _ in range(3): train()
    T, F, B = [], [], []
    for _ in range(15):
        t0 = time.perf_counter(); train(); T.append(time.perf_counter() - t0)
        F.append(rec.detail_s.get('forward', 0)); B.append(rec.detail_s.get('backward', 0))
    t, f, b = st.median(T), st.median(F), st.median(B)
    print(f"L{L} mb{mb}: step {t*1e3:.2f} ms (fwd {f*1e3:.2f} bwd {b*1e3:.2f} other {(t-f-b)*1e3:.2f}); model {mb*(w.fwd_s+w.bwd_s)*1e3:.2f} (fwd {mb*w.fwd_s*1e3:.2f} bwd {mb*w.bwd_s*1e3:.2f}); c={t/(mb*(w.fwd_s+w.bwd_s)):.3f} cF={f/(mb*w.fwd_s):.3f} cB={b/(mb*w.bwd_s):.3f}  {dict((k, round(v*1e3,2)) for k,v in rec.detail_s.items())}")
