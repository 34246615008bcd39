import math

import pytest
import torch

from tinyllm.data.filters import domain_consistency, entropy_filter
from tinyllm.data.pipeline import load_documents, load_domain_terms, select_documents
from tinyllm.data.tokenizer import SPECIAL_TOKENS

pytestmark = pytest.mark.correctness


def test_documents_are_blank_line_separated_paragraphs(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("first doc\nstill first\n\n  second doc  \n\n\n\nthird\n")
    assert load_documents(path) == ["first doc\nstill first", "second doc", "third"]


def test_domain_terms_skip_comments_and_blank_lines(tmp_path):
    path = tmp_path / "terms.txt"
    path.write_text("# header\nloss\n\n  gradient  # inline comment\n#disabled\n")
    assert load_domain_terms(path) == ["loss", "gradient"]


def test_bundled_corpus_and_terms_load(corpus_documents, domain_terms):
    assert len(corpus_documents) == 320
    assert all(doc == doc.strip() and doc for doc in corpus_documents)
    assert len(domain_terms) == len(set(domain_terms)) == 39


def test_tokenizer_keeps_domain_terms_in_file_order(tokenizer, domain_terms):
    start = len(SPECIAL_TOKENS)
    assert tokenizer.tokens[start : start + len(domain_terms)] == domain_terms


def test_selection_rescores_only_entropy_survivors(corpus_documents, tokenizer, tiny_config):
    token_docs, kept, n_entropy = select_documents(corpus_documents, tokenizer, tiny_config.data)
    survivors = entropy_filter(corpus_documents, tiny_config.data.entropy_threshold)
    assert n_entropy == len(survivors)
    assert set(kept) <= set(survivors)
    expected = math.floor(tiny_config.data.keep_easiest * n_entropy) + math.floor(tiny_config.data.keep_hardest * n_entropy)
    assert len(kept) == len(token_docs) == expected
    assert token_docs[0] == tokenizer.encode(corpus_documents[kept[0]])


def test_rows_are_bucketed_by_their_document_domain_score(
    tiny_dataset, corpus_documents, tokenizer, tiny_config, domain_terms
):
    _, kept, _ = select_documents(corpus_documents, tokenizer, tiny_config.data)
    edges = tiny_config.data.bucket_edges
    for row, doc in enumerate(tiny_dataset.packed.row_doc.tolist()[:200]):
        score = domain_consistency(corpus_documents[kept[doc]], domain_terms)
        expected = sum(score >= edge for edge in edges)
        assert tiny_dataset.buckets[row] == expected, (row, score)
    assert tiny_dataset.buckets.dtype == torch.int64
