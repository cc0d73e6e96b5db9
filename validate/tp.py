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
And at the ends of the stack, Megatron's vocabulary-parallel embedding and loss
(Shoeybi et al. 2019, Sec. 3, "Input embedding" and the fused cross entropy; Megatron-Core
tensor_parallel/layers.py VocabParallelEmbedding and cross_entropy.py
VocabParallelCrossEntropy): the token embedding is split along the vocabulary, rows
[index*V/t, (index+1)*V/t) on TP rank index, and
- ``vocab_embedding``: each rank looks up the tokens in its rows (zeros for the others),
  then ``leave`` without sequence parallelism: an all-reduce forward (Megatron reduces
  the word embedding before adding learned positions, and with sp splits the sum along
  the sequence only after that, ``scatter_seq``: keep my slice, backward all-gather);
- the logits are the column-parallel GEMM of ``enter``'s output with the rank's rows;
- ``vocab_cross_entropy``: the loss from the split logits with two small all-reduces
  forward, the maximum per token (for a stable exponential) and one sum of each token's
  [target logit, sum of exponentials] pair; it keeps only the softmax for backward,
  which needs no communication.
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

    class _VocabCrossEntropy(torch.autograd.Function):
        """Per-token loss from this rank's logit columns z [N, V/t] (vocab_cross_entropy)."""

        @staticmethod
        def forward(ctx, z, t, comm: Comm):
            m = comm.all_reduce(z.amax(dim=-1), "all-reduce (logits max)", maximum=True)
            lo = comm.index * z.shape[-1]
            mine = (t >= lo) & (t < lo + z.shape[-1])
            col = (t - lo).masked_fill(~mine, 0)
            soft = (z - m.unsqueeze(-1)).exp_()
            picked = (z.gather(1, col.unsqueeze(1)).squeeze(1) - m) * mine
            both = comm.all_reduce(torch.stack((picked, soft.sum(dim=-1))), "all-reduce (loss terms)")
            soft.div_(both[1].unsqueeze(-1))
            ctx.save_for_backward(soft, mine, col)
            return both[1].log() - both[0]

        @staticmethod
        def backward(ctx, g):
            soft, mine, col = ctx.saved_tensors
            # softmax - onehot(target) on the rank holding the target's column, in place:
            # the saved softmax is not needed again.
            soft[torch.arange(soft.shape[0], device=soft.device), col] -= mine.to(soft.dtype)
            return soft.mul_(g.unsqueeze(-1)), None, None

    return _Enter, _Leave, _ScatterSeq, _VocabCrossEntropy


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
    """Embedding output (the same on every TP rank) -> this rank's sequence slice (only
    with sp)."""
    if not sp or comm is None or comm.size == 1:
        return x
    return _classes()[2].apply(x, comm)


def vocab_embedding(ids, weight, comm: Comm | None):
    """Token embedding from this rank's rows ``weight`` [V/t, h] of the vocabulary-split
    table: each rank's lookup of the tokens in its rows, summed over the TP group."""
    import torch.nn.functional as F
    if comm is None or comm.size == 1:
        return F.embedding(ids, weight)
    lo = comm.index * weight.shape[0]
    mine = (ids >= lo) & (ids < lo + weight.shape[0])
    part = F.embedding((ids - lo).masked_fill(~mine, 0), weight) * mine.unsqueeze(-1).to(weight.dtype)
    return leave(part, comm, False)


def vocab_cross_entropy(logits, targets, comm: Comm | None):
    """Mean cross entropy of the tokens whose logits [.., V/t] over this rank's vocabulary
    rows are ``logits`` (targets: global token ids), the same value on every TP rank.
    Loss of a token = log(sum_v exp(z_v - m)) - (z_target - m) with m the token's
    maximum logit over the whole vocabulary. As Megatron's fused loss, it keeps only the
    softmax of its columns (fp32, normalised in place) and the target's position for
    backward, whose input gradient is softmax - onehot(target) (costmodel/memory.py
    logits_bytes counts that one tensor); autograd's own ops would also keep the shifted
    logits (gather saves its input)."""
    import torch.nn.functional as F
    if comm is None or comm.size == 1:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return _classes()[3].apply(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), comm).mean()
