"""Rotary position embeddings (RoPE).

Feature pairs (i, i + head_dim/2) are rotated by the angle ``pos * theta_i``
with ``theta_i = base ** (-2i / head_dim)``. Because a rotation by ``a``
followed by the inverse of a rotation by ``b`` is a rotation by ``a - b``,
the dot product of a rotated query and key depends only on their relative
position, which is what lets attention generalise across offsets.
"""

from __future__ import annotations

import torch
from torch import nn


def rope_inv_freq(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The per-pair angular frequencies theta_i, shape [head_dim // 2]."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / base**exponents).float()


def rope_cache(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``pos * theta_i`` for pos < seq_len, each [seq_len, head_dim // 2]."""
    positions = torch.arange(seq_len, dtype=torch.float64)
    angles = torch.outer(positions, rope_inv_freq(head_dim, base).double())
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., T, head_dim] by the first T rows of the cache.

    The rotation is computed in (at least) fp32 and cast back, so bf16
    activations are not rotated with bf16-rounded angles.
    """
    seq_len = x.shape[-2]
    cos, sin = cos[:seq_len], sin[:seq_len]
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin cache for ``max_seq_len`` positions."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        self.max_seq_len = max_seq_len
        cos, sin = rope_cache(max_seq_len, head_dim, base)
        # Not persistent: the cache is a pure function of the config.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] > self.max_seq_len:
            raise ValueError(f"sequence length {x.shape[-2]} exceeds the RoPE cache ({self.max_seq_len})")
        return apply_rope(x, self.cos, self.sin)
