"""The single-process reference every parallel layout is checked against: the whole
model in one process, the whole global batch in one forward, no communication.

It shares the model (validate/gpt.py) and the Adam step (validate/dp.py) with the
runner but none of the splitting: no microbatches, no TP slices, no pipeline, no
buckets, so a layout whose losses and gradients match it splits the work correctly.
"""
from __future__ import annotations

from costmodel.shapes import ModelSpec


def reference_run(model: ModelSpec, steps: int, seed: int = 0) -> dict:
    """Train ``steps`` steps; returns {'losses': [...], 'grads': {name: ndarray} of the
    first step, 'weights': {name: ndarray} after the last step}."""
    import torch
    from validate.dp import adam_update
    from validate.gpt import GPTChunk, batch_tokens, full_weights

    torch.manual_seed(seed)
    chunk = GPTChunk(model, list(range(model.num_layers)), True, True, full_weights(model, seed),
                     None, False, "none", torch.device("cpu"))
    state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in chunk.params.items()}
    losses, grads = [], None
    for step in range(steps):
        tokens = batch_tokens(model, step, seed)
        loss = chunk.forward(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(float(loss.detach()))
        if grads is None:
            grads = {n: p.grad.detach().numpy().copy() for n, p in chunk.params.items()}
        with torch.no_grad():
            for n, p in chunk.params.items():
                adam_update(p, p.grad, *state[n], step + 1)
                p.grad = None
    return {"losses": losses, "grads": grads,
            "weights": {n: p.detach().numpy().copy() for n, p in chunk.params.items()}}
