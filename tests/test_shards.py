"""Sharding by expected duration, the scrubbed test environment, the shard's checkout, and
diff coverage."""

from __future__ import annotations

import pytest

from fastci.runner.execution.coverage_delta import changed_lines, report, statement_lines
from fastci.runner.execution.shard import checkout, scrubbed_environment, split
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


def test_test_processes_never_see_credentials():
    env = scrubbed_environment({
        "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1", "GITHUB_TOKEN": "x", "GH_TOKEN": "x",
        "FASTCI_APP_PRIVATE_KEY": "x", "FASTCI_WEBHOOK_SECRET": "x", "AWS_SECRET_ACCESS_KEY": "x",
        "HF_TOKEN": "x", "DB_PASSWORD": "x", "FASTCI_STORE": "redis://h/0"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1", "FASTCI_STORE": "redis://h/0"}


def test_diff_coverage_counts_statements_not_blank_lines_or_docstrings():
    source = b'def f(x):\n    """doc"""\n\n    y = x + 1\n    return y\n\n\ndef g():\n    return 2\n'
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


def test_a_shard_checks_out_its_commit_and_never_reads_it_as_an_option(project, tmp_path):
    # Without --end-of-options, `git fetch <mirror> --upload-pack=...` runs the command.
    project.write({"a.py": "x = 1\n"})
    sha = project.commit("base")
    out = tmp_path / "out"
    out.mkdir()
    hostile = f"--upload-pack=touch {out / 'ran'}"
    with pytest.raises(GitError):
        checkout(str(project.root), hostile, tmp_path / "ws")
    with pytest.raises(GitError):
        checkout(hostile, sha, tmp_path / "ws")
    assert list(out.iterdir()) == []
    root = checkout(str(project.root), sha, tmp_path / "ws")
    assert (root / "a.py").read_text() == "x = 1\n"
    assert Repo(root).resolve("HEAD") == sha
