"""Context parallelism's per-layer costs: the attention of one K/V block and the bytes a
rank exchanges (docs/context-parallelism.md).

With context parallelism (cp ranks share every sequence) each rank holds seq/cp tokens:
every per-token op shrinks by cp, but attention needs every key. Two ways to get them:

* ring (Megatron-Core's default ``cp_comm_type="p2p"``,
  megatron/core/transformer/transformer_config.py; Transformer Engine's context-parallel
  attention): the ranks pass K/V blocks round a ring. Each of the cp steps attends the
  local queries to the block in hand while the next block is in flight, so a rank does cp
  block attentions and cp-1 transfers of one K/V block per layer forward; backward passes
  K/V again and the dK/dV accumulated for the block's owner, 2 blocks per step.
  Causal load balancing (the sequence cut into 2*cp chunks, rank r holding chunks r and
  2cp-1-r: megatron/core/models/common/embeddings/rope_utils.py) gives every rank and
  every step the same causal work: half a dense block on every step (the own-block step
  is causal within the two chunks, the others attend half the queries or half the keys).
  A step therefore costs what the attention ops of the seq/cp-token block cost, whatever
  causal discount the op list applies to a block, and a rank's cp steps total 1/cp of
  the whole sequence's attention.
* a2a (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509, Sec. 3.1; Megatron-Core
  ``cp_comm_type="a2a"``): an all-to-all turns the rank's seq/cp tokens of all its heads
  into all tokens of heads/cp heads before attention (Q, K and V), and another one turns
  the output back; backward does the same for the gradients. Nothing overlaps them.

Context-parallel attention runs on fused kernels only (Transformer Engine's
context-parallel attention has no unfused backend), so the block's attention ops are
costed fused whatever the runtime's flash_attention setting.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from costmodel.dtypes import working_bytes
from costmodel.efficiency import ops_time_s
from costmodel.flops import Op, is_core_attention, matmul_flops
from costmodel.shapes import ModelSpec


class CPLayerWork(NamedTuple):
    """One layer, one microbatch, one rank of a context-parallel group."""

    fwd_block_s: float  # core attention of the local queries against one K/V block, fused
    bwd_block_s: float  # its backward (and the recompute's attention, if any)
    fwd_local_s: float  # the core attention the local op lists already hold, as costed there
    bwd_local_s: float
    fwd_block_flops: float  # matmul FLOPs of one block, forward / backward
    bwd_block_flops: float
    fwd_bytes: float  # ring: one K/V block sent per step; a2a: all bytes one rank sends
    bwd_bytes: float  # ring: K/V + dK/dV per step; a2a: the gradients' all-to-alls


def kv_block_bytes(local: ModelSpec, mbs: int, tp: int, precision: str) -> float:
    """K and V of one rank's seq/cp tokens for its TP rank's KV heads (at least one head:
    with more TP ranks than KV heads each keeps a copy of one), in the working dtype. GQA
    shrinks the exchange: Llama 3 405B's 8 KV heads of 128 heads send 1/16 of MHA's."""
    kv_width = max(local.kv_hidden // tp, local.head_dim)
    return 2.0 * mbs * local.seq_length * kv_width * working_bytes(precision)


def a2a_bytes(local: ModelSpec, mbs: int, tp: int, cp: int, precision: str) -> float:
    """Bytes one rank sends in the forward all-to-alls of one layer (Ulysses): it keeps
    1/cp of its Q, K, V and output and sends the rest, (cp-1)/cp of them."""
    e = working_bytes(precision)
    tokens = mbs * local.seq_length
    q = local.hidden_size // tp
    kv = max(local.kv_hidden // tp, local.head_dim)
    return (cp - 1) / cp * tokens * (q + 2 * kv + q) * e


def ring_piece_ops(local: ModelSpec, mbs: int, tp: int, cp: int, bytes_per_elem: float) -> tuple[list[Op], list[Op]]:
    """(forward, backward) ops of one layer's ring attention over all cp steps as the
    validator's runner computes it (validate/cp.Ring.attend; RuntimeSettings
    cp_attention_pieces): each rank holds two sequence chunks of c = seq/(2cp) tokens, and
    every visible pair of a query chunk and a key chunk is unfused attention (validate/cp.
    _piece: scores Q K^T scaled, the causal mask on the two diagonal pairs, log-sum-exp,
    exp(s - lse) V), each pair's output merged into its query chunk's by log-sum-exp
    rescaling (validate/cp.merge). With the load-balanced chunks a rank sees P = 2cp + 1
    pairs (3 at its own step, 2 at each other one) and merges M = 2cp - 1 times. The counts
    of autograd's forward and backward ops per kind are what a torch dispatch mode counts
    on that code (tests/test_cp_pieces.py): forward 28cp + 5, backward 80cp - 5 (views
    left out). Bytes: each op reads and writes the tensor it works on once, scores (B c c),
    outputs (B c d) or log-sum-exps (B c), B = microbatch x query heads on this TP rank."""
    e = float(bytes_per_elem)
    c = max(1, local.seq_length // 2)
    d = local.head_dim
    B = mbs * max(1, local.num_attention_heads // tp)
    P, M = 2 * cp + 1, 2 * cp - 1
    S, O, L = B * c * c, B * c * d, B * c

    def mem(name: str, elems: float, n: int) -> list[Op]:
        return [Op(name, "memory", 0.0, 2.0 * elems * e) for _ in range(n)]

    mm_bytes = B * (2 * c * d + c * c) * e
    fwd = ([Op("piece_qk", "attention", 2.0 * B * c * c * d, mm_bytes, c, c, d, B) for _ in range(P)]
           + [Op("piece_pv", "attention", 2.0 * B * c * c * d, mm_bytes, c, d, c, B) for _ in range(P)]
           + mem("piece_scale", S, P) + mem("piece_logsumexp", S, P) + mem("piece_sub", S, P)
           + mem("piece_exp", S, P) + mem("piece_mask", S, 2) + mem("piece_mask_build", c * c, 4)
           + mem("merge_mul", O, 2 * M) + mem("merge_sub", L, 2 * M) + mem("merge_exp", L, 2 * M)
           + mem("merge_logaddexp", L, M) + mem("merge_add", O, M) + mem("chunks_cat", 2 * O, 1))
    bwd = ([Op("piece_bmm_bwd", "attention", 2.0 * B * c * c * d, mm_bytes, c, c, d, B) for _ in range(4 * P)]
           + mem("piece_mul_bwd", S, 3 * P) + mem("piece_sum_bwd", S, P) + mem("piece_sub_bwd", S, P)
           + mem("piece_exp_bwd", S, P) + mem("piece_mask_bwd", S, 2)
           + mem("merge_mul_bwd", O, 6 * M) + mem("merge_sum_bwd", O, 2 * M) + mem("neg_bwd", L, P + 2 * M)
           + mem("merge_sub_bwd", L, 2 * M) + mem("merge_exp_bwd", L, 2 * M) + mem("merge_div_bwd", L, 2 * M)
           + mem("grad_add", O, 22 * cp - 6) + mem("slice_bwd", 2 * O, 2 * P + 2))
    return fwd, bwd


def ring_pieces(runtime, cp_comm: str) -> bool:
    """Whether the ring's attention is the validator runner's unfused pieces
    (runtime.cp_attention_pieces; the all-to-all variant has no pieces)."""
    return runtime is not None and runtime.cp_attention_pieces and cp_comm != "a2a"


def pieces_checkpointed(runtime, cp_comm: str, recompute: str) -> bool:
    """Whether selective recompute checkpoints each ring piece on its own (the validator's
    runner, validate/cp.Ring.attend), rather than the layer's core attention as one region."""
    return ring_pieces(runtime, cp_comm) and recompute == "selective"


def recomputed_piece_ops(piece_forward: list[Op]) -> list[Op]:
    """What backward re-runs of ring_piece_ops' forward when each piece is checkpointed:
    every piece's ops up to the tensors its backward saved. torch's non-reentrant
    checkpoint stops once those are rebuilt, so the last product with V is not re-run, nor
    are the merges outside the pieces (tests/test_cp_pieces.py counts the runner's)."""
    return [o for o in piece_forward if o.name.startswith("piece_") and o.name != "piece_pv"]


def cp_layer_work(local: ModelSpec, mbs: int, tp: int, cp: int, cp_comm: str, precision: str,
                  gpu, eff, runtime, f_ops: list[Op], b_ops: list[Op], recompute: str = "none") -> CPLayerWork:
    """``f_ops`` / ``b_ops`` (backward with recompute) are one layer's ops for the rank's
    seq/cp tokens (``local``); their core attention is one K/V block. Under
    ``runtime.cp_attention_pieces`` the ring's attention is the runner's unfused pieces
    (ring_piece_ops), a block a cp-th of them; with selective ``recompute`` each piece is
    a checkpointed region of its own (pieces_checkpointed): backward re-runs every piece's
    forward ops but its last product with V and pays the region's host cost 2cp + 1 times
    a layer."""
    fa = [o for o in f_ops if is_core_attention(o)]
    ba = [o for o in b_ops if is_core_attention(o)]
    fused = replace(runtime, flash_attention=True)
    if cp_comm == "a2a":
        fwd_b = bwd_b = a2a_bytes(local, mbs, tp, cp, precision)
    else:
        kv = kv_block_bytes(local, mbs, tp, precision)
        fwd_b, bwd_b = kv, 2 * kv
    if ring_pieces(runtime, cp_comm):
        pf, pb = ring_piece_ops(local, mbs, tp, cp, working_bytes(precision))
        if pieces_checkpointed(runtime, cp_comm, recompute):
            pb = pb + recomputed_piece_ops(pf)
            regions_s = (2 * cp + 1) * runtime.checkpoint_region_s("selective")
        else:
            regions_s = 0.0
        blocks = (ops_time_s(pf, gpu, eff, precision, runtime) / cp,
                  ops_time_s(pb, gpu, eff, precision, runtime, regions_s) / cp,
                  matmul_flops(pf) / cp, matmul_flops(pb) / cp)
    else:
        blocks = (ops_time_s(fa, gpu, eff, precision, fused), ops_time_s(ba, gpu, eff, precision, fused),
                  matmul_flops(fa), matmul_flops(ba))
    return CPLayerWork(
        fwd_block_s=blocks[0], bwd_block_s=blocks[1],
        fwd_local_s=ops_time_s(fa, gpu, eff, precision, runtime),
        bwd_local_s=ops_time_s(ba, gpu, eff, precision, runtime),
        fwd_block_flops=blocks[2], bwd_block_flops=blocks[3],
        fwd_bytes=fwd_b, bwd_bytes=bwd_b,
    )


def ring_attention_s(cp: int, block_s: float, step_s: float) -> float:
    """Closed form of one ring pass: cp block computes, each of the first cp-1 overlapped
    with the transfer of the next block (``step_s``): exposed max(0, step - block) each."""
    return cp * block_s + (cp - 1) * max(0.0, step_s - block_s)
