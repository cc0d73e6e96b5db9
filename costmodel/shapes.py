"""The model shape that the cost model computes with.

A plain frozen record (no parsing): specs/model.py loads presets and YAML files into it.
It lives here because both costmodel and sim need it and costmodel may not import sim.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. All sizes are counts (not bytes)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    global_batch_size: int  # sequences per optimizer step
    num_query_groups: int | None = None  # grouped-query attention; None = multi-head
    ffn_hidden_size: int | None = None  # None = 4 * hidden_size
    activation: str = "gelu"  # "gelu" (2 FFN matrices) or "swiglu" (3 FFN matrices)
    # The four choices that tell a Llama from a GPT-3 in the parameter count (Megatron-Core's
    # --untie-embeddings-and-output-weights, --position-embedding-type rope,
    # --disable-bias-linear, --normalization RMSNorm; TorchTitan's Llama has all four):
    tie_embeddings: bool = True  # output layer shares the token embedding's V x h matrix
    position_embedding: str = "learned"  # "learned" (s x h table) or "rope" (no parameters)
    linear_bias: bool = True  # biases on the QKV, attention-out and MLP linears
    normalization: str = "layernorm"  # "layernorm" (weight and bias, 2h) or "rmsnorm" (weight, h)

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size if self.ffn_hidden_size is not None else 4 * self.hidden_size

    @property
    def kv_groups(self) -> int:
        return self.num_query_groups if self.num_query_groups is not None else self.num_attention_heads

    @property
    def heads_per_group(self) -> int:
        """Query heads per K/V group (1: multi-head attention)."""
        return self.num_attention_heads // self.kv_groups

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection output: kv_groups * head_dim."""
        return self.kv_groups * self.head_dim

    @property
    def norm_params(self) -> int:
        """One normalisation layer: LayerNorm's weight and bias (2h), RMSNorm's weight (h)."""
        return (2 if self.normalization == "layernorm" else 1) * self.hidden_size

    @property
    def column_bias_params(self) -> int:
        """Biases of the column-parallel linears (QKV, MLP up and gate), split over TP."""
        if not self.linear_bias:
            return 0
        return self.hidden_size + 2 * self.kv_hidden + self.ffn * (2 if self.activation == "swiglu" else 1)

    @property
    def row_bias_params(self) -> int:
        """Biases of the row-parallel linears (attention out, MLP down), replicated on every
        TP rank (added after the reduction)."""
        return 2 * self.hidden_size if self.linear_bias else 0

    @property
    def params_per_layer(self) -> int:
        """Weights and biases of one layer: attention (QKV + output), MLP, two norms."""
        h, f = self.hidden_size, self.ffn
        n_mats = 3 if self.activation == "swiglu" else 2
        weights = h * (h + 2 * self.kv_hidden) + h * h + n_mats * h * f
        return weights + self.column_bias_params + self.row_bias_params + 2 * self.norm_params

    @property
    def position_params(self) -> int:
        """The learned position table (s*h, GPT-3 and Megatron's default); RoPE has none."""
        return self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0

    @property
    def embedding_params(self) -> int:
        """Token embedding (V*h) plus the position table."""
        return self.vocab_size * self.hidden_size + self.position_params

    @property
    def output_params(self) -> int:
        """The output layer's own matrix: none when tied to the token embedding, V*h untied."""
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """All layers + embeddings + final norm + the output layer when untied."""
        return (self.num_layers * self.params_per_layer + self.embedding_params + self.norm_params
                + self.output_params)
