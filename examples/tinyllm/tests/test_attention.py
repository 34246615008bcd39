import pytest
import torch

from tinyllm.config import ModelConfig
from tinyllm.model.attention import CausalSelfAttention, causal_mask, topk_mask
from tinyllm.model.transformer import build_model

pytestmark = pytest.mark.correctness

SEQ = 16


def make_cfg(**overrides) -> ModelConfig:
    values = dict(vocab_size=32, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
    values.update(overrides)
    cfg = ModelConfig(**values)
    cfg.validate()
    return cfg


def sparse_and_dense(topk, layer_idx=0):
    """A top-k attention layer and a dense one with identical weights."""
    sparse = CausalSelfAttention(make_cfg(attention="topk", topk=topk), layer_idx)
    dense = CausalSelfAttention(make_cfg(), layer_idx)
    dense.load_state_dict(sparse.state_dict())
    return sparse, dense


def causal_scores(batch=2, heads=4, seq=SEQ):
    scores = torch.randn(batch, heads, seq, seq)
    return scores.masked_fill(~causal_mask(seq), float("-inf"))


@pytest.mark.parametrize("seq_len", [1, 7, 32])
def test_output_shape(seq_len, device):
    attn = CausalSelfAttention(make_cfg(), 0).to(device)
    assert attn(torch.randn(3, seq_len, 32, device=device)).shape == (3, seq_len, 32)


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8])
def test_head_counts_partition_the_model_dim(n_heads):
    attn = CausalSelfAttention(make_cfg(n_heads=n_heads), 0)
    assert attn.head_dim * attn.n_heads == 32
    assert attn(torch.randn(1, 5, 32)).shape == (1, 5, 32)


def test_causal_mask_is_lower_triangular():
    mask = causal_mask(4)
    assert mask.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]


@pytest.mark.parametrize("attention,topk", [("dense", None), ("topk", [3, 3])])
def test_future_tokens_do_not_change_past_outputs(attention, topk):
    attn = CausalSelfAttention(make_cfg(attention=attention, topk=topk), 0)
    x = torch.randn(2, SEQ, 32)
    perturbed = x.clone()
    perturbed[:, 10:] += torch.randn(2, SEQ - 10, 32)
    torch.testing.assert_close(attn(x)[:, :10], attn(perturbed)[:, :10], atol=0, rtol=0)


def test_gradient_reaches_only_past_positions():
    attn = CausalSelfAttention(make_cfg(), 0)
    x = torch.randn(1, SEQ, 32, requires_grad=True)
    attn(x)[0, 5].sum().backward()
    assert x.grad[0, 6:].abs().max() == 0
    assert x.grad[0, :6].abs().sum(-1).min() > 0


@pytest.mark.parametrize("k", [1, 3, 8])
def test_topk_mask_keeps_exactly_k_keys_per_row(k):
    scores = causal_scores()
    mask = topk_mask(scores, k)
    assert (mask.sum(-1) == k).all()
    kept_finite = (mask & scores.isfinite()).sum(-1)
    expected = torch.clamp(torch.arange(1, SEQ + 1), max=k).expand_as(kept_finite)
    assert torch.equal(kept_finite, expected)


def test_topk_mask_keeps_the_largest_scores():
    scores = causal_scores()
    mask = topk_mask(scores, 4)
    kept_min = scores.masked_fill(~mask, float("inf")).amin(-1)
    dropped_max = scores.masked_fill(mask, float("-inf")).amax(-1)
    rows = torch.arange(SEQ) >= 4  # rows with more than k causal keys
    assert (kept_min[..., rows] > dropped_max[..., rows]).all()


@pytest.mark.parametrize("k", [SEQ, SEQ + 1, 100])
def test_topk_k_is_clamped_to_the_sequence_length(k):
    mask = topk_mask(causal_scores(), k)
    assert mask.all()


@pytest.mark.parametrize("topk", [[SEQ, SEQ], [SEQ + 5, 1000]])
def test_sparse_attention_with_large_k_equals_dense_exactly(topk):
    sparse, dense = sparse_and_dense(topk)
    x = torch.randn(2, SEQ, 32)
    assert torch.equal(sparse(x), dense(x))


def test_small_k_changes_the_output():
    sparse, dense = sparse_and_dense([2, 2])
    x = torch.randn(2, SEQ, 32)
    out_sparse, out_dense = sparse(x), dense(x)
    # Positions 0 and 1 have at most two causal keys: nothing is dropped there.
    torch.testing.assert_close(out_sparse[:, :2], out_dense[:, :2], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(out_sparse[:, 2:], out_dense[:, 2:])


def test_k_is_taken_per_layer_from_the_config():
    model = build_model(make_cfg(attention="topk", topk=[2, 5]))
    assert [block.attn.topk for block in model.blocks] == [2, 5]
    assert all(block.attn.topk is None for block in build_model(make_cfg()).blocks)
