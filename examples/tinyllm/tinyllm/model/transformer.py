"""The decoder-only transformer: embeddings, pre-norm blocks, final norm, LM head."""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tinyllm.config import ModelConfig
from tinyllm.data.packing import IGNORE_INDEX
from tinyllm.kernels.cross_entropy import cross_entropy
from tinyllm.model.attention import CausalSelfAttention
from tinyllm.model.ffn import SwiGLU, build_ffns
from tinyllm.model.norms import build_norm


class Block(nn.Module):
    """x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, ffn: SwiGLU):
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.ffn_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class TinyLM(nn.Module):
    """Decoder-only LM.

    Two hooks are set by the training code rather than the constructor, since
    they are execution policies and not architecture: ``precision`` (an object
    with ``block_autocast(layer_idx, device_type)``, see
    tinyllm.train.precision) and ``checkpoint_layers`` (block indices whose
    activations are recomputed in backward, see tinyllm.train.checkpointing).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.emb_dropout = nn.Dropout(cfg.dropout)
        ffns = build_ffns(cfg)
        self.blocks = nn.ModuleList(Block(cfg, i, ffns[i]) for i in range(cfg.n_layers))
        self.norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.precision = None
        self.checkpoint_layers: frozenset[int] = frozenset()
        self._init_weights()

    def _init_weights(self) -> None:
        # Residual-branch outputs are scaled down by sqrt(2 * n_layers) so the
        # residual stream's variance does not grow with depth (GPT-2 recipe).
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                is_residual_out = name.endswith(("attn.proj", "w_down"))
                nn.init.normal_(module.weight, std=residual_std if is_residual_out else self.cfg.init_std)

    def num_parameters(self) -> int:
        """Unique parameters (shared FFNs and tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())

    def _run_block(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        ctx = nullcontext() if self.precision is None else self.precision.block_autocast(block.layer_idx, x.device.type)
        with ctx:
            if block.layer_idx in self.checkpoint_layers and torch.is_grad_enabled():
                return checkpoint(block, x, use_reentrant=False)
            return block(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Return fp32 logits [B, T, V], or (logits, loss) when ``targets`` is given."""
        seq_len = idx.shape[1]
        if seq_len > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_seq_len {self.cfg.max_seq_len}")
        # Embeddings and the head run outside autocast: they stay fp32.
        x = self.emb_dropout(self.tok_emb(idx))
        for block in self.blocks:
            x = self._run_block(block, x)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return logits, cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)


def build_model(cfg: ModelConfig, seed: int | None = None) -> TinyLM:
    """Validate ``cfg`` and build a model; ``seed`` makes the initialisation reproducible."""
    cfg.validate()
    if seed is not None:
        torch.manual_seed(seed)
    return TinyLM(cfg)
