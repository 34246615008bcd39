import pytest
import torch

from tinyllm.data.packing import IGNORE_INDEX, BucketedSampler, pack_sequences, split_inputs_targets

pytestmark = pytest.mark.correctness

EOS, PAD = 3, 0
DOCS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15]]


def _stream(docs):
    return [tok for doc in docs for tok in (*doc, EOS)]


@pytest.mark.parametrize("seq_len", [1, 3, 4, 7, 16])
def test_rows_have_fixed_length_and_preserve_the_stream(seq_len):
    packed = pack_sequences(DOCS, seq_len, EOS, PAD)
    assert packed.rows.shape[1] == seq_len + 1
    flat = packed.rows.flatten().tolist()
    stream = _stream(DOCS)
    assert flat[: len(stream)] == stream
    assert flat[len(stream) :] == [PAD] * packed.n_pad
    assert packed.n_pad < seq_len + 1


def test_only_the_final_row_is_padded():
    packed = pack_sequences(DOCS, 3, EOS, PAD)  # 15 stream tokens into rows of 4
    assert packed.n_pad == 1
    assert (packed.rows[:-1] != PAD).all()
    assert packed.rows[-1].tolist() == [EOS, 15, EOS, PAD]


def test_row_doc_is_the_document_with_most_tokens():
    # rows: [5 6 7 E] [8 9 E 10] [11 12 13 14] [E 15 E P]
    packed = pack_sequences(DOCS, 3, EOS, PAD)
    assert packed.row_doc.tolist() == [0, 1, 2, 3]


def test_row_doc_ties_go_to_the_earlier_document():
    packed = pack_sequences([[5], [6]], 3, EOS, PAD)  # [5 E 6 E]
    assert packed.row_doc.tolist() == [0]


def test_exact_fit_needs_no_padding():
    packed = pack_sequences([[5, 6, 7]], 3, EOS, PAD)
    assert packed.n_pad == 0 and len(packed) == 1


def test_empty_document_list_is_rejected():
    with pytest.raises(ValueError, match="empty list of documents"):
        pack_sequences([], 8, EOS, PAD)


def test_non_positive_seq_len_is_rejected():
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        pack_sequences(DOCS, 0, EOS, PAD)


def test_split_shifts_by_one_and_ignores_padding():
    rows = torch.tensor([[5, 6, 7, EOS], [EOS, 15, PAD, PAD]])
    inputs, targets = split_inputs_targets(rows, PAD)
    assert inputs.tolist() == [[5, 6, 7], [EOS, 15, PAD]]
    assert targets.tolist() == [[6, 7, EOS], [15, IGNORE_INDEX, IGNORE_INDEX]]
    assert rows[1, 2] == PAD, "split must not modify the packed rows"


def test_bundled_dataset_rows(tiny_dataset, tiny_config, tokenizer):
    rows = tiny_dataset.packed.rows
    assert rows.shape[1] == tiny_config.data.seq_len + 1
    assert rows.dtype == torch.int64
    assert int(rows.max()) < tokenizer.vocab_size
    assert tiny_dataset.buckets.shape == (rows.shape[0],)
    assert (rows == EOS).sum() == tiny_dataset.stats.after_rescoring


def _draw(sampler, n_batches):
    return torch.stack([sampler.sample() for _ in range(n_batches)])


def test_sampler_is_deterministic_for_a_seed():
    buckets = [0, 1, 2] * 10
    a = _draw(BucketedSampler(buckets, [0.2, 0.3, 0.5], batch_size=4, seed=11), 20)
    b = _draw(BucketedSampler(buckets, [0.2, 0.3, 0.5], batch_size=4, seed=11), 20)
    assert torch.equal(a, b)


def test_sampler_streams_differ_between_seeds():
    buckets = [0, 1, 2] * 10
    a = _draw(BucketedSampler(buckets, [0.2, 0.3, 0.5], batch_size=4, seed=11), 20)
    b = _draw(BucketedSampler(buckets, [0.2, 0.3, 0.5], batch_size=4, seed=12), 20)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("weights", [[0.5, 0.5], [0.9, 0.1], [0.2, 0.3, 0.5]])
def test_bucket_frequencies_follow_weights(weights):
    buckets = [b for b in range(len(weights)) for _ in range(5)]
    sampler = BucketedSampler(buckets, weights, batch_size=100, seed=0)
    drawn = torch.tensor(buckets)[_draw(sampler, 50).flatten()]
    freq = torch.bincount(drawn, minlength=len(weights)).double() / drawn.numel()
    torch.testing.assert_close(freq, torch.tensor(weights, dtype=torch.float64), atol=0.02, rtol=0)


def test_draws_come_from_the_chosen_bucket_members():
    buckets = [1, 0, 1, 1, 0]
    sampler = BucketedSampler(buckets, [0.0, 1.0], batch_size=64, seed=3)
    drawn = sampler.sample()
    assert set(drawn.tolist()) == {0, 2, 3}


def test_empty_bucket_mass_is_redistributed():
    sampler = BucketedSampler([0, 0, 2], [1.0, 1.0, 1.0], batch_size=1, seed=0)
    torch.testing.assert_close(sampler.probs, torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64))


def test_sampler_state_dict_resumes_the_stream():
    buckets = [0, 1] * 8
    reference = BucketedSampler(buckets, [0.5, 0.5], batch_size=4, seed=5)
    expected = _draw(reference, 6)
    resumed = BucketedSampler(buckets, [0.5, 0.5], batch_size=4, seed=5)
    _draw(resumed, 3)
    state = resumed.state_dict()
    fresh = BucketedSampler(buckets, [0.5, 0.5], batch_size=4, seed=999)
    fresh.load_state_dict(state)
    assert torch.equal(_draw(fresh, 3), expected[3:])


@pytest.mark.parametrize(
    "buckets,weights,batch_size,message",
    [
        ([0, 1], [0.0, 0.0], 2, "no non-empty bucket has positive weight"),
        ([0, 0], [0.0, 1.0], 2, "no non-empty bucket has positive weight"),
        ([0, 2], [0.5, 0.5], 2, r"bucket ids must lie in \[0, 2\)"),
        ([0, 1], [0.5, -0.5], 2, "must be non-negative"),
        ([0, 1], [0.5, 0.5], 0, "batch_size must be at least 1"),
    ],
)
def test_sampler_rejects_bad_arguments(buckets, weights, batch_size, message):
    with pytest.raises(ValueError, match=message):
        BucketedSampler(buckets, weights, batch_size=batch_size, seed=0)
