"""The git edge: a revision that looks like an option stays a revision, and every git failure
is a GitError (exit code 3), wherever FastCI runs git."""

from __future__ import annotations

import pytest

from fastci.app import workspace
from fastci.runner.errors import EXIT_GIT
from fastci.runner.git import GitError, Repo, run_git


@pytest.fixture
def two_commits(project):
    project.write({"a.py": "x = 1\n"})
    base = project.commit("base")
    project.write({"b.py": "x = 1\n", "a.py": "x = 2\n"})
    head = project.commit("change")
    return project, base, head


def test_a_hostile_revision_is_never_read_as_an_option(two_commits, tmp_path):
    # Without --end-of-options, git show / rev-list / diff write this file.
    project, base, head = two_commits
    out = tmp_path / "out"
    out.mkdir()
    hostile = f"--output={out / 'written'}"
    repo = Repo(project.root)
    blob = repo.tree(head)["a.py"]
    raising = {
        "resolve": lambda: repo.resolve(hostile),
        "ancestors": lambda: repo.ancestors(hostile),
        "tree": lambda: repo.tree(hostile),
        "read": lambda: repo.read(hostile, "a.py"),
        "hunks old": lambda: repo.hunks(hostile, blob),
        "hunks new": lambda: repo.hunks(blob, hostile),
    }
    for name, call in raising.items():
        with pytest.raises(GitError):
            call()
        assert list(out.iterdir()) == [], name
    # These answer "nothing" for a revision git does not know, by contract.
    assert repo.merge_base(hostile, head) is None and repo.merge_base(base, hostile) is None
    assert repo.renames(hostile, head) == {} and repo.renames(base, hostile) == {}
    assert repo.read_many(hostile, ["a.py"]) == {}
    assert list(out.iterdir()) == []
    assert repo.resolve(head) == head and repo.merge_base(base, head) == base  # still works


def test_the_app_workspace_never_reads_a_sha_or_url_as_an_option(two_commits, tmp_path):
    project, base, head = two_commits
    out = tmp_path / "out"
    out.mkdir()
    hostile = f"--upload-pack=touch {out / 'ran'}"
    root = tmp_path / "workspace"
    with pytest.raises(GitError, match="could not be fetched"):
        workspace.sync(root, "octo/lib", str(project.root), [hostile])
    with pytest.raises(GitError, match="could not be fetched"):
        workspace.sync(tmp_path / "fresh", "octo/lib", hostile, [head])
    mirror = workspace.sync(root, "octo/lib", str(project.root), [base, head])
    assert workspace.read_at(mirror, f"--output={out / 'written'}", "a.py") is None
    with pytest.raises(GitError):
        with workspace.worktree(mirror, f"--output={out / 'written'}"):
            pass
    assert list(out.iterdir()) == []
    assert workspace.read_at(mirror, base, "a.py") == b"x = 1\n"
    with workspace.worktree(mirror, head) as tree:
        assert (tree / "b.py").exists()


def test_a_git_failure_is_a_git_error_that_says_which_command_and_why(tmp_path):
    with pytest.raises(GitError, match=r"git rev-parse failed: fatal: not a git repository") \
            as failed:
        run_git(["rev-parse", "--show-toplevel"], tmp_path)
    assert failed.value.exit_code == EXIT_GIT
    with pytest.raises(GitError, match=r"git commit failed"):
        run_git(["-c", "user.name=x", "commit", "-q", "-m", "m"], tmp_path)
    assert run_git(["rev-parse", "--show-toplevel"], tmp_path, check=False) == b""
