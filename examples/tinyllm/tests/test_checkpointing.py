import random

import numpy as np
import pytest
import torch

from tinyllm.config import load_config
from tinyllm.model.transformer import build_model
from tinyllm.train.checkpointing import (
    apply_activation_checkpointing,
    capture_rng_state,
    export_flat_weights,
    load_checkpoint,
    load_flat_weights,
    restore_rng_state,
    save_checkpoint,
)
from tinyllm.train.optim import build_optimizer
from tinyllm.train.trainer import Trainer

pytestmark = pytest.mark.correctness


def grads_for(model, idx):
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, idx)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture
def idx(device):
    return torch.randint(0, 160, (2, 24), device=device)


@pytest.mark.parametrize("layers", [[], [0], [1], [0, 1]], ids=str)
def test_checkpointed_layers_give_identical_gradients(tiny_config, device, idx, layers):
    model = build_model(tiny_config.model, seed=0).to(device)
    expected = grads_for(model, idx)
    apply_activation_checkpointing(model, layers)
    actual = grads_for(model, idx)
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


@pytest.mark.parametrize("layers", [[], [1], [0, 1]], ids=str)
def test_only_listed_blocks_are_recomputed(tiny_config, idx, layers):
    model = build_model(tiny_config.model).to(idx.device)
    apply_activation_checkpointing(model, layers)
    calls = [0] * len(model.blocks)
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    model(idx, idx)[1].backward()
    assert calls == [2 if i in layers else 1 for i in range(len(model.blocks))]


def test_no_recomputation_without_grad(tiny_config, idx):
    model = build_model(tiny_config.model).to(idx.device)
    apply_activation_checkpointing(model, [0, 1])
    calls = []
    model.blocks[0].register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        model(idx)
    assert calls == [1]


@pytest.mark.parametrize("layers,message", [([2], r"\[2\] outside"), ([-1], r"\[-1\] outside"), ([0, 0], "duplicate")])
def test_invalid_layer_lists_are_rejected(tiny_config, layers, message):
    model = build_model(tiny_config.model)
    with pytest.raises(ValueError, match=message):
        apply_activation_checkpointing(model, layers)


def test_save_and_load_restore_model_optimizer_and_step(tiny_config, tmp_path, idx):
    model = build_model(tiny_config.model).to(idx.device)
    opt = build_optimizer(model, tiny_config.train)
    model(idx, idx)[1].backward()
    opt.step()
    save_checkpoint(tmp_path / "ckpt.pt", model, opt, step=7, sampler_state={"position": 3})

    fresh = build_model(tiny_config.model).to(idx.device)
    fresh_opt = build_optimizer(fresh, tiny_config.train)
    state = load_checkpoint(tmp_path / "ckpt.pt", fresh, fresh_opt)
    assert state["step"] == 7 and state["sampler"] == {"position": 3}
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(opt.state[p]["exp_avg_sq"], fresh_opt.state[q]["exp_avg_sq"])


def _draw():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_state_round_trip():
    state = capture_rng_state()
    expected = _draw()
    _draw()
    restore_rng_state(state)
    assert _draw() == expected


def test_load_restores_rng_streams(tiny_config, tmp_path):
    model = build_model(tiny_config.model)
    opt = build_optimizer(model, tiny_config.train)
    save_checkpoint(tmp_path / "ckpt.pt", model, opt, step=0)
    expected = _draw()
    load_checkpoint(tmp_path / "ckpt.pt", model, opt)
    assert _draw() == expected


def test_unknown_checkpoint_version_is_rejected(tiny_config, tmp_path):
    model = build_model(tiny_config.model)
    torch.save({"version": 0}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="unsupported checkpoint version 0"):
        load_checkpoint(tmp_path / "old.pt", model)


def test_flat_weights_round_trip_and_refuse_another_model(tiny_config, tmp_path, config_dir):
    source = build_model(tiny_config.model, seed=1)
    export_flat_weights(source, tmp_path / "w.f32")
    target = build_model(tiny_config.model, seed=2)
    load_flat_weights(tmp_path / "w.f32", target)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name
    other = build_model(load_config(config_dir / "shared_ffn.yaml").model)
    with pytest.raises(ValueError, match="the model has"):
        load_flat_weights(tmp_path / "w.f32", other)
    (tmp_path / "junk.f32").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="not a tinyllm flat weights file"):
        load_flat_weights(tmp_path / "junk.f32", target)


def test_checked_in_weights_reproduce_the_golden_eval_loss(tiny_config, tokenizer, tiny_dataset, golden_dir,
                                                          load_golden, device):
    """tests/golden/tiny_weights.f32 is the tiny run's model after its 40 golden steps."""
    golden = load_golden("tiny")
    trainer = Trainer(tiny_config, device=device, tokenizer=tokenizer, dataset=tiny_dataset)
    before = trainer.evaluate()
    load_flat_weights(golden_dir / "tiny_weights.f32", trainer.model)
    tol = golden["tolerance"][device.type]
    assert trainer.evaluate() == pytest.approx(golden["eval_loss"], abs=tol["atol"], rel=tol["rtol"])
    assert trainer.evaluate() < before - 1.0
