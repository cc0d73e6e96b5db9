import validate.runner as vr
import validate.gpt as vg
def worker(rank, world, runs):
    real = vg.batch_tokens
    out = []
    for model, plan, cfg, fixed in runs:
        if fixed:
            vr_bt = lambda model, step, seed: real(model, 0, seed)
            import validate.gpt
            validate.gpt.batch_tokens = vr_bt
        try:
            out.append(vr._worker(rank, world, model, plan, cfg))
        finally:
            vg.batch_tokens = real
    return out
