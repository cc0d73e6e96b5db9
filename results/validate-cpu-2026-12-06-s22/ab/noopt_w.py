import validate.runner as vr
import validate.dp as vdp
def worker(rank, world, runs):
    real = vdp.GradReducer.step
    out = []
    for model, plan, cfg, noopt in runs:
        if noopt:
            vdp.GradReducer.step = lambda self, step: None
        try:
            out.append(vr._worker(rank, world, model, plan, cfg))
        finally:
            vdp.GradReducer.step = real
    return out
