"""The capture budget comes from the trusted base (issue 11): a pull request whose own
config raises `capture_budget_mb` gets the base's budget anyway, and a runner that claims
captures past it has its result rejected, never stored.

The attack runs through the real path, as in test_evidence_attacks.py: a real `fastci
worker` running the shard (as the worker's own user), real Redis, the selection job in this
process. The head's conftest plays the attacker: it records the budget the plugin used and,
in the forging variant, rewrites the recording to claim a capture that only the head's own
budget would have allowed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid

import pytest
from attack_world import github_with_pull, selection_side
from conftest import Project, app_key_file, redis_or_skip, redis_url

from fastci.app.events import Work
from fastci.runner.analysis.environment import current
from fastci.runner.execution import validate
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.record.plugin import capture_budget
from fastci.runner.store import open_store
from fastci.testing.runs import run_job

REPO, INSTALLATION, APP_ID, NUMBER = "octo/budget", 73, 7373, 5
BASE_MB = 1
BASE = {
    "pyproject.toml": f"[tool.fastci]\ncapture_budget_mb = {BASE_MB}\n",
    "pkg/__init__.py": "",
    "pkg/calc.py": "def add(a, b):\n    return a + b\n",
    "tests/test_calc.py": "from pkg.calc import add\n\n\ndef test_add():\n"
                          "    assert add(1, 2) == 3\n",
}
ATTACKER = '''
import json
import pytest

FORGE = {forge!r}
SEEN = {seen!r}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    fastci = session.config.pluginmanager.get_plugin("fastci-session")
    with open(SEEN, "w") as f:
        json.dump({{"budget": getattr(fastci, "capture_budget", None)}}, f)
    out = session.config.getoption("fastci_out", None)
    if not FORGE or not out:
        return
    with open(out) as f:
        data = json.load(f)
    for test in data["tests"]:  # as if the head's own budget had been honoured
        test["modules"] = {{"captures": [{{"index": 0, "module": "pkg.calc.Net",
                                          "digest": "a" * 64, "size": {size}}}],
                           "outside": {{}}, "inside": {{}}, "sys_path": []}}
    with open(out, "w") as f:
        json.dump(data, f)
'''


@pytest.fixture
def attack(tmp_path, monkeypatch, request):
    client = redis_or_skip()
    forge = request.param
    seen = tmp_path / "budget-seen.json"
    remote = Project(tmp_path / "remote" / REPO)
    remote.write(BASE)
    base = remote.commit("base")
    workspace = tmp_path / "workspace"
    remote.fastci("record", "-q", "--store", str(workspace / "evidence.db"), "--", "-q",
                  "-p", "no:cacheprovider")
    remote.write({"pyproject.toml": "[tool.fastci]\ncapture_budget_mb = 100000\n",
                  "tests/conftest.py": ATTACKER.format(forge=forge, seen=str(seen),
                                                       size=(BASE_MB + 1) * 2**20)})
    remote.edit("pkg/calc.py", "return a + b", "return b + a")
    head = remote.commit("a change, a bigger budget, and an attacker")
    keys, key = app_key_file(tmp_path)
    prefix = f"fastci-budget-{uuid.uuid4().hex[:8]}"
    selection_side(monkeypatch, tmp_path, key, workspace, prefix, redis_url(),
                   APP_ID)
    worker = None
    try:
        with github_with_pull(monkeypatch, keys.public, REPO, INSTALLATION, NUMBER, head,
                              base, APP_ID) as fake:
            worker = subprocess.Popen(
                [sys.executable, "-m", "fastci", "worker", "--gpu", "0"],
                env={**os.environ, "FASTCI_RUNNER_DIR": str(tmp_path / "runner")},
                stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT,
                start_new_session=True)
            yield forge, fake, base, head, workspace, seen
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, 9)
            worker.wait()
        for key_name in client.scan_iter(f"*{prefix}*"):
            client.delete(key_name)


@pytest.mark.parametrize("attack", [False, True], ids=["honest", "forged"], indirect=True)
def test_the_heads_capture_budget_never_counts(attack):
    forge, fake, base, head, workspace, seen = attack
    work = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat", mode="run_all")
    outcome = run_job(work.to_json(), f"delivery-{uuid.uuid4().hex[:8]}")
    assert outcome["status"] == "completed", outcome
    # The plugin in the runner used the base's budget, not the 100000 MB of the head.
    assert json.loads(seen.read_text())["budget"] == BASE_MB * 2**20
    summary = {r["name"]: r for r in fake.check_runs(REPO)}["FastCI regressions"][
        "output"]["summary"]
    with open_store(workspace / "evidence.db") as store:
        stored = store.commits_with_evidence()
    with sqlite3.connect(workspace / "evidence.db") as db:
        [(captured,)] = db.execute("SELECT coalesce(sum(length(data)), 0) FROM captures")
    assert captured <= BASE_MB * 2**20  # what is stored stays within the base's budget
    if forge:
        assert head not in stored  # the forged result was rejected, nothing of it stored
        assert "capture budget" in summary and "Evidence was not stored" in summary, summary
    else:
        assert head in stored, summary


# -- the trusted side's check, unit by unit --------------------------------------------------
HEAD_TREE = {"tests/test_x.py": "b" * 40}
TEST = "tests/test_x.py::test_a"


def _recording(*sizes, digest="d" * 64) -> dict:
    modules = None if not sizes else {
        "captures": [{"index": i, "module": "m.Net", "digest": digest, "size": s}
                     for i, s in enumerate(sizes)], "outside": {}, "inside": {}}
    return {"tests": [{"test_id": TEST, "outcome": "passed", "duration": 0.1,
                       "modules": modules}],
            "environment": json.loads(current().to_json())}


def _check(data, budget_mb):
    return validate.recording(data, head_tree=HEAD_TREE, inventories={}, planned={TEST},
                              capture_budget_mb=budget_mb)


def test_captures_within_the_budget_pass_with_their_metadata_checked():
    rec, _, _ = _check(_recording(2**19, 2**19), 1)
    # What pruning reads comes through, checked; the bytes come separately, digest-checked.
    assert [c["size"] for c in rec.tests[TEST].modules["captures"]] == [2**19, 2**19]
    _check(_recording(5 * 2**20), None)  # no budget sent: nothing to hold it to
    _check(_recording(), 0)


@pytest.mark.parametrize("data, why", [
    (_recording(2**20, 1), "over the base's capture budget"),
    ({**_recording(), "tests": [{**_recording()["tests"][0], "modules": {"captures": "x"}}]},
     "module captures"),
    (_recording(-5), "size"),
])
def test_captures_past_the_budget_or_malformed_are_rejected(data, why):
    with pytest.raises(InvalidResult, match=why):
        _check(data, 1)


def test_a_capture_not_kept_does_not_count():
    data = _recording(10 * 2**20)
    data["tests"][0]["modules"]["captures"][0]["digest"] = None  # over budget, not kept
    _check(data, 1)


def test_the_command_lines_budget_beats_the_files():
    assert capture_budget(None, 64.0) == 64 * 2**20
    assert capture_budget(1.5, 100000.0) == int(1.5 * 2**20)
    assert capture_budget(0.0, 100000.0) == 0
