"""Make one rank of a real run slow, in proportion to the work it holds. Two ways:

- ``quota`` (data parallel): after its forward and backward, the rank pauses for
  ``elapsed * (1/F - 1)``, so its compute phase lasts 1/F times what it measured. This is
  what a CPU quota of F (cgroup ``cpu.max``) does to a compute-bound process, without the
  privileges a cgroup needs, and like a slower device it leaves the cores to others while
  it waits. It scales with the rank's share because it is a multiple of the measured time
  of that share.
- ``work``: the rank does its own forward and backward and ``1/F - 1`` more passes of the
  same kind on the same inputs whose gradients are thrown away (``torch.autograd.grad``:
  no ``.grad`` is accumulated, so no gradient hook fires and training is unchanged); the
  fractional part runs one pass over that share of the batch rows. Real extra work, in
  every action of a pipeline stage (validate/pp.py runs only ``forward``, so the extra
  passes, backward included, ride on it). On a host with fewer free cores than busy
  processes the extra passes take CPU from the other ranks too, and a waiting rank gives
  its share to the slow one: the fixed split then shows less than 1/F (1.45x instead of
  2x measured at load 11-14 on 2 cores), which is why ``quota`` is the default for dp.
"""
from __future__ import annotations

import math

from costmodel.errors import InputError
from costmodel.limits import MAX_DEVICES, number_problem


SLOW_MODES = ("quota", "work")
MIN_SPEED = 0.05  # slowest emulated rank: 20x slower than the others


def quota_pause(elapsed_s: float, speed: float) -> None:
    """Pause so that ``elapsed_s`` of compute lasts ``elapsed_s / speed`` in all."""
    import time
    if speed < 1.0 and elapsed_s > 0:
        time.sleep(elapsed_s * (1.0 / speed - 1.0))


def parse_slow_rank(text: str, world: int | None = None) -> tuple[int, float]:
    """'R:F' -> (rank R, speed F); e.g. '1:0.5' is rank 1 at half speed."""
    head, sep, tail = str(text).partition(":")
    try:
        rank, speed = int(head), float(tail)
    except ValueError:
        rank, speed = None, None
    if not sep or rank is None:
        raise InputError("--slow-rank", None, f"{str(text)[:40]!r}: give R:F, a rank R and a speed F "
                         "(e.g. 1:0.5 = rank 1 at half speed)")
    problem = number_problem(rank, 0, (world - 1) if world is not None else MAX_DEVICES, integer=True)
    if problem:
        raise InputError("--slow-rank", "rank", f"{rank}: {problem} (the run's processes)")
    # Below 0.05 (a 20x slower rank) the run would only grow long.
    problem = number_problem(speed, MIN_SPEED, 1.0)
    if problem:
        raise InputError("--slow-rank", "speed", f"{speed:g}: {problem}")
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
