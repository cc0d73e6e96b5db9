"""Per-call TP all-reduce cost, four ways, alternating in one 2-process launch:
stream (calibration's after-compute stream), tiny tp=2 step real-noop, chain tp=2 step real-noop."""
import sys, statistics, time
sys.path.insert(0, '/work/main')
from validate.launch import launch
from validate.runner import _worker, RunConfig
from validate.collective_bench import CollectiveConfig, after_compute_rows
from specs.model import load_model, ModelSpec
from specs.plan import resolve_plan

def tp_trainer(model, layers, microbatches, dev, comm):
    from validate.dp import GradReducer
    from validate.comm import Comm
    from validate.gpt import GPTChunk, batch_tokens, full_weights
    from validate.pp import PipelineStage
    rec = comm.rec
    chunk = GPTChunk(model, list(range(layers)), True, True, full_weights(model, 0), comm, False, "none", dev)
    reducer = GradReducer([(0, chunk.params)], Comm("dp", [0], 0, rec), bucket_bytes=25e6,
                          overlap=True, zero=0, topk=None, late=set())
    stage = PipelineStage(0, 1, 1, {0: chunk}, lambda st: 0, (1, model.seq_length, model.hidden_size), rec, reducer, dev)
    acts = stage.actions("1f1b", microbatches)
    tokens = batch_tokens(model, 0, 0).to(dev)
    mbs = [(tokens[i:i + 1, :-1], tokens[i:i + 1, 1:]) for i in range(microbatches)]
    def train():
        rec.begin_step(); reducer.begin_step()
        stage.run(acts, mbs, 1.0 / microbatches)
        reducer.mark_late_ready(); reducer.finish(); rec.end_step()
    return train

def worker(rank, world, reps, steps, chain_w):
    import torch, torch.distributed as dist
    from validate.comm import Comm
    from validate.timeline import Recorder
    model = load_model("tiny")
    plan = resolve_plan("tp=2", model, 2)
    real_ar = Comm.all_reduce
    calls = [0]
    def counting(self, t, *a, **k):
        calls[0] += 1
        return real_ar(self, t, *a, **k)
    def noop(self, t, *a, **k):
        calls[0] += 1
        return t
    cfg = RunConfig(steps=steps, warmup=2, seed=0, backend="gloo")
    ccfg = CollectiveConfig(sizes=(), ops=(), after_compute_sizes=(32768,), after_compute_ops=("all_reduce",))
    g = dist.new_group([0, 1])
    comm = Comm("tp", [0, 1], rank, Recorder(), g)
    trains = {}
    for w, s_ in chain_w:
        chain = ModelSpec("tpchain", num_layers=4, hidden_size=w, num_attention_heads=2, seq_length=s_, vocab_size=8, global_batch_size=2)
        trains[(w, s_)] = tp_trainer(chain, 4, 2, torch.device("cpu"), comm)
    mx = torch.zeros(1, dtype=torch.float64)
    def chain_time(n, chain_train):
        for _ in range(3): chain_train()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n): chain_train()
        mx[0] = (time.perf_counter() - t0) / n
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        return float(mx[0])
    out = []
    for r in range(reps):
        row = after_compute_rows(ccfg, 2, None, 0, (rank+1)%2, (rank+1)%2, torch.device("cpu"), None)
        out.append(("stream", round(row[0][3]*1e3, 3)))
        for key, tr in trains.items():
          res = {}
          for mode in ("real", "noop"):
            Comm.all_reduce = counting if mode == "real" else noop
            calls[0] = 0
            res[mode] = chain_time(60, tr)
            c = calls[0] / 63
            Comm.all_reduce = real_ar
          out.append(("chain", key, round((res["real"] - res["noop"]) / c * 1e3, 3), c, round(res["noop"]*1e3, 2)))
        res = {}
        for mode in ("real", "noop"):
            Comm.all_reduce = counting if mode == "real" else noop
            calls[0] = 0
            rr = _worker(rank, world, model, plan, cfg)
            Comm.all_reduce = real_ar
            ws = [s["wall_s"] for s in rr["steps"][2:]]
            t = torch.tensor(ws, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            res[mode] = statistics.median(t.tolist())
        out.append(("tiny", round((res["real"] - res["noop"]) / 320 * 1e3, 3), round(res["noop"]*1e3, 1)))
    return out

if __name__ == "__main__":
    res = launch(worker, 2, (3, 6, [(8, 4), (64, 16), (128, 64)]), timeout_s=900, backend="gloo")
    for x in res[0]:
        print(x)
