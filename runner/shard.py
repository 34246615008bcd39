"""Test shards: splitting a selection over GPU workers, and the job that runs one shard.

`split` is pure: longest expected duration first onto the least-loaded shard (LPT), each
shard keeping the selection's risk order. `run_shard` is the RQ job a GPU worker runs: it
checks out a commit from a mirror path (no credentials travel in the job), runs its tests
through pytest with FastCI recording, in a scrubbed environment, and returns what pytest
recorded. It knows nothing of GitHub.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .plan import make_plan
from .report import Decision

# Never handed to a test process: GitHub credentials, the App's key, the webhook secret.
SCRUBBED_PREFIXES = ("GITHUB_", "GH_", "FASTCI_APP_", "FASTCI_WEBHOOK_", "ACTIONS_")
SCRUBBED_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PRIVATE_KEY")


def split(decisions: list[Decision], shards: int) -> list[list[Decision]]:
    """Selected tests over `shards` bins of about equal expected seconds, risk order kept."""
    shards = max(1, shards)
    bins: list[list[Decision]] = [[] for _ in range(shards)]
    load = [0.0] * shards
    for decision in sorted(decisions, key=lambda d: -d.expected_seconds):
        i = min(range(shards), key=lambda k: (load[k], k))
        bins[i].append(decision)
        load[i] += decision.expected_seconds
    rank = {d.test_id: i for i, d in enumerate(decisions)}
    return [sorted(b, key=lambda d: rank[d.test_id]) for b in bins if b]


def scrubbed_environment(environ: dict | None = None) -> dict:
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items()
            if not k.startswith(SCRUBBED_PREFIXES)
            and not any(word in k.upper() for word in SCRUBBED_WORDS)}


def checkout(mirror: str, sha: str, workspace: Path) -> Path:
    """A worktree at `sha`, from a clone of `mirror` cached in `workspace`."""
    name = hashlib.sha1(mirror.encode()).hexdigest()[:16]
    root = workspace / "checkouts" / name
    if not (root / ".git").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        _git(None, "clone", "-q", "--no-checkout", mirror, str(root))
    if _git(root, "cat-file", "-t", sha, check=False).strip() != "commit":
        _git(root, "fetch", "-q", mirror, sha)
    _git(root, "checkout", "-q", "--force", "--detach", sha)
    _git(root, "clean", "-q", "-fdx", "-e", ".fastci")
    return root


def _git(cwd: Path | None, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**scrubbed_environment(), "GIT_TERMINAL_PROMPT": "0"})
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def run_shard(request: dict) -> dict:
    """Run one shard. request: mirror, sha, tests (ids in order), known (every id the plan
    may see), store, workspace, and optionally pytest_args and record_all."""
    started = time.time()
    workspace = Path(request["workspace"])
    root = checkout(request["mirror"], request["sha"], workspace)
    with tempfile.TemporaryDirectory(prefix="fastci-shard-") as tmp:
        out = Path(tmp) / "recording.json"
        args = [sys.executable, "-m", "pytest", f"--rootdir={root}", "-p", "no:cacheprovider",
                "--fastci-record", f"--fastci-store={request['store']}"]
        if not request.get("record_all"):
            plan = Path(tmp) / "plan.json"
            plan.write_text(json.dumps(make_plan(request["tests"], request.get("known", []),
                                                 only=True)))
            args += [f"--fastci-plan={plan}", f"--fastci-out={out}"]
        args += list(request.get("pytest_args", ()))
        proc = subprocess.run(args, cwd=root, env=scrubbed_environment(),
                              capture_output=True, text=True)
        recording = json.loads(out.read_text()) if out.exists() else None
    return {"sha": request["sha"], "exit_code": proc.returncode, "recording": recording,
            "output_tail": (proc.stdout + proc.stderr)[-4000:],
            "seconds": time.time() - started, "worker_pid": os.getpid()}
