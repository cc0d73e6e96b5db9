"""Move pipeline layers between ranks for real: weights and Adam state over send/recv.

After a step's optimizer update, every parameter of a layer changing stage travels from
its old owner to its new one as one message per layer: the weight, Adam's first and
second moments (validate/dp.adam_update), concatenated in the fixed order of
validate/gpt.layer_params. Adam's step count is the run's step, the same on every rank,
so it does not travel. The receiving rank then builds its new chunk from those tensors
and the weights it kept, and a fresh GradReducer whose buckets are loaded with the moved
and kept Adam state, so the next step computes exactly what the unmoved model would.
"""
from __future__ import annotations


def reducer_state(reducer) -> dict:
    """name -> (weight, m, v) of every parameter the reducer (validate/dp.GradReducer,
    not sharded) holds; copies. m and v are zeros before the first optimizer step."""
    import torch
    out = {}
    for b in reducer.buckets:
        for name, p, off in zip(b.names, b.params, b.offsets):
            sl = slice(off, off + p.numel())
            m = b.adam["m"][sl].view_as(p).clone() if b.adam else torch.zeros_like(p.data)
            v = b.adam["v"][sl].view_as(p).clone() if b.adam else torch.zeros_like(p.data)
            out[name] = (p.data.clone(), m, v)
    return out


def load_reducer_state(reducer, state: dict) -> None:
    """Fill the reducer's flat Adam buffers from ``state`` (name -> (weight, m, v)); the
    weights themselves are already in place (the chunk was built from them)."""
    import torch
    for b in reducer.buckets:
        m = torch.zeros_like(b.flat_param)
        v = torch.zeros_like(b.flat_param)
        for name, p, off in zip(b.names, b.params, b.offsets):
            _, mi, vi = state[name]
            m[off:off + p.numel()].copy_(mi.reshape(-1))
            v[off:off + p.numel()].copy_(vi.reshape(-1))
        b.adam = {"m": m, "v": v, "scratch": torch.empty_like(m)}  # as GradReducer.step keeps it


def owners(layers_per_stage) -> list[int]:
    """Stage owning each global layer for a contiguous split: (2, 2) -> [0, 0, 1, 1]."""
    out = []
    for s, n in enumerate(layers_per_stage):
        out += [s] * n
    return out


def move_layers(model, state: dict, old, new, stage: int, rank_of) -> tuple[dict, int]:
    """Send this stage's layers that ``new`` gives to another stage, receive the ones it
    gains; returns (the state of every layer this stage holds under ``new`` plus its
    non-layer parameters, bytes sent). ``rank_of(stage)`` is the stage's global rank."""
    import torch
    import torch.distributed as dist
    from validate.gpt import layer_params

    before, after = owners(old), owners(new)
    sends, recvs = [], []
    for layer, (a, b) in enumerate(zip(before, after)):
        if a == b or stage not in (a, b):
            continue
        names = [ps.name for ps in layer_params(model, layer)]
        if stage == a:
            flat = torch.cat([t.reshape(-1) for n in names for t in state[n]])
            sends.append((dist.isend(flat, rank_of(b), tag=layer), flat))
        else:
            numel = sum(3 * int(torch.Size(ps.shape).numel()) for ps in layer_params(model, layer))
            buf = torch.empty(numel)
            recvs.append((dist.irecv(buf, rank_of(a), tag=layer), buf, layer))
    for work, buf, layer in recvs:
        work.wait()
        off = 0
        for ps in layer_params(model, layer):
            n = int(torch.Size(ps.shape).numel())
            parts = []
            for _ in range(3):
                parts.append(buf[off:off + n].view(ps.shape).clone())
                off += n
            state[ps.name] = tuple(parts)
    sent = 0
    for work, flat in sends:
        work.wait()
        sent += flat.numel() * flat.element_size()
    gone = {ps.name for layer, (a, b) in enumerate(zip(before, after)) if a == stage and b != stage
            for ps in layer_params(model, layer)}
    return {n: t for n, t in state.items() if n not in gone}, sent
