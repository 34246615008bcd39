"""Multi-head causal self-attention with an optional top-k sparse mode.

In top-k mode each query keeps only its k highest-scoring causal keys; every
other score is set to -inf before the softmax. k is configured per layer, so
early layers can attend locally and sharply while later ones stay broad, and
it is clamped to the sequence length so a large k degrades to dense attention
exactly rather than failing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tinyllm.config import ModelConfig
from tinyllm.model.rope import RotaryEmbedding


def causal_mask(seq_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean [T, T] mask, True where query i may attend to key j (j <= i)."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask selecting exactly ``min(k, T)`` keys per query row.

    ``scores`` must already carry -inf on disallowed positions, so rows with
    fewer than k causal keys keep all of them (the extra picks are -inf).
    """
    k = min(k, scores.shape[-1])
    index = scores.topk(k, dim=-1).indices
    # Tensor src (not a scalar): the scatter variant with a deterministic CUDA kernel.
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, index, torch.ones_like(index, dtype=torch.bool))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.topk = cfg.topk[layer_idx] if cfg.attention == "topk" else None
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rope = RotaryEmbedding(self.head_dim, cfg.max_seq_len, cfg.rope_base)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        q, k, v = (t.view(batch, seq_len, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = self.rope(q), self.rope(k)

        scores = (q @ k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(~causal_mask(seq_len, x.device), float("-inf"))
        if self.topk is not None:
            scores = scores.masked_fill(~topk_mask(scores, self.topk), float("-inf"))
        # Softmax in fp32: bf16 exponentials of large logits lose the tail.
        probs = F.softmax(scores.float(), dim=-1).to(v.dtype)
        out = self.attn_dropout(probs) @ v
        out = out.transpose(1, 2).reshape(batch, seq_len, d_model)
        return self.resid_dropout(self.proj(out))
