"""Replay packs and replay outputs: what crosses between the selection side and a runner.

The selection side packs the trees and captures it wrote out; a runner unpacks them and
runs the steps it was sent; what it sends back is checked before any fingerprint is
compared. Every check here is played by the side that would abuse it.
"""

from __future__ import annotations

import json
import os
import tarfile

import pytest

from fastci.runner.execution.validate import InvalidResult, replay_output
from fastci.runner.prune.replayers import (
    LocalReplayer,
    ReplayItem,
    SettlePlan,
    items_from,
    pack,
    read_output,
)

DIGEST = "a" * 64


def scratch_with_trees(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "old" / "net").mkdir(parents=True)
    (scratch / "old" / "net" / "layers.py").write_text("x = 1\n")
    (scratch / "new" / "net").mkdir(parents=True)
    (scratch / "new" / "net" / "layers.py").write_text("x = 2\n")
    (scratch / "captures").mkdir()
    (scratch / "captures" / DIGEST).write_bytes(b"pickle bytes")
    (scratch / "tensors-g0").mkdir()
    return scratch


def test_a_pack_holds_the_trees_and_captures_and_its_steps_name_them_relatively(tmp_path):
    scratch = scratch_with_trees(tmp_path)
    (scratch / "unrelated-secret").write_text("not for the runner")
    capture = {DIGEST: scratch / "captures" / DIGEST}
    old = ReplayItem("old-g0", scratch / "old", capture, ["src"], env={"A": "1"},
                     save=scratch / "tensors-g0", budget=1.25)
    new = ReplayItem("new-g0", scratch / "new", capture, compare=scratch / "tensors-g0",
                     overrides=[["net/layers.py", "Scale", ["describe"]]],
                     settle=SettlePlan([[DIGEST]], scratch / "settled-g0",
                                   [{DIGEST: {"out": {"hash": "aa"}}}]))
    steps = pack(scratch, [[old], [new]], tmp_path / "pack.tar.gz")
    with tarfile.open(tmp_path / "pack.tar.gz") as tar:
        names = set(tar.getnames())
        assert all(m.uid == 0 and (m.isfile() or m.isdir()) for m in tar.getmembers())
    assert {"old/net/layers.py", "new/net/layers.py", f"captures/{DIGEST}"} <= names
    assert "unrelated-secret" not in names  # only what the steps use
    json.dumps(steps)  # plain JSON: it travels in the job
    assert steps[0][0]["root"] == "old" and steps[0][0]["captures"] == {
        DIGEST: f"captures/{DIGEST}"}
    assert steps[1][0]["compare_to"] == "tensors-g0" and steps[0][0]["env"] == {"A": "1"}

    # The runner reads them back under where it unpacked the pack, and only there.
    [[old_back], [new_back]] = items_from(steps, tmp_path / "unpacked")
    assert old_back.root == tmp_path / "unpacked" / "old"
    assert old_back.save == tmp_path / "unpacked" / "tensors-g0"
    assert new_back.overrides == [["net/layers.py", "Scale", ["describe"]]]
    assert steps[1][0]["settle"]["settled"] == "settled-g0"
    assert new_back.settle == SettlePlan([[DIGEST]], tmp_path / "unpacked" / "settled-g0",
                                     [{DIGEST: {"out": {"hash": "aa"}}}])
    assert old_back.settle is None
    assert old_back.budget == 1.25 and new_back.budget is None


@pytest.mark.parametrize("field,value", [
    ("root", "/etc"), ("root", "../../worker"), ("out", "../x"),
    ("save_tensors", "/root/.ssh"), ("name", "../../evil"), ("name", "x" * 100),
    ("settle", {"groups": [[DIGEST]], "settled": "/home/runner/.bashrc"}),
    ("settle", {"groups": [[DIGEST]], "settled": "../settled"}),
    ("settle", {"groups": "not a list of lists", "settled": "settled"}),
    ("settle", {"groups": [[DIGEST]], "settled": "settled", "recorded": {"a": 1}}),
    ("budget", "2"), ("budget", -1.0), ("budget", True), ("budget", 1e12)])
def test_a_step_cannot_point_outside_its_pack(tmp_path, field, value):
    step = {"name": "old-g0", "root": "old", "captures": {DIGEST: f"captures/{DIGEST}"},
            "out": "old-g0.json", "save_tensors": None, "compare_to": None}
    step[field] = value
    if field == "out":  # the runner chooses where results go: a sent `out` is ignored
        [[item]] = items_from([[step]], tmp_path)
        assert item.request(tmp_path / "r.json")["out"] == str(tmp_path / "r.json")
        return
    with pytest.raises(ValueError):
        items_from([[step]], tmp_path)


def test_a_pack_never_takes_files_from_outside_the_scratch_folder(tmp_path):
    scratch = scratch_with_trees(tmp_path)
    outside = ReplayItem("new-g0", tmp_path, {DIGEST: scratch / "captures" / DIGEST})
    with pytest.raises(ValueError, match="outside"):
        pack(scratch, [[outside]], tmp_path / "pack.tar.gz")


def item(tmp_path):
    return ReplayItem("new-g0", tmp_path, {DIGEST: tmp_path / DIGEST})


def test_results_left_by_the_replayed_code_are_read_only_from_a_plain_file(tmp_path):
    secret = tmp_path / "key.pem"
    secret.write_text('{"captures": {}, "stolen": "-----BEGIN PRIVATE KEY-----"}')
    out = tmp_path / "out.json"
    out.symlink_to(secret)
    got = read_output(item(tmp_path), 0, "", out)
    assert "stolen" not in json.dumps(got) and "PRIVATE" not in json.dumps(got)
    assert got["captures"][DIGEST]["error"].startswith("the replay wrote no results")
    out.unlink()
    os.mkfifo(out)  # would block a plain open() forever
    got = read_output(item(tmp_path), 0, "", out)
    assert "not a plain file" in got["captures"][DIGEST]["error"]


def test_a_failed_or_silent_replay_is_an_error_for_each_capture(tmp_path):
    got = read_output(item(tmp_path), 3, "Traceback\nImportError: no torch\n",
                      tmp_path / "missing.json")
    assert got == {"captures": {DIGEST: {
        "error": "the replay process exited with 3: ImportError: no torch"}}}
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert "not a mapping" in read_output(item(tmp_path), 0, "", tmp_path / "bad.json")[
        "captures"][DIGEST]["error"]


GOOD = {"captures": {DIGEST: {
    "fingerprints": {"out": {"hash": "00ff", "dtype": "float32", "shape": [3], "sum": 1.5,
                             "sumsq": None, "nans": 0}, "rng": {"hash": "12"}},
    "error": None, "seconds": 0.01, "load_seconds": 0.2,
    "lines": {"net/layers.py": [3, 4, 4]}, "close": {"out": "ok"},
    "read": ["net/scale.txt", "net/scale.txt"]}},
    "overrides": {"net/layers.py::Scale": {"overriding": [], "error": None}}}


def check(raw):
    return replay_output(raw, captures={DIGEST}, overrides={"net/layers.py::Scale"},
                         tree={"net/layers.py", "net/scale.txt"})


def test_a_well_formed_replay_output_passes_with_its_lines_deduplicated():
    got = check(GOOD)
    assert got["captures"][DIGEST]["lines"] == {"net/layers.py": [3, 4]}
    assert got["captures"][DIGEST]["read"] == ["net/scale.txt"]
    assert got["captures"][DIGEST]["fingerprints"] == GOOD["captures"][DIGEST]["fingerprints"]
    assert got["overrides"] == GOOD["overrides"]


def _with(path: list, value):
    raw = json.loads(json.dumps(GOOD))
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return raw


@pytest.mark.parametrize("path,value,why", [
    (["captures", "b" * 64], {"fingerprints": {}, "error": None}, "was not sent"),
    (["captures", DIGEST, "lines"], {"/etc/passwd": [1]}, "repository-relative"),
    (["captures", DIGEST, "lines"], {"other.py": [1]}, "not in the tree"),
    (["captures", DIGEST, "lines"], {"net/layers.py": ["1"]}, "not line numbers"),
    (["captures", DIGEST, "fingerprints"], {"out": {"hash": {"nested": "x"}}}, "not a text"),
    (["captures", DIGEST, "fingerprints"], {"out": "0xff"}, "not a mapping"),
    (["captures", DIGEST, "seconds"], -1, "non-negative"),
    (["overrides", "net/other.py::Evil"], {"overriding": [], "error": None}, "not asked"),
    (["captures", DIGEST, "error"], ["not", "text"], "not a string"),
    # A file a replay read joins a pruned test's evidence: only the tree's files may.
    (["captures", DIGEST, "read"], ["../../etc/shadow"], "repository-relative"),
    (["captures", DIGEST, "read"], ["net/other.txt"], "not in the tree"),
    (["captures", DIGEST, "read"], "net/scale.txt", "not a list"),
    (["captures", DIGEST, "unwatched"], {"why": 1}, "not a string"),
])
def test_a_replay_output_that_claims_more_than_it_was_asked_is_rejected(path, value, why):
    with pytest.raises(InvalidResult, match=why):
        check(_with(path, value))


def test_an_oversized_replay_output_is_rejected():
    many = {f"out[{i}]": {"hash": "0"} for i in range(10_001)}
    with pytest.raises(InvalidResult, match="at most"):
        check(_with(["captures", DIGEST, "fingerprints"], many))


def test_a_local_replay_that_fails_settles_its_tests_for_the_process_beside_it(tmp_path):
    # A real replay process of the new tree fails on its call (this capture cannot be read):
    # the tests that need the call are noted as settled in the file the evidence's tree's
    # process reads before each call it would replay.
    scratch = scratch_with_trees(tmp_path)
    settled = scratch / "settled-g0"
    new = ReplayItem("new-g0", scratch / "new", {DIGEST: scratch / "captures" / DIGEST},
                     settle=SettlePlan([[DIGEST], ["b" * 64]], settled,
                                       [{DIGEST: {"out": {"hash": "aa"}}}, {}]))
    outputs = LocalReplayer(warm=False).run(scratch, [[new]])
    assert "error" in outputs["new-g0"]["captures"][DIGEST]
    assert settled.read_text().split() == ["0"]


def test_a_local_deadline_travels_to_local_replays_only(tmp_path):
    """`until` is this machine's monotonic clock: a runner's would not agree with it, so a
    pack never carries it (its processes keep their own budget)."""
    import time  # noqa: PLC0415

    scratch = scratch_with_trees(tmp_path)
    until = time.monotonic() + 5
    item = ReplayItem("new-g0", scratch / "new", {DIGEST: scratch / "captures" / DIGEST},
                      budget=2.0, until=until)
    assert item.request(scratch / "out.json")["until"] == until
    steps = pack(scratch, [[item]], tmp_path / "pack.tar.gz")
    assert steps[0][0]["until"] is None and steps[0][0]["budget"] == 2.0
    assert items_from(steps, scratch)[0][0].until is None


def test_past_the_deadline_no_replay_process_starts(tmp_path, monkeypatch):
    """A selection on the developer's machine waits no longer than its budget: once the
    deadline has passed, or too little is left for a cold interpreter to import torch, the
    items are cut off unreplayed (their tests stay selected), and nothing is started."""
    import time  # noqa: PLC0415

    from fastci.runner.prune import replayers  # noqa: PLC0415
    from fastci.runner.prune.budget import cut_off  # noqa: PLC0415

    def no_process(*args, **kwargs):
        raise AssertionError("a replay process was started past the deadline")

    monkeypatch.setattr(replayers, "_start", no_process)
    monkeypatch.setattr(replayers.zygote, "replay", lambda *a, **k: None)  # none serves
    scratch = scratch_with_trees(tmp_path)
    captures = {DIGEST: scratch / "captures" / DIGEST}
    late = ReplayItem("new-g0", scratch / "new", captures, until=time.monotonic() - 1)
    short = ReplayItem("new-g1", scratch / "new", captures,
                       until=time.monotonic() + replayers.COLD_START / 2)
    for warm in (False, True):
        out = LocalReplayer(warm=warm).run(scratch, [[late]])
        assert cut_off(out["new-g0"]["captures"][DIGEST])
    out = LocalReplayer(warm=True).run(scratch, [[short]])  # the zygote could not serve
    assert cut_off(out["new-g1"]["captures"][DIGEST])
