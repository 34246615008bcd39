"""Per-layer mixed-precision policy.

Parameters always stay fp32 (the optimizer updates fp32 master weights); the
policy only decides, block by block, whether the block's matmuls run under
autocast in a reduced dtype. The token embedding, the final norm and the LM
head never run under autocast: the embedding lookup gains nothing from bf16
and the logits feed a softmax over the whole vocabulary, where bf16 rounding
is visible in the loss. Individual blocks can be pinned to fp32 (e.g. the
first layer, which is often the most sensitive).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from tinyllm.config import TrainConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PrecisionPolicy:
    compute_dtype: torch.dtype = torch.float32
    fp32_layers: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> PrecisionPolicy:
        try:
            dtype = DTYPES[cfg.precision]
        except KeyError:
            raise ValueError(f"unknown precision {cfg.precision!r}; expected one of {sorted(DTYPES)}") from None
        return cls(dtype, frozenset(cfg.fp32_layers))

    @property
    def enabled(self) -> bool:
        return self.compute_dtype != torch.float32

    def layer_dtype(self, layer_idx: int) -> torch.dtype:
        """The dtype block ``layer_idx`` computes its matmuls in."""
        return torch.float32 if layer_idx in self.fp32_layers else self.compute_dtype

    def block_autocast(self, layer_idx: int, device_type: str) -> torch.autocast:
        dtype = self.layer_dtype(layer_idx)
        return torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32)


def apply_precision_policy(model: nn.Module, policy: PrecisionPolicy) -> None:
    """Attach ``policy`` to ``model`` after checking its layer indices."""
    _check_layers(policy.fp32_layers, len(model.blocks), "fp32_layers")
    model.precision = policy


def _check_layers(layers: Iterable[int], n_layers: int, what: str) -> None:
    bad = sorted(i for i in layers if not 0 <= i < n_layers)
    if bad:
        raise ValueError(f"{what} {bad} outside [0, {n_layers})")
