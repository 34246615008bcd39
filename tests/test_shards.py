"""Sharding by expected duration, the test environment (an allowlist), the shard's checkout
from a bundle (which it takes by an http(s) URL only), and diff coverage."""

from __future__ import annotations

import threading

import pytest

from fastci.app import workspace
from fastci.app.workspace import bundle
from fastci.runner.errors import RunError
from fastci.runner.execution.coverage_delta import changed_lines, report, statement_lines
from fastci.runner.execution.sandbox import Sandbox, environment
from fastci.runner.execution.shard import checkout, run_shard, scrubbed_environment, split
from fastci.runner.git import GitError, Repo
from fastci.runner.selection.report import Decision


def decisions(seconds: list[float]) -> list[Decision]:
    return [Decision(f"t{i}", True, ("r",), rank=i + 1, expected_seconds=s)
            for i, s in enumerate(seconds)]


def test_split_balances_expected_seconds_and_keeps_risk_order():
    chosen = decisions([9, 1, 1, 1, 4, 4, 1, 1, 2])
    shards = split(chosen, 3)
    loads = sorted(sum(d.expected_seconds for d in s) for s in shards)
    assert loads[-1] == 9  # the longest test alone: no shard can finish sooner
    assert sum(loads) == 24 and loads[0] >= 7
    for shard in shards:
        ranks = [d.rank for d in shard]
        assert ranks == sorted(ranks)
    assert sorted(d.test_id for s in shards for d in s) == sorted(d.test_id for d in chosen)
    assert split(decisions([1.0]), 4) == [decisions([1.0])]
    assert split([], 2) == []


def test_test_processes_get_only_allowlisted_variables(tmp_path):
    env = environment(tmp_path, {
        "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1", "LC_ALL": "C", "GITHUB_TOKEN": "x",
        "FASTCI_REDIS_URL": "redis://:pw@h/0", "FASTCI_STORE": "redis://:pw@h/0",
        "FASTCI_QUEUE_PREFIX": "p", "REDIS_URL": "redis://h", "SLOW": "1",
        "PYTHONPATH": "/elsewhere"}, extra=("SLOW", "FASTCI_STORE"))
    assert env.pop("HOME") == env.pop("TMPDIR") == str(tmp_path)
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1", "LC_ALL": "C", "SLOW": "1",
                   "PYTHONNOUSERSITE": "1", "GIT_TERMINAL_PROMPT": "0",
                   "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


def test_git_and_tools_scrub_credentials():
    env = scrubbed_environment({
        "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1", "GITHUB_TOKEN": "x", "GH_TOKEN": "x",
        "FASTCI_APP_PRIVATE_KEY": "x", "FASTCI_WEBHOOK_SECRET": "x", "AWS_SECRET_ACCESS_KEY": "x",
        "HF_TOKEN": "x", "DB_PASSWORD": "x", "FASTCI_STORE": "redis://h/0"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1", "FASTCI_STORE": "redis://h/0"}


def test_diff_coverage_counts_statements_not_blank_lines_or_docstrings():
    source = (b'def f(x):\n    """doc"""\n\n    y = x + 1\n    return y\n\n\n'
              b"def g():\n    return 2\n")
    stmts = statement_lines(source)
    assert stmts == {1, 4, 5, 8, 9}
    changed = {"pkg/m.py": changed_lines([(3, 0, 3, 3)]) | {9}, "tests/test_m.py": {1}}
    result = report(changed, {"pkg/m.py": stmts}, {"pkg/m.py": {1, 4, 5}},
                    {"pkg/m.py": {1, 4, 5, 8, 9}}, {"pkg/m.py": {1, 4}})
    assert (result.changed_statements, result.changed_covered) == (3, 2)
    assert result.uncovered == {"pkg/m.py": (9,)}
    assert result.diff_coverage == 2 / 3
    assert result.head_ratio == 3 / 5 and result.base_ratio == 2 / 5
    assert round(result.delta, 6) == 0.2


def test_a_shard_checks_out_its_commit_from_a_bundle_and_never_reads_it_as_an_option(
        project, tmp_path):
    # Without validation, `git checkout --output=...`-like shas would reach git as options.
    project.write({"a.py": "x = 1\n"})
    sha = project.commit("base")
    project.write({"b.py": "y = 2\n"})
    project.git("checkout", "-q", "-b", "other")
    other = project.commit("not in the bundle")
    project.git("checkout", "-q", "-")
    out = tmp_path / "out"
    out.mkdir()
    path = bundle(project.root / ".git", sha, tmp_path / "bundles")
    sandbox = Sandbox()
    for n, hostile in enumerate([f"--output={out / 'ran'}", "HEAD", sha[:12]]):
        home = tmp_path / f"bad{n}"
        home.mkdir()
        with pytest.raises(GitError):
            checkout(sandbox, path, hostile, home)
    assert list(out.iterdir()) == []
    home = tmp_path / "home"
    home.mkdir()
    root = checkout(sandbox, path, sha, home)
    assert (root / "a.py").read_text() == "x = 1\n"
    assert Repo(root).resolve("HEAD") == sha
    with pytest.raises(GitError):  # the bundle holds that commit's history, no other branch
        Repo(root).resolve(other)


def test_a_shard_takes_its_bundle_only_by_an_http_url(project, tmp_path, monkeypatch):
    # No shared filesystem: a path (the old "bundle" field), a file:// URL or a local
    # bundle never reaches git; the runner leaves no job folder behind.
    project.write({"a.py": "x = 1\n"})
    sha = project.commit("base")
    path = bundle(project.root / ".git", sha, tmp_path / "bundles")
    monkeypatch.setenv("FASTCI_RUNNER_DIR", str(tmp_path / "runner"))
    for request in ({"bundle": str(path)}, {"bundle_url": str(path)},
                    {"bundle_url": f"file://{path}"}, {"bundle_url": ["http://h/x"]}):
        with pytest.raises(RunError, match="URL"):
            run_shard({**request, "sha": sha, "tests": []})
    assert list((tmp_path / "runner").iterdir()) == []


def test_selection_jobs_that_make_one_mirror_at_once_all_get_it(project, tmp_path):
    """Two selection workers, each a first job of a repository, create its mirror at the
    same moment: both go on with it (one git init, then the other's, used to fail on the
    mirror's locked config and lose that pull request's run)."""
    project.write({"a.py": "x = 1\n"})
    sha = project.commit("base")
    start, errors, mirrors = threading.Barrier(6), [], []

    def sync() -> None:
        start.wait()
        try:
            mirrors.append(workspace.sync(tmp_path / "ws", "octo/x", str(project.root), [sha]))
        except Exception as exc:  # noqa: BLE001 - the test reports each failure
            errors.append(exc)

    threads = [threading.Thread(target=sync) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(set(mirrors)) == 1
    assert workspace.tree(mirrors[0], sha) == {"a.py": Repo(project.root).tree(sha)["a.py"]}
    assert [p.name for p in (tmp_path / "ws" / "mirrors").iterdir()] == ["octo__x.git"]
