"""Worker: 32 KiB-ish all-reduce cost after the model's own layer compute at tp=2 slicing.
kinds: chain (gap_layers 0.35 ms), mlp (GEMM+gelu), halves (tiny layer's attention and MLP
halves, forward, no grad, call after each), layer (tiny layer fwd+bwd with its 4 calls via
a real Comm vs a no-op Comm)."""
import time, torch, torch.distributed as dist
import validate.collective_bench as cb
from specs.model import load_model
from validate.gpt import GPTChunk, full_weights
from validate.comm import Comm

class NoComm(Comm):
    def all_reduce(self, t, label="", maximum=False):
        return t

class NullRec:
    def span(self, *a, **k):
        import contextlib; return contextlib.nullcontext()
    def sent(self, *a, **k): pass

def worker(rank, world, kinds, calls):
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    m = load_model("tiny")
    w = full_weights(m, 0)
    real = Comm("tp", [0, 1], rank, NullRec())
    fake = NoComm("tp", [0, 1], rank, NullRec())
    ch_real = GPTChunk(m, [1], False, False, w, real, False, "none", dev)
    ch_fake = GPTChunk(m, [1], False, False, w, fake, False, "none", dev)
    x = torch.randn(1, m.seq_length, m.hidden_size)
    t = torch.zeros(1 * m.seq_length * m.hidden_size)
    mx = torch.zeros(1, dtype=torch.float64)
    def timed(fn):
        dist.barrier(); t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        mx[0] = (time.perf_counter() - t0) / calls
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        return float(mx[0])
    call = lambda: dist.all_reduce(t)
    out = []
    for kind in kinds:
        if kind == "halves":
            def mk(c):
                def f():
                    with torch.no_grad():
                        h = c._attention("l1.", c._norm(x, "l1.ln1")); 
                        if c is ch_fake: call()
                        c._mlp("l1.", c._norm(x + h, "l1.ln2"))
                        if c is ch_fake: call()
                return f
            def alone():
                with torch.no_grad():
                    h = ch_fake._attention("l1.", ch_fake._norm(x, "l1.ln1")); ch_fake._mlp("l1.", ch_fake._norm(x + h, "l1.ln2"))
            a = timed(alone); wc = timed(mk(ch_fake)); n = 2
        elif kind == "layer":
            xs = x.clone().requires_grad_(True)
            def run(c):
                def f():
                    y = c.forward(xs); y.backward(torch.ones_like(y))
                return f
            a = timed(run(ch_fake)); wc = timed(run(ch_real)); n = 4
        else:
            comp = cb.gap_layers(0.35e-3, dev, None) if kind == "chain" else None
            if kind == "mlp":
                xm = torch.randn(64, 128); w1 = torch.randn(256, 128); w2 = torch.randn(128, 256)
                comp = lambda: torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(xm, w1)), w2)
            a = timed(comp)
            def both():
                comp(); call()
            wc = timed(both); n = 1
        out.append((kind, a / n, (wc - a) / n))
    return out
