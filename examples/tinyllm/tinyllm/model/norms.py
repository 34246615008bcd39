"""Normalisation layers.

Both norms compute their statistics in at least fp32: under bf16 autocast the
mean of squares loses too many bits otherwise. The output is cast back to the
input dtype so the layer is dtype-transparent.
"""

from __future__ import annotations

import torch
from torch import nn

# Default epsilon for every norm; ModelConfig.norm_eps overrides it per model.
EPS = 1e-6


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or in its own dtype if that is wider (fp64 stays fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight  (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _upcast(x)
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance."""

    def __init__(self, dim: int, eps: float = EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _upcast(x)
        centered = xf - xf.mean(dim=-1, keepdim=True)
        var = centered.pow(2).mean(dim=-1, keepdim=True)
        normed = centered * torch.rsqrt(var + self.eps)
        return (normed * self.weight + self.bias).to(x.dtype)


NORMS = {"rmsnorm": RMSNorm, "layernorm": LayerNorm}


def build_norm(kind: str, dim: int, eps: float | None = None) -> nn.Module:
    """Instantiate the norm named by ``kind``; ``eps=None`` means the module default EPS."""
    try:
        cls = NORMS[kind]
    except KeyError:
        raise ValueError(f"unknown norm {kind!r}; expected one of {sorted(NORMS)}") from None
    return cls(dim, EPS if eps is None else eps)
