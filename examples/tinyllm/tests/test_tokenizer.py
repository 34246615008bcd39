from collections import Counter

import pytest

from tinyllm.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_CHAR,
    UNK_ID,
    Tokenizer,
)

pytestmark = pytest.mark.correctness


def test_vocabulary_is_filled_to_the_configured_size(tokenizer, tiny_config):
    assert tokenizer.vocab_size == tiny_config.model.vocab_size


def test_special_tokens_have_fixed_ids(tokenizer):
    assert tokenizer.tokens[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert [tokenizer.token_to_id[t] for t in SPECIAL_TOKENS] == [PAD_ID, UNK_ID, BOS_ID, EOS_ID]


def test_every_domain_term_is_a_single_token(tokenizer, domain_terms):
    for term in domain_terms:
        assert tokenizer.encode(term) == [tokenizer.token_to_id[term]], term


@pytest.mark.parametrize(
    "text",
    [
        "The optimizer updates the gradient during training.",
        "a residual block; the tokenizer, then the token!",
        "Each attention head masks the logits",
        "x",
        "",
    ],
)
def test_in_vocabulary_text_round_trips(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("char", ["\n", "ß", "🙂", "Ω", "é"])
def test_unseen_characters_map_to_unk(tokenizer, char):
    ids = tokenizer.encode(f"a{char}b")
    assert ids == [tokenizer.token_to_id["a"], UNK_ID, tokenizer.token_to_id["b"]]
    assert tokenizer.decode(ids) == f"a{UNK_CHAR}b"


def test_compression_keeps_the_most_frequent_characters(tokenizer, corpus_documents):
    counts = Counter("".join(corpus_documents))
    kept = [c for c in counts if c in tokenizer.token_to_id]
    dropped = [c for c in counts if c not in tokenizer.token_to_id]
    assert dropped, "the bundled corpus should have a tail of rare characters to compress away"
    assert min(counts[c] for c in kept) >= max(counts[c] for c in dropped)


def test_compression_loses_little_of_the_corpus(tokenizer, corpus_documents):
    ids = [i for doc in corpus_documents for i in tokenizer.encode(doc)]
    assert ids.count(UNK_ID) / len(ids) < 0.02


def test_longest_domain_term_wins(tokenizer):
    assert tokenizer.encode("tokenizer") == [tokenizer.token_to_id["tokenizer"]]
    assert tokenizer.encode("tokens") == [tokenizer.token_to_id["token"], tokenizer.token_to_id["s"]]


def test_domain_terms_shorten_in_domain_text(tokenizer):
    text = "The optimizer updates the gradient during training."
    assert len(tokenizer.encode(text)) < 0.6 * len(text)


def test_bos_and_eos_are_added_and_dropped_on_decode(tokenizer):
    ids = tokenizer.encode("loss", bos=True, eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert tokenizer.decode(ids + [PAD_ID]) == "loss"


def test_unk_rate(tokenizer):
    assert tokenizer.unk_rate("a🙂") == pytest.approx(0.5)
    assert tokenizer.unk_rate("") == 0.0


def test_save_and_load_round_trip(tokenizer, tmp_path):
    path = tmp_path / "vocab.json"
    tokenizer.save(path)
    loaded = Tokenizer.load(path)
    assert loaded.tokens == tokenizer.tokens
    text = "The trainer caches the checkpoint ±"
    assert loaded.encode(text) == tokenizer.encode(text)


def test_load_rejects_unknown_format_version(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text('{"version": 99, "tokens": []}')
    with pytest.raises(ValueError, match="unsupported vocabulary format version 99"):
        Tokenizer.load(path)


def test_frequency_ties_break_by_character():
    tok = Tokenizer.train(["ba", "ab"], vocab_size=len(SPECIAL_TOKENS) + 1)
    assert tok.tokens[-1] == "a"


def test_training_counts_frequencies_across_documents():
    tok = Tokenizer.train(["xyz", "zz", "y"], vocab_size=len(SPECIAL_TOKENS) + 2)
    assert tok.tokens[len(SPECIAL_TOKENS) :] == ["z", "y"]


def test_vocabulary_must_start_with_special_tokens():
    with pytest.raises(ValueError, match="must start with the special tokens"):
        Tokenizer(["a", "b"])


def test_duplicate_tokens_are_rejected():
    with pytest.raises(ValueError, match=r"duplicate tokens in vocabulary: \['a'\]"):
        Tokenizer([*SPECIAL_TOKENS, "a", "a"])


def test_vocab_too_small_for_terms_is_rejected():
    with pytest.raises(ValueError, match="leaves no room for characters"):
        Tokenizer.train(["abc"], vocab_size=6, domain_terms=["loss", "step"])


def test_single_character_terms_are_rejected():
    with pytest.raises(ValueError, match="at least two characters"):
        Tokenizer.train(["abc"], vocab_size=16, domain_terms=["a"])


@pytest.mark.parametrize("bad_id", [-1, 160, 10_000])
def test_decode_rejects_ids_outside_the_vocabulary(tokenizer, bad_id):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([bad_id])
