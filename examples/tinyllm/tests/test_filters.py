import dataclasses
import math
import random

import pytest

from tinyllm.data.filters import (
    KEEP_EASIEST,
    KEEP_HARDEST,
    UnigramModel,
    char_entropy,
    domain_consistency,
    entropy_filter,
    length_normalised_score,
    passes_entropy,
    rescore,
)
from tinyllm.data.pipeline import build_dataset

pytestmark = pytest.mark.correctness


@pytest.mark.parametrize(
    "text,bits",
    [
        ("", 0.0),
        ("aaaa", 0.0),
        ("ab", 1.0),
        ("aabb", 1.0),
        ("abcd", 2.0),
        ("abcdefgh", 3.0),
        # p = (3/4, 1/4): -(0.75 log2 0.75 + 0.25 log2 0.25)
        ("aaab", 0.8112781244591328),
        # p = (1/2, 1/4, 1/4): 0.5 + 0.5 + 0.5
        ("aabc", 1.5),
    ],
)
def test_char_entropy_matches_hand_computed_values(text, bits):
    assert char_entropy(text) == pytest.approx(bits, abs=1e-12)


def test_char_entropy_ignores_character_order():
    text = "the gradient of the loss"
    shuffled = "".join(random.Random(3).sample(text, len(text)))
    assert char_entropy(shuffled) == pytest.approx(char_entropy(text), abs=1e-12)


def test_threshold_is_inclusive():
    assert passes_entropy("abcdefgh", threshold=3.0)
    assert not passes_entropy("abcdefgh", threshold=3.0 + 1e-9)


def test_clean_prose_passes_and_spam_fails():
    prose = (
        "The optimizer scales the gradient before the next step. "
        "Each attention head masks the logits during training."
    )
    assert passes_entropy(prose)
    assert not passes_entropy("buy now! " * 30)
    assert not passes_entropy("free free free " * 20)


def _is_periodic(text: str, max_period: int = 12) -> bool:
    return any(text == (text[:n] * (len(text) // n + 1))[: len(text)] for n in range(1, max_period + 1))


def test_entropy_filter_drops_exactly_the_repetitive_corpus_documents(corpus_documents):
    """On the bundled corpus, the filter must remove the spam and nothing else."""
    kept = set(entropy_filter(corpus_documents))
    dropped = {i for i in range(len(corpus_documents)) if i not in kept}
    repetitive = {i for i, doc in enumerate(corpus_documents) if _is_periodic(doc)}
    assert repetitive, "the bundled corpus should contain spam documents"
    assert dropped == repetitive


def test_uniform_unigram_model_has_perplexity_equal_to_vocab_size():
    model = UnigramModel(vocab_size=4).fit([[0, 1, 2, 3]])
    assert model.perplexity([0, 1, 2, 3, 3]) == pytest.approx(4.0)


def test_unigram_perplexity_uses_add_one_smoothing():
    # counts (3, 0) -> p = (4/5, 1/5); ppl([0, 1]) = (0.8 * 0.2) ** -0.5 = 2.5
    model = UnigramModel(vocab_size=2).fit([[0, 0, 0]])
    assert model.perplexity([0, 1]) == pytest.approx(2.5)


def test_perplexity_of_empty_sequence_is_rejected():
    with pytest.raises(ValueError, match="empty sequence"):
        UnigramModel(3).perplexity([])


def test_length_normalised_score_hand_computed():
    assert length_normalised_score(10.0, 1000) == pytest.approx(10.0 / 1000**0.3)
    assert length_normalised_score(10.0, 1000) == pytest.approx(1.2589254117941673)


def test_longer_document_with_equal_perplexity_is_easier():
    assert length_normalised_score(8.0, 400) < length_normalised_score(8.0, 50)


@pytest.mark.parametrize("n", [10, 20, 37, 100])
def test_rescore_keeps_easiest_and_hardest_fractions(n):
    perplexities = [float(p) for p in random.Random(n).sample(range(1, n + 1), n)]
    kept = rescore(perplexities, [1] * n)
    by_difficulty = sorted(range(n), key=lambda i: perplexities[i])
    n_easy, n_hard = math.floor(KEEP_EASIEST * n), math.floor(KEEP_HARDEST * n)
    expected = set(by_difficulty[:n_easy]) | set(by_difficulty[n - n_hard :])
    assert kept == sorted(expected)
    assert len(kept) == n_easy + n_hard


def test_rescore_breaks_ties_by_document_index():
    assert rescore([5.0] * 10, [20] * 10) == [0, 1, 2, 3, 9]


def test_rescore_ranks_by_length_normalised_perplexity():
    # Same perplexity: the 1000-token document is the easiest, the 10-token one the hardest.
    kept = rescore([6.0] * 5, [10, 100, 1000, 100, 100], keep_easiest=0.2, keep_hardest=0.2)
    assert kept == [0, 2]


def test_rescore_without_hard_slice():
    assert rescore([3.0, 1.0, 2.0], [1, 1, 1], keep_easiest=0.4, keep_hardest=0.0) == [1]


@pytest.mark.parametrize("easiest,hardest", [(-0.1, 0.1), (0.4, -0.1), (0.8, 0.3)])
def test_rescore_rejects_bad_fractions(easiest, hardest):
    with pytest.raises(ValueError, match="keep fractions"):
        rescore([1.0, 2.0], [1, 1], easiest, hardest)


def test_rescore_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 perplexities for 3 token counts"):
        rescore([1.0, 2.0], [1, 1, 1])


@pytest.mark.parametrize(
    "text,score",
    [
        ("gradient optimizer loss", 1.0),
        ("the cat sat", 0.0),
        ("the gradient and the loss", 0.4),
        ("Gradient, LOSS!", 1.0),
        ("", 0.0),
        ("1234 !!", 0.0),
    ],
)
def test_domain_consistency(text, score, domain_terms):
    assert domain_consistency(text, domain_terms) == pytest.approx(score)


def test_pipeline_statistics_match_golden(tiny_config, tokenizer, load_golden):
    """Any change to the corpus, the filters or the tokenizer shows up here first."""
    stats = build_dataset(tiny_config.data, tokenizer).stats
    assert dataclasses.asdict(stats) == load_golden("pipeline_stats")


def test_every_quality_bucket_is_populated(tiny_dataset, tiny_config):
    counts = tiny_dataset.buckets.bincount(minlength=len(tiny_config.data.bucket_weights))
    assert len(counts) == len(tiny_config.data.bucket_weights)
    assert (counts > 0).all()
