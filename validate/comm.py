"""Collectives of one process group, timed and byte-counted for the run record.

Bytes sent per rank are counted as a ring algorithm moves them, busbw_factor(op, n) x the
collective's total size (nccl-tests' definition, costmodel/collectives.py), so the
count is the same whatever algorithm gloo or NCCL picks internally.
"""
from __future__ import annotations

from costmodel.collectives import busbw_factor
from validate.timeline import Recorder


class Comm:
    """One group (TP, DP, or the embedding pair) as seen by this rank.

    kind: 'tp' or 'dp' (the run record's byte and time category); name: how its
    collectives are named in the record's details (default: kind, e.g. 'tp_all_reduce';
    'embedding' for the tied-embedding pair); ranks: global ranks of the group in group
    order. With one member every operation is the identity and nothing is recorded."""

    def __init__(self, kind: str, ranks: list[int], rank: int, rec: Recorder, group=None,
                 name: str | None = None):
        self.kind = kind
        self.name = name or kind
        self.ranks = list(ranks)
        self.size = len(ranks)
        self.index = self.ranks.index(rank)
        self.rec = rec
        self.group = group

    def count(self, op: str, total_bytes: float) -> None:
        self.rec.sent(self.kind, busbw_factor(op, self.size) * total_bytes)

    def all_reduce(self, t, label: str = "all-reduce", maximum: bool = False):
        """Sum ``t`` in place over the group (the element-wise maximum when ``maximum``);
        returns ``t``."""
        if self.size == 1:
            return t
        import torch.distributed as dist
        op = dist.ReduceOp.MAX if maximum else dist.ReduceOp.SUM
        with self.rec.span(self.kind, f"{self.name}_all_reduce", f"{self.name} {label}"):
            dist.all_reduce(t, op=op, group=self.group)
        self.count("all_reduce", t.numel() * t.element_size())
        return t

    def all_gather(self, t, dim: int, label: str = "all-gather"):
        """Concatenate every member's ``t`` along ``dim`` (group order), with the tensor
        form of the collective (tensor_collectives), as Megatron-Core's sequence parallelism
        calls it and plansim calibrate times it."""
        if self.size == 1:
            return t
        import torch
        gather, _ = tensor_collectives()
        x = t.movedim(dim, 0).contiguous()  # no copy for a [1, s, h] activation
        out = torch.empty((self.size * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        with self.rec.span(self.kind, f"{self.name}_all_gather", f"{self.name} {label}"):
            gather(out, x, group=self.group)
        self.count("all_gather", self.size * t.numel() * t.element_size())
        return out.movedim(0, dim)

    def reduce_scatter(self, t, dim: int, label: str = "reduce-scatter"):
        """Sum over the group, keep this member's 1/size slice along ``dim`` (the tensor
        form, as all_gather)."""
        if self.size == 1:
            return t
        import torch
        _, scatter = tensor_collectives()
        x = t.movedim(dim, 0).contiguous()
        out = torch.empty((x.shape[0] // self.size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        with self.rec.span(self.kind, f"{self.name}_reduce_scatter", f"{self.name} {label}"):
            scatter(out, x, group=self.group)
        self.count("reduce_scatter", t.numel() * t.element_size())
        return out.movedim(0, dim)

    def split(self, t, dim: int):
        """This member's 1/size slice along ``dim`` (no communication), in storage of its
        own: a view would keep the whole tensor alive for as long as the slice is saved
        for backward (Megatron-Core's embedding clones its sequence-parallel slice for that
        reason: models/common/embeddings/language_model_embedding.py,
        clone_scatter_output_in_embedding)."""
        if self.size == 1:
            return t
        import torch
        return t.chunk(self.size, dim=dim)[self.index].clone(memory_format=torch.contiguous_format)


def tensor_collectives():
    """(all-gather, reduce-scatter) in their tensor forms, which take and fill one
    contiguous tensor whose first dimension is the ranks' parts in group order (torch
    2.13 names them all_gather_single / reduce_scatter_single; earlier releases
    all_gather_into_tensor / reduce_scatter_tensor). The one definition the runner, its
    FSDP and the calibration's collective benchmark share: on gloo the list forms cost
    more (a 32 KiB reduce-scatter between rounds of ~0.5 ms of compute, 2 processes here,
    2026-12-04: 1.54 ms a round in the list form against 0.87 ms in the tensor form, the
    all-reduce 0.78 ms)."""
    import torch.distributed as dist
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return gather, scatter
