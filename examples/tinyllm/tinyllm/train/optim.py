"""Optimizer construction, learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from tinyllm.config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split parameters into decayed (matrices, embeddings) and non-decayed (norms, biases).

    Decaying a norm gain pulls it towards zero, i.e. towards switching the
    layer off, which is never what regularisation is meant to do.
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
        foreach=False,
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``steps``.

    ``step`` counts from 0; the first update uses ``lr / warmup_steps``.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= cfg.steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_gradients(parameters: Iterable[torch.Tensor], max_norm: float) -> float:
    """Scale gradients so their global L2 norm is at most ``max_norm``; return the norm before clipping."""
    total = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, foreach=False)
    return float(total)
