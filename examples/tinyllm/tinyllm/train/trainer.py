"""The training loop.

Everything that influences the loss curve is seeded from
``TrainConfig.seed``: model initialisation, dropout and the data sampler, so
a run is reproducible bit for bit on the same device, and a run resumed from
a checkpoint continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tinyllm.config import Config
from tinyllm.data.packing import BucketedSampler, split_inputs_targets
from tinyllm.data.pipeline import Dataset, build_dataset, build_tokenizer
from tinyllm.data.tokenizer import PAD_ID, Tokenizer
from tinyllm.model.transformer import build_model
from tinyllm.train.checkpointing import apply_activation_checkpointing, load_checkpoint, save_checkpoint
from tinyllm.train.optim import build_optimizer, clip_gradients, lr_at, set_lr
from tinyllm.train.precision import PrecisionPolicy, apply_precision_policy

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and all CUDA devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_deterministic() -> None:
    """The settings the golden files were made under, for processes outside the test suite
    (the training command, data-parallel ranks): one CPU thread, so reductions keep one
    order, and torch's deterministic algorithms."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


@dataclass
class TrainResult:
    losses: list[float]
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


class Trainer:
    """Owns model, optimizer, data and step counter for one run.

    ``tokenizer`` and ``dataset`` may be passed in to share them between runs
    that use the same data config (they are pure functions of it).
    """

    def __init__(
        self,
        cfg: Config,
        device: str | torch.device = "cpu",
        tokenizer: Tokenizer | None = None,
        dataset: Dataset | None = None,
    ):
        self.cfg = cfg
        self.device = torch.device(device)
        self.tokenizer = tokenizer if tokenizer is not None else build_tokenizer(cfg.data, cfg.model.vocab_size)
        if self.tokenizer.vocab_size > cfg.model.vocab_size:
            raise ValueError(
                f"tokenizer has {self.tokenizer.vocab_size} tokens but the model only {cfg.model.vocab_size}"
            )
        self.dataset = dataset if dataset is not None else build_dataset(cfg.data, self.tokenizer)
        self.inputs, self.targets = split_inputs_targets(self.dataset.packed.rows, PAD_ID)

        seed_everything(cfg.train.seed)
        self.model = build_model(cfg.model).to(self.device)
        apply_precision_policy(self.model, PrecisionPolicy.from_config(cfg.train))
        apply_activation_checkpointing(self.model, cfg.train.checkpoint_layers)
        self.optimizer = build_optimizer(self.model, cfg.train)
        self.sampler = BucketedSampler(
            self.dataset.buckets.tolist(), cfg.data.bucket_weights, cfg.train.batch_size, cfg.train.seed
        )
        self.step = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.sampler.sample()
        return self.inputs[index].to(self.device), self.targets[index].to(self.device)

    def train_step(self) -> float:
        """One optimizer update; returns the (pre-update) training loss."""
        self.model.train()
        inputs, targets = self.next_batch()
        set_lr(self.optimizer, lr_at(self.step, self.cfg.train))
        _, loss = self.model(inputs, targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_gradients(self.model.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.step += 1
        if self.step % self.cfg.train.log_every == 0:
            log.info("step %d loss %.4f grad_norm %.3f", self.step, loss.item(), grad_norm)
        return loss.item()

    def train(self, steps: int | None = None) -> TrainResult:
        """Run ``steps`` updates (default: up to ``cfg.train.steps`` in total)."""
        steps = self.cfg.train.steps - self.step if steps is None else steps
        tokens_per_step = self.cfg.train.batch_size * self.cfg.data.seq_len
        start = time.perf_counter()
        losses = [self.train_step() for _ in range(steps)]
        seconds = time.perf_counter() - start
        return TrainResult(losses=losses, tokens=steps * tokens_per_step, seconds=seconds)

    @torch.no_grad()
    def evaluate(self, n_rows: int = 64) -> float:
        """Mean loss over the first ``n_rows`` packed rows (a fixed probe set)."""
        self.model.eval()
        inputs = self.inputs[:n_rows].to(self.device)
        targets = self.targets[:n_rows].to(self.device)
        _, loss = self.model(inputs, targets)
        return loss.item()

    def save(self, path: str | Path) -> None:
        save_checkpoint(path, self.model, self.optimizer, self.step, self.sampler.state_dict())

    def resume(self, path: str | Path) -> None:
        state = load_checkpoint(path, self.model, self.optimizer)
        self.sampler.load_state_dict(state["sampler"])
        self.step = state["step"]
