"""`fastci gc` end to end: a real git repository in a temporary folder, its evidence in a
real SQLite file (and a Redis prefix of the test's own), snapshots aged by hand.

The rule itself is tested in test_retention.py and, on both stores, in the contract
(test_store_backends.py); here: git's branches reach the rule, the table and the dry run
say what they should, bad input is a clear error without a traceback."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace

import pytest
from conftest import Project, redis_url
from test_store import snapshot

from fastci.runner.errors import EXIT_STORE, EXIT_USAGE
from fastci.runner.store import open_store

DAY = 86400.0


@pytest.fixture
def aged(project: Project):
    """main: m1 -> m2; feature: m1 -> f1; a commit left on no branch (x, its branch
    deleted); evidence for each, all 40 days old."""
    project.write({"a.txt": "1"})
    m1 = project.commit("m1")
    project.git("checkout", "-q", "-b", "feature")
    project.write({"b.txt": "f"})
    f1 = project.commit("f1")
    project.git("checkout", "-q", "-b", "doomed", m1)
    project.write({"c.txt": "x"})
    x = project.commit("x")
    project.git("checkout", "-q", "main")
    project.write({"a.txt": "2"})
    m2 = project.commit("m2")
    project.git("branch", "-D", "doomed")
    old = time.time() - 40 * DAY
    shas = {"m1": m1, "m2": m2, "f1": f1, "x": x}
    with open_store(project.root / ".fastci" / "evidence.db") as store:
        for name, sha in shas.items():
            store.save_snapshot(replace(snapshot(sha), created_at=old))
    return project, shas


def _commits(project: Project, location=None) -> set[str]:
    with open_store(location or project.root / ".fastci" / "evidence.db") as store:
        return store.commits_with_evidence()


def test_gc_keeps_each_branch_newest_and_deletes_the_rest(aged):
    project, shas = aged
    dry = project.fastci("gc", "--dry-run")
    assert "would delete" in dry.stdout and "dry run: nothing was deleted" in dry.stdout
    assert _commits(project) == set(shas.values())
    done = project.fastci("gc", "--json")
    report = json.loads(done.stdout)
    assert report["kinds"]["snapshots"] == {"kept": 2, "deleted": 2,
                                            "bytes": report["kinds"]["snapshots"]["bytes"]}
    # main's newest (m2) and feature's (f1) stay; m1 (shadowed on both) and x (no branch) go.
    assert _commits(project) == {shas["m2"], shas["f1"]}
    with open_store(project.root / ".fastci" / "evidence.db") as store:
        [(env, _)] = store.snapshot_envs(shas["m2"])
        kept = store.load_snapshot(shas["m2"], env, with_lines=True)
    assert len(kept.tests) == 3 and all(t.lines for t in kept.tests.values())
    table = project.fastci("gc").stdout  # nothing left to do
    assert "0 item(s) deleted" in table and "snapshots" in table


def test_a_long_retention_keeps_everything(aged):
    project, shas = aged
    project.fastci("gc", "--keep-days", "41")
    assert _commits(project) == set(shas.values())


def test_retention_days_comes_from_the_config(aged):
    project, shas = aged
    project.write({"pyproject.toml": "[tool.fastci]\nretention_days = 45\n"})
    project.fastci("gc")
    assert _commits(project) == set(shas.values())
    project.fastci("gc", "--keep-days", "0")  # the option wins over the file
    assert _commits(project) == {shas["m2"], shas["f1"]}


@pytest.mark.parametrize("days", ["-1", "nan", "soon"])
def test_a_bad_retention_is_a_usage_error(aged, days):
    project, shas = aged
    proc = project.fastci("gc", "--keep-days", days, check=False)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "Traceback" not in proc.stderr and "error" in proc.stderr
    assert _commits(project) == set(shas.values())


def test_an_unknown_store_is_a_store_error(project: Project, tmp_path):
    project.write({"a.txt": "1"})
    project.commit()
    proc = project.fastci("gc", "--store", str(tmp_path / "nope.db"), check=False)
    assert proc.returncode == EXIT_STORE
    assert "no evidence store" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "nope.db").exists()  # gc never creates a store


def test_gc_through_a_redis_store(aged, redis):
    project, shas = aged
    prefix = f"fastci-test-gc-{uuid.uuid4().hex[:8]}"
    location = f"{redis_url()}?prefix={prefix}"
    try:
        with open_store(location) as store:
            for sha in shas.values():
                store.save_snapshot(replace(snapshot(sha), created_at=time.time() - 40 * DAY))
        project.fastci("gc", "--store", location)
        assert _commits(project, location) == {shas["m2"], shas["f1"]}
    finally:
        for key in redis.scan_iter(f"{prefix}*"):
            redis.delete(key)
