"""Pruning's replays in two halves (app/replays.py): the selection job's plan defers them,
and the plan made when the replay job has ended answers them from the runner's output,
only for a replay whose inputs are what was sent, and only as validated JSON."""

from __future__ import annotations

import tarfile
import time
from dataclasses import replace

from fastci.app.replays import DEFERRED, AnsweringReplayer, DeferredReplayer
from fastci.runner.prune.replayers import ReplayItem, items_from

DIGEST = "b" * 64
OUTPUT = {"captures": {DIGEST: {"fingerprints": {"out": {"hash": "f00d", "dtype": "float32"}},
                                "seconds": 0.1, "lines": {"net/layers.py": [1]}}},
          "overrides": {}}


def scratch(tmp_path, name: str = "scratch", text: str = "x = 2\n"):
    root = tmp_path / name
    (root / "new" / "net").mkdir(parents=True)
    (root / "new" / "net" / "layers.py").write_text(text)
    (root / "captures").mkdir()
    (root / "captures" / DIGEST).write_bytes(b"pickle bytes")
    return root, [[ReplayItem("new-g0", root / "new", {DIGEST: root / "captures" / DIGEST},
                              ["."])]]


def deferred_for(tmp_path):
    """A first plan's replayer, asked for the one replay of `scratch`."""
    root, steps = scratch(tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    deferred = DeferredReplayer(staging)
    assert not deferred.asked
    return root, steps, deferred, deferred.run(root, steps)


def test_the_first_plan_runs_nothing_and_keeps_what_the_runner_needs(tmp_path):
    root, steps, deferred, out = deferred_for(tmp_path)
    assert out == {"new-g0": {"captures": {DIGEST: {"error": DEFERRED}}}}  # keeps all selected
    assert deferred.asked and set(deferred.digests) == {"new-g0"}
    steps_json = deferred.pack(tmp_path / "pack.tar.gz")
    with tarfile.open(tmp_path / "pack.tar.gz") as tar:
        assert {"new/net/layers.py", f"captures/{DIGEST}"} <= set(tar.getnames())
    assert steps_json[0][0]["root"] == "new"  # relative: the scratch folder is gone by then


def test_the_second_plan_uses_an_answer_only_for_the_inputs_it_was_computed_on(tmp_path):
    root, steps, deferred, _ = deferred_for(tmp_path)
    raw = {"outputs": {"new-g0": OUTPUT}}

    # The same inputs, written out again by the second plan: the answer is used.
    again, again_steps = scratch(tmp_path, "again")
    answered = AnsweringReplayer(raw, deferred.digests).run(again, again_steps)
    assert answered["new-g0"]["captures"][DIGEST]["fingerprints"] == {
        "out": {"hash": "f00d", "dtype": "float32"}}

    # The tree changed between the two plans (another snapshot, another head): the answer
    # was computed on other code, so it is not used and the test stays selected.
    changed, changed_steps = scratch(tmp_path, "changed", text="x = 3\n")
    refused = AnsweringReplayer(raw, deferred.digests).run(changed, changed_steps)
    assert "changed after it was sent" in refused["new-g0"]["captures"][DIGEST]["error"]

    # A replay that was never sent gets no answer either.
    other = [[ReplayItem("old-g1", again / "new", {DIGEST: again / "captures" / DIGEST})]]
    assert "error" in AnsweringReplayer(raw, deferred.digests).run(again, other)[
        "old-g1"]["captures"][DIGEST]


def test_a_runners_output_is_validated_and_a_failed_job_keeps_everything(tmp_path):
    root, steps, deferred, _ = deferred_for(tmp_path)
    forged = {"outputs": {"new-g0": {**OUTPUT, "captures": {
        **OUTPUT["captures"], "c" * 64: {"fingerprints": {}}}}}}  # a capture not sent
    replayer = AnsweringReplayer(forged, deferred.digests)
    out = replayer.run(root, steps)
    assert "rejected" in out["new-g0"]["captures"][DIGEST]["error"]
    assert replayer.rejected and "not sent" in replayer.rejected[0]
    assert "rejected" in replayer.notes({})[0]
    lost = AnsweringReplayer("the replay job failed on the runner", deferred.digests)
    assert lost.run(root, steps)["new-g0"]["captures"][DIGEST]["error"] == \
        "the replay job failed on the runner"
    malformed = AnsweringReplayer({"outputs": []}, deferred.digests)
    assert "malformed" in malformed.run(root, steps)["new-g0"]["captures"][DIGEST]["error"]


def test_a_runner_never_gets_a_launch_folder(tmp_path):
    """Remembered kernel launches are written and read only where this machine's user alone
    may write (`launches.py`). A runner's replays get no folder: the pack the selection job
    makes names none even when its replays had one (nor this machine's clock), and a runner
    reading a pack that names one takes none."""
    root, steps = scratch(tmp_path)
    steps = [[replace(item, launches=tmp_path / "launches", until=time.monotonic() + 60)
              for item in step] for step in steps]
    assert steps[0][0].request(tmp_path / "out.json")["launches"] == str(tmp_path / "launches")
    staging = tmp_path / "staging"
    staging.mkdir()
    deferred = DeferredReplayer(staging)
    deferred.run(root, steps)
    packed = deferred.pack(tmp_path / "pack.tar.gz")
    assert [(raw["launches"], raw["until"]) for step in packed for raw in step] == [(None, None)]
    forged = [[{**raw, "launches": str(tmp_path / "launches")} for raw in step]
              for step in packed]
    for step in items_from(forged, tmp_path / "unpacked"):
        for item in step:
            assert item.launches is None
            assert item.request(tmp_path / "unpacked" / "out.json")["launches"] is None
