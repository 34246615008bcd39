"""The evidence cannot be forged from a runner (issue 11, routes 2 and 5): a recording is data
the selection side validates and rebuilds from git before storing; a capture is verified
against its digest before anything loads it.

The recording attacks run through the real path: a pull request whose conftest rewrites
the recording pytest hands back (after FastCI's plugin wrote it), a real `fastci worker`
running the shard (as the worker's own user: what is checked here is the trusted side, not
the sandbox), real Redis, the selection job in this process.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import uuid

import pytest
from attack_world import github_with_pull, selection_side
from conftest import Project, app_key_file, redis_or_skip, redis_url

from fastci.app.events import Work
from fastci.runner.store import open_store
from fastci.testing.runs import run_job

REPO, INSTALLATION, APP_ID, NUMBER = "octo/forged", 71, 7171, 3
BASE = {
    "pkg/__init__.py": "",
    "pkg/calc.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "tests/test_calc.py": "from pkg.calc import add, sub\n\n\ndef test_add():\n"
                          "    assert add(1, 2) == 3\n\n\ndef test_sub():\n"
                          "    assert sub(3, 2) == 1\n",
}

# Rewrites the recording after FastCI's plugin wrote it: pytest calls the trylast hook last.
FORGER = '''
import json
import pytest

ATTACK = {attack!r}
MARKER = {marker!r}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    out = session.config.getoption("fastci_out", None)
    if not out:
        return
    with open(out) as f:
        data = json.load(f)
    if ATTACK == "options in the tree":
        data["tree"] = {{p: f"--output={{MARKER}}" for p in data["tree"]}}
        data["tree"]["--output=" + MARKER] = "--output=" + MARKER
    elif ATTACK == "a test the plan never sent":
        data["tests"].append(dict(data["tests"][0], test_id="tests/test_calc.py::test_forged"))
    elif ATTACK == "a path outside the head":
        data["tests"][0]["lines"]["../../etc/passwd"] = [1]
    elif ATTACK == "evidence that hides a test":
        for test in data["tests"]:  # claim test_sub ran nothing of pkg/calc.py
            if test["test_id"].endswith("test_sub"):
                test["blocks"] = {{"pkg/calc.py": ["add"]}}
                test["kernels"] = {{"pkg/calc.py::sub": "forged"}}
                test["files"] = {{"pkg/calc.py": "0" * 40, "/etc/passwd": "1" * 40}}
    with open(out, "w") as f:
        json.dump(data, f)
'''

ATTACKS = {  # attack -> rejected (reported, nothing stored)
    "options in the tree": False,  # the tree is never read from a recording: git's is used
    "a test the plan never sent": True,
    "a path outside the head": True,
    "evidence that hides a test": False,  # blocks, kernels, files rebuilt from git
}


@pytest.fixture
def forged(tmp_path, monkeypatch, request):
    client = redis_or_skip()
    attack = request.param
    marker = tmp_path / "option-ran"
    remote = Project(tmp_path / "remote" / REPO)
    remote.write(BASE)
    base = remote.commit("base")
    workspace = tmp_path / "workspace"
    remote.fastci("record", "-q", "--store", str(workspace / "evidence.db"), "--", "-q",
                  "-p", "no:cacheprovider")
    (remote.root / "tests" / "conftest.py").write_text(
        FORGER.format(attack=attack, marker=str(marker)))
    remote.edit("pkg/calc.py", "return a + b", "return b + a")
    head = remote.commit("a change, and a forger")
    keys, key = app_key_file(tmp_path)
    prefix = f"fastci-forge-{uuid.uuid4().hex[:8]}"
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
            yield attack, fake, base, head, workspace, marker
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, 9)
            worker.wait()
        for key_name in client.scan_iter(f"*{prefix}*"):
            client.delete(key_name)


@pytest.mark.parametrize("forged", list(ATTACKS), indirect=True)
def test_a_forged_recording_is_rejected_or_rebuilt_from_git(forged):
    attack, fake, base, head, workspace, marker = forged
    work = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat", mode="run_all")
    outcome = run_job(work.to_json(), f"delivery-{uuid.uuid4().hex[:8]}")
    assert outcome["status"] == "completed", outcome
    assert not marker.exists()  # no option ever reached git
    summary = {r["name"]: r for r in fake.check_runs(REPO)}["FastCI regressions"][
        "output"]["summary"]
    with open_store(workspace / "evidence.db") as store:
        stored = store.commits_with_evidence()
        if ATTACKS[attack]:
            assert head not in stored  # nothing of it was stored
            assert "rejected" in summary and "Evidence was not stored" in summary, summary
            return
        assert head in stored, summary
        [(env, _)] = store.snapshot_envs(head)
        snapshot = store.load_snapshot(head, env)
    from fastci.app.workspace import mirror_path, tree

    assert snapshot.tree == tree(mirror_path(workspace, REPO), head)  # git's, not the runner's
    sub = snapshot.tests["tests/test_calc.py::test_sub"]
    assert "sub" in sub.blocks["pkg/calc.py"]  # rebuilt from its lines and git's blob
    assert set(sub.files) <= set(snapshot.tree)
    assert all(v == snapshot.tree[p] for p, v in sub.files.items())
    assert "forged" not in str(sub.kernels)


def test_a_pickle_planted_in_a_capture_is_never_loaded(tmp_path):
    """The store holds a capture under a digest; bytes that do not hash to it are reported
    and the test stays selected, and the pickle's code never runs."""
    pytest.importorskip("torch")
    from test_prune import NET, SCALE

    project = Project(tmp_path / "repo")
    project.write(NET)
    project.commit("net")
    project.record()
    marker = tmp_path / "pickle-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    planted = pickle.dumps(Payload())
    db = project.root / ".fastci" / "evidence.db"
    with sqlite3.connect(db) as conn:
        digests = [d for (d,) in conn.execute("SELECT digest FROM captures")]
        assert digests
        conn.executemany("UPDATE captures SET data = ? WHERE digest = ?",
                         [(planted, d) for d in digests])
    project.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    tests = {t["id"]: t for t in project.select()["tests"]}
    assert tests[SCALE]["decision"] == "selected"
    assert "does not match its digest" in project.fastci("explain", "-q", SCALE).stdout
    assert not marker.exists()
    shutil.rmtree(project.root / ".fastci", ignore_errors=True)
