"""Character tokenizer with vocabulary compression.

The vocabulary is: four special tokens, the domain terms (whole words that
become single tokens, so in-domain text is shorter), then the most frequent
characters of the training corpus until ``vocab_size`` is reached. Characters
that did not make the cut encode to ``<unk>``; on a small corpus with a long
tail of symbols this keeps the embedding table small without losing the text
that matters.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))
# Decoded in place of <unk> so that lost characters stay visible.
UNK_CHAR = "\ufffd"
VOCAB_FORMAT_VERSION = 1


class Tokenizer:
    """Maps text to token ids: longest domain-term match first, then single characters."""

    def __init__(self, tokens: Sequence[str]):
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"vocabulary must start with the special tokens {SPECIAL_TOKENS}")
        if len(set(tokens)) != len(tokens):
            duplicates = sorted(t for t, c in Counter(tokens).items() if c > 1)
            raise ValueError(f"duplicate tokens in vocabulary: {duplicates}")
        self.tokens = list(tokens)
        self.token_to_id = {tok: i for i, tok in enumerate(self.tokens)}
        ordinary = self.tokens[len(SPECIAL_TOKENS) :]
        self.terms = [t for t in ordinary if len(t) > 1]
        # Longest alternative first: the regex engine takes the first that matches.
        by_length = sorted(self.terms, key=lambda t: (-len(t), t))
        self._term_re = re.compile("|".join(map(re.escape, by_length))) if by_length else None

    @classmethod
    def train(cls, documents: Iterable[str], vocab_size: int, domain_terms: Sequence[str] = ()) -> Tokenizer:
        """Build a vocabulary of at most ``vocab_size`` tokens from ``documents``."""
        terms = list(dict.fromkeys(domain_terms))
        short = [t for t in terms if len(t) < 2]
        if short:
            raise ValueError(f"domain terms must be at least two characters long: {short}")
        n_chars = vocab_size - len(SPECIAL_TOKENS) - len(terms)
        if n_chars <= 0:
            raise ValueError(
                f"vocab_size={vocab_size} leaves no room for characters after "
                f"{len(SPECIAL_TOKENS)} special tokens and {len(terms)} domain terms"
            )
        counts = Counter()
        for doc in documents:
            counts.update(doc)
        chars = sorted(counts, key=lambda c: (-counts[c], c))[:n_chars]
        return cls([*SPECIAL_TOKENS, *terms, *chars])

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def _encode_chars(self, text: str, out: list[int]) -> None:
        lookup = self.token_to_id
        out.extend(lookup.get(ch, UNK_ID) for ch in text)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = [BOS_ID] if bos else []
        pos = 0
        if self._term_re is not None:
            for match in self._term_re.finditer(text):
                self._encode_chars(text[pos : match.start()], ids)
                ids.append(self.token_to_id[match.group()])
                pos = match.end()
        self._encode_chars(text[pos:], ids)
        if eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Inverse of :meth:`encode` for in-vocabulary text; pad/bos/eos are dropped."""
        parts = []
        for i in ids:
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"token id {i} is outside the vocabulary of {len(self.tokens)}")
            if i == UNK_ID:
                parts.append(UNK_CHAR)
            elif i >= len(SPECIAL_TOKENS):
                parts.append(self.tokens[i])
        return "".join(parts)

    def unk_rate(self, text: str) -> float:
        """Fraction of the tokens of ``text`` that are <unk>."""
        ids = self.encode(text)
        return ids.count(UNK_ID) / len(ids) if ids else 0.0

    def save(self, path: str | Path) -> None:
        payload = {"version": VOCAB_FORMAT_VERSION, "tokens": self.tokens}
        Path(path).write_text(json.dumps(payload, ensure_ascii=False, indent=0), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        version = payload.get("version") if isinstance(payload, dict) else None
        if version != VOCAB_FORMAT_VERSION:
            raise ValueError(f"{path}: unsupported vocabulary format version {version!r}")
        return cls(payload["tokens"])
