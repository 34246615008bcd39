"""Trainer behaviour and the training regressions.

Golden losses were produced on CPU by scripts/update_golden.py and reproduce
bit for bit there; the stored tolerance per device (tests/golden/*.json)
allows for other CPUs' vector widths (atol 1e-4) and, on CUDA, for cuBLAS
and compiled-Triton numerics (atol 5e-2).
"""

import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tinyllm.config import load_config
from tinyllm.data.pipeline import build_dataset
from tinyllm.kernels.cross_entropy import cross_entropy
from tinyllm.model.transformer import build_model
from tinyllm.train.optim import lr_at
from tinyllm.train.trainer import Trainer, seed_everything

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GOLDEN_CONFIGS = ["tiny", "sparse", "shared_ffn", "layernorm"]
perf_log = logging.getLogger("tinyllm.perf")


def make_trainer(cfg, device, tokenizer):
    return Trainer(cfg, device=device, tokenizer=tokenizer, dataset=build_dataset(cfg.data, tokenizer))


def _synchronize(device):
    """Wait for queued CUDA work so wall-clock timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- correctness


@pytest.mark.correctness
def test_seed_everything_reproduces_every_stream():
    def draw():
        return random.random(), float(np.random.rand()), torch.rand(2).tolist()

    seed_everything(42)
    first = draw()
    seed_everything(42)
    assert draw() == first


@pytest.mark.correctness
def test_model_vocab_smaller_than_tokenizer_is_rejected(tiny_config, tokenizer, device):
    tiny_config.model.vocab_size = 100
    with pytest.raises(ValueError, match="tokenizer has 160 tokens but the model only 100"):
        Trainer(tiny_config, device=device, tokenizer=tokenizer)


@pytest.mark.correctness
def test_same_seed_gives_same_weights_and_batches(tiny_config, tokenizer, tiny_dataset, device):
    a = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    b = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    assert torch.equal(a.model.tok_emb.weight, b.model.tok_emb.weight)
    for _ in range(3):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.correctness
def test_batches_are_shifted_windows_of_packed_rows(tiny_config, tokenizer, tiny_dataset, device):
    trainer = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    inputs, targets = trainer.next_batch()
    assert inputs.shape == targets.shape == (tiny_config.train.batch_size, tiny_config.data.seq_len)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


@pytest.mark.correctness
def test_train_step_advances_step_and_applies_schedule(tiny_config, tokenizer, tiny_dataset, device):
    trainer = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    loss = trainer.train_step()
    assert trainer.step == 1
    assert math.isfinite(loss)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(0, tiny_config.train))


@pytest.mark.correctness
def test_first_loss_equals_model_loss_on_first_batch(tiny_config, tokenizer, tiny_dataset, device):
    probe = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    inputs, targets = probe.next_batch()
    expected = cross_entropy(probe.model(inputs), targets).item()
    trainer = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    assert trainer.train_step() == pytest.approx(expected, abs=1e-6)


@pytest.mark.correctness
def test_evaluate_is_deterministic(tiny_config, tokenizer, tiny_dataset, device):
    trainer = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    assert trainer.evaluate() == trainer.evaluate()


@pytest.mark.correctness
def test_precision_and_checkpointing_policies_come_from_config(tokenizer, tiny_dataset, device):
    cfg = load_config(CONFIG_DIR / "bf16_ckpt.yaml")
    trainer = Trainer(cfg, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    assert trainer.model.precision.compute_dtype == torch.bfloat16
    assert trainer.model.precision.fp32_layers == {0}
    assert trainer.model.checkpoint_layers == {1}


# ---------------------------------------------------------------- convergence


@pytest.mark.convergence
@pytest.mark.parametrize("name", GOLDEN_CONFIGS)
def test_losses_match_golden(name, device, tokenizer, load_golden):
    golden = load_golden(name)
    cfg = load_config(CONFIG_DIR / f"{name}.yaml")
    assert cfg.train.steps == golden["steps"]
    trainer = make_trainer(cfg, device, tokenizer)
    losses = trainer.train().losses
    tol = golden["tolerance"][device.type]
    torch.testing.assert_close(
        torch.tensor(losses, dtype=torch.float64),
        torch.tensor(golden["losses"], dtype=torch.float64),
        atol=tol["atol"],
        rtol=tol["rtol"],
    )
    assert trainer.evaluate() == pytest.approx(golden["eval_loss"], abs=tol["atol"], rel=tol["rtol"])


@pytest.mark.convergence
def test_loss_decreases(tiny_config, tokenizer, tiny_dataset, device):
    trainer = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    before = trainer.evaluate()
    losses = trainer.train().losses
    after = trainer.evaluate()
    assert before == pytest.approx(math.log(tiny_config.model.vocab_size), abs=0.1)
    assert after < before - 1.0
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.8


@pytest.mark.convergence
def test_resume_matches_uninterrupted_run(tiny_config, tokenizer, tiny_dataset, device, tmp_path):
    tiny_config.train.steps = 12
    uninterrupted = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    expected = uninterrupted.train().losses

    first_half = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    first_half.train(6)
    first_half.save(tmp_path / "step6.pt")
    # Disturb the global RNG: resume must restore it rather than rely on it.
    torch.rand(100)

    resumed = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    resumed.resume(tmp_path / "step6.pt")
    assert resumed.step == 6
    assert resumed.train().losses == expected[6:]
    for p, q in zip(uninterrupted.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)


@pytest.mark.convergence
def test_resume_with_dropout_matches_uninterrupted_run(tiny_config, tokenizer, tiny_dataset, device, tmp_path):
    """Dropout masks come from the global RNG, so this also checks RNG restoration."""
    tiny_config.model.dropout = 0.1
    tiny_config.train.steps = 8
    expected = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset).train().losses
    first = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    first.train(4)
    first.save(tmp_path / "step4.pt")
    torch.rand(100)
    resumed = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    resumed.resume(tmp_path / "step4.pt")
    assert resumed.train().losses == expected[4:]


@pytest.mark.convergence
def test_sparse_training_with_large_k_matches_dense(tiny_config, tokenizer, tiny_dataset, device):
    tiny_config.train.steps = 8
    dense = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset).train().losses
    tiny_config.model.attention = "topk"
    tiny_config.model.topk = [tiny_config.data.seq_len, 4 * tiny_config.data.seq_len]
    sparse = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset).train().losses
    assert sparse == dense


@pytest.mark.convergence
def test_activation_checkpointing_does_not_change_training(tiny_config, tokenizer, tiny_dataset, device):
    tiny_config.train.steps = 8
    plain = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset).train().losses
    tiny_config.train.checkpoint_layers = [0, 1]
    checkpointed = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset).train().losses
    assert checkpointed == plain


@pytest.mark.convergence
def test_bf16_training_tracks_fp32(tiny_config, tokenizer, tiny_dataset, device):
    """bf16_ckpt.yaml is tiny.yaml plus bf16 autocast and checkpointing: same curve within bf16 noise."""
    tiny_config.train.steps = 15
    bf16_cfg = load_config(CONFIG_DIR / "bf16_ckpt.yaml")
    bf16_cfg.train.steps = 15
    fp32 = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset).train().losses
    bf16 = Trainer(bf16_cfg, device=device, tokenizer=tokenizer, dataset=tiny_dataset).train().losses
    assert bf16 != fp32
    torch.testing.assert_close(torch.tensor(bf16), torch.tensor(fp32), atol=5e-2, rtol=0)


# ---------------------------------------------------------------- perf


@pytest.mark.perf
def test_training_throughput_smoke(tiny_config, tokenizer, tiny_dataset, device, record_property):
    trainer = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    trainer.train(2)  # warm-up: first kernel launches, allocator
    result = trainer.train(8)
    perf_log.info("training throughput: %.0f tokens/s on %s", result.tokens_per_s, device)
    record_property("train_tokens_per_s", result.tokens_per_s)
    assert result.tokens == 8 * tiny_config.train.batch_size * tiny_config.data.seq_len
    assert 0 < result.tokens_per_s < float("inf")


@pytest.mark.perf
@pytest.mark.parametrize("name", ["tiny", "sparse", "layernorm"])
def test_forward_throughput_smoke(name, device, record_property):
    cfg = load_config(CONFIG_DIR / f"{name}.yaml")
    model = build_model(cfg.model).to(device).eval()
    idx = torch.randint(0, cfg.model.vocab_size, (8, cfg.data.seq_len), device=device)
    with torch.no_grad():
        model(idx)
        start = time.perf_counter()
        for _ in range(5):
            model(idx)
        _synchronize(device)
        seconds = time.perf_counter() - start
    tokens_per_s = 5 * idx.numel() / seconds
    perf_log.info("%s forward: %.0f tokens/s on %s", name, tokens_per_s, device)
    record_property("forward_tokens_per_s", tokens_per_s)
    assert tokens_per_s > 0


@pytest.mark.perf
def test_cross_entropy_kernel_throughput_smoke(device, record_property):
    logits = torch.randn(512, 160, device=device, requires_grad=True)
    targets = torch.randint(0, 160, (512,), device=device)
    start = time.perf_counter()
    for _ in range(3):
        cross_entropy(logits, targets).backward()
    _synchronize(device)
    seconds = time.perf_counter() - start
    rows_per_s = 3 * logits.shape[0] / seconds
    perf_log.info("cross-entropy fwd+bwd: %.0f rows/s on %s", rows_per_s, device)
    record_property("ce_rows_per_s", rows_per_s)
    assert logits.grad.isfinite().all()
    assert rows_per_s > 0
