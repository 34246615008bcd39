"""SwiGLU feed-forward network, optionally shared across layers.

Sharing one FFN between all blocks (ALBERT-style) cuts the parameter count by
(n_layers - 1) FFNs at a modest quality cost; it is a config switch so both
variants train from the same code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tinyllm.config import ModelConfig


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))"""

    def __init__(self, d_model: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)))


def build_ffns(cfg: ModelConfig) -> list[SwiGLU]:
    """One FFN per layer; in shared mode the same module object for every layer."""
    if cfg.shared_ffn:
        shared = SwiGLU(cfg.d_model, cfg.hidden_dim, cfg.dropout)
        return [shared] * cfg.n_layers
    return [SwiGLU(cfg.d_model, cfg.hidden_dim, cfg.dropout) for _ in range(cfg.n_layers)]
