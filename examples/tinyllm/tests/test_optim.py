import math

import pytest
import torch

from tinyllm.config import TrainConfig
from tinyllm.model.transformer import build_model
from tinyllm.train.optim import build_optimizer, clip_gradients, lr_at, param_groups

pytestmark = pytest.mark.correctness


@pytest.fixture
def model(tiny_config):
    return build_model(tiny_config.model)


def test_param_groups_split_matrices_from_vectors(model):
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.ndim >= 2 for p in decay["params"])
    assert all(p.ndim == 1 for p in no_decay["params"])
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)


def test_param_groups_cover_every_parameter_once(model):
    groups = param_groups(model, 0.1)
    grouped = [id(p) for g in groups for p in g["params"]]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == {id(p) for p in model.parameters()}


def test_norm_gains_and_biases_are_not_decayed(tiny_config):
    tiny_config.model.norm = "layernorm"
    model = build_model(tiny_config.model)
    _, no_decay = param_groups(model, 0.1)
    norm_params = {id(p) for name, p in model.named_parameters() if "norm" in name}
    assert norm_params == {id(p) for p in no_decay["params"]}


def test_tied_weight_is_grouped_once(tiny_config):
    tiny_config.model.tie_embeddings = True
    model = build_model(tiny_config.model)
    decay, _ = param_groups(model, 0.1)
    assert sum(p is model.tok_emb.weight for p in decay["params"]) == 1


def test_frozen_parameters_are_left_out(model):
    model.tok_emb.weight.requires_grad_(False)
    decay, _ = param_groups(model, 0.1)
    assert all(p is not model.tok_emb.weight for p in decay["params"])


def test_optimizer_takes_hyperparameters_from_config(model, tiny_config):
    opt = build_optimizer(model, tiny_config.train)
    assert isinstance(opt, torch.optim.AdamW)
    for group in opt.param_groups:
        assert group["lr"] == tiny_config.train.lr
        assert group["betas"] == (tiny_config.train.beta1, tiny_config.train.beta2)


def test_decay_shrinks_matrices_but_not_norms(model, tiny_config):
    """With zero gradients AdamW's update is pure decoupled decay: w <- w * (1 - lr * wd)."""
    opt = build_optimizer(model, tiny_config.train)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    factor = 1 - tiny_config.train.lr * tiny_config.train.weight_decay
    for name, p in model.named_parameters():
        expected = before[name] * factor if p.ndim >= 2 else before[name]
        torch.testing.assert_close(p.detach(), expected, atol=1e-8, rtol=1e-6, msg=name)


SCHEDULE = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=4, steps=14)


@pytest.mark.parametrize(
    "step,expected",
    [
        (0, 2.5e-4),  # first warmup step: lr / warmup_steps
        (3, 1e-3),  # warmup ends at the peak
        (4, 1e-3),  # cosine starts at the peak
        (9, 5.5e-4),  # half way: (lr + min_lr) / 2
        (14, 1e-4),  # end of schedule
        (50, 1e-4),  # past the end: held at min_lr
    ],
)
def test_lr_schedule_values(step, expected):
    assert lr_at(step, SCHEDULE) == pytest.approx(expected)


def test_lr_decays_monotonically_after_warmup():
    lrs = [lr_at(s, SCHEDULE) for s in range(SCHEDULE.warmup_steps, SCHEDULE.steps + 1)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_lr_without_warmup_starts_at_peak():
    cfg = TrainConfig(lr=1e-3, min_lr=0.0, warmup_steps=0, steps=10)
    assert lr_at(0, cfg) == pytest.approx(1e-3)


def _params_with_grads(*grads):
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    return params


@pytest.mark.parametrize("max_norm", [0.1, 1.0, 2.5])
def test_clipping_caps_the_global_norm(max_norm):
    params = _params_with_grads(torch.full((3,), 4.0), torch.full((2, 2), -3.0))
    total = clip_gradients(params, max_norm)
    assert total == pytest.approx(math.sqrt(3 * 16 + 4 * 9))
    clipped = torch.cat([p.grad.flatten() for p in params]).norm()
    assert clipped.item() == pytest.approx(max_norm, rel=1e-5)


def test_clipping_preserves_gradient_direction():
    params = _params_with_grads(torch.tensor([3.0, 4.0]))
    clip_gradients(params, 1.0)
    torch.testing.assert_close(params[0].grad, torch.tensor([0.6, 0.8]))


def test_small_gradients_are_left_alone():
    params = _params_with_grads(torch.tensor([0.3, 0.4]))
    assert clip_gradients(params, 1.0) == pytest.approx(0.5)
    torch.testing.assert_close(params[0].grad, torch.tensor([0.3, 0.4]))
