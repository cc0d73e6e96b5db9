import torch, time, statistics
from validate.topk import select
torch.manual_seed(0); torch.set_num_threads(1)
n=860_000
def run(mode, steps=30):
    p=torch.randn(n)*0.02; m=torch.zeros(n); v=torch.zeros(n); s=torch.empty(n); g=torch.empty(n); res=None
    T={}
    b1,b2=0.9,0.999
    for t in range(1,steps+1):
        fresh=torch.randn(n)*1e-3
        if mode=='dense': g.copy_(fresh)
        else:
            idx,vals,res=select(fresh,res,n//10)
            g.zero_(); g.index_add_(0, idx.long(), vals)
        ops=[('m',lambda: m.mul_(b1).add_(g,alpha=1-b1)),('v',lambda: v.mul_(b2).addcmul_(g,g,value=1-b2)),
             ('sqrt',lambda: torch.sqrt(v,out=s)),('div',lambda: s.div_((1-b2**t)**0.5).add_(1e-8)),('addcdiv',lambda: p.addcdiv_(m,s,value=-1e-3/(1-b1**t)))]
        for name,f in ops:
            t0=time.perf_counter(); f(); T.setdefault(name,[]).append(time.perf_counter()-t0)
    return {k:round(statistics.median(x[10:])*1e6) for k,x in T.items()}
for mode in ['dense','topk','dense','topk']:
    print(mode, run(mode))
