"""Generate data/corpus.txt, the small mixed-quality corpus bundled with tinyllm.

The corpus is synthetic on purpose: it must be reproducible byte for byte (the
pipeline-statistics and golden-loss tests depend on it) and it must contain the
kinds of documents the filters exist to handle:

* clean machine-learning prose (the in-domain data we want to keep),
* off-domain prose (fluent, but with a low domain-consistency score),
* repetitive spam (low character entropy, dropped by the entropy filter),
* garbled text (high entropy and high perplexity),
* noisy in-domain prose (clean prose with character-level corruption).

Documents are single paragraphs separated by one blank line.

Usage: python scripts/make_corpus.py [--seed 7] [--docs 320] [--out data/corpus.txt]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

DEFAULT_SEED = 7
DEFAULT_DOCS = 320
ROOT = Path(__file__).resolve().parents[1]

ML_SUBJECTS = [
    "the optimizer", "the transformer", "each attention head", "the tokenizer",
    "a residual block", "the embedding table", "the scheduler", "the loss",
    "the fused kernel", "the trainer", "the feedforward layer", "the normalization layer",
    "the data loader", "a rotary position encoding", "the checkpoint manager",
]
ML_VERBS = [
    "updates", "normalizes", "projects", "scales", "computes", "stores", "reduces",
    "averages", "clips", "caches", "rotates", "samples", "packs", "masks",
]
ML_OBJECTS = [
    "the gradient", "every weight", "the query and key vectors", "the softmax output",
    "each token embedding", "the learning rate", "the activation memory", "the checkpoint",
    "the vocabulary", "the batch", "the attention scores", "the residual stream",
    "the sequence", "every parameter tensor", "the logits",
]
ML_TAILS = [
    "before the next step", "during training", "at every layer", "to keep the loss stable",
    "so that convergence is faster", "when precision is reduced", "for long sequences",
    "with a short warmup", "after the optimizer step", "to save memory", "",
]

OFF_SUBJECTS = [
    "the baker", "my grandmother", "the river guide", "a small cafe", "the old fisherman",
    "our neighbor", "the market vendor", "a young painter",
]
OFF_VERBS = ["bakes", "serves", "paints", "follows", "sells", "remembers", "carries", "visits"]
OFF_OBJECTS = [
    "fresh bread", "a quiet trail", "warm soup", "the morning market", "a basket of apples",
    "the blue boat", "old photographs", "a pot of tea",
]
OFF_TAILS = ["on sunday", "near the harbor", "after the rain", "every summer", "in the village", ""]

SPAM_UNITS = ["buy now! ", "free free free ", "ha", "lol ", "click here ", "aaaa", "win $$$ ", "ok ok "]

GARBLE_POOL = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    "αβγδεζηθλμπσφψω€£¥©®±×÷…→←↑↓∞≈≠≤≥♠♣♥♦☀☁★☆漢字語文本数据"
)

# Fractions of each document kind; they sum to one.
MIX = (("ml", 0.55), ("off", 0.15), ("spam", 0.10), ("garbled", 0.10), ("noisy", 0.10))


def _prose(rng: random.Random, subjects, verbs, objects, tails, n_sentences: int) -> str:
    sentences = []
    for _ in range(n_sentences):
        words = [rng.choice(subjects), rng.choice(verbs), rng.choice(objects), rng.choice(tails)]
        sentence = " ".join(w for w in words if w)
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
    return " ".join(sentences)


def make_document(kind: str, rng: random.Random) -> str:
    """Return one document of the given kind."""
    if kind == "ml":
        return _prose(rng, ML_SUBJECTS, ML_VERBS, ML_OBJECTS, ML_TAILS, rng.randint(3, 9))
    if kind == "off":
        return _prose(rng, OFF_SUBJECTS, OFF_VERBS, OFF_OBJECTS, OFF_TAILS, rng.randint(3, 8))
    if kind == "spam":
        unit = rng.choice(SPAM_UNITS)
        return (unit * rng.randint(20, 60)).strip()
    if kind == "garbled":
        return "".join(rng.choice(GARBLE_POOL) for _ in range(rng.randint(80, 400)))
    if kind == "noisy":
        chars = list(_prose(rng, ML_SUBJECTS, ML_VERBS, ML_OBJECTS, ML_TAILS, rng.randint(3, 9)))
        for i in range(len(chars)):
            if rng.random() < 0.05:
                chars[i] = rng.choice(GARBLE_POOL)
        return "".join(chars)
    raise ValueError(f"unknown document kind {kind!r}")


def make_corpus(n_docs: int = DEFAULT_DOCS, seed: int = DEFAULT_SEED) -> list[str]:
    """Return ``n_docs`` documents drawn from MIX with a fixed seed."""
    rng = random.Random(seed)
    kinds = [name for name, _ in MIX]
    weights = [weight for _, weight in MIX]
    return [make_document(rng.choices(kinds, weights)[0], rng) for _ in range(n_docs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--docs", type=int, default=DEFAULT_DOCS)
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "corpus.txt")
    args = parser.parse_args()
    docs = make_corpus(args.docs, args.seed)
    args.out.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    print(f"wrote {len(docs)} documents, {args.out.stat().st_size} bytes to {args.out}")


if __name__ == "__main__":
    main()
