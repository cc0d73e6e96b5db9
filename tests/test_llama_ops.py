"""The runner's RoPE and RMSNorm autograd Functions (validate/gpt.py): forward against an
independent formula, backward against autograd's numerical gradient, and what they keep
for backward (what the cost model's activation count assumes)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from validate.gpt import rms_norm, rope, rope_angles  # noqa: E402


def test_rope_is_a_rotation_of_channel_pairs():
    """RoFormer eq. 34 in the rotate-half layout: channel i and i + d/2 of position p are
    the real and imaginary part of a complex number multiplied by exp(i p theta_i),
    theta_i = 10000^(-2i/d). Computed here with torch.complex, independently of rope()."""
    g = torch.Generator().manual_seed(0)
    b, heads, s, d = 2, 3, 5, 8
    x = torch.randn(b, heads, s, d, generator=g, dtype=torch.float64)
    cos, sin = rope_angles(torch.arange(s), d, "cpu")
    got = rope(x, cos.double(), sin.double())
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(
        torch.ones(s, d // 2, dtype=torch.float64), torch.arange(s, dtype=torch.float64)[:, None] * theta)
    torch.testing.assert_close(got, torch.cat((z.real, z.imag), dim=-1))
    # A rotation keeps norms.
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))


def test_rope_and_rmsnorm_gradients_match_numerical_ones():
    """torch.autograd.gradcheck (finite differences in float64) on both hand-written backwards."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    cos, sin = (t.double() for t in rope_angles(torch.arange(4), 6, "cpu"))
    assert torch.autograd.gradcheck(lambda t: rope(t, cos, sin), (x,))
    h = torch.randn(3, 5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-5), (h, w))


def test_rmsnorm_forward_and_what_it_keeps():
    """Forward equals torch's own F.rms_norm; for backward it keeps its input, the weight and
    one fp32 value per row (the reciprocal RMS), where the eager composite also keeps the
    normalised input: 3 x 5 x 64 fp32 input = 3,840 B + 15 rows x 4 B, the weight 256 B.
    RoPE keeps no tensor at all (its angles are constants of the positions)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 64, generator=g, requires_grad=True)
    w = torch.randn(64, generator=g, requires_grad=True)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), torch.nn.functional.rms_norm(x, (64,), w, 1e-5))
    kept = []

    def pack(t):
        kept.append(t.untyped_storage().nbytes())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        rms_norm(x, w, 1e-5)
    assert sorted(kept) == [15 * 4, 64 * 4, 3 * 5 * 64 * 4]
    kept.clear()
    cos, sin = rope_angles(torch.arange(5), 64, "cpu")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        rope(x.view(3, 1, 5, 64), cos, sin)
    assert kept == []
