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
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastci.runner.execution import flaky
from fastci.runner.git import END, run_git
from fastci.runner.selection.plan import make_plan
from fastci.runner.selection.report import Decision

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
    # One checkout per worker: workers on one machine share the workspace, and two shards
    # checking out into one folder would trample each other.
    device = os.environ.get("CUDA_VISIBLE_DEVICES")
    owner = f"gpu{device}" if device else f"pid{os.getpid()}"
    name = hashlib.sha1(mirror.encode()).hexdigest()[:16]
    root = workspace / "checkouts" / f"{name}-{owner}"
    if not (root / ".git").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        _git(None, "clone", "-q", "--no-checkout", END, mirror, str(root))
    if _git(root, "cat-file", "-t", END, sha, check=False).strip() != "commit":
        _git(root, "fetch", "-q", END, mirror, sha)
    # `git checkout` (2.39) reads --end-of-options as a path: it is handed a full sha.
    commit = _git(root, "rev-parse", "--verify", END, f"{sha}^{{commit}}").strip()
    _git(root, "checkout", "-q", "--force", "--detach", commit)
    _git(root, "clean", "-q", "-fdx", "-e", ".fastci")
    return root


def _git(cwd: Path | None, *args: str, check: bool = True) -> str:
    """git without credentials: the scrubbed environment, and never a prompt."""
    env = {**scrubbed_environment(), "GIT_TERMINAL_PROMPT": "0"}
    return run_git(list(args), cwd, env=env, check=check).decode(errors="surrogateescape")


def _mark_running() -> None:
    """Tell whoever follows this shard where it runs, so a dead worker is noticed."""
    try:
        from rq import get_current_job  # noqa: PLC0415
    except ImportError:
        return
    job = get_current_job()
    if job is not None:
        job.meta.update(host=socket.gethostname(), pid=os.getpid(), started=time.time())
        job.save_meta()


def run_shard(request: dict) -> dict:
    """Run one shard. request: mirror, sha, tests (ids in order), known (every id the plan
    may see), store, workspace, and optionally pytest_args and record_all.

    A test that fails is run once more before it counts: if it passes then, it is flaky
    (listed in `flaky`, its passing record kept, its first failure in `flaky_failures`)."""
    started = time.time()
    _mark_running()
    workspace = Path(request["workspace"])
    root = checkout(request["mirror"], request["sha"], workspace)
    with tempfile.TemporaryDirectory(prefix="fastci-shard-") as tmp:
        if request.get("record_all"):
            proc = _pytest(root, request, [], Path(tmp), record_all=True)
            return {"sha": request["sha"], "exit_code": proc.returncode, "recording": None,
                    "output_tail": (proc.stdout + proc.stderr)[-4000:],
                    "seconds": time.time() - started, "worker_pid": os.getpid()}
        proc = _pytest(root, request, request["tests"], Path(tmp) / "first")
        recording = _read(Path(tmp) / "first")
        flaky_failures: dict = {}
        failed = flaky.failed_ids(recording)
        if recording is not None and failed:
            _pytest(root, request, failed, Path(tmp) / "again")
            recording, flaky_failures = flaky.confirm(recording, _read(Path(tmp) / "again"))
    return {"sha": request["sha"], "exit_code": proc.returncode, "recording": recording,
            "flaky": sorted(flaky_failures), "flaky_failures": flaky_failures,
            "output_tail": (proc.stdout + proc.stderr)[-4000:],
            "seconds": time.time() - started, "worker_pid": os.getpid()}


def _pytest(root: Path, request: dict, tests: list[str], tmp: Path,
            record_all: bool = False) -> subprocess.CompletedProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pytest", f"--rootdir={root}", "-p", "no:cacheprovider",
            "--fastci-record", f"--fastci-store={request['store']}"]
    if not record_all:
        plan = tmp / "plan.json"
        plan.write_text(json.dumps(make_plan(tests, request.get("known", []), only=True)))
        args += [f"--fastci-plan={plan}", f"--fastci-out={tmp / 'recording.json'}"]
    args += list(request.get("pytest_args", ()))
    return subprocess.run(args, cwd=root, env=scrubbed_environment(), capture_output=True,
                          text=True)


def _read(tmp: Path) -> dict | None:
    out = tmp / "recording.json"
    return json.loads(out.read_text()) if out.exists() else None
