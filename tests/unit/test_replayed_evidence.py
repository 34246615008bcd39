"""A pruned test's carried evidence gains what its replays read, or stops vouching for its
files where they could not see (`carry.add_replayed`, `decide._reads`)."""

from __future__ import annotations

from fastci.runner.evidence import TestRecord
from fastci.runner.execution.carry import add_replayed
from fastci.runner.prune.decide import _reads

HEAD = {"net/layers.py": "a" * 40, "net/scale.txt": "b" * 40, "data/corpus.txt": "c" * 40}


def carried(**fields) -> TestRecord:
    return TestRecord("tests/test_net.py::test_scale", "passed", 0.5,
                      blocks={"net/layers.py": ("Scale.forward",)},
                      files={"data/corpus.txt": "c" * 40}, file_events=True, **fields)


def test_a_file_the_replays_read_joins_the_evidence_with_its_blob_at_the_head():
    test = add_replayed(carried(), {}, {}, ("net/scale.txt",), HEAD)
    assert test.files == {"data/corpus.txt": "c" * 40, "net/scale.txt": "b" * 40}
    assert test.file_events


def test_replays_that_could_not_see_their_reads_leave_evidence_that_vouches_for_less():
    # None: no file events in the replay process (another platform, an overflow), or a
    # run planned before replays noted reads. Its files may then miss a native read, so
    # any changed non-Python file selects it from now on (rules: unwatched_changes).
    test = add_replayed(carried(), {}, {}, None, HEAD)
    assert test.files == {"data/corpus.txt": "c" * 40}
    assert not test.file_events


def test_a_replay_that_saw_no_reads_keeps_the_evidence_as_it_was():
    test = add_replayed(carried(), {}, {}, (), HEAD)
    assert test.files == carried().files and test.file_events


def test_any_replay_of_a_test_that_went_unwatched_makes_its_reads_unknown():
    seen = {"read": ["net/scale.txt"]}
    assert _reads([seen, {"read": []}]) == ("net/scale.txt",)
    assert _reads([seen, {"read": [], "unwatched": "inotify_init1 failed"}]) is None
    assert _reads([seen, {"fingerprints": {}}]) is None  # stored before reads were noted
