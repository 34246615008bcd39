"""From raw corpus file to packed, bucketed training rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tinyllm.config import DataConfig
from tinyllm.data.filters import (
    UnigramModel,
    domain_consistency,
    entropy_filter,
    rescore,
)
from tinyllm.data.packing import PackedRows, pack_sequences
from tinyllm.data.tokenizer import EOS_ID, PAD_ID, Tokenizer


def load_documents(path: str | Path) -> list[str]:
    """Documents are paragraphs separated by blank lines."""
    text = Path(path).read_text(encoding="utf-8")
    return [doc.strip() for doc in text.split("\n\n") if doc.strip()]


def load_domain_terms(path: str | Path) -> list[str]:
    """One term per line; blank lines and '#' comments are ignored."""
    terms = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        term = line.split("#", 1)[0].strip()
        if term:
            terms.append(term)
    return terms


@dataclass(frozen=True)
class PipelineStats:
    documents: int
    after_entropy: int
    after_rescoring: int
    tokens: int
    rows: int


@dataclass
class Dataset:
    packed: PackedRows
    buckets: torch.Tensor  # [n_rows] bucket id of each row
    stats: PipelineStats


def select_documents(documents: list[str], tokenizer: Tokenizer, cfg: DataConfig) -> tuple[list[list[int]], list[int], int]:
    """Apply the entropy filter then perplexity rescoring.

    Returns the token ids of the kept documents, their indices into
    ``documents``, and how many documents survived the entropy filter.
    """
    survivors = entropy_filter(documents, cfg.entropy_threshold)
    encoded = [tokenizer.encode(documents[i]) for i in survivors]
    reference = UnigramModel(tokenizer.vocab_size).fit(encoded)
    perplexities = [reference.perplexity(ids) for ids in encoded]
    kept = rescore(perplexities, [len(ids) for ids in encoded], cfg.keep_easiest, cfg.keep_hardest)
    return [encoded[k] for k in kept], [survivors[k] for k in kept], len(survivors)


def build_dataset(cfg: DataConfig, tokenizer: Tokenizer) -> Dataset:
    documents = load_documents(cfg.corpus)
    terms = load_domain_terms(cfg.domain_terms)
    token_docs, doc_indices, n_entropy = select_documents(documents, tokenizer, cfg)
    packed = pack_sequences(token_docs, cfg.seq_len, EOS_ID, PAD_ID)
    scores = torch.tensor([domain_consistency(documents[i], terms) for i in doc_indices], dtype=torch.float64)
    edges = torch.tensor(cfg.bucket_edges, dtype=torch.float64)
    buckets = torch.bucketize(scores[packed.row_doc], edges, right=True)
    stats = PipelineStats(
        documents=len(documents),
        after_entropy=n_entropy,
        after_rescoring=len(token_docs),
        tokens=sum(len(ids) for ids in token_docs),
        rows=len(packed),
    )
    return Dataset(packed=packed, buckets=buckets, stats=stats)


def build_tokenizer(cfg: DataConfig, vocab_size: int) -> Tokenizer:
    """Train the tokenizer on the full (unfiltered) corpus plus the domain terms."""
    return Tokenizer.train(load_documents(cfg.corpus), vocab_size, load_domain_terms(cfg.domain_terms))
