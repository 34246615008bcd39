"""Sequence packing and bucketed sampling.

Documents are concatenated (each followed by ``<eos>``) into one stream that
is cut into fixed rows of ``seq_len + 1`` tokens, so no compute is wasted on
padding except in the final row. Each row remembers the document that
contributes most of its tokens; the sampler uses that to draw rows from
quality buckets with configured mixture weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100


@dataclass
class PackedRows:
    """Rows of ``seq_len + 1`` token ids plus per-row provenance."""

    rows: torch.Tensor  # [n_rows, seq_len + 1] int64
    row_doc: torch.Tensor  # [n_rows] int64: document with most tokens in the row
    n_pad: int

    def __len__(self) -> int:
        return self.rows.shape[0]


def pack_sequences(documents: Sequence[Sequence[int]], seq_len: int, eos_id: int, pad_id: int) -> PackedRows:
    """Concatenate ``documents`` with ``eos_id`` separators and cut into rows."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    if not documents:
        raise ValueError("cannot pack an empty list of documents")
    row_len = seq_len + 1
    stream = np.fromiter(
        (tok for doc in documents for tok in (*doc, eos_id)),
        dtype=np.int64,
    )
    owner = np.repeat(np.arange(len(documents), dtype=np.int64), [len(d) + 1 for d in documents])
    n_rows = -(-len(stream) // row_len)
    n_pad = n_rows * row_len - len(stream)
    stream = np.concatenate([stream, np.full(n_pad, pad_id, dtype=np.int64)])
    owner = np.concatenate([owner, np.full(n_pad, -1, dtype=np.int64)]).reshape(n_rows, row_len)
    # argmax over per-row document counts; ties go to the earlier document.
    row_doc = np.array([np.bincount(r[r >= 0]).argmax() for r in owner], dtype=np.int64)
    return PackedRows(
        rows=torch.from_numpy(stream.reshape(n_rows, row_len)),
        row_doc=torch.from_numpy(row_doc),
        n_pad=int(n_pad),
    )


def split_inputs_targets(rows: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift rows into (inputs, targets); padded targets become IGNORE_INDEX."""
    inputs = rows[:, :-1]
    targets = rows[:, 1:].clone()
    targets[targets == pad_id] = IGNORE_INDEX
    return inputs, targets


class BucketedSampler:
    """Draws row indices from buckets with fixed mixture weights.

    Each draw first picks a bucket with probability proportional to its weight
    (empty buckets get no mass), then a row uniformly within that bucket. The
    generator is private and seeded, so the stream of batches depends only on
    the seed and the number of batches already drawn; ``state_dict`` captures
    that position for checkpoint/resume.
    """

    def __init__(self, buckets: Sequence[int], weights: Sequence[float], batch_size: int, seed: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if any(w < 0 for w in weights):
            raise ValueError(f"bucket weights must be non-negative, got {list(weights)}")
        bucket_ids = torch.as_tensor(buckets, dtype=torch.int64)
        if bucket_ids.numel() and (bucket_ids.min() < 0 or bucket_ids.max() >= len(weights)):
            raise ValueError(f"bucket ids must lie in [0, {len(weights)}), got range "
                             f"[{int(bucket_ids.min())}, {int(bucket_ids.max())}]")
        self.members = [torch.nonzero(bucket_ids == b).flatten() for b in range(len(weights))]
        mass = torch.tensor([w if len(m) else 0.0 for w, m in zip(weights, self.members)], dtype=torch.float64)
        if mass.sum() <= 0:
            raise ValueError("no non-empty bucket has positive weight")
        self.probs = mass / mass.sum()
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self) -> torch.Tensor:
        """Return ``batch_size`` row indices."""
        choice = torch.multinomial(self.probs, self.batch_size, replacement=True, generator=self.generator)
        out = torch.empty(self.batch_size, dtype=torch.int64)
        for b, members in enumerate(self.members):
            slots = torch.nonzero(choice == b).flatten()
            if len(slots):
                picks = torch.randint(len(members), (len(slots),), generator=self.generator)
                out[slots] = members[picks]
        return out

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())
