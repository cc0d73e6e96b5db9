import sys, torch, time, statistics as st
sys.path.insert(0,'/work/main')
torch.set_num_threads(1)
import torch.nn.functional as F
from validate.compute_bench import stage_trainer
from specs.model import load_model
chunk, mbs, train = stage_trainer(load_model('tiny'), 4, 8, torch.device('cpu'))
def fwd():
    with torch.no_grad():
        for x in mbs: chunk.forward(*x)
def t(f, n=20):
    for _ in range(5): f()
    xs=[]
    for _ in range(15):
        t0=time.perf_counter()
        for _ in range(n): f()
        xs.append((time.perf_counter()-t0)/n)
    return st.median(xs)*1e6/8
orig=F.gelu
res={}
for r in range(3):
    F.gelu=orig; a=t(fwd)
    F.gelu=lambda x,*k,**kw: x; b=t(fwd)
    F.gelu=lambda x,*k,**kw: orig(x.clone()); c=t(fwd)
    print(f"per mb: with gelu {a:.0f} us, gelu->identity {b:.0f} us (gelu costs {a-b:.0f} us for 4 calls), gelu(clone) {c:.0f}")
F.gelu=orig
