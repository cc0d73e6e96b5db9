"""Top-k gradient sparsification with error feedback over the data-parallel group.

Each rank adds the residual it kept from the previous step to its gradient bucket,
keeps the k = ceil(F x n) entries of largest magnitude, and sends them as (int32 index,
fp32 value) pairs with an all-gather; every rank then sums all ranks' pairs into a dense
gradient. What was dropped stays in the residual and is added back next step ("memory",
Stich, Cordonnier and Jaggi 2018, "Sparsified SGD with Memory", Algorithm 1; Lin et al.
2018, "Deep Gradient Compression", Sec. 3.1).
"""
from __future__ import annotations

import math

from costmodel.dtypes import TOPK_INDEX_BYTES
from validate.comm import Comm, tensor_collectives

# Values travel in the gradient buffer's own dtype (fp32 here: the runner trains in fp32),
# so an entry is costmodel/dtypes.topk_entry_bytes("fp32") = 8 B, as the simulator counts it.


def select(grad, residual, k: int):
    """The compression of one bucket: add the residual (error feedback), keep the k entries
    of largest magnitude. Returns (int32 indices, values, the new residual: the sum with
    the kept entries zeroed). validate/compute_bench.py times this same function."""
    import torch
    acc = grad + residual if residual is not None else grad.clone()
    idx = acc.abs().topk(k, sorted=False).indices
    vals = acc[idx]
    acc[idx] = 0.0
    return idx.to(torch.int32), vals, acc


class TopKCompressor:
    def __init__(self, fraction: float, comm: Comm):
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"top-k fraction must be in (0, 1), got {fraction}")
        self.fraction = fraction
        self.comm = comm
        self.residual: dict[int, object] = {}  # bucket id -> dropped remainder

    def kept(self, n: int) -> int:
        return max(1, math.ceil(self.fraction * n))

    def start(self, key: int, grad, selecting=None):
        """Select and launch the all-gather of bucket ``key``'s top-k entries (async).
        Returns the state ``finish`` needs. ``selecting``: a context manager around the
        selection alone (the runner's timing span: the selection is compute on the
        issuing thread, as the simulator prices it, not communication)."""
        import contextlib

        import torch
        with selecting if selecting is not None else contextlib.nullcontext():
            idx32, vals, self.residual[key] = select(grad, self.residual.get(key), self.kept(grad.numel()))
        k = idx32.numel()
        n = self.comm.size
        # One all-gather of (indices, values) packed in one buffer, as the simulator's
        # sparse all-gather is one call (sim/collective_flows.sparse_allgather): the int32
        # indices travel bit for bit in fp32 slots (a view, no conversion), so a kept entry
        # is 4 + 4 B either way.
        packed = torch.cat([idx32.view(vals.dtype), vals])
        gather, _ = tensor_collectives()  # the tensor form, as calibration times it
        out = packed.new_empty(n * packed.numel())
        work = gather(out, packed, group=self.comm.group, async_op=True)
        parts = list(out.chunk(n))
        self.comm.count("all_gather", n * k * (TOPK_INDEX_BYTES + vals.element_size()))
        return work, parts, k

    @staticmethod
    def finish(state, grad) -> None:
        """Wait for the all-gather and write the summed sparse gradient into ``grad``."""
        import torch
        work, parts, k = state
        work.wait()
        grad.zero_()
        for part in parts:
            grad.index_add_(0, part[:k].view(torch.int32).long(), part[k:])

