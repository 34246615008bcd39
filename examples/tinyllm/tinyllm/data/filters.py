"""Document quality filters.

Three signals decide which documents reach training:

* character entropy drops repetitive spam ("buy now! buy now! ..."), whose
  character distribution is far narrower than natural prose;
* perplexity rescoring under a reference unigram model keeps the easiest
  documents (clean, typical text) plus a small slice of the hardest ones, so
  the model still sees some rare characters and constructions;
* the domain-consistency score measures how on-topic a document is; the
  sampler uses it to weight data buckets;
* the symbol ratio drops garbled text (markup debris, mojibake, encoding
  noise) on its own; the streaming loader (tinyllm.data.loader) applies it,
  per document, in its worker processes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

# Bits per character below which a document is treated as repetitive spam.
# English prose sits around 4.0-4.3 bits; spam built from a few repeated
# words stays under 3.
ENTROPY_THRESHOLD = 3.5

# Perplexity is divided by n_tokens ** LENGTH_EXPONENT so that long documents,
# whose unigram perplexity is a more reliable estimate, are not penalised.
LENGTH_EXPONENT = 0.3
KEEP_EASIEST = 0.4
KEEP_HARDEST = 0.1

# Share of characters that are neither letters, digits, whitespace nor common
# punctuation above which a document is garbled. Clean prose has none; noisy
# in-domain prose stays around 0.02.
MAX_SYMBOL_RATIO = 0.05
PLAIN_PUNCTUATION = frozenset(".,;:!?'\"()-")

_WORD_RE = re.compile(r"[a-z]+")


def char_entropy(text: str) -> float:
    """Shannon entropy of the character distribution of ``text``, in bits."""
    if not text:
        return 0.0
    n = len(text)
    entropy = 0.0
    for count in Counter(text).values():
        p = count / n
        entropy -= p * math.log2(p)
    return entropy


def passes_entropy(text: str, threshold: float = ENTROPY_THRESHOLD) -> bool:
    """True when ``text`` is diverse enough to be kept."""
    return char_entropy(text) >= threshold


def entropy_filter(documents: Sequence[str], threshold: float = ENTROPY_THRESHOLD) -> list[int]:
    """Indices of the documents whose character entropy reaches ``threshold``."""
    return [i for i, doc in enumerate(documents) if passes_entropy(doc, threshold)]


class UnigramModel:
    """Add-one smoothed unigram model over token ids, used as a cheap reference LM."""

    def __init__(self, vocab_size: int):
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.vocab_size = vocab_size
        self.counts = [0] * vocab_size
        self.total = 0

    def fit(self, sequences: Iterable[Sequence[int]]) -> UnigramModel:
        for seq in sequences:
            for token in seq:
                self.counts[token] += 1
                self.total += 1
        return self

    def log_prob(self, token: int) -> float:
        return math.log((self.counts[token] + 1) / (self.total + self.vocab_size))

    def perplexity(self, tokens: Sequence[int]) -> float:
        """exp of the mean negative log-likelihood of ``tokens``."""
        if not tokens:
            raise ValueError("perplexity of an empty sequence is undefined")
        nll = -sum(self.log_prob(t) for t in tokens) / len(tokens)
        return math.exp(nll)


def length_normalised_score(perplexity: float, n_tokens: int, exponent: float = LENGTH_EXPONENT) -> float:
    """Difficulty score: perplexity divided by ``n_tokens ** exponent``."""
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    return perplexity / n_tokens**exponent


def rescore(
    perplexities: Sequence[float],
    n_tokens: Sequence[int],
    keep_easiest: float = KEEP_EASIEST,
    keep_hardest: float = KEEP_HARDEST,
) -> list[int]:
    """Indices (ascending) of documents kept by length-normalised perplexity.

    Documents are ranked by :func:`length_normalised_score`; the lowest
    ``floor(keep_easiest * n)`` and the highest ``floor(keep_hardest * n)`` are
    kept. Ties are broken by document index so the selection is deterministic.
    """
    if len(perplexities) != len(n_tokens):
        raise ValueError(
            f"got {len(perplexities)} perplexities for {len(n_tokens)} token counts"
        )
    if keep_easiest < 0 or keep_hardest < 0 or keep_easiest + keep_hardest > 1:
        raise ValueError(
            f"keep fractions must be non-negative and sum to at most 1, "
            f"got easiest={keep_easiest}, hardest={keep_hardest}"
        )
    n = len(perplexities)
    scores = [length_normalised_score(p, t) for p, t in zip(perplexities, n_tokens)]
    order = sorted(range(n), key=lambda i: (scores[i], i))
    n_easy = math.floor(keep_easiest * n)
    n_hard = math.floor(keep_hardest * n)
    kept = set(order[:n_easy]) | set(order[n - n_hard :] if n_hard else [])
    return sorted(kept)


def symbol_ratio(text: str) -> float:
    """Share of the characters of ``text`` that are symbols (0.0 for empty text)."""
    if not text:
        return 0.0
    symbols = sum(
        not (ch.isascii() and (ch.isalnum() or ch.isspace())) and ch not in PLAIN_PUNCTUATION
        for ch in text
    )
    return symbols / len(text)


def passes_symbol_ratio(text: str, max_ratio: float = MAX_SYMBOL_RATIO) -> bool:
    """True when at most ``max_ratio`` of ``text`` is symbols."""
    return symbol_ratio(text) <= max_ratio


def domain_consistency(text: str, terms: Iterable[str]) -> float:
    """Fraction of the words in ``text`` that are domain terms (0.0 for no words)."""
    words = _WORD_RE.findall(text.lower())
    if not words:
        return 0.0
    vocabulary = set(terms)
    return sum(word in vocabulary for word in words) / len(words)
