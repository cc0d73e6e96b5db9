"""Worker: the runner's own pp=2 plan (validate/runner._worker), with its pipeline sends and
receives real or replaced by local no-ops (each receive buffer filled with N(0, 0.1) before
its wait returns), several plans in one set of processes, interleaved."""
import torch.distributed as dist
import validate.runner as vr

class _Done:
    def wait(self, *a, **k):
        return True
    def is_completed(self):
        return True

def worker(rank, world, runs):
    real_isend, real_irecv = dist.isend, dist.irecv
    out = []
    for model, plan, cfg, fake in runs:
        if fake:
            dist.isend = lambda t, dst, group=None, tag=0: _Done()
            def irecv(t, src=None, group=None, tag=0):
                t.normal_(0.0, 0.1)
                return _Done()
            dist.irecv = irecv
        try:
            out.append(vr._worker(rank, world, model, plan, cfg))
        finally:
            dist.isend, dist.irecv = real_isend, real_irecv
    return out
