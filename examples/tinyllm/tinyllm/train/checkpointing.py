"""Selective activation checkpointing and training-state checkpoints.

Activation checkpointing is selective: only the blocks listed in
``TrainConfig.checkpoint_layers`` drop their activations after forward and
recompute them in backward, trading compute for memory where it pays most.

A training checkpoint holds everything needed for a bit-identical resume:
model and optimizer state, the step, every RNG stream (python, numpy, torch
CPU and CUDA) and the data sampler's position.

Exported weights are one flat little-endian float32 file, the layout C
inference code reads: a four-word header (magic, format version, tensor count,
value count) then every tensor of ``state_dict()`` in order. Loading maps the
file with ``torch.from_file``, in torch's C++ code: no Python file object.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

CHECKPOINT_VERSION = 1
FLAT_MAGIC = 0x6D6C6C74  # b"tllm", little-endian
FLAT_VERSION = 1
FLAT_HEADER = 4  # int32 words: magic, version, tensors, values


def apply_activation_checkpointing(model: nn.Module, layers: Iterable[int]) -> None:
    """Recompute activations of the listed blocks in backward."""
    layers = list(layers)
    n_layers = len(model.blocks)
    bad = sorted(i for i in layers if not 0 <= i < n_layers)
    if bad:
        raise ValueError(f"checkpoint layers {bad} outside [0, {n_layers})")
    if len(set(layers)) != len(layers):
        raise ValueError(f"duplicate checkpoint layers: {layers}")
    model.checkpoint_layers = frozenset(layers)


def capture_rng_state() -> dict[str, Any]:
    """Snapshot every RNG stream in a form torch.load(weights_only=True) accepts."""
    version, mt_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(mt_state), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    sampler_state: dict | None = None,
) -> None:
    torch.save(
        {
            "version": CHECKPOINT_VERSION,
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": capture_rng_state(),
            "sampler": sampler_state,
        },
        path,
    )


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load states into ``model`` (and ``optimizer``); return the checkpoint dict for step/sampler."""
    device = next(model.parameters()).device
    state = torch.load(path, map_location=device, weights_only=True)
    if state.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path}: unsupported checkpoint version {state.get('version')!r}")
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if restore_rng:
        rng = state["rng"]
        rng["torch"] = rng["torch"].cpu()
        if "cuda" in rng:
            rng["cuda"] = [s.cpu() for s in rng["cuda"]]
        restore_rng_state(rng)
    return state


def export_flat_weights(model: nn.Module, path: str | Path) -> None:
    """Write the model's weights as one flat float32 file (see the module docstring)."""
    tensors = [t.detach().to("cpu", torch.float32).flatten() for t in model.state_dict().values()]
    values = sum(t.numel() for t in tensors)
    header = torch.tensor([FLAT_MAGIC, FLAT_VERSION, len(tensors), values], dtype=torch.int32)
    flat = torch.cat([header.view(torch.float32), *tensors])
    Path(path).write_bytes(flat.numpy().astype("<f4").tobytes())


def load_flat_weights(path: str | Path, model: nn.Module) -> None:
    """Load weights written by :func:`export_flat_weights` into ``model``, checking the
    header against the model's own tensors."""
    size = os.path.getsize(path)
    if size % 4 or size < 4 * FLAT_HEADER:
        raise ValueError(f"{path}: {size} bytes is not a flat float32 weights file")
    flat = torch.from_file(os.fspath(path), shared=False, size=size // 4, dtype=torch.float32)
    magic, version, n_tensors, n_values = flat[:FLAT_HEADER].view(torch.int32).tolist()
    if magic != FLAT_MAGIC or version != FLAT_VERSION:
        raise ValueError(f"{path}: not a tinyllm flat weights file (version {FLAT_VERSION})")
    state = model.state_dict()
    expected = sum(t.numel() for t in state.values())
    if (n_tensors, n_values) != (len(state), expected) or flat.numel() != FLAT_HEADER + expected:
        raise ValueError(f"{path}: holds {n_tensors} tensors of {n_values} values, the model has "
                         f"{len(state)} of {expected}")
    offset = FLAT_HEADER
    with torch.no_grad():
        for tensor in state.values():
            tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
