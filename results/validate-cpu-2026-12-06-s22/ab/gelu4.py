import sys, torch, time, statistics as st
sys.path.insert(0,'/work/main')
torch.set_num_threads(1)
import torch.nn.functional as F
from validate.compute_bench import stage_trainer
from specs.model import load_model
chunk, mbs, train = stage_trainer(load_model('tiny'), 4, 8, torch.device('cpu'))
orig=F.gelu; lin=F.linear
T=[]; L=[]; A=[]
def gw(x,*a,**k):
    t0=time.perf_counter(); y=orig(x,*a,**k); T.append(time.perf_counter()-t0); return y
def lw(x,w,b=None):
    t0=time.perf_counter(); y=lin(x,w,b); L.append((tuple(w.shape), time.perf_counter()-t0)); return y
F.gelu=gw; F.linear=lw
for mode in ('plain','train'):
    T.clear(); L.clear()
    for _ in range(30):
        if mode=='plain':
            with torch.no_grad():
                for x in mbs: chunk.forward(*x)
        else: train()
    print(mode, 'gelu in forward: median', st.median(T)*1e6, 'us  p10', sorted(T)[len(T)//10]*1e6)
    by={}
    for s,t in L: by.setdefault(s,[]).append(t)
    for s,v in by.items(): print('   linear', s, f"{st.median(v)*1e6:.1f} us", len(v))
