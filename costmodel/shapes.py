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
    def params_per_layer(self) -> int:
        """Weights and biases of one layer: attention (QKV + output), MLP, two layer norms."""
        h, f = self.hidden_size, self.ffn
        attn = h * (h + 2 * self.kv_hidden) + (h + 2 * self.kv_hidden) + h * h + h
        n_mats = 3 if self.activation == "swiglu" else 2
        mlp = n_mats * h * f + (f * (n_mats - 1) + h)  # biases: up (and gate), down
        norms = 4 * h
        return attn + mlp + norms

    @property
    def embedding_params(self) -> int:
        """Token embedding (V*h) plus learned position embedding (s*h), as in GPT-3 and Megatron."""
        return self.vocab_size * self.hidden_size + self.seq_length * self.hidden_size

    @property
    def total_params(self) -> int:
        """All layers + embeddings (output layer tied to the token embedding) + final norm."""
        return self.num_layers * self.params_per_layer + self.embedding_params + 2 * self.hidden_size
