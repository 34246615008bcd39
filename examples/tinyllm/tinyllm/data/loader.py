"""Streaming documents through DataLoader workers.

For corpora too large to filter up front (tinyllm.data.pipeline filters the
whole bundled corpus in memory), the per-document quality filters run in the
DataLoader's worker processes: each worker takes a batch of document indices,
drops the documents that fail the filters, and tokenizes the rest. Batches
keep their order, and each one says which worker built it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from tinyllm.data.filters import ENTROPY_THRESHOLD, MAX_SYMBOL_RATIO, passes_entropy, passes_symbol_ratio
from tinyllm.data.tokenizer import Tokenizer


@dataclass(frozen=True)
class Document:
    index: int
    ids: torch.Tensor | None  # None: the document failed a filter


@dataclass(frozen=True)
class DocumentBatch:
    indices: list[int]  # documents that passed the filters, in corpus order
    ids: list[torch.Tensor]  # their token ids
    seen: int  # documents the worker looked at
    worker: int  # the worker that built the batch (-1: the main process)


class FilteredDocuments(Dataset):
    """Documents by index, filtered and tokenized when they are read (in a worker)."""

    def __init__(
        self,
        documents: Sequence[str],
        tokenizer: Tokenizer,
        entropy_threshold: float = ENTROPY_THRESHOLD,
        max_symbol_ratio: float = MAX_SYMBOL_RATIO,
    ):
        self.documents = list(documents)
        self.tokenizer = tokenizer
        self.entropy_threshold = entropy_threshold
        self.max_symbol_ratio = max_symbol_ratio

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, index: int) -> Document:
        text = self.documents[index]
        if not (passes_entropy(text, self.entropy_threshold) and passes_symbol_ratio(text, self.max_symbol_ratio)):
            return Document(index, None)
        return Document(index, torch.tensor(self.tokenizer.encode(text), dtype=torch.int64))


def collate_documents(documents: list[Document]) -> DocumentBatch:
    kept = [d for d in documents if d.ids is not None]
    info = get_worker_info()
    return DocumentBatch(
        indices=[d.index for d in kept],
        ids=[d.ids for d in kept],
        seen=len(documents),
        worker=info.id if info is not None else -1,
    )


def document_loader(dataset: FilteredDocuments, batch_size: int, num_workers: int) -> DataLoader:
    """Batches of filtered documents, in order, built by ``num_workers`` worker processes."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      collate_fn=collate_documents)
