import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tinyllm.config import ModelConfig, load_config
from tinyllm.data.packing import IGNORE_INDEX
from tinyllm.model.norms import LayerNorm, RMSNorm
from tinyllm.model.transformer import build_model

pytestmark = pytest.mark.correctness

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
BUNDLED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def model_cfg(name: str) -> ModelConfig:
    return load_config(CONFIG_DIR / f"{name}.yaml").model


def expected_parameter_count(cfg: ModelConfig) -> int:
    d, v, h, n = cfg.d_model, cfg.vocab_size, cfg.hidden_dim, cfg.n_layers
    norm = d if cfg.norm == "rmsnorm" else 2 * d
    attention = 4 * d * d  # fused qkv (3 d^2) + output projection (d^2)
    ffn = 3 * d * h
    ffn_total = ffn if cfg.shared_ffn else n * ffn
    head = 0 if cfg.tie_embeddings else v * d
    return v * d + n * (attention + 2 * norm) + ffn_total + norm + head


@pytest.mark.parametrize("name", BUNDLED)
def test_forward_shape_and_dtype(name, device):
    cfg = model_cfg(name)
    model = build_model(cfg).to(device)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len), device=device)
    logits = model(idx)
    assert logits.shape == (2, cfg.max_seq_len, cfg.vocab_size)
    assert logits.dtype == torch.float32


@pytest.mark.parametrize("name", BUNDLED)
def test_parameter_count_matches_formula(name):
    cfg = model_cfg(name)
    assert build_model(cfg).num_parameters() == expected_parameter_count(cfg)


def test_tiny_parameter_count_is_pinned():
    assert build_model(model_cfg("tiny")).num_parameters() == 37_024


@pytest.mark.parametrize("kind,cls", [("rmsnorm", RMSNorm), ("layernorm", LayerNorm)])
def test_configured_norm_is_used_everywhere(kind, cls):
    model = build_model(ModelConfig(norm=kind))
    norms = [m for m in model.modules() if isinstance(m, (RMSNorm, LayerNorm))]
    assert len(norms) == 2 * model.cfg.n_layers + 1
    assert all(isinstance(m, cls) for m in norms)


def test_configured_norm_eps_reaches_every_norm():
    model = build_model(model_cfg("layernorm"))
    assert {m.eps for m in model.modules() if isinstance(m, LayerNorm)} == {1e-5}


def test_tied_embeddings_share_storage():
    model = build_model(model_cfg("shared_ffn"))
    assert model.lm_head.weight is model.tok_emb.weight


def test_initialisation_is_reproducible_with_a_seed():
    a = build_model(model_cfg("tiny"), seed=3).state_dict()
    b = build_model(model_cfg("tiny"), seed=3).state_dict()
    c = build_model(model_cfg("tiny"), seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tok_emb.weight"], c["tok_emb.weight"])


def test_residual_output_projections_use_scaled_init():
    cfg = ModelConfig(d_model=64, n_layers=8, init_std=0.02)
    model = build_model(cfg, seed=0)
    proj_std = torch.cat([b.attn.proj.weight.flatten() for b in model.blocks]).std().item()
    qkv_std = torch.cat([b.attn.qkv.weight.flatten() for b in model.blocks]).std().item()
    assert proj_std == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert qkv_std == pytest.approx(0.02, rel=0.05)


def test_initial_loss_is_close_to_uniform():
    cfg = model_cfg("tiny")
    model = build_model(cfg)
    idx = torch.randint(0, cfg.vocab_size, (4, 32))
    _, loss = model(idx, idx)
    assert loss.item() == pytest.approx(math.log(cfg.vocab_size), abs=0.05)


def test_loss_matches_reference_and_skips_ignored_targets():
    cfg = model_cfg("tiny")
    model = build_model(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    targets = torch.randint(0, cfg.vocab_size, (2, 16))
    targets[1, 8:] = IGNORE_INDEX
    logits, loss = model(idx, targets)
    expected = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.flatten(), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_sequence_longer_than_max_seq_len_is_rejected():
    cfg = model_cfg("tiny")
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        build_model(cfg)(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


def test_dropout_only_acts_in_training_mode():
    model = build_model(ModelConfig(dropout=0.2))
    idx = torch.randint(0, 160, (2, 16))
    model.eval()
    assert torch.equal(model(idx), model(idx))
    model.train()
    assert not torch.equal(model(idx), model(idx))


def test_sparse_model_with_large_k_equals_dense_model():
    dense_cfg = model_cfg("tiny")
    sparse_cfg = ModelConfig(**{**vars(dense_cfg), "attention": "topk", "topk": [32, 64]})
    dense = build_model(dense_cfg, seed=0)
    sparse = build_model(sparse_cfg, seed=0)
    idx = torch.randint(0, dense_cfg.vocab_size, (2, 32))
    assert torch.equal(dense(idx), sparse(idx))
