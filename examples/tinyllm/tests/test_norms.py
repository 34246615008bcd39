import pytest
import torch
import torch.nn.functional as F

from tinyllm.model.norms import EPS, LayerNorm, RMSNorm, build_norm

pytestmark = pytest.mark.correctness

# (atol, rtol) against a float64 evaluation of the formula.
TOLERANCES = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-6, 1e-5),
    torch.bfloat16: (2e-2, 1.6e-2),
}
SHAPES = [(4, 8), (2, 3, 16), (1, 1, 64)]


def rms_formula(x, weight, eps):
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def layernorm_formula(x, weight, bias, eps):
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight.double() + bias.double()


def _randomise(norm):
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))
    return norm


@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rmsnorm_matches_formula(dtype, shape, device):
    norm = _randomise(RMSNorm(shape[-1])).to(device)
    x = torch.randn(shape, device=device).to(dtype)
    out = norm(x)
    assert out.dtype == dtype
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), rms_formula(x, norm.weight, EPS), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layernorm_matches_formula(dtype, shape, device):
    norm = _randomise(LayerNorm(shape[-1])).to(device)
    x = (3 * torch.randn(shape, device=device) + 1).to(dtype)
    atol, rtol = TOLERANCES[dtype]
    expected = layernorm_formula(x, norm.weight, norm.bias, EPS)
    torch.testing.assert_close(norm(x).double(), expected, atol=atol, rtol=rtol)


def test_layernorm_matches_torch_functional(device):
    norm = _randomise(LayerNorm(16, eps=1e-5)).to(device)
    x = torch.randn(5, 16, device=device)
    expected = F.layer_norm(x, (16,), norm.weight, norm.bias, eps=1e-5)
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-5)


def test_eps_dominates_for_tiny_inputs():
    """For inputs far below sqrt(eps) the output is ~ x / sqrt(eps)."""
    x = torch.full((1, 8), 1e-5, dtype=torch.float64)
    out = RMSNorm(8).double()(x)
    torch.testing.assert_close(out, x / torch.sqrt(torch.tensor(1e-10 + EPS, dtype=torch.float64)))


def test_rmsnorm_is_scale_invariant():
    norm = RMSNorm(32)
    x = torch.randn(4, 32)
    torch.testing.assert_close(norm(1000 * x), norm(x), atol=1e-5, rtol=1e-5)


def test_layernorm_is_shift_invariant():
    norm = LayerNorm(32)
    x = torch.randn(4, 32)
    torch.testing.assert_close(norm(x + 5.0), norm(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind,cls", [("rmsnorm", RMSNorm), ("layernorm", LayerNorm)])
def test_build_norm_defaults_to_module_eps(kind, cls):
    norm = build_norm(kind, 8)
    assert isinstance(norm, cls)
    assert norm.eps == EPS
    assert build_norm(kind, 8, eps=1e-3).eps == 1e-3


def test_unknown_norm_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        build_norm("batchnorm", 8)
