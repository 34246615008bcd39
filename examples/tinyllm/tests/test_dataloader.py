"""The streaming loader: quality filters and tokenization in DataLoader worker processes.

The filters run in the two workers only; the test process builds the dataset
and checks what comes back.
"""

import pytest
import torch

from tinyllm.data.filters import entropy_filter
from tinyllm.data.loader import FilteredDocuments, document_loader

pytestmark = pytest.mark.correctness

# Of the bundled corpus's 320 documents, 293 pass the entropy filter and the
# symbol-ratio filter then drops the 31 garbled ones among those.
KEPT = 262


def test_workers_filter_and_tokenize_the_corpus(corpus_documents, tokenizer):
    loader = document_loader(FilteredDocuments(corpus_documents, tokenizer), batch_size=40, num_workers=2)
    batches = list(loader)
    assert [b.seen for b in batches] == [40] * 8
    assert {b.worker for b in batches} == {0, 1}  # both workers built batches; the test process none
    kept = [i for b in batches for i in b.indices]
    assert len(kept) == KEPT
    assert kept == sorted(kept)
    survivors = entropy_filter(corpus_documents)
    assert set(kept) < set(survivors)
    for batch in batches:
        for index, ids in zip(batch.indices, batch.ids):
            assert ids.dtype == torch.int64
            assert ids.tolist() == tokenizer.encode(corpus_documents[index])

