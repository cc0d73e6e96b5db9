"""Fully sharded data parallelism (ZeRO stage 3, ``zero=3``): every weight lives as 1/n
shards over the n ranks of the dp(-cp) group, whole only while a layer computes.

Rajbhandari et al. 2020, "ZeRO", Sec. 5.3 (stage 3, P_os+g+p): each unit's parameters
are all-gathered before its forward and freed after it, all-gathered again for its
backward, and its gradients reduce-scattered, so each rank ends a step with the summed
gradient of its own shard and runs Adam on that shard alone. The units are PyTorch
FSDP's (Zhao et al. 2023, "PyTorch FSDP", Sec. 3): one per transformer layer, plus one
for what lies outside the layers (token and position embeddings, final norm), gathered
for the whole forward and again for the whole backward, as FSDP's root unit is.

Prefetch (FSDP paper Sec. 3.3, backward and forward prefetching): when unit i is
taken into use, the all-gather of the unit that comes next (i+1 in forward, i-1 in
backward) is started asynchronously, so it runs while unit i computes. Each unit's
reduce-scatter runs asynchronously while the next unit's backward computes (one in
flight; the previous one is waited for before the next is started).

Mechanism: a unit's gathered flat buffer enters autograd through ``_Gather`` (backward:
reduce-scatter of the flat gradient); the layer's weights are views of it. Autograd
would keep the buffer alive through the tensors it saves for backward (a linear saves
its weight), so a saved-tensor hook replaces any saved tensor that lives in a gathered
buffer by a reference (unit, size, stride, offset), and the unpack hook re-gathers the
unit in backward and rebuilds the view. Nothing else holds the buffer, so it is freed
when the layer's forward ends.

Bytes per rank and microbatch, counted as a ring moves them (validate/comm.py): two
all-gathers and one reduce-scatter of every unit, 3 (n-1)/n x parameter bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from validate.comm import Comm, tensor_collectives
from validate.dp import adam_update
from validate.gpt import GPTChunk

OUTER = "outer"  # the unit of a chunk's weights outside its layers


@dataclass
class Unit:
    """One FSDP unit: a chunk's layer (``l{i}``) or its weights outside the layers."""

    chunk: int
    name: str
    names: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]
    numel: int  # real elements; the flat buffer is padded to a multiple of the group size
    shard: object = None  # this rank's 1/n of the flat weights (leaf, requires grad)
    grad: object = None  # summed gradient of the shard, this step
    adam: dict = field(default_factory=dict)
    full: object = None  # gathered flat weights in use by the forward
    bwd_full: object = None  # gathered again for backward
    pending: object = None  # (work, buffer, launch time, 'fwd'|'bwd') of a gather in flight
    incoming: object = None  # gathered buffer handed to _Gather


@dataclass(frozen=True)
class _Ref:
    """A saved tensor that lived in a unit's gathered buffer."""

    unit: Unit
    size: tuple
    stride: tuple
    offset: int


class ShardedChunk(GPTChunk):
    """A GPTChunk whose weights FSDP brings in layer by layer (``self.fsdp`` is set by
    FSDP). Its ``params`` hold a weight only while its unit is gathered."""

    fsdp: "FSDP"

    def forward(self, inp, targets=None, loss_scale: float = 1.0):
        import torch
        with torch.autograd.graph.saved_tensors_hooks(self.fsdp.pack, self.fsdp.unpack):
            self.fsdp.use(self, OUTER)
            try:
                return super().forward(inp, targets, loss_scale)
            finally:
                self.fsdp.release(self, OUTER)

    def _layer(self, i: int, x):
        self.fsdp.use(self, f"l{i}")
        try:
            # a span of its own, so the trace shows the next layer's gather in flight over it
            with self.fsdp.rec.span("compute", "forward", f"layer {i}"):
                return super()._layer(i, x)
        finally:
            self.fsdp.release(self, f"l{i}")


def _gather_class():
    import torch

    class _Gather(torch.autograd.Function):
        """Forward: the unit's gathered flat weights (gathered by FSDP.use). Backward:
        reduce-scatter of their gradient into the unit's shard gradient."""

        @staticmethod
        def forward(ctx, shard, fsdp, unit):
            ctx.fsdp, ctx.unit = fsdp, unit
            full, unit.incoming = unit.incoming, None
            return full

        @staticmethod
        def backward(ctx, g):
            ctx.fsdp.reduce_scatter(ctx.unit, g)
            return None, None, None

    return _Gather


_GATHER = None


class FSDP:
    """Shards ``chunks`` ({index: ShardedChunk}) over ``comm`` and runs the gathers,
    frees, reduce-scatters and the sharded Adam step. Offers the runner the interface
    of validate/dp.GradReducer (begin_step, final, mark_late_ready, finish, step)."""

    def __init__(self, chunks: dict, comm: Comm):
        import torch
        global _GATHER
        if _GATHER is None:
            _GATHER = _gather_class()
        self.comm, self.rec, self.n = comm, comm.rec, comm.size
        self.final: set = set()
        self.units: dict[tuple[int, str], Unit] = {}
        self.fwd_order: dict[int, list[str]] = {}
        self.live: dict[int, Unit] = {}  # storage address of a gathered buffer -> its unit
        self._rs = None  # the reduce-scatter in flight: (unit, work, out, grad, launch time)
        for c, ch in sorted(chunks.items()):
            ch.fsdp = self
            groups = {f"l{i}": [n for n in ch.params if n.startswith(f"l{i}.")] for i in ch.layers}
            inner = {n for names in groups.values() for n in names}
            groups = {OUTER: [n for n in ch.params if n not in inner]} | groups
            order = [u for u, names in groups.items() if names]
            self.fwd_order[c] = order
            for u in order:
                names = groups[u]
                flat = torch.cat([ch.params[n].detach().reshape(-1) for n in names])
                numel = flat.numel()
                padded = -(-numel // self.n) * self.n
                flat = torch.cat([flat, flat.new_zeros(padded - numel)])
                offsets, off = [], 0
                for n in names:
                    offsets.append(off)
                    off += ch.params[n].numel()
                unit = Unit(c, u, names, [tuple(ch.params[n].shape) for n in names], offsets, numel)
                k = padded // self.n
                unit.shard = flat[comm.index * k:(comm.index + 1) * k].clone().requires_grad_()
                self.units[(c, u)] = unit
                for n in names:
                    ch.params[n] = None  # the whole weight exists only while gathered
            assert all(v is None for v in ch.params.values()), "every weight belongs to one unit"
        self.chunks = chunks

    # -- gathers -------------------------------------------------------------------
    def _launch_gather(self, unit: Unit, why: str):
        import torch
        t0 = self.rec.now()
        if self.n == 1:  # nothing to gather: the shard is the whole
            unit.pending = (None, unit.shard.detach().clone(), t0, why)
            return
        buf = torch.empty(unit.shard.numel() * self.n, dtype=unit.shard.dtype, device=unit.shard.device)
        gather, _ = tensor_collectives()
        with self.rec.span("dp", "fsdp_all_gather", f"launch gather {unit.name} ({why})"):
            # the tensor form, as PyTorch FSDP calls it (validate/comm.tensor_collectives)
            work = gather(buf, unit.shard.detach(), group=self.comm.group, async_op=True)
        self.comm.count("all_gather", buf.numel() * buf.element_size())
        unit.pending = (work, buf, t0, why)

    def _take(self, unit: Unit, why: str):
        """The unit's gathered flat weights: the prefetched ones, or gathered now."""
        if unit.pending is None or unit.pending[3] != why:
            self._launch_gather(unit, why)
        work, buf, t0, _ = unit.pending
        unit.pending = None
        if work is None:
            return buf
        with self.rec.span("dp", "fsdp_all_gather", f"wait gather {unit.name} ({why})"):
            work.wait()
        self.rec.segment("dp", "collective", t0, self.rec.now(), f"fsdp all_gather {unit.name} ({why})")
        return buf

    def _prefetch(self, chunk: int, order: list[str], after: str, why: str) -> None:
        i = order.index(after)
        if i + 1 < len(order):
            nxt = self.units[(chunk, order[i + 1])]
            if nxt.pending is None:
                self._launch_gather(nxt, why)

    # -- forward -------------------------------------------------------------------
    def use(self, ch: ShardedChunk, name: str) -> None:
        """Gather unit ``name`` of ``ch``, point the chunk's weights at it, prefetch the next."""
        unit = self.units.get((self._index(ch), name))
        if unit is None:
            return
        unit.incoming = self._take(unit, "fwd")
        full = _GATHER.apply(unit.shard, self, unit)
        self.live[full.untyped_storage().data_ptr()] = unit
        unit.full = full
        # One split of the flat buffer (its padding the last piece), as PyTorch FSDP's
        # flat parameter makes its views (torch.split): autograd then gathers the weights'
        # gradients with one concatenation into the flat gradient. Slicing each weight
        # instead made every slice's backward write a zero-filled copy of the whole unit
        # and autograd add them up: 2 x (weights per unit) unit-sized passes a microbatch,
        # which doubled tiny's zero=3 step at one process (100 -> 211 ms).
        sizes = [_numel(shape) for shape in unit.shapes]
        pieces = full.split(sizes + ([full.numel() - unit.numel] if full.numel() > unit.numel else []))
        for n, shape, piece in zip(unit.names, unit.shapes, pieces):
            ch.params[n] = piece.view(shape)
        self._prefetch(unit.chunk, self.fwd_order[unit.chunk], name, "fwd")

    def release(self, ch: ShardedChunk, name: str) -> None:
        """Drop the unit's gathered weights (freed: saved tensors hold references only)."""
        unit = self.units.get((self._index(ch), name))
        if unit is None:
            return
        self.live.pop(unit.full.untyped_storage().data_ptr(), None)
        unit.full = None
        for n in unit.names:
            ch.params[n] = None

    def _index(self, ch) -> int:
        for c, other in self.chunks.items():
            if other is ch:
                return c
        raise KeyError("chunk not sharded by this FSDP")

    def pack(self, t):
        try:
            unit = self.live.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # a tensor without plain storage
            unit = None
        if unit is None:
            return t
        return _Ref(unit, tuple(t.size()), tuple(t.stride()), t.storage_offset())

    # -- backward ------------------------------------------------------------------
    def unpack(self, x):
        if not isinstance(x, _Ref):
            return x
        unit = x.unit
        if unit.bwd_full is None:
            unit.bwd_full = self._take(unit, "bwd")
            order = self._bwd_order(unit.chunk)
            self._prefetch(unit.chunk, order, unit.name, "bwd")
        return unit.bwd_full.as_strided(x.size, x.stride, x.offset)

    def _bwd_order(self, chunk: int) -> list[str]:
        """Backward meets the head (outer unit) first, then the layers last to first."""
        order = self.fwd_order[chunk]
        return [u for u in order if u == OUTER] + [u for u in reversed(order) if u != OUTER]

    def reduce_scatter(self, unit: Unit, g) -> None:
        import torch
        unit.bwd_full = None  # the unit's backward is done: free its weights
        self._wait_rs()
        g = g.contiguous()
        t0 = self.rec.now()
        if self.n == 1:
            unit.grad = g.clone() if unit.grad is None else unit.grad.add_(g)
            return
        out = torch.empty_like(unit.shard)
        _, scatter = tensor_collectives()
        with self.rec.span("dp", "fsdp_reduce_scatter", f"launch reduce-scatter {unit.name}"):
            work = scatter(out, g, group=self.comm.group, async_op=True)
        self.comm.count("reduce_scatter", g.numel() * g.element_size())
        self._rs = (unit, work, out, g, t0)

    def _wait_rs(self) -> None:
        if self._rs is None:
            return
        unit, work, out, _, t0 = self._rs
        with self.rec.span("dp", "fsdp_reduce_scatter", f"wait reduce-scatter {unit.name}"):
            work.wait()
        self.rec.segment("dp", "collective", t0, self.rec.now(), f"fsdp reduce_scatter {unit.name}")
        unit.grad = out if unit.grad is None else unit.grad.add_(out)
        self._rs = None

    # -- the GradReducer interface ---------------------------------------------------
    def begin_step(self) -> None:
        self.final = set()
        for u in self.units.values():
            u.grad = None

    def mark_late_ready(self) -> None:
        """Nothing is late: each unit's gradient is reduce-scattered when its backward ends."""

    def finish(self) -> None:
        self._wait_rs()

    def step(self, step: int) -> None:
        """Adam on this rank's shards only (no parameter all-gather: the next forward gathers)."""
        import torch
        with self.rec.span("compute", "optimizer", "optimizer"):
            with torch.no_grad():
                for u in self.units.values():
                    if u.grad is None:
                        u.grad = torch.zeros_like(u.shard)
                    if not u.adam:
                        u.adam = {"m": torch.zeros_like(u.shard), "v": torch.zeros_like(u.shard),
                                  "scratch": torch.empty_like(u.shard)}
                    adam_update(u.shard, u.grad, u.adam["m"], u.adam["v"], step, scratch=u.adam["scratch"])

    def gathered_weights(self) -> dict:
        """{name: whole weight as numpy} (an all-gather per unit; every rank must call)."""
        return self._gathered(lambda u: u.shard.detach())

    def gathered_grads(self) -> dict:
        """{name: whole reduced gradient of this step as numpy} (collective, as above)."""
        return self._gathered(lambda u: u.grad)

    def _gathered(self, part) -> dict:
        import torch.distributed as dist
        out = {}
        for u in self.units.values():
            buf = part(u).clone()
            if self.n > 1:
                buf = u.shard.new_empty(u.shard.numel() * self.n)
                dist.all_gather(list(buf.chunk(self.n)), part(u).contiguous(), group=self.comm.group)
            for n, shape, off in zip(u.names, u.shapes, u.offsets):
                out[n] = buf[off:off + _numel(shape)].view(shape).cpu().numpy().copy()
        return out

    def param_count(self) -> int:
        """Elements of this rank's whole (unsharded) weights, padding excluded."""
        return sum(u.numel for u in self.units.values())


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
