"""Local copies of the repositories the App serves: a bare mirror per repository, fetched with
the installation token (passed to git through its environment, never on a command line), and
throwaway worktrees of it for selection. Mirrors are private to the selection worker: a GPU
worker gets the commit it tests as a git bundle of that commit's objects (`bundle`), which it
downloads by a signed URL that expires (`artifacts.py`), so no credential, no other branch
and no path into the mirror ever travels in a job. No git hook
ever runs here (`core.hooksPath=/dev/null` on every call).
"""

from __future__ import annotations

import base64
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path

from fastci.runner.execution.shard import scrubbed_environment
from fastci.runner.git import END, GitError, run_git


def _git(cwd: Path | None, *args: str, token: str | None = None, check: bool = True) -> str:
    """git without this process's credentials; the installation token, if any, goes in
    through git's environment as an HTTP header."""
    env = {**scrubbed_environment(), "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_COUNT": "1",
           "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": os.devnull}
    if token:
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        env.update(GIT_CONFIG_COUNT="2", GIT_CONFIG_KEY_1="http.extraHeader",
                   GIT_CONFIG_VALUE_1=f"Authorization: Basic {basic}")
    return run_git(list(args), cwd, env=env, check=check).decode(errors="surrogateescape")


def mirror_path(workspace: Path, repo: str) -> Path:
    owner, name = repo.lower().split("/")
    return workspace / "mirrors" / f"{owner}__{name}.git"


def sync(workspace: Path, repo: str, url: str, shas: list[str], number: int | None = None,
         token: str | None = None) -> Path:
    """The mirror, with every sha in `shas` present (fetching the PR's head ref if needed)."""
    mirror = mirror_path(workspace, repo)
    if not (mirror / "HEAD").exists():
        # Made aside and renamed into place: two selection workers making it at once (each
        # the first job of the repository) both end with the one mirror.
        mirror.parent.mkdir(parents=True, exist_ok=True)
        fresh = mirror.parent / f".{mirror.name}-{uuid.uuid4().hex}"
        _git(None, "init", "-q", "--bare", str(fresh))
        try:
            os.rename(fresh, mirror)
        except OSError:  # another job's is there now
            shutil.rmtree(fresh, ignore_errors=True)
    refspecs = ["+refs/heads/*:refs/heads/*"]
    if number is not None:
        refspecs.append(f"+refs/pull/{number}/head:refs/pull/{number}/head")
    _git(mirror, "fetch", "-q", "--prune", END, url, *refspecs, token=token, check=False)
    for sha in shas:
        if _git(mirror, "cat-file", "-t", END, sha, check=False).strip() != "commit":
            _git(mirror, "fetch", "-q", END, url, sha, token=token, check=False)
        if _git(mirror, "cat-file", "-t", END, sha, check=False).strip() != "commit":
            raise GitError(f"commit {sha[:12]} of {repo} could not be fetched")
    return mirror


def ensure(workspace: Path, repo: str, url: str, shas: list[str], number: int | None = None,
           token=None) -> Path:
    """The mirror with every sha in `shas`, fetching (`sync`) only when one is missing, as
    on a selection host that has not seen the run before; `token`: a callable giving the
    installation token, asked only then."""
    mirror = mirror_path(workspace, repo)
    if (mirror / "HEAD").exists() and all(
            _git(mirror, "cat-file", "-t", END, sha, check=False).strip() == "commit"
            for sha in shas):
        return mirror
    return sync(workspace, repo, url, shas, number=number, token=token() if token else None)


@contextmanager
def worktree(mirror: Path, sha: str):
    """A detached worktree of `sha`, removed afterwards."""
    path = mirror.parent.parent / "trees" / f"{mirror.stem}-{sha[:12]}-{uuid.uuid4().hex[:8]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    _git(mirror, "worktree", "add", "-q", "--detach", END, str(path), sha)
    try:
        yield path
    finally:
        _git(mirror, "worktree", "remove", "--force", str(path), check=False)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        _git(mirror, "worktree", "prune", check=False)


def read_at(mirror: Path, sha: str, path: str) -> bytes | None:
    """A file's contents at `sha`, or None where it is not there."""
    try:
        return _git(mirror, "show", END, f"{sha}:{path}").encode(errors="surrogateescape")
    except GitError:
        return None


def tree(mirror: Path, sha: str) -> dict[str, str]:
    """{path: blob sha} of a commit of the mirror."""
    out = _git(mirror, "ls-tree", "-r", "-z", "--full-tree", END, sha)
    entries = (e.split("\t", 1) for e in out.split("\0") if e)
    return {path: info.split()[2] for info, path in entries if info.split()[1] == "blob"}


def bundle(mirror: Path, sha: str, directory: Path) -> Path:
    """A git bundle holding `sha` and its history (nothing else of the mirror), written for
    one job into `directory` (the artifacts folder, whose mode its caller sets); readable by
    the webhook service that serves it, removed by whoever follows the job."""
    if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
        raise GitError(f"not a commit id: {sha[:60]!r}")
    directory.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    path = directory / f"{sha[:12]}-{name}.bundle"
    ref = f"refs/fastci/bundle/{name}"
    _git(mirror, "update-ref", ref, sha)
    try:
        _git(mirror, "bundle", "create", "-q", str(path), ref)
    finally:
        _git(mirror, "update-ref", "-d", ref, check=False)
    os.chmod(path, 0o644)
    return path
