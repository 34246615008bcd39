"""The retention rule (`fastci.runner.store.retention`): pure, over snapshot listings and
branch histories; and the branches as git lists them, in real repositories."""

from __future__ import annotations

import pytest
from conftest import Project

from fastci.runner.errors import EXIT_USAGE, UsageError
from fastci.runner.evidence import TestRecord, pack
from fastci.runner.store.retention import (
    DAY,
    Reach,
    Retention,
    SnapshotRef,
    branch_histories,
    captures_in,
    check_days,
)

NOW = 1_700_000_000.0


def ref(commit: str, days_old: float, env: str = "e1") -> SnapshotRef:
    return SnapshotRef(commit, env, NOW - days_old * DAY)


def test_young_snapshots_stay_whatever_their_commit():
    kept = Retention(keep_days=30, now=NOW).kept([ref("pr-head", 29.9), ref("gone", 30.1)])
    assert kept == {("pr-head", "e1")}


def test_the_newest_per_branch_and_environment_stays_however_old():
    snapshots = [ref("c3", 100), ref("c2", 90), ref("c1", 80), ref("c1", 200, env="e2"),
                 ref("side", 95)]
    branches = {"refs/heads/main": ["c4", "c3", "c2", "c1"],  # c4: no evidence yet
                "refs/heads/old": ["side", "c1"]}
    kept = Retention(keep_days=30, now=NOW, branches=branches).kept(snapshots)
    # main: c3 nearest its tip in e1, c1 in e2; old: side in e1, c1 in e2 (the same one).
    assert kept == {("c3", "e1"), ("c1", "e2"), ("side", "e1")}


def test_nearest_the_tip_wins_over_recorded_later():
    """An older commit re-recorded yesterday is not what selection starts from: the tip's
    nearest evidence is (and yesterday's stays anyway, being young)."""
    snapshots = [ref("tip", 60), ref("older", 1)]
    kept = Retention(keep_days=30, now=NOW,
                     branches={"main": ["tip", "older"]}).kept(snapshots)
    assert kept == {("tip", "e1"), ("older", "e1")}


def test_zero_days_keeps_only_each_branch_newest():
    snapshots = [ref("c2", 0.001), ref("c1", 0.002)]
    assert Retention(keep_days=0, now=NOW, branches={"main": ["c2", "c1"]}).kept(
        snapshots) == {("c2", "e1")}


@pytest.mark.parametrize("days", [-1, "-0.5", float("nan"), float("inf"), "soon", None])
def test_bad_retentions_are_usage_errors(days):
    with pytest.raises(UsageError, match="retention") as info:
        check_days(days)
    assert info.value.exit_code == EXIT_USAGE
    with pytest.raises(UsageError):
        Retention(keep_days=days, now=NOW)  # type: ignore[arg-type]


def test_reach_keeps_replays_by_their_capture_and_inventories_by_blob():
    record = TestRecord(test_id="t", outcome="passed", duration=0.1,
                        modules={"captures": [{"digest": "c1"}, {"digest": None},
                                              {"why": "over the capture budget"}]})
    reach = Reach()
    packed = record.modules_payload()
    assert packed is not None and b"c1" not in record.payload()  # apart from the evidence
    reach.add_modules(packed)
    reach.add_tree(pack({"a.py": "blob1"}))
    assert captures_in(packed) == {"c1"}
    assert reach.keeps("replays", "c1:0123abcd:exact")
    assert not reach.keeps("replays", "c2:0123abcd:exact")
    assert reach.keeps("inventories", "blob1") and not reach.keeps("inventories", "blob2")
    assert not reach.keeps("captures", "c2") and reach.keeps("captures", "c1")


def test_branch_histories_lists_local_and_remote_branches_tip_first(tmp_path):
    origin = Project(tmp_path / "origin")
    origin.write({"a.txt": "1"})
    first = origin.commit("first")
    origin.write({"a.txt": "2"})
    second = origin.commit("second")
    origin.git("branch", "feature", first)
    clone = tmp_path / "clone"
    origin.git("clone", "-q", str(origin.root), str(clone))
    work = Project.at(clone)
    work.git("checkout", "-q", "-b", "local", first)
    work.git("-c", "user.email=t@fastci.invalid", "-c", "user.name=t", "commit", "-q",
             "--allow-empty", "-m", "local")
    local = work.git("rev-parse", "HEAD")
    histories = branch_histories(clone)
    assert histories["refs/heads/local"] == [local, first]
    assert histories["refs/remotes/origin/main"] == [second, first]
    assert histories["refs/remotes/origin/feature"] == [first]
    assert "refs/remotes/origin/HEAD" not in histories  # a symbolic ref: listed anyway
    bare = tmp_path / "mirror.git"
    origin.git("clone", "-q", "--bare", str(origin.root), str(bare))
    assert branch_histories(bare, "octo/x:") == {"octo/x:refs/heads/main": [second, first],
                                                 "octo/x:refs/heads/feature": [first]}


def test_branch_histories_of_a_repository_without_commits_is_empty(tmp_path):
    assert branch_histories(Project(tmp_path / "empty").root) == {}
