"""What autograd keeps from forward to backward, measured: the bytes of the tensors saved for
backward that are alive at once, at their peak over a step (the "activations" of the cost
model's memory, costmodel/memory.py and costmodel/device_memory.py, measured rather than
counted).

torch.autograd.graph.saved_tensors_hooks sees every tensor an op saves for its backward
(torch docs, "Hooks for saved tensors"). Each saved tensor is wrapped in a small object
whose lifetime is the saved variable's: autograd drops it when the graph that holds it is
freed (after that microbatch's backward), and CPython frees the wrapper at once
(reference counting), so the running total falls exactly then. A storage counts once while
any saved tensor refers to it (Q, K and V are views of one QKV output; a tensor saved by
two ops is kept once). Parameters and views of them (a GEMM saves its weight) are not
activations, nor is the step's batch (the embedding saves its token ids, the loss its
targets, as views of the whole batch): the caller names both, and they are left out. Device-agnostic: storage sizes, not an allocator's figure,
so CPU and CUDA runs measure the same thing.

The hooks cost a Python call per saved tensor: the runner measures in a warm-up step
only (validate/runner.py), never in a timed one.
"""
from __future__ import annotations

import contextlib


class _Held:
    """One saved tensor, alive as long as autograd keeps it."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor, key, meter: "SavedBytes"):
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self):
        if self.key is not None:
            self.meter._release(self.key)


class SavedBytes:
    """Live and peak bytes of tensors saved for backward while ``track()`` is active."""

    def __init__(self, exclude=()):
        # Storages of the parameters and the batch (``exclude``): not activations.
        self._skip = {_storage_key(p) for p in exclude}
        self._refs: dict = {}  # storage key -> [saved tensors referring to it, bytes]
        self.live = 0
        self.peak = 0

    def _pack(self, t):
        key = _storage_key(t)
        if key in self._skip:
            return _Held(t, None, self)
        got = self._refs.get(key)
        if got is None:
            nbytes = t.untyped_storage().nbytes()
            self._refs[key] = [1, nbytes]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        else:
            got[0] += 1
        return _Held(t, key, self)

    def _release(self, key) -> None:
        got = self._refs[key]
        got[0] -= 1
        if got[0] == 0:
            self.live -= got[1]
            del self._refs[key]

    @contextlib.contextmanager
    def track(self):
        """Count what autograd saves inside the block (backward's recomputation included)."""
        import torch

        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor):
            yield self


def _storage_key(t):
    """A storage's identity: its device and data pointer (a view shares both)."""
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr(), s.nbytes())
