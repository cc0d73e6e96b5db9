"""Tensor-parallel communication as autograd functions (Shoeybi et al. 2019, Megatron-LM,
Sec. 3 and Fig. 3: the f and g operators; Korthikanti et al. 2022, Sec. 4.2.2, for the
sequence-parallel variant).

A column-parallel linear (weight split along its output rows) needs its input on every
TP rank; a row-parallel linear (weight split along its input columns) produces partial
sums that must be added up. Without sequence parallelism:
- ``enter``  (f): forward identity, backward all-reduce of the input gradient;
- ``leave``  (g): forward all-reduce, backward identity.
With sequence parallelism (activations between blocks split along the sequence):
- ``enter``: forward all-gather along the sequence, backward reduce-scatter;
- ``leave``: forward reduce-scatter along the sequence, backward all-gather.
And at the ends of the stack, where the replicated embedding output enters the
sequence-split region and the split output returns to the replicated logits:
- ``scatter_seq``: forward keep my slice, backward all-gather;
- ``gather_seq``: forward all-gather, backward keep my slice (every rank computes the
  same replicated loss, so each already holds the whole, identical gradient).
Activations are [batch, sequence, hidden]; the sequence is dim 1.
"""
from __future__ import annotations

from validate.comm import Comm

SEQ_DIM = 1


def _fn_classes():
    import torch

    class _Enter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, comm: Comm, sp: bool):
            ctx.comm, ctx.sp = comm, sp
            return comm.all_gather(x, SEQ_DIM, "all-gather (sp enter)") if sp else x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            c = ctx.comm
            if ctx.sp:
                return c.reduce_scatter(g, SEQ_DIM, "reduce-scatter (sp enter, bwd)"), None, None
            return c.all_reduce(g.contiguous().clone(), "all-reduce (enter, bwd)"), None, None

    class _Leave(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, comm: Comm, sp: bool):
            ctx.comm, ctx.sp = comm, sp
            if sp:
                return comm.reduce_scatter(x, SEQ_DIM, "reduce-scatter (sp leave)")
            return comm.all_reduce(x.contiguous().clone(), "all-reduce (leave)")

        @staticmethod
        def backward(ctx, g):
            if ctx.sp:
                return ctx.comm.all_gather(g, SEQ_DIM, "all-gather (sp leave, bwd)"), None, None
            return g, None, None

    class _ScatterSeq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, comm: Comm):
            ctx.comm = comm
            return comm.split(x, SEQ_DIM)

        @staticmethod
        def backward(ctx, g):
            return ctx.comm.all_gather(g, SEQ_DIM, "all-gather (sp scatter, bwd)"), None

    class _GatherSeq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, comm: Comm):
            ctx.comm = comm
            return comm.all_gather(x, SEQ_DIM, "all-gather (sp gather)")

        @staticmethod
        def backward(ctx, g):
            return ctx.comm.split(g, SEQ_DIM), None

    return _Enter, _Leave, _ScatterSeq, _GatherSeq


_CLASSES = None


def _classes():
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _fn_classes()
    return _CLASSES


def enter(x, comm: Comm | None, sp: bool):
    """Into a column-parallel linear (f; with sp: all-gather the sequence)."""
    if comm is None or comm.size == 1:
        return x
    return _classes()[0].apply(x, comm, sp)


def leave(x, comm: Comm | None, sp: bool):
    """Out of a row-parallel linear (g; with sp: reduce-scatter the sequence)."""
    if comm is None or comm.size == 1:
        return x
    return _classes()[1].apply(x, comm, sp)


def scatter_seq(x, comm: Comm | None, sp: bool):
    """Replicated embedding output -> this rank's sequence slice (only with sp)."""
    if not sp or comm is None or comm.size == 1:
        return x
    return _classes()[2].apply(x, comm)


def gather_seq(x, comm: Comm | None, sp: bool):
    """Sequence slice -> the whole sequence on every rank (only with sp)."""
    if not sp or comm is None or comm.size == 1:
        return x
    return _classes()[3].apply(x, comm)
