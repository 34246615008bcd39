"""The git edge: revisions, trees as {path: blob sha}, file contents, renames.

Evidence remembers the blob sha of every file it was recorded against, so a change set is
a comparison of two {path: blob} maps: it is exact for dirty working trees and needs no
checkout of the base.

`run_git` is the one place FastCI runs git (the CLI, the App's mirrors, the shards, the
demos); every failure is a `GitError`. A revision or URL that comes from outside is passed
after `--end-of-options`, so a string such as `--output=/tmp/x` is never read as an option.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from fastci.runner.errors import GitError  # re-exported: every git call raises it

WORKTREE = "WORKTREE"  # the head is the working tree, uncommitted changes included
END = "--end-of-options"  # what follows is a revision, path or URL, never an option


def run_git(args: list[str], cwd: str | Path | None = None, *, env: dict | None = None,
            input: bytes | None = None, check: bool = True) -> bytes:
    """git's stdout; with `check`, a failure is a GitError that names the command and why.

    `env` None inherits this process's environment; callers that must not hand credentials
    to git (the shards, the App) pass a scrubbed one."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True,
                              env=env, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed or not on PATH") from None
    except NotADirectoryError:
        raise GitError(f"{cwd} is not a directory") from None
    if check and proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip()[:500] or f"exit {proc.returncode}"
        raise GitError(f"git {_command(args)} failed: {message}")
    return proc.stdout


def _command(args: list[str]) -> str:
    """The subcommand, past any leading `-c key=value`."""
    i = 0
    while i + 1 < len(args) and args[i] == "-c":
        i += 2
    return args[i] if i < len(args) else ""


@dataclass(frozen=True)
class Repo:
    root: Path

    @classmethod
    def find(cls, start: str | Path = ".") -> "Repo":
        try:
            out = run_git(["rev-parse", "--show-toplevel"], Path(start)).decode(
                errors="surrogateescape")
        except GitError:
            raise GitError(f"{Path(start).resolve()} is not inside a git repository "
                           "(FastCI compares commits; run `git init` and commit first)") from None
        return cls(Path(out.strip()))

    def git(self, *args: str, input: bytes | None = None) -> str:
        return run_git(list(args), self.root, input=input).decode(errors="surrogateescape")

    def resolve(self, rev: str) -> str:
        """A revision -> full commit sha, or a GitError naming the revision."""
        if rev == WORKTREE:
            return WORKTREE
        try:
            return self.git("rev-parse", "--verify", "--quiet", END, f"{rev}^{{commit}}").strip()
        except GitError:
            raise GitError(f"unknown revision {rev!r}: not a commit in {self.root}") from None

    def head(self) -> str | None:
        try:
            return self.resolve("HEAD")
        except GitError:
            return None  # a repository with no commit yet

    def merge_base(self, a: str, b: str) -> str | None:
        try:
            return self.git("merge-base", END, a, b).strip() or None
        except GitError:
            return None

    def ancestors(self, rev: str, limit: int = 200) -> list[str]:
        """`rev` and its ancestors, nearest first."""
        out = self.git("rev-list", f"--max-count={limit}", END, rev)
        return out.split()

    def tree(self, rev: str) -> dict[str, str]:
        """{path: blob sha} of a commit, or of the working tree for WORKTREE."""
        if rev == WORKTREE:
            return self._worktree()
        out = self.git("ls-tree", "-r", "-z", "--full-tree", END, rev)
        tree = {}
        for entry in out.split("\0"):
            if not entry:
                continue
            meta, path = entry.split("\t", 1)
            mode, kind, sha = meta.split()
            if kind == "blob":
                tree[path] = sha
        return tree

    def _worktree(self) -> dict[str, str]:
        tree: dict[str, str] = {}
        for entry in self.git("ls-files", "-s", "-z").split("\0"):
            if entry:
                meta, path = entry.split("\t", 1)
                tree[path] = meta.split()[1]
        dirty = [p for p in self.git("ls-files", "-z", "-m", "-d").split("\0") if p]
        untracked = [p for p in self.git("ls-files", "-z", "-o", "--exclude-standard")
                     .split("\0") if p and not _is_by_product(p)]
        rehash = []
        for path in dict.fromkeys(dirty + untracked):
            if (self.root / path).is_file():
                rehash.append(path)
            else:
                tree.pop(path, None)  # deleted in the working tree
        if rehash:
            shas = self.git("hash-object", "--stdin-paths",
                            input="\n".join(rehash).encode()).split()
            tree.update(zip(rehash, shas))
        return tree

    def read(self, rev: str, path: str) -> bytes:
        if rev == WORKTREE:
            return (self.root / path).read_bytes()
        return run_git(["show", END, f"{rev}:{path}"], self.root)

    def read_many(self, rev: str, paths: list[str]) -> dict[str, bytes]:
        """Contents of many files at once (one `git cat-file --batch` for a commit)."""
        if rev == WORKTREE or not paths:
            return {p: (self.root / p).read_bytes() for p in paths
                    if (self.root / p).is_file()}
        found = self._batch([f"{rev}:{p}" for p in paths])
        return {p: found[f"{rev}:{p}"] for p in paths if f"{rev}:{p}" in found}

    def read_blobs(self, shas: list[str]) -> dict[str, bytes]:
        """Blob contents by sha; a blob git never stored (a dirty file's) is left out."""
        return self._batch(list(dict.fromkeys(shas))) if shas else {}

    def _batch(self, requests: list[str]) -> dict[str, bytes]:
        # The requests go in on stdin, one a line: never read as options.
        out = run_git(["cat-file", "--batch"], self.root,
                      input="".join(f"{r}\n" for r in requests).encode())
        contents, pos = {}, 0
        for request in requests:
            newline = out.index(b"\n", pos)
            header = out[pos:newline].split()
            pos = newline + 1
            if len(header) < 3 or header[1] == b"missing":
                continue
            size = int(header[2])
            contents[request] = out[pos:pos + size]
            pos += size + 1
        return contents

    def renames(self, base: str, head: str) -> dict[str, str]:
        """{old path: new path} for files git sees as renamed between two revisions."""
        args = ["diff", "-M", "--name-status", "-z", END, base]
        args += [] if head == WORKTREE else [head]
        try:
            out = self.git(*args).split("\0")
        except GitError:
            return {}
        pairs, i = {}, 0
        while i < len(out) and out[i]:
            status = out[i]
            if status.startswith(("R", "C")):
                if status.startswith("R"):
                    pairs[out[i + 1]] = out[i + 2]
                i += 3
            else:
                i += 2
        return pairs

    def hunks(self, old: str, new: str) -> list[tuple[int, int, int, int]]:
        """Hunks (old_start, old_len, new_start, new_len) between two blobs, no context."""
        out = self.git("diff", "-U0", "--no-color", END, old, new)
        hunks = []
        for line in out.splitlines():
            if line.startswith("@@"):
                before, after = line.split()[1:3]
                hunks.append((*_span(before[1:]), *_span(after[1:])))
        return hunks


BY_PRODUCTS = ("__pycache__/", ".fastci/", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/")


def _is_by_product(path: str) -> bool:
    """Untracked files that tools write while tests run, never inputs of a test."""
    return path.endswith((".pyc", ".pyo")) or any(
        path.startswith(p) or f"/{p}" in path for p in BY_PRODUCTS)


def _span(text: str) -> tuple[int, int]:
    start, _, length = text.partition(",")
    return int(start), int(length) if length else 1

