"""Context parallelism: every sequence split over the cp ranks of a group, attention
computed as ring attention (K/V blocks passed around the ring while the block in hand is
attended to, softmax combined across blocks with log-sum-exp rescaling).

Load balancing (causal masking makes late tokens attend to more keys than early ones):
the sequence is cut into 2*cp equal chunks and rank r of the group holds chunks r and
2cp-1-r, so every rank does the same attention work. This is Megatron-Core's split
(megatron/core/utils.py, ``_get_batch_on_this_cp_rank_per_sequence_balancing``; the
ring itself is Transformer Engine's ``AttnFuncWithCPAndKVP2P``,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py).

Ring: cp steps. At step j rank r holds the K/V of the rank (r - j) mod cp; before
attending to it, it posts the send of that block to r+1 and the receive of the next one
from r-1, so the exchange runs while the block is computed (Liu et al. 2023, "Ring
Attention with Blockwise Transformers", Sec. 3). Within a block only the chunk pairs
the causal mask leaves visible are computed: query chunk a against key chunk b in full
when a > b, with the causal triangle when a == b, not at all when a < b (so each
off-diagonal block costs half a full block, on every rank).

Softmax across blocks (Milakov and Gimelshein 2018, "Online normalizer calculation for
softmax"; Dao et al. 2022, FlashAttention, Sec. 3.1): each piece gives its normalised
output o_i and the log-sum-exp l_i of its scores; two pieces combine as
l = log(e^l1 + e^l2), o = o1 e^(l1 - l) + o2 e^(l2 - l). The result equals softmax
attention over all visible keys at once, up to roundoff.

Backward runs through autograd: the exchange is an autograd function whose backward
sends the gradient of the received block back to the rank it came from and receives
the gradient of the block this rank sent (the ring reversed). Every rank runs the same
exchanges in the same order, forward and backward, so the pairwise sends always meet.

Time spent posting and waiting for the exchange is category ``cp`` (validate/timeline.py);
bytes sent are counted under ``cp``.
"""
from __future__ import annotations

from validate.timeline import Recorder


def cp_chunk_ids(cp: int, index: int) -> tuple[int, int]:
    """The two of 2*cp sequence chunks rank ``index`` of a cp group holds (cp > 1)."""
    return index, 2 * cp - 1 - index


def cp_positions(seq: int, cp: int, index: int):
    """Token positions (LongTensor [seq/cp]) rank ``index`` holds, in the order it holds them."""
    import torch
    if cp == 1:
        return torch.arange(seq)
    n = seq // (2 * cp)
    a, b = cp_chunk_ids(cp, index)
    return torch.cat([torch.arange(a * n, (a + 1) * n), torch.arange(b * n, (b + 1) * n)])


def cp_split(x, cp: int, index: int, dim: int = 1):
    """This rank's part of ``x`` along the sequence dimension ``dim`` (a copy)."""
    if cp == 1:
        return x
    import torch
    parts = x.chunk(2 * cp, dim=dim)
    a, b = cp_chunk_ids(cp, index)
    return torch.cat([parts[a], parts[b]], dim=dim).contiguous()


def _piece(q, k, v, causal: bool):
    """Softmax attention of q [.., sq, d] over k, v [.., sk, d]: (normalised output,
    log-sum-exp of the scaled scores per query [.., sq])."""
    import torch
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:  # same chunk: query i sees keys 0..i
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge(o1, l1, o2, l2):
    """Two partial softmax outputs over disjoint key sets -> the output over their union."""
    import torch
    if o1 is None:
        return o2, l2
    lse = torch.logaddexp(l1, l2)
    return o1 * torch.exp(l1 - lse).unsqueeze(-1) + o2 * torch.exp(l2 - lse).unsqueeze(-1), lse


def _exchange_class():
    import torch
    import torch.distributed as dist

    class _RingExchange(torch.autograd.Function):
        """Forward: post send of ``kv`` to the next rank and receive of the previous
        rank's block (returned; valid after ``ring.wait()``). Backward: the reverse."""

        @staticmethod
        def forward(ctx, kv, ring: "Ring"):
            ctx.ring = ring
            buf = torch.empty_like(kv)
            ring.post(kv, buf, ring.next, ring.prev, "kv")
            return buf

        @staticmethod
        def backward(ctx, g):
            ring = ctx.ring
            g = g.contiguous()
            out = torch.empty_like(g)
            ring.post(g, out, ring.prev, ring.next, "kv grad (bwd)")
            ring.wait()
            return out, None

    return _RingExchange, dist


_EXCHANGE = None


class Ring:
    """This rank's place in one cp group and its timed, byte-counted exchanges.

    ranks: global ranks of the group in ring order; group: its process group."""

    def __init__(self, ranks: list[int], rank: int, rec: Recorder, group):
        self.ranks = list(ranks)
        self.size = len(ranks)
        self.index = self.ranks.index(rank)
        self.next = self.ranks[(self.index + 1) % self.size]
        self.prev = self.ranks[(self.index - 1) % self.size]
        self.rec, self.group = rec, group
        self._pending: list = []
        self._posted_s = 0.0
        self._label = ""

    def positions(self, seq: int):
        return cp_positions(seq, self.size, self.index)

    def split(self, x, dim: int = 1):
        return cp_split(x, self.size, self.index, dim)

    def post(self, send, recv, dst: int, src: int, label: str) -> None:
        import torch.distributed as dist
        with self.rec.span("cp", "cp_send_recv", f"cp post {label}"):
            # One batch, so NCCL posts the pair together (two neighbours sending to each
            # other one op at a time would each wait for the other's receive).
            self._pending = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, dst, self.group),
                                                    dist.P2POp(dist.irecv, recv, src, self.group)])
        self.rec.sent("cp", send.numel() * send.element_size())
        self._posted_s, self._label = self.rec.now(), label

    def wait(self) -> None:
        with self.rec.span("cp", "cp_wait", f"cp wait {self._label}"):
            for w in self._pending:
                w.wait()
        self.rec.segment("cp", "send", self._posted_s, self.rec.now(), f"cp {self._label}")
        self._pending = []

    def attend(self, q, k, v, rep: int, checkpoint: bool = False):
        """Causal attention of this rank's queries q [b, heads, s/cp, d] over the whole
        sequence's keys, given this rank's k, v [b, groups, s/cp, d] (rep = heads/groups
        query heads per K/V head, grouped-query attention). Returns [b, heads, s/cp, d].
        ``checkpoint``: recompute each piece's scores in backward (selective recompute)."""
        import torch
        from torch.utils.checkpoint import checkpoint as ckpt
        global _EXCHANGE
        if _EXCHANGE is None:
            _EXCHANGE = _exchange_class()[0]
        half = q.shape[2] // 2
        qs = (q[:, :, :half], q[:, :, half:])
        mine = cp_chunk_ids(self.size, self.index)
        acc = [(None, None), (None, None)]
        kv = torch.stack([k, v])  # one message per step; K/V heads only (GQA sends fewer)
        for step in range(self.size):
            src = (self.index - step) % self.size
            last = step == self.size - 1
            nxt = None if last else _EXCHANGE.apply(kv, self)
            kk, vv = kv[0], kv[1]
            if rep > 1:
                kk, vv = kk.repeat_interleave(rep, dim=1), vv.repeat_interleave(rep, dim=1)
            theirs = cp_chunk_ids(self.size, src)
            with self.rec.span("compute", "cp_attention", f"cp attention block {src}"):
                attend_block(qs, kk, vv, mine, theirs, acc, ckpt if checkpoint else None)
            if not last:
                self.wait()
                kv = nxt
        return torch.cat([acc[0][0], acc[1][0]], dim=2)


def attend_block(qs, kk, vv, mine, theirs, acc: list, ckpt=None) -> None:
    """This rank's two query chunks ``qs`` against one block's K/V (``kk``, ``vv``: the
    two chunks ``theirs`` of another rank, or its own), each visible pair of chunks a
    piece merged into ``acc`` (per query chunk: (output, log-sum-exp)); ``ckpt``: run each
    piece under activation checkpointing (torch.utils.checkpoint.checkpoint)."""
    half = kk.shape[2] // 2
    for a in range(2):
        for b in range(2):
            if mine[a] < theirs[b]:
                continue  # entirely in the future of these queries
            sl = slice(b * half, (b + 1) * half)
            args = (qs[a], kk[:, :, sl], vv[:, :, sl], mine[a] == theirs[b])
            o, lse = ckpt(_piece, *args, use_reentrant=False) if ckpt is not None else _piece(*args)
            acc[a] = merge(*acc[a], o, lse)
