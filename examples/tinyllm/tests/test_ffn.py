import pytest
import torch
import torch.nn.functional as F

from tinyllm.config import ModelConfig
from tinyllm.model.ffn import SwiGLU, build_ffns
from tinyllm.model.transformer import build_model

pytestmark = pytest.mark.correctness


def make_cfg(**overrides) -> ModelConfig:
    values = dict(vocab_size=32, d_model=32, n_layers=3, n_heads=4, max_seq_len=16)
    values.update(overrides)
    return ModelConfig(**values)


@pytest.mark.parametrize("shape", [(2, 5, 32), (1, 1, 32), (7, 32)], ids=str)
def test_swiglu_preserves_shape(shape, device):
    ffn = SwiGLU(32, 96).to(device)
    assert ffn(torch.randn(shape, device=device)).shape == shape


def test_swiglu_matches_formula():
    ffn = SwiGLU(8, 24)
    x = torch.randn(4, 8)
    gate = x @ ffn.w_gate.weight.T
    up = x @ ffn.w_up.weight.T
    expected = (gate * torch.sigmoid(gate) * up) @ ffn.w_down.weight.T
    torch.testing.assert_close(ffn(x), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(F.silu(gate), gate * torch.sigmoid(gate))


def test_hidden_width_comes_from_config():
    (ffn, *_) = build_ffns(make_cfg())
    assert ffn.w_gate.out_features == make_cfg().hidden_dim == 96


def test_shared_mode_uses_one_module_for_every_layer():
    ffns = build_ffns(make_cfg(shared_ffn=True))
    assert len(ffns) == 3
    assert all(f is ffns[0] for f in ffns)


def test_unshared_mode_builds_independent_modules():
    ffns = build_ffns(make_cfg())
    assert len({id(f) for f in ffns}) == 3
    assert ffns[0].w_up.weight.data_ptr() != ffns[1].w_up.weight.data_ptr()


def test_shared_weights_are_identical_across_layers_after_an_update():
    model = build_model(make_cfg(shared_ffn=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 32, (2, 8))
    model(idx, idx)[1].backward()
    opt.step()
    weights = [block.ffn.w_down.weight for block in model.blocks]
    assert all(w is weights[0] for w in weights)


def _shared_and_unshared():
    shared = build_model(make_cfg(shared_ffn=True), seed=0)
    unshared = build_model(make_cfg(), seed=0)
    unshared.load_state_dict(shared.state_dict())
    return shared, unshared


def test_shared_and_unshared_agree_when_weights_are_equal():
    shared, unshared = _shared_and_unshared()
    idx = torch.randint(0, 32, (2, 12))
    assert torch.equal(shared(idx), unshared(idx))


def test_shared_gradient_is_the_sum_of_per_layer_gradients():
    shared, unshared = _shared_and_unshared()
    idx = torch.randint(0, 32, (2, 12))
    shared(idx, idx)[1].backward()
    unshared(idx, idx)[1].backward()
    for name in ("w_gate", "w_up", "w_down"):
        per_layer = sum(getattr(block.ffn, name).weight.grad for block in unshared.blocks)
        torch.testing.assert_close(getattr(shared.blocks[0].ffn, name).weight.grad, per_layer, atol=1e-7, rtol=1e-5)
