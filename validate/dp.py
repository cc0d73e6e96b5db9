"""Data parallelism: gradient buckets reduced over the DP group, and the Adam step
(optionally with its state sharded over the DP group, ZeRO stage 1).

Gradients accumulate, microbatch after microbatch, into one flat buffer per bucket: each
parameter's ``.grad`` is a view of its slice of the bucket, so autograd's gradient
accumulation adds every microbatch's gradient there in place (PyTorch DDP with
gradient_as_bucket_view=True; Megatron-Core's main_grad buffers). The earlier runner let
autograd store a fresh gradient per parameter and microbatch and added it into the bucket
from a hook: measured here (tiny, 8 microbatches, two processes at once, 2026-12-02) that
path took 67.4-70.0 ms a step against 63.6-65.5 with the views. With ``overlap`` on, a
bucket's reduction starts (asynchronously) as soon as the last microbatch's backward has
produced every gradient in it, while backward continues
(post-accumulate-grad hooks, as PyTorch DDP's reducer does); the handles are waited
before the optimizer. With ``overlap`` off, every bucket is reduced after backward.
Buckets fill in backward order (last layer first) up to ``bucket_bytes``
(sim/program.BUCKET_BYTES by default, PyTorch DDP's 25 MB) and never span model chunks.

The reduction is a sum: each microbatch's loss is already scaled by its share of the
global batch, so the sum is the gradient of the global mean loss, exactly what the
single-process reference computes.

ZeRO-1 (Rajbhandari et al. 2020, "ZeRO", Sec. 5.1): each bucket is reduce-scattered,
each DP rank runs Adam on its 1/dp of the bucket (and holds only that part of the Adam
state), then the updated parameters are all-gathered. With top-k compression the
gradients come back dense on every rank and each rank uses its part.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from validate.comm import Comm, tensor_collectives
from validate.topk import TopKCompressor

# Adam (Kingma and Ba 2015, Algorithm 1); betas as in GPT-3 (Brown et al. 2020, App. B).
ADAM_LR = 2e-3
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
# The smallest normal binary32 value, 2^-126 (IEEE 754-2008, Table 3.2: emin = -126):
# adam_update clamps v here before its root.
FLT_MIN = 2.0 ** -126


def adam_update(param, grad, m, v, step: int, lr: float = ADAM_LR,
                betas: tuple[float, float] = ADAM_BETAS, eps: float = ADAM_EPS, scratch=None) -> None:
    """One Adam step in place on same-shaped tensors; ``step`` counts from 1.

    torch.optim.Adam's formulation (denominator sqrt(v)/sqrt(1-b2^t) + eps, step size
    lr/(1-b1^t)) as 9 in-place element-wise ops whose only intermediate lives in
    ``scratch`` (same shape; kept by the caller across steps, allocated here when None).
    No fresh parameter-sized tensor: each one costs a page fault per 4 KiB on every step,
    which the memory-bound microbenchmarks (same-size outputs reused) never pay. Measured
    here over tiny's 860k fp32 parameters: the earlier form with six temporaries took
    13 ms and 5,007 minor faults a step, this one 0.8 ms and none. Fused optimizers
    (Megatron-Core's, apex's FusedAdam) write no temporaries either.

    The root is taken of v clamped at the smallest normal float (FLT_MIN, 1.18e-38), a
    ninth op: torch's CPU sqrt (AVX-512 build, 2026-12-05, one thread, 860k fp32) took
    0.24 ms over positive values and 3.8 ms over a buffer with 70 % exact zeros, 5.9 ms
    over subnormals, and v is mostly exact zeros under top-k with error feedback (an entry
    no rank has kept yet has v = 0): Adam took 2.6 ms a step there against 1.66 dense
    (tiny's runs measured 4.8-6.3 ms against 2.6-3.5). A cost that follows the data is
    nothing the cost model or a GPU's fused Adam has. The clamp changes no update: where
    v < FLT_MIN the root (at most 1.1e-19, under 5e-19 after bias correction at beta2
    0.95) is far below half an ulp of eps (1e-8), so denom rounds to eps as it does with
    the plain root (tests/test_validate_layout.py checks the updates bit for bit against
    the plain root, and within 1e-6 of torch.optim.Adam)."""
    import torch
    b1, b2 = betas
    m.mul_(b1).add_(grad, alpha=1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = torch.empty_like(v) if scratch is None else scratch
    torch.clamp_min(v, FLT_MIN, out=denom)
    denom.sqrt_()
    denom.div_((1 - b2 ** step) ** 0.5).add_(eps)
    param.addcdiv_(m, denom, value=-lr / (1 - b1 ** step))


@dataclass
class Bucket:
    index: int
    chunk: int
    names: list[str]
    params: list
    offsets: list[int]
    numel: int  # real elements; buffers are padded to a multiple of dp
    flat_param: object = None
    flat_grad: object = None
    shard_grad: object = None  # ZeRO: this rank's reduced part
    ready: int = 0
    state: object = None  # in-flight work
    launched_s: float = 0.0
    op: str = ""  # the collective in flight, for the record's details
    adam: dict = field(default_factory=dict)


class GradReducer:
    """Owns the flat parameter and gradient buffers of this rank's chunks.

    chunks: list of (chunk index, {name: Parameter}) for this rank; late: names whose
    gradient is completed by another collective after backward (tied embedding across
    pipeline ends, sequence-parallel norms and biases), reduced in buckets of their own
    once ``mark_late_ready`` is called."""

    def __init__(self, chunks, comm: Comm, *, bucket_bytes: float, overlap: bool, zero: int,
                 topk: float | None, late: set[str]):
        import torch
        self.comm, self.overlap, self.zero = comm, overlap, zero
        self.rec = comm.rec
        self.topk = TopKCompressor(topk, comm) if topk else None
        self.buckets: list[Bucket] = []
        self.where: dict[int, tuple[Bucket, int]] = {}  # id(param) -> (bucket, position)
        self.final = set()  # chunks whose last microbatch's backward is running
        dp = comm.size
        groups = []
        for c, params in sorted(chunks, key=lambda cp: -cp[0]):  # backward order: last chunk first
            names = list(reversed(list(params)))
            groups.append((c, [(n, params[n]) for n in names if n not in late]))
        for c, params in sorted(chunks, key=lambda cp: -cp[0]):
            groups.append((c, [(n, params[n]) for n in reversed(list(params)) if n in late]))
        self.late_names = late
        for c, named in groups:
            cur: list = []
            size = 0.0
            for n, p in named:
                nbytes = p.numel() * p.element_size()
                if cur and size + nbytes > bucket_bytes:
                    self._add_bucket(c, cur, dp)
                    cur, size = [], 0.0
                cur.append((n, p))
                size += nbytes
            if cur:
                self._add_bucket(c, cur, dp)
        for b in self.buckets:
            for p in b.params:
                p.register_post_accumulate_grad_hook(self._hook)
        self._torch = torch

    def _add_bucket(self, chunk: int, named, dp: int) -> None:
        import torch
        offsets, off = [], 0
        for _, p in named:
            offsets.append(off)
            off += p.numel()
        padded = -(-off // dp) * dp
        b = Bucket(len(self.buckets), chunk, [n for n, _ in named], [p for _, p in named], offsets, off)
        b.flat_param = torch.zeros(padded, dtype=named[0][1].dtype, device=named[0][1].device)
        b.flat_grad = torch.zeros_like(b.flat_param)
        for (n, p), o in zip(named, offsets):
            b.flat_param[o:o + p.numel()].copy_(p.data.reshape(-1))
            p.data = b.flat_param[o:o + p.numel()].view_as(p)  # the optimizer updates the view
            p.grad = b.flat_grad[o:o + p.numel()].view_as(p)  # autograd accumulates into the bucket
        for pos, p in enumerate(b.params):
            self.where[id(p)] = (b, pos)
        self.buckets.append(b)

    # -- during backward ---------------------------------------------------------------
    def begin_step(self) -> None:
        for b in self.buckets:
            b.flat_grad.zero_()
            b.ready = 0
            b.state = None
        self.final = set()

    def _hook(self, p) -> None:
        """After autograd has added a microbatch's gradient of ``p`` into its bucket (its
        ``.grad`` is a view there): in the last microbatch, one more of the bucket ready."""
        b, pos = self.where[id(p)]
        if b.chunk in self.final and b.names[pos] not in self.late_names:
            self._mark(b)

    def _mark(self, b: Bucket) -> None:
        b.ready += 1
        if b.ready == len(b.params) and self.overlap:
            self._launch(b)

    def grad_view(self, name: str):
        """The accumulated gradient of ``name`` (a view into its bucket)."""
        for b in self.buckets:
            if name in b.names:
                pos = b.names.index(name)
                o = b.offsets[pos]
                return b.flat_grad[o:o + b.params[pos].numel()].view_as(b.params[pos])
        raise KeyError(name)

    def mark_late_ready(self) -> None:
        for b in self.buckets:
            for n in b.names:
                if n in self.late_names:
                    self._mark(b)

    def _launch(self, b: Bucket) -> None:
        import torch.distributed as dist
        if self.comm.size == 1:
            b.state = "done"
            return
        t0 = self.rec.now()
        op = "topk_all_gather" if self.topk is not None else "reduce_scatter" if self.zero >= 1 else "all_reduce"
        with self.rec.span("dp", f"dp_{op}", f"launch {op} c{b.chunk}b{b.index}"):
            if self.topk is not None:
                # The selection (error feedback's add and the top-k) is compute on this
                # thread, timed as such: the simulator prices it on the compute stream
                # (sim/pipeline_executor._grad_ready), the exchange and the decompression
                # as 'dp'.
                b.state = ("topk", self.topk.start(b.index, b.flat_grad, self.rec.span(
                    "compute", "topk_select", f"top-k select c{b.chunk}b{b.index}")))
            elif self.zero >= 1:
                # the tensor form, as calibration times it (validate/comm.tensor_collectives)
                _, scatter = tensor_collectives()
                b.shard_grad = self._torch.empty_like(b.flat_grad.chunk(self.comm.size)[self.comm.index])
                b.state = ("work", scatter(b.shard_grad, b.flat_grad, group=self.comm.group, async_op=True))
                self.comm.count("reduce_scatter", b.flat_grad.numel() * b.flat_grad.element_size())
            else:
                b.state = ("work", dist.all_reduce(b.flat_grad, group=self.comm.group, async_op=True))
                self.comm.count("all_reduce", b.flat_grad.numel() * b.flat_grad.element_size())
        b.launched_s = t0
        b.op = op

    # -- after backward ----------------------------------------------------------------
    def finish(self) -> None:
        """Launch what has not started (all buckets when overlap is off), wait for all."""
        for b in self.buckets:
            if b.state is None:
                self._launch(b)
                if not self.overlap:
                    self._wait(b)
        for b in self.buckets:
            self._wait(b)

    def _wait(self, b: Bucket) -> None:
        if b.state in (None, "done"):
            return
        kind, st = b.state
        with self.rec.span("dp", f"dp_{b.op}", f"wait {b.op} c{b.chunk}b{b.index}"):
            if kind == "topk":
                self.topk.finish(st, b.flat_grad)
            else:
                st.wait()
        self.rec.segment("dp", "collective", b.launched_s, self.rec.now(), f"{b.op} c{b.chunk}b{b.index}")
        b.state = "done"

    def step(self, step: int) -> None:
        """Adam on every bucket (on this rank's shard under ZeRO), then, under ZeRO,
        all-gather the updated parameters."""
        torch = self._torch
        sharded = self.zero >= 1 and self.comm.size > 1
        with self.rec.span("compute", "optimizer", "optimizer"):
            for b in self.buckets:
                if sharded:
                    n = b.flat_param.numel() // self.comm.size
                    lo = self.comm.index * n
                    p = b.flat_param[lo:lo + n]
                    g = b.shard_grad if self.topk is None else b.flat_grad[lo:lo + n]
                else:
                    p, g = b.flat_param, b.flat_grad
                if not b.adam:
                    b.adam = {"m": torch.zeros_like(p), "v": torch.zeros_like(p), "scratch": torch.empty_like(p)}
                adam_update(p, g, b.adam["m"], b.adam["v"], step, scratch=b.adam["scratch"])
        if sharded:
            t0 = self.rec.now()
            with self.rec.span("dp", "dp_all_gather", "param all-gather"):
                gather, _ = tensor_collectives()
                for b in self.buckets:
                    mine = b.flat_param.chunk(self.comm.size)[self.comm.index].clone()
                    gather(b.flat_param, mine, group=self.comm.group)
                    self.comm.count("all_gather", b.flat_param.numel() * b.flat_param.element_size())
            self.rec.segment("dp", "collective", t0, self.rec.now(), "param all-gather")
