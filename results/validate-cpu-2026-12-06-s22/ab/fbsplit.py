"""Forward vs backward time per action in the runner's stage (one process), at the chain's
width 8 and at tiny's width; plus a plain (no_grad) forward."""
import sys, time, statistics as st
from dataclasses import replace
sys.path.insert(0, '/work/main')
import torch
torch.set_num_threads(1)
from validate.compute_bench import stage_trainer, CHAIN_MODEL, chain_ops
from specs.model import load_model
from costmodel.profile import load_profile
from plansim.cmd_calibrate import resolve_world
import costmodel.flops as fl
from costmodel.efficiency import transform_ops
from sim.program import grad_accumulation_ops

def run(model, layers, mb, reps):
    chunk, mbs, train = stage_trainer(model, layers, mb, torch.device('cpu'))
    rec = chunk  # placeholder
    # find recorder: train closure's rec
    rec = train.__closure__
    recs = [c.cell_contents for c in train.__closure__ if type(c.cell_contents).__name__ == 'Recorder']
    rec = recs[0]
    for _ in range(3): train()
    F, B, O, T = [], [], [], []
    for _ in range(reps):
        t0 = time.perf_counter(); train(); T.append(time.perf_counter() - t0)
        F.append(rec.detail_s.get('forward', 0)); B.append(rec.detail_s.get('backward', 0)); O.append(rec.detail_s.get('optimizer', 0))
    with torch.no_grad():
        chunk.forward(*mbs[0])
        P = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for x in mbs: chunk.forward(*x)
            P.append(time.perf_counter() - t0)
    return st.median(F) / mb, st.median(B) / mb, st.median(P) / mb, st.median(T), dict(rec.detail_s)

for name, model, layers, mb in (("chain w8", CHAIN_MODEL, 4, 2), ("chain w8 L1 mb8", replace(CHAIN_MODEL, num_layers=1, global_batch_size=8), 1, 8),
                                 ("tiny L4 mb8", load_model('tiny'), 4, 8)):
    f, b, p, t, det = run(model, layers, mb, 30 if 'tiny' in name else 200)
    m = replace(model, num_layers=layers)
    nf = (len(fl.layer_forward_ops(m, 1, 1, False, 4)) * layers + len(fl.embedding_ops(m, 1, 1, 4)) + len(fl.head_forward_ops(m, 1, 1, 4)))
    nb = (len(fl.layer_backward_ops(m, 1, 1, False, 4)) * layers + len(fl.embedding_backward_ops(m, 1, 1, 4)) + len(fl.head_backward_ops(m, 1, 1, 4)))
    print(f"{name}: per microbatch fwd(grad) {f*1e6:.0f} us, bwd {b*1e6:.0f} us, plain fwd {p*1e6:.0f} us; model ops fwd {nf} bwd {nb}; "
          f"fwd extra over plain {(f-p)*1e6:.0f} us = {(f-p)*1e6/nf:.2f} us/fwd op; bwd per bwd op {b*1e6/nb:.2f}; plain per fwd op {p*1e6/nf:.2f}; step {t*1e3:.2f} ms; detail { {k: round(v*1e3,3) for k,v in det.items()} }")
