import pytest
import torch
from torch import nn

from tinyllm.config import TrainConfig
from tinyllm.model.transformer import build_model
from tinyllm.train.precision import PrecisionPolicy, apply_precision_policy

pytestmark = pytest.mark.correctness

BF16 = PrecisionPolicy(torch.bfloat16)


def output_dtypes(model, idx):
    """Forward once and return {module name: output dtype} for embeddings, linears and norms."""
    seen, hooks = {}, []

    def record(name):
        def hook(module, inputs, output):
            seen[name] = output.dtype

        return hook

    for name, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.Linear)) or name.endswith("norm"):
            hooks.append(module.register_forward_hook(record(name)))
    model(idx)
    for h in hooks:
        h.remove()
    return seen


@pytest.fixture
def model(tiny_config, device):
    return build_model(tiny_config.model).to(device)


@pytest.fixture
def idx(device):
    return torch.randint(0, 160, (2, 16), device=device)


def test_embeddings_head_and_final_norm_stay_fp32(model, idx):
    apply_precision_policy(model, BF16)
    dtypes = output_dtypes(model, idx)
    assert dtypes["tok_emb"] == torch.float32
    assert dtypes["norm"] == torch.float32
    assert dtypes["lm_head"] == torch.float32
    assert model(idx).dtype == torch.float32


def test_block_matmuls_run_in_bf16(model, idx):
    apply_precision_policy(model, BF16)
    dtypes = output_dtypes(model, idx)
    block_linears = [n for n in dtypes if n.startswith("blocks.") and not n.endswith("norm")]
    assert len(block_linears) == 2 * 5
    assert {dtypes[n] for n in block_linears} == {torch.bfloat16}


@pytest.mark.parametrize("pinned", [0, 1])
def test_pinned_layers_stay_fp32(model, idx, pinned):
    apply_precision_policy(model, PrecisionPolicy(torch.bfloat16, frozenset({pinned})))
    dtypes = output_dtypes(model, idx)
    for layer in (0, 1):
        expected = torch.float32 if layer == pinned else torch.bfloat16
        assert dtypes[f"blocks.{layer}.attn.qkv"] == expected
        assert dtypes[f"blocks.{layer}.ffn.w_down"] == expected


def test_parameters_stay_fp32_master_weights(model, idx):
    apply_precision_policy(model, BF16)
    model(idx).sum().backward()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}


def test_fp32_policy_is_bit_identical_to_no_policy(model, idx):
    expected = model(idx)
    apply_precision_policy(model, PrecisionPolicy())
    assert torch.equal(model(idx), expected)


def test_bf16_logits_track_fp32_logits(model, idx):
    expected = model(idx)
    apply_precision_policy(model, BF16)
    torch.testing.assert_close(model(idx), expected, atol=5e-3, rtol=5e-2)


@pytest.mark.parametrize(
    "precision,dtype,enabled",
    [("fp32", torch.float32, False), ("bf16", torch.bfloat16, True), ("fp16", torch.float16, True)],
)
def test_policy_from_config(precision, dtype, enabled):
    policy = PrecisionPolicy.from_config(TrainConfig(precision=precision, fp32_layers=[1]))
    assert policy.compute_dtype == dtype
    assert policy.enabled is enabled
    assert policy.layer_dtype(0) == dtype
    assert policy.layer_dtype(1) == torch.float32


def test_unknown_precision_is_rejected():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        PrecisionPolicy.from_config(TrainConfig(precision="fp8"))


def test_out_of_range_pinned_layer_is_rejected(model):
    with pytest.raises(ValueError, match=r"fp32_layers \[5\] outside \[0, 2\)"):
        apply_precision_policy(model, PrecisionPolicy(torch.bfloat16, frozenset({5})))
