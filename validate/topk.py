"""Top-k gradient sparsification with error feedback over the data-parallel group.

Each rank adds the residual it kept from the previous step to its gradient bucket,
keeps the k = ceil(F x n) entries of largest magnitude, and sends them as (int32 index,
fp32 value) pairs with an all-gather; every rank then sums all ranks' pairs into a dense
gradient. What was dropped stays in the residual and is added back next step ("memory",
Stich, Cordonnier and Jaggi 2018, "Sparsified SGD with Memory", Algorithm 1; Lin et al.
2018, "Deep Gradient Compression", Sec. 3.1).

Every buffer a step needs is allocated once per bucket and reused (SelectBuffers, the
gathered buffer): on a CPU a fresh bucket-sized tensor is fresh pages from the kernel,
a fault per 4 KiB on every step, which a GPU's caching allocator never pays and the cost
model does not price. Measured here (2026-12-05, tiny dp=2 top-k:0.1, three alternating
pairs of launches): the earlier form (a new accumulator, magnitudes, index and value
tensors per bucket and step) selected in 10.5-10.6 ms a step with 226-340 minor faults,
this one in 9.6-10.0 ms with 114-227 (what is left is torch's own top-k and gloo's
all-gather). The ranks' forward and backward run 3-6 % longer than dp=2's either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.dtypes import TOPK_INDEX_BYTES
from validate.comm import Comm, tensor_collectives

# Values travel in the gradient buffer's own dtype (fp32 here: the runner trains in fp32),
# so an entry is costmodel/dtypes.topk_entry_bytes("fp32") = 8 B, as the simulator counts it.


@dataclass
class SelectBuffers:
    """One bucket's reusable selection buffers: the magnitudes (n), the top-k's own
    outputs (k values, k int64 indices) and the packed message (k int32 indices viewed as
    fp32, then k values: one all-gather, sim/collective_flows.sparse_allgather)."""
    mag: object
    top_vals: object
    top_idx: object
    packed: object

    @classmethod
    def like(cls, grad, k: int) -> "SelectBuffers":
        import torch
        return cls(torch.empty_like(grad), grad.new_empty(k), torch.empty(k, dtype=torch.int64, device=grad.device),
                   grad.new_empty(2 * k))


# The steps of select, in order, as its ``lap`` callback names them.
SELECT_STEPS = ("add", "abs", "topk", "gather", "zero")


def select(grad, residual, k: int, bufs: SelectBuffers | None = None, lap=None):
    """The compression of one bucket: add the residual (error feedback), keep the k entries
    of largest magnitude. Returns (int32 indices, values, the new residual: the sum with
    the kept entries zeroed). ``residual`` is that sum's buffer and is updated in place
    (None on the first step: a copy of ``grad`` starts it); indices and values are views
    of ``bufs.packed`` (allocated here when None). validate/compute_bench.py times this
    same function; ``lap``, when given, is called after each of SELECT_STEPS
    (benchmarks/topk_gap.py times them one by one)."""
    import torch
    mark = lap or (lambda: None)
    acc = grad.clone() if residual is None else residual.add_(grad)
    mark()
    b = SelectBuffers.like(grad, k) if bufs is None else bufs
    torch.abs(acc, out=b.mag)
    mark()
    torch.topk(b.mag, k, sorted=False, out=(b.top_vals, b.top_idx))
    mark()
    idx32, vals = b.packed[:k].view(torch.int32), b.packed[k:]
    idx32.copy_(b.top_idx)
    torch.index_select(acc, 0, b.top_idx, out=vals)
    mark()
    acc.index_fill_(0, b.top_idx, 0.0)
    mark()
    return idx32, vals, acc


class TopKCompressor:
    def __init__(self, fraction: float, comm: Comm):
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"top-k fraction must be in (0, 1), got {fraction}")
        self.fraction = fraction
        self.comm = comm
        self.residual: dict[int, object] = {}  # bucket id -> dropped remainder
        self.buffers: dict[int, tuple] = {}  # bucket id -> (SelectBuffers, gathered buffer)

    def kept(self, n: int) -> int:
        return max(1, math.ceil(self.fraction * n))

    def start(self, key: int, grad, selecting=None):
        """Select and launch the all-gather of bucket ``key``'s top-k entries (async).
        Returns the state ``finish`` needs. ``selecting``: a context manager around the
        selection alone (the runner's timing span: the selection is compute on the
        issuing thread, as the simulator prices it, not communication)."""
        import contextlib
        k = self.kept(grad.numel())
        n = self.comm.size
        if key not in self.buffers:
            self.buffers[key] = (SelectBuffers.like(grad, k), grad.new_empty(n * 2 * k))
        bufs, out = self.buffers[key]
        with selecting if selecting is not None else contextlib.nullcontext():
            self.residual[key] = select(grad, self.residual.get(key), k, bufs)[2]
        # One all-gather of (indices, values) packed in one buffer, as the simulator's
        # sparse all-gather is one call: the int32 indices travel bit for bit in fp32
        # slots (a view, no conversion), so a kept entry is 4 + 4 B either way.
        gather, _ = tensor_collectives()  # the tensor form, as calibration times it
        work = gather(out, bufs.packed, group=self.comm.group, async_op=True)
        self.comm.count("all_gather", n * k * (TOPK_INDEX_BYTES + bufs.packed.element_size()))
        return work, list(out.chunk(n)), k

    @staticmethod
    def finish(state, grad) -> None:
        """Wait for the all-gather and write the summed sparse gradient into ``grad``
        (index_add_ takes the int32 indices as they came: no conversion, no new tensor)."""
        import torch
        work, parts, k = state
        work.wait()
        grad.zero_()
        for part in parts:
            grad.index_add_(0, part[:k].view(torch.int32), part[k:])
