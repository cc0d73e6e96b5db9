"""Make one rank of a real run slow, in proportion to the work it holds.

A rank at speed F (0 < F <= 1) does its own forward and backward, and ``1/F - 1`` more
passes of the same kind on the same inputs whose gradients are thrown away
(``torch.autograd.grad``: no ``.grad`` is accumulated, so no gradient hook fires and the
training is unchanged). The fractional part of ``1/F - 1`` runs one pass over that share
of the batch rows.

Why extra passes and not a sleep or a CPU quota: the extra time then scales with the
rank's share exactly as its real compute does (a rank given 5 samples instead of 8
slows by 5/8 of its work, batch-size effects included), which is what a rebalancer has
to discover; a fixed sleep would not scale, and a CPU quota (cgroups) needs privileges
this runner does not assume. The price: the slow rank really uses the CPU, so on a host
with fewer free cores than ranks its neighbours lose some speed too (the ratios reported
are measured in one run, so they see the same load).
"""
from __future__ import annotations

import math

from costmodel.errors import InputError


def parse_slow_rank(text: str, world: int | None = None) -> tuple[int, float]:
    """'R:F' -> (rank R, speed F); e.g. '1:0.5' is rank 1 at half speed."""
    head, sep, tail = str(text).partition(":")
    try:
        rank, speed = int(head), float(tail)
    except ValueError:
        rank, speed = -1, float("nan")
    if not sep or rank < 0 or not (0.0 < speed <= 1.0) or not math.isfinite(speed):
        raise InputError("--slow-rank", None, f"{str(text)[:40]!r}: give R:F, a rank R >= 0 and a speed "
                         "F in (0, 1] (e.g. 1:0.5 = rank 1 at half speed)")
    if world is not None and rank >= world:
        raise InputError("--slow-rank", None, f"rank {rank} is outside the run's {world} processes")
    if speed < 0.05:
        raise InputError("--slow-rank", None, f"speed {speed:g} is below 0.05 (a 20x slower rank "
                         "would only make the run long)")
    return rank, speed


def extra_passes(speed: float) -> tuple[int, float]:
    """(whole extra passes, fraction of one more) for a rank at ``speed``: 0.5 -> (1, 0.0),
    0.4 -> (1, 0.5), 1.0 -> (0, 0.0)."""
    extra = 1.0 / speed - 1.0
    whole = int(math.floor(extra + 1e-9))
    frac = max(0.0, extra - whole)
    return whole, (0.0 if frac < 1e-9 else frac)


def waste_pass(chunk, inp, targets, loss_scale: float, rows: int | None = None) -> None:
    """One forward and backward of ``chunk`` on (the first ``rows`` rows of) ``inp``, its
    gradients discarded. Costs what the real pass costs: same kernels, same shapes."""
    import torch
    if rows is not None:
        inp = inp[:rows]
        targets = targets[:rows] if targets is not None else None
    x = inp.detach()
    if x.is_floating_point():
        x.requires_grad_()
    out = chunk.forward(x, targets, loss_scale)
    wrt = [p for p in chunk.params.values()] + ([x] if x.requires_grad else [])
    grad_out = None if out.dim() == 0 else torch.ones_like(out)
    torch.autograd.grad(out, wrt, grad_outputs=grad_out, allow_unused=True)


def slow_work(chunk, inp, targets, loss_scale: float, speed: float) -> None:
    """The extra work of a rank at ``speed`` for one pass over ``inp`` (nothing at 1.0)."""
    whole, frac = extra_passes(speed)
    for _ in range(whole):
        waste_pass(chunk, inp, targets, loss_scale)
    if frac:
        waste_pass(chunk, inp, targets, loss_scale, rows=max(1, math.ceil(frac * inp.shape[0])))


class SlowChunk:
    """A GPTChunk whose every forward first does the extra work of ``speed`` (pipeline
    stages: validate/pp.PipelineStage only calls ``forward``). The extra passes include
    their backward, so the stage's total time scales by 1/speed; it lands in its F actions."""

    def __init__(self, chunk, speed: float):
        self.chunk, self.speed, self.params = chunk, speed, chunk.params

    def forward(self, inp, targets=None, loss_scale: float = 1.0):
        slow_work(self.chunk, inp, targets, loss_scale, self.speed)
        return self.chunk.forward(inp, targets, loss_scale)
