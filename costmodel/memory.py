"""Memory per device: activations, model states (weights, gradients, optimizer) and logits.

Activation accounting follows Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", Table 2 and the per-tensor accounting behind it), tensor by
tensor, so that it extends to grouped-query attention, SwiGLU and any FFN width; for GPT
(MHA, gelu, ffn = 4h) it reduces exactly to Table 2.
"""
from __future__ import annotations

from costmodel.dtypes import DTYPE_BYTES, grad_reduce_bytes, optimizer_state_bytes, working_bytes
from costmodel.errors import InputError
from costmodel.flops import check_recompute, check_sizes, check_tp_divides
from costmodel.shapes import ModelSpec

_MASK_BYTES = 1  # a dropout mask element (torch.bool / uint8), whatever the activation width
# FlashAttention keeps, per query row and head, the fp32 log-sum-exp of the softmax for its
# backward instead of the s x s probabilities (Dao 2023, FlashAttention-2, Alg. 1 line 13
# and Alg. 2; FlashAttention-1, Dao et al. 2022 Alg. 2, kept the row max m and row sum l,
# two such fp32 vectors, which FlashAttention-2 folds into one).
_LSE_BYTES = DTYPE_BYTES["fp32"]


def activation_bytes_per_layer(
    model: ModelSpec, mbs: int, tp: int, sp: bool, recompute: str, *, bytes_per_elem: int = 2,
    flash_attention: bool = False, sp_saves_gathered: bool = False, dropout: bool = True,
) -> float:
    """Activation bytes one layer keeps from forward to backward, per device, one microbatch.

    Derivation (s seq, b mbs, h hidden, a heads, g = kv_hidden, f = ffn, t = tp, e =
    bytes_per_elem; "2" below is e for 16-bit), as in Korthikanti 2022:

    attention block
      LayerNorm-1 input                  e*sbh       replicated without SP
      QKV GEMM input                     e*sbh       replicated without SP
      Q and K (for QK^T)                 e*sb(h+g)/t
      softmax output                     e*a*s^2*b/t   (selective recompute drops these three)
      attention-dropout mask             1*a*s^2*b/t
      attention-dropout output           e*a*s^2*b/t
      V                                  e*sbg/t
      attention-out GEMM input           e*sbh/t
      dropout mask                       1*sbh       replicated without SP
    MLP block
      LayerNorm-2 input                  e*sbh       replicated without SP
      MLP-up GEMM input                  e*sbh       replicated without SP
      activation input (gelu: f wide;    e*sbf/t  (gelu)  or  2*e*sbf/t (swiglu: gate and up)
      MLP-down input                     e*sbf/t
      dropout mask                       1*sbh       replicated without SP

    GPT with e=2, g=h, f=4h: replicated 4*2+2*1 = 10 sbh, split (4+2+2+8+8) = 24 sbh/t and
    5*a*s^2*b/t, i.e. Table 2's s*b*h*(10 + 24/t + 5*a*s/(h*t)); SP divides the replicated
    part by t too (34/t). t=1 gives the unparallelised 34 + 5*a*s/h.

    ``sp_saves_gathered``: with SP, the two column-parallel GEMMs (QKV, MLP-up) keep their
    all-gathered input [s, b, h] for the weight gradient instead of Megatron's s/t slice
    that backward gathers again (profile runtime ``sp_regather_input`` false, as the
    project's validator runs): those two e*sbh terms stay whole, 2e*sbh + (2e+2)*sbh/t
    of the replicated part.

    Grouped-query attention with more than one K/V group on a rank: the fused projection's
    output is laid out per group (its query heads, then its key and value heads), so the
    query heads of several groups are not one strided view and reshaping them copies
    (Megatron-Core transformer/attention.py, get_query_key_value_tensors: torch.split
    along the per-group dim, then query.reshape); attention keeps that copy, and the key
    and value views keep the whole projection output: e*sbh/t more. With one group per
    rank (or one query head per group, MHA) the query is a view and nothing is added.

    RoPE (``model.position_embedding`` rope): the rotated Q and K are new tensors, which
    attention keeps, while V stays a view of the fused projection's output and keeps that
    whole buffer alive (megatron/core/transformer/attention.py: query and key are replaced
    by apply_rotary_pos_emb's outputs, value is not): e*sb(h+g)/t more. The GQA query copy
    above is then only RoPE's input, freed once rotated, so it is not added again.

    ``dropout`` false (hidden and attention dropout off, as Llama-style recipes and the
    project's validator train): no masks and no attention-dropout output; the softmax
    output feeds the probabilities x V GEMM directly, e*a*s^2*b/t. GPT with e=2:
    s*b*h*(8 + 24/t) + 2*a*s^2*b/t without SP, 32*s*b*h/t + 2*a*s^2*b/t with it.

    Full recompute keeps only the layer input, e*sbh (Table 2: 2sbh). With SP the layer
    input is Megatron's sequence-parallel slice [s/t, b, h], so we divide it by t; Table 2's
    2sbh row is for plain TP.

    FlashAttention (Dao et al. 2022, Sec. 3.1 and Alg. 2: the forward returns O and the
    softmax row statistics; the backward recomputes the attention matrix from Q, K, V in
    SRAM) keeps no s x s tensor: the three score terms go, and the kernel keeps the fp32
    log-sum-exp per row and head, 4*a*s*b/t. Q, K, V and O are already counted above.
    Selective recompute re-runs the whole core attention, so it keeps neither.
    """
    check_recompute(recompute)
    check_sizes(mbs, tp, bytes_per_elem)
    check_tp_divides(model, tp, sp)
    s, b, h, e = model.seq_length, mbs, model.hidden_size, bytes_per_elem
    sbh, t = s * b * h, tp
    replicated_div = t if sp else 1
    if recompute == "full":
        return e * sbh / replicated_div

    g, f = model.kv_hidden, model.ffn
    act_in = 2 * f if model.activation == "swiglu" else f
    gemm_inputs = 2 * e * sbh  # the QKV and MLP-up GEMM inputs
    # SP splits these two only where backward gathers them again (see sp_saves_gathered).
    kept_whole = gemm_inputs if sp and sp_saves_gathered else 0
    masks = _MASK_BYTES if dropout else 0
    replicated = 2 * e * sbh + 2 * masks * sbh + gemm_inputs - kept_whole  # + two LN inputs, two masks
    split = e * s * b * (h + g) + e * s * b * g + e * sbh + e * s * b * (act_in + f)
    if model.position_embedding == "rope":
        split += e * s * b * (h + g)  # rotated Q and K beside the projection output (docstring)
    elif model.kv_groups // t > 1 and model.heads_per_group > 1:
        split += e * sbh  # the query heads copied out of the grouped projection (docstring)
    a = model.num_attention_heads
    if recompute == "selective":
        attn_scores = 0
    elif flash_attention:
        attn_scores = a * s * b * _LSE_BYTES
    else:
        # softmax output; with dropout also its mask and the dropout's output
        attn_scores = a * s * s * b * (2 * e + _MASK_BYTES if dropout else e)
    return kept_whole + replicated / replicated_div + (split + attn_scores) / t


def model_state_bytes(params: float, dp: int, zero: int, precision: str = "bf16",
                      grad_bytes: float | None = None) -> dict:
    """{'weights', 'grads', 'optimizer'} bytes on one device holding ``params`` parameters
    (already divided by tp and pp). ZeRO (Rajbhandari et al. 2020) shards over the dp
    ranks: stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the weights.
    Bytes per parameter come from costmodel/dtypes.py: working weights, the gradient buffer
    in the dtype gradients accumulate and are reduced in (``grad_bytes``, default the
    precision's: fp32 main grads for bf16 as Megatron-LM and DeepSpeed's BF16_Optimizer keep,
    which makes the 18 bytes per parameter BLOOM's planning used), master copy + Adam."""
    w, o = working_bytes(precision), optimizer_state_bytes(precision)
    if zero not in (0, 1, 2, 3):
        raise InputError(None, "plan.zero", f"got {zero!r}; allowed: 0, 1, 2, 3")
    if not isinstance(dp, int) or dp < 1:
        raise InputError(None, "plan.dp", f"data-parallel size must be an integer >= 1, got {dp!r}")
    if params < 0:
        raise InputError(None, "params", f"must be >= 0, got {params!r}")
    g = grad_reduce_bytes(precision) if grad_bytes is None else grad_bytes
    return {
        "weights": params * w / (dp if zero >= 3 else 1),
        "grads": params * g / (dp if zero >= 2 else 1),
        "optimizer": params * o / (dp if zero >= 1 else 1),
    }


def stage_params(model: ModelSpec, layers: int, tp: int, first: bool, last: bool) -> float:
    """Parameters held by one device of a pipeline stage with ``layers`` layers.

    Layers: Megatron splits the QKV, attention-out and MLP matrices and the column-parallel
    biases (QKV, MLP-up/gate) over tp; the two norms (LayerNorm 4h, RMSNorm 2h) and the
    row-parallel biases (attention-out, MLP-down: 2h, none without linear biases) are
    replicated on every TP rank. First stage: the word embedding is vocab-parallel (V*h/t);
    a learned position embedding (s*h) is replicated (Megatron does not split it). Last
    stage: the final norm (replicated) and the output layer (V*h/t): tied to the word
    embedding, the last stage keeps its own copy when pp > 1 (GPT-3/Megatron) and with
    pp = 1 the one copy is counted once; untied (Llama), it is a matrix of its own.
    """
    if not isinstance(layers, int) or layers < 0:
        raise InputError(None, "plan.layers", f"layers per stage must be an integer >= 0, got {layers!r}")
    if not isinstance(tp, int) or tp < 1:
        raise InputError(None, "plan.tp", f"tensor-parallel size must be an integer >= 1, got {tp!r}")
    h = model.hidden_size
    replicated = 2 * model.norm_params + model.row_bias_params
    per_layer = (model.params_per_layer - replicated) / tp + replicated
    total = layers * per_layer
    word = model.vocab_size * h / tp
    if first:
        total += word + model.position_params
    if last:
        total += model.norm_params + (word if (not first or not model.tie_embeddings) else 0)
    return total


def logits_bytes(model: ModelSpec, mbs: int, tp: int) -> float:
    """fp32 softmax of one microbatch's logits on one TP rank, s*b*V/t*4 bytes, which the
    vocabulary-parallel cross entropy keeps for its backward (Megatron-Core
    tensor_parallel/cross_entropy.py, VocabParallelCrossEntropy: save_for_backward(exp_logits,
    ...) after normalising in place)."""
    return model.seq_length * mbs * model.vocab_size / tp * DTYPE_BYTES["fp32"]


def head_activation_bytes(model: ModelSpec, mbs: int, tp: int, sp: bool, *, bytes_per_elem: int = 2,
                          sp_saves_gathered: bool = False) -> float:
    """What the output end of the stack keeps per microbatch in flight on the last stage:
    the final LayerNorm's input (e*sbh, /t with SP), the output layer's GEMM input (e*sbh:
    a column-parallel GEMM, /t with SP unless it keeps the gathered input, as the layers'
    do: activation_bytes_per_layer) and the fp32 softmax of the logits (logits_bytes).
    Held until that microbatch's backward, so a schedule that runs many forwards before
    their backwards (GPipe) holds it many times."""
    check_sizes(mbs, tp, bytes_per_elem)
    sbh, e = model.seq_length * mbs * model.hidden_size, bytes_per_elem
    split = tp if sp else 1
    gemm_in = e * sbh if sp_saves_gathered else e * sbh / split
    return e * sbh / split + gemm_in + logits_bytes(model, mbs, tp)


def topk_residual_bytes(params: float) -> float:
    """Top-k with error feedback keeps the unsent remainder of every local gradient
    element between steps: one fp32 buffer the size of the local parameters, not
    sharded by ZeRO (Stich et al. 2018, error-feedback / memory SGD)."""
    return float(DTYPE_BYTES["fp32"] * params)
