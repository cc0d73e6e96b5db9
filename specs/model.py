"""Model presets and model YAML files, loaded into costmodel.shapes.ModelSpec.

Preset shapes are the published ones; each entry cites its paper. Vocabularies are
padded the way Megatron-LM pads them (to a multiple of 128 x TP, we use the common
padded size) where the paper gives an unpadded size, and say so.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from costmodel.errors import InputError
from costmodel.limits import MAX_GLOBAL_BATCH, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_SEQ, MAX_VOCAB
from costmodel.shapes import ModelSpec
from costmodel.yamlio import load_yaml, not_a_file
from specs.validation import Bool, Int, Strict, validate


class ModelFile(Strict):
    """The model YAML: exactly these fields (unknown keys are rejected); sizes bounded as
    costmodel/limits.py says."""

    name: str = Field(max_length=200)
    num_layers: Int(1, MAX_LAYERS)
    hidden_size: Int(1, MAX_HIDDEN)
    num_attention_heads: Int(1, MAX_HEADS)
    num_query_groups: Int(1, MAX_HEADS) | None = None
    ffn_hidden_size: Int(1, 4 * MAX_HIDDEN) | None = None
    seq_length: Int(1, MAX_SEQ)
    vocab_size: Int(1, MAX_VOCAB)
    global_batch_size: Int(1, MAX_GLOBAL_BATCH)
    activation: Literal["gelu", "swiglu"] = "gelu"
    tie_embeddings: Bool = True
    position_embedding: Literal["learned", "rope"] = "learned"
    linear_bias: Bool = True
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"

    @model_validator(mode="after")
    def _consistent(self) -> "ModelFile":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_query_groups and self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by "
                f"num_query_groups {self.num_query_groups}"
            )
        return self


def _gpt3(name, layers, hidden, heads, batch):
    # GPT-3 shapes and batch sizes: Brown et al. 2020, "Language Models are Few-Shot
    # Learners", Table 2.1 (batch given in tokens; divided by the 2048-token context).
    # Vocabulary 50257 padded to 51200 as Megatron-LM does (Narayanan et al. 2021 use 51200).
    return ModelSpec(name, layers, hidden, heads, 2048, 51200, batch)


# What makes a Llama a Llama in the parameter count (see the Llama presets' sources).
_LLAMA = dict(activation="swiglu", tie_embeddings=False, position_embedding="rope", linear_bias=False,
              normalization="rmsnorm")


def _llama(name, layers, hidden, heads, seq, vocab, batch, kv, ffn):
    return ModelSpec(name, layers, hidden, heads, seq, vocab, batch, kv, ffn, **_LLAMA)


PRESETS: dict[str, ModelSpec] = {
    "gpt3-125m": _gpt3("gpt3-125m", 12, 768, 12, 256),  # 0.5M tokens
    "gpt3-350m": _gpt3("gpt3-350m", 24, 1024, 16, 256),  # 0.5M tokens
    "gpt3-760m": _gpt3("gpt3-760m", 24, 1536, 16, 256),  # 0.5M tokens
    "gpt3-1.3b": _gpt3("gpt3-1.3b", 24, 2048, 16, 512),  # 1M tokens; 16 heads of 128 (Megatron's GPT-3 1.3B)
    "gpt3-2.7b": _gpt3("gpt3-2.7b", 32, 2560, 32, 512),  # 1M tokens
    "gpt3-6.7b": _gpt3("gpt3-6.7b", 32, 4096, 32, 1024),  # 2M tokens
    # Table 2.1 prints d_model 5140; 5120 (= 40 heads x 128) is what implementations use.
    "gpt3-13b": _gpt3("gpt3-13b", 40, 5120, 40, 1024),  # 2M tokens
    "gpt3-175b": _gpt3("gpt3-175b", 96, 12288, 96, 1536),  # 3.2M tokens
    # Llama 2: Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models",
    # Table 1 and Sec. 2.2 (4096 context, 4M-token batch = 1024 sequences, vocab 32000,
    # SwiGLU; 70B uses grouped-query attention with 8 KV heads). FFN widths from the
    # released configs (11008, 13824, 28672). The architecture of Llama 1 (Sec. 2.2 there:
    # RMSNorm pre-normalisation, SwiGLU, rotary embeddings); no biases and an output layer
    # of its own (meta-llama/llama, llama/model.py: linears with bias=False, a separate
    # `output` ColumnParallelLinear): _LLAMA.
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 4096, 32000, 1024, None, 11008),
    "llama2-13b": _llama("llama2-13b", 40, 5120, 40, 4096, 32000, 1024, None, 13824),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 4096, 32000, 1024, 8, 28672),
    # Llama 3: Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (layers, width,
    # FFN, heads, 8 KV heads, vocab 128256) and Sec. 3.4 (405B: 8192 context, batch up to
    # 16M tokens = 2048 sequences); Sec. 3.2: Llama 2's architecture. The paper gives no
    # batch for 8B/70B: we assume the same 16M tokens; override with a model file if you
    # know better. With _LLAMA the counts are the published 8.03B, 70.6B and 405.9B.
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8192, 128256, 2048, 8, 14336),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8192, 128256, 2048, 8, 28672),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8192, 128256, 2048, 8, 53248),
    # Not a published model: the smallest GPT that exercises every plan the real runner
    # validates on a CPU machine (validate/): 4 layers and 4 heads split over tp, pp,
    # vpp = 2 and dp up to 4, 16 sequences = 2+ microbatches per replica; one step takes
    # well under a second per gloo process.
    "tiny": ModelSpec("tiny", 4, 128, 4, 64, 512, 16),
}

DEFAULT_MODEL = "gpt3-1.3b"


def model_from_mapping(data: dict, source: str) -> ModelSpec:
    """Validate a mapping (from YAML) into a ModelSpec; InputError names the field."""
    m = validate(ModelFile, data, source)
    return ModelSpec(**m.model_dump())


def with_overrides(model: ModelSpec, seq_length: int | None = None,
                   global_batch_size: int | None = None) -> ModelSpec:
    """``model`` with the command line's --seq / --global-batch, validated as a model file's
    fields are (a long-context phase of a preset: Llama 3 405B's 131,072-token phase ran
    128 sequences per step, Dubey et al. 2024, Table 4)."""
    data = dataclasses.asdict(model)
    if seq_length is not None:
        data["seq_length"] = seq_length
    if global_batch_size is not None:
        data["global_batch_size"] = global_batch_size
    src = "--seq" if seq_length is not None else "--global-batch"
    return model if data == dataclasses.asdict(model) else model_from_mapping(data, src)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (see PRESETS) or a path to a model YAML file."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    problem = not_a_file(path, "model file")
    if problem:
        raise InputError(name_or_path, "--model", problem)
    if not path.is_file():
        raise InputError(
            name_or_path, "--model",
            f"no such preset or file; presets: {', '.join(sorted(PRESETS))}",
        )
    return model_from_mapping(load_yaml(path, str(path), "model file"), str(path))
