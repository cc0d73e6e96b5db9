"""Activation memory follows FlashAttention and the training precision.

FlashAttention (Dao et al. 2022, Sec. 3.1, Alg. 2) keeps no s x s attention matrix for the
backward, only per-row softmax statistics; activations are as wide as the precision's
working dtype (costmodel/dtypes.py). The published check: Megatron-LM's H100 table
(docs/facts.md, bottom table) trains 70B-462B GPTs at sequence 4096 on 80 GB H100s with
tp=8, microbatch 1 and the distributed optimizer; they must fit.
"""
from __future__ import annotations

import pytest

from costmodel.memory import activation_bytes_per_layer
from costmodel.profile import load_profile
from costmodel.shapes import ModelSpec
from sim.program import build_program, stage_memory
from specs.plan import resolve_plan
from specs.topology import load_topology

GIB = 2.0 ** 30
S, V = 4096, 131072
# (name, heads, hidden, layers, pp, dp, global batch): docs/facts.md, Megatron-LM on H100.
MEGATRON_H100 = [
    ("70B", 64, 8192, 84, 2, 48, 384),
    ("119B", 80, 10240, 92, 4, 48, 768),
    ("177B", 96, 12288, 96, 6, 48, 1152),
    ("314B", 128, 16384, 96, 8, 48, 1536),
    ("462B", 144, 18432, 112, 16, 48, 3072),
]


@pytest.fixture(scope="module")
def h100_flash(tmp_path_factory):
    """dgx-h100 with its bundled profile and a user profile turning flash attention on."""
    path = tmp_path_factory.mktemp("profile") / "flash.yaml"
    path.write_text("name: flash\nruntime:\n  flash_attention: true\n")
    cluster = load_topology("dgx-h100", nodes=1)
    profile = load_profile(str(path), bundled=cluster.profiles)
    assert profile.runtime.flash_attention
    return cluster, profile


def test_flash_layer_bytes_by_hand():
    """70B layer, s=4096, b=1, h=8192, a=64, t=8 with SP, no recompute: Korthikanti's
    34*s*b*h/t without the 5*a*s^2*b/t of scores, softmax and dropout mask, plus the fp32
    log-sum-exp per row and head, 4*a*s*b/t. Selective recompute keeps neither term."""
    m = ModelSpec("70B", 84, 8192, 64, S, V, 384)
    sbh = S * 8192
    flash = activation_bytes_per_layer(m, 1, 8, True, "none", flash_attention=True)
    assert flash == 34 * sbh / 8 + 4 * 64 * S / 8
    plain = activation_bytes_per_layer(m, 1, 8, True, "none")
    assert plain == 34 * sbh / 8 + 5 * 64 * S * S / 8
    assert activation_bytes_per_layer(m, 1, 8, True, "selective", flash_attention=True) == 34 * sbh / 8


@pytest.mark.parametrize("name,heads,hidden,layers,pp,dp,batch", MEGATRON_H100)
def test_megatron_h100_rows_fit_with_flash_attention(h100_flash, name, heads, hidden, layers, pp, dp, batch):
    """Each published row (tp=8, microbatch 1, sequence parallelism, zero=1 for the
    distributed optimizer, no recompute) fits in the H100's 80 GiB on every pipeline stage
    once flash attention drops the s x s tensors; without it (the profile's default) the
    first stage would need 89-214 GiB, more than the GPU has."""
    cluster, profile = h100_flash
    model = ModelSpec(name, layers, hidden, heads, S, V, batch)
    plan = resolve_plan(f"tp=8,pp={pp},dp={dp},mbs=1,sp=true,zero=1", model, 8 * pp * dp)
    cap = cluster.devices[0].gpu.mem_bytes
    m = plan.mb_shares[0]
    peaks = [sum(stage_memory(model, plan, profile.runtime, s, m).values()) for s in range(pp)]
    assert max(peaks) < cap, f"{name}: {max(peaks) / GIB:.1f} GiB of {cap / GIB:.0f}"
    no_flash = load_profile(None, bundled=cluster.profiles).runtime
    assert sum(stage_memory(model, plan, no_flash, 0, m).values()) > cap


def test_activation_bytes_follow_precision():
    """The program's activation memory is 4 bytes per element for fp32 training, 2 for
    bf16 and fp16, and bf16-wide for fp8 (Transformer Engine keeps activations outside the
    GEMMs in bf16); the 1-byte dropout masks do not widen."""
    cluster = load_topology("dgx-a100", nodes=1)
    profile = load_profile(None, bundled=cluster.profiles)
    model = ModelSpec("m", 8, 1024, 16, 512, 32000, 64)
    acts = {}
    for prec in ("fp32", "bf16", "fp16", "fp8"):
        plan = resolve_plan(f"tp=2,pp=2,dp=2,mbs=2,precision={prec}", model, 8)
        acts[prec] = build_program(model, plan, cluster, profile).pipelines[0].memory[0]["activations"]
    held = 2 * 4  # 1F1B stage 0 of pp=2 holds 2 microbatches of its 4 layers
    for prec, width in (("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 2)):
        assert acts[prec] == held * activation_bytes_per_layer(model, 2, 2, False, "none", bytes_per_elem=width)
    # One-byte dropout masks per layer: two s*b*h (replicated over TP) and the attention
    # dropout's a*s*s*b/t.
    masks = held * (2 * 512 * 2 * 1024 + 16 * 512 * 512 * 2 / 2)
    assert acts["fp32"] - masks == 2 * (acts["bf16"] - masks)
