import torch, time, statistics
from validate.dp import adam_update
from validate.topk import select
torch.manual_seed(0); torch.set_num_threads(1)
n=860_000
def run(mode, steps=40):
    p=torch.randn(n)*0.02; m=torch.zeros(n); v=torch.zeros(n); s=torch.empty(n); g=torch.empty(n); res=None
    ts=[]
    for t in range(1,steps+1):
        fresh=torch.randn(n)*1e-3
        if mode=='dense': g.copy_(fresh)
        else:
            idx,vals,res=select(fresh,res,n//10)
            g.zero_(); g.index_add_(0, idx.long(), vals); g.index_add_(0, idx.long(), vals)
        t0=time.perf_counter(); adam_update(p,g,m,v,t,scratch=s); ts.append(time.perf_counter()-t0)
    sub=(v[v!=0].abs()<1.18e-38).sum().item(); subm=((m!=0)&(m.abs()<1.18e-38)).sum().item()
    return statistics.median(ts[10:])*1e3, sub, subm
for mode in ['dense','topk','dense','topk']:
    print(mode, run(mode))
