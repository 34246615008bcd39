"""The watchdog's retention: gc on the App's store once per interval across watchdogs, with
the branches of the workspace's mirrors (real git, a real SQLite store, real Redis)."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest
from conftest import Project
from test_store import snapshot

from fastci.app import watchdog
from fastci.app.settings import AppSettings, SettingsError, load
from fastci.app.workspace import mirror_path
from fastci.runner.store import open_store

DAY = 86400.0


@pytest.fixture
def app(tmp_path, redis):
    """A workspace with one mirror (main: m1 -> m2) and evidence for m1, m2 and a commit on
    no branch, all 40 days old; a queue prefix of the test's own."""
    origin = Project(tmp_path / "origin")
    origin.write({"a.txt": "1"})
    m1 = origin.commit("m1")
    origin.write({"a.txt": "2"})
    m2 = origin.commit("m2")
    workspace = tmp_path / "workspace"
    mirror = mirror_path(workspace, "octo/x")
    mirror.parent.mkdir(parents=True)
    origin.git("clone", "-q", "--bare", str(origin.root), str(mirror))
    old = time.time() - 40 * DAY
    with open_store(workspace / "evidence.db") as store:
        for sha in (m1, m2, "f" * 40):
            store.save_snapshot(replace(snapshot(sha), created_at=old))
    prefix = f"fastci-test-gc-{uuid.uuid4().hex[:8]}"
    settings = AppSettings(workspace=workspace, queue_prefix=prefix)
    yield settings, redis, {"m1": m1, "m2": m2}
    for key in redis.scan_iter(f"{prefix}*"):
        redis.delete(key)


def _commits(settings: AppSettings) -> set[str]:
    with open_store(settings.store_path) as store:
        return store.commits_with_evidence()


def test_the_watchdogs_run_gc_once_per_interval(app):
    settings, redis, shas = app
    report = watchdog.collect_garbage(settings, redis)
    assert report is not None and report["kinds"]["snapshots"]["deleted"] == 2
    assert _commits(settings) == {shas["m2"]}  # the mirror's main keeps its newest
    assert watchdog.collect_garbage(settings, redis) is None  # this watchdog, again
    assert watchdog.collect_garbage(replace(settings), redis) is None  # another one
    marker = f"{settings.queue_prefix}:gc-last"
    assert 0 < redis.ttl(marker) <= 24 * 3600
    redis.delete(marker)  # the interval passed
    again = watchdog.collect_garbage(settings, redis)
    assert again is not None and again["kinds"]["snapshots"] == {"kept": 1, "deleted": 0,
                                                                 "bytes": 0}


def test_without_mirrors_gc_deletes_nothing_and_tries_again_later(app):
    settings, redis, shas = app
    bare = replace(settings, workspace=settings.workspace.parent / "elsewhere")
    (bare.workspace).mkdir()
    (settings.workspace / "evidence.db").rename(bare.workspace / "evidence.db")
    assert watchdog.collect_garbage(bare, redis) is None
    assert len(_commits(bare)) == 3  # no branch known: nothing judged unreachable
    assert redis.ttl(f"{settings.queue_prefix}:gc-last") <= watchdog.GC_RETRY


def test_gc_off_and_a_missing_store(app):
    settings, redis, _ = app
    assert watchdog.collect_garbage(replace(settings, gc_interval_hours=0), redis) is None
    assert redis.get(f"{settings.queue_prefix}:gc-last") is None
    (settings.workspace / "evidence.db").unlink()
    assert watchdog.collect_garbage(settings, redis) is None  # a StoreError, logged
    assert not (settings.workspace / "evidence.db").exists()


@pytest.mark.parametrize("name, value", [("FASTCI_RETENTION_DAYS", "-3"),
                                         ("FASTCI_GC_INTERVAL_HOURS", "daily")])
def test_bad_gc_settings_name_the_variable(name, value):
    with pytest.raises(SettingsError, match=name):
        load({name: value})
    assert load({"FASTCI_RETENTION_DAYS": "7"}).retention_days == 7.0
