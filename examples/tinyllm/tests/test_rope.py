import math

import pytest
import torch

from tinyllm.model.rope import RotaryEmbedding, apply_rope, rope_cache, rope_inv_freq

pytestmark = pytest.mark.correctness


def _rotate(x, seq_len, base=10000.0):
    cos, sin = rope_cache(seq_len, x.shape[-1], base)
    return apply_rope(x, cos, sin)


def test_inverse_frequencies_match_formula():
    expected = torch.tensor([1.0, 0.1, 0.01, 0.001])
    torch.testing.assert_close(rope_inv_freq(8, base=10000.0), expected, atol=0, rtol=1e-6)


def test_first_pair_turns_one_radian_per_position():
    cos, sin = rope_cache(4, 8)
    positions = torch.arange(4, dtype=torch.float64)
    torch.testing.assert_close(cos[:, 0].double(), positions.cos(), atol=1e-7, rtol=0)
    torch.testing.assert_close(sin[:, 0].double(), positions.sin(), atol=1e-7, rtol=0)


@pytest.mark.parametrize("head_dim", [8, 16])
def test_position_zero_is_the_identity(head_dim):
    x = torch.randn(2, 3, 1, head_dim)
    torch.testing.assert_close(_rotate(x, 1), x, atol=0, rtol=0)


@pytest.mark.parametrize("head_dim", [8, 16, 32])
def test_rotation_preserves_norm(head_dim):
    x = torch.randn(2, 4, 24, head_dim)
    torch.testing.assert_close(_rotate(x, 24).norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shift", [1, 5, 17])
def test_scores_depend_only_on_relative_position(shift):
    head_dim, seq_len = 16, 32
    q, k = torch.randn(head_dim), torch.randn(head_dim)
    # The same q and k at every position; score(m, n) must equal score(m + s, n + s).
    rq = _rotate(q.expand(seq_len, head_dim).clone(), seq_len)
    rk = _rotate(k.expand(seq_len, head_dim).clone(), seq_len)
    m, n = 9, 2
    assert torch.dot(rq[m], rk[n]) == pytest.approx(torch.dot(rq[m + shift], rk[n + shift]).item(), abs=1e-4)


@pytest.mark.parametrize("head_dim", [4, 8, 64])
def test_matches_complex_multiplication(head_dim):
    """Pair (i, i + d/2) as a complex number, multiplied by exp(i * pos * theta_i)."""
    seq_len = 12
    x = torch.randn(3, seq_len, head_dim, dtype=torch.float64)
    half = head_dim // 2
    z = torch.complex(x[..., :half], x[..., half:])
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), rope_inv_freq(head_dim).double())
    rotated = z * torch.polar(torch.ones_like(angles), angles)
    expected = torch.cat((rotated.real, rotated.imag), dim=-1)
    torch.testing.assert_close(_rotate(x, seq_len), expected, atol=1e-6, rtol=1e-6)


def test_larger_base_means_longer_wavelengths():
    slow, fast = rope_inv_freq(16, base=500000.0), rope_inv_freq(16, base=10000.0)
    assert slow[0] == fast[0] == 1.0
    assert (slow[1:] < fast[1:]).all()


def test_odd_head_dim_is_rejected():
    with pytest.raises(ValueError, match="even head_dim"):
        rope_inv_freq(7)


def test_low_precision_input_keeps_its_dtype():
    x = torch.randn(2, 8, 16, dtype=torch.bfloat16)
    out = _rotate(x, 8)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _rotate(x.float(), 8), atol=2e-2, rtol=1.6e-2)


def test_module_rejects_sequences_longer_than_its_cache():
    rope = RotaryEmbedding(head_dim=8, max_seq_len=4)
    with pytest.raises(ValueError, match="exceeds the RoPE cache"):
        rope(torch.randn(1, 5, 8))


def test_module_cache_is_not_saved_in_state_dict():
    assert RotaryEmbedding(head_dim=8, max_seq_len=4).state_dict() == {}


def test_half_turn_at_pi():
    """A pair with angle pi is negated: a closed-form check of the sign convention."""
    cos, sin = torch.tensor([[math.cos(math.pi)]]), torch.tensor([[math.sin(math.pi)]])
    x = torch.tensor([[0.6, -0.8]])
    torch.testing.assert_close(apply_rope(x, cos, sin), -x, atol=1e-6, rtol=0)
