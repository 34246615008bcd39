"""Test shards: splitting a selection over GPU workers, and the job that runs one shard.

`split` is pure: longest expected duration first onto the least-loaded shard (LPT), each
shard keeping the selection's risk order. `run_shard` is the RQ job a GPU worker runs: it
downloads the git bundle the selection side published for the job (`fetch.download`, by a
signed URL that expires; no mirror, no credential, no store, no shared folder travel in the
job), checks the commit out of it, runs its tests through pytest with FastCI
recording, as the sandbox user with an allowlisted environment, and returns what pytest
recorded as JSON. It knows nothing of GitHub.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastci.runner.errors import RunError
from fastci.runner.execution import fetch, flaky
from fastci.runner.execution.sandbox import Sandbox
from fastci.runner.git import GitError
from fastci.runner.selection.plan import make_plan
from fastci.runner.selection.report import Decision

# Never handed to a test process: GitHub credentials, the App's key, the webhook secret.
SCRUBBED_PREFIXES = ("GITHUB_", "GH_", "FASTCI_APP_", "FASTCI_WEBHOOK_", "ACTIONS_")
SCRUBBED_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PRIVATE_KEY")
SHA = re.compile(r"[0-9a-f]{40}\Z")
MAX_RECORDING_BYTES = 64 * 2**20
MAX_CAPTURES_RETURNED = 256 * 2**20  # bytes of module captures one shard sends back
CAPTURE_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
MAX_BUNDLE_BYTES = 8 * 2**30  # a whole history of a large repository, with room to spare


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


def runner_dir() -> Path:
    """Where a runner keeps its jobs' folders: FASTCI_RUNNER_DIR, else a folder of the
    worker's in the temporary directory. Mode 0711: the sandbox reaches its own job's folder
    by name, and can list no other."""
    path = Path(os.environ.get("FASTCI_RUNNER_DIR")
                or Path(tempfile.gettempdir()) / f"fastci-runner-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o711)
    return path


def checkout(sandbox: Sandbox, bundle: Path, sha: str, home: Path) -> Path:
    """`sha` checked out of a git bundle into `home`/tree, by the sandbox user: the checkout
    is the sandbox's, and no hook in it ever runs as the worker (hooks are off as well)."""
    if not SHA.match(str(sha)):
        raise GitError(f"not a commit id: {str(sha)[:60]!r}")
    tree = home / "tree"
    for args in (["init", "-q", "--", str(tree)],
                 ["-C", str(tree), "fetch", "-q", "--no-tags", "--", str(bundle),
                  "+refs/*:refs/bundle/*"],
                 ["-C", str(tree), "checkout", "-q", "--detach", sha]):
        proc = sandbox.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=home,
                           home=home)
        if proc.returncode != 0:
            command = args[2 if args[0] == "-C" else 0]
            raise GitError(f"git {command} failed: {proc.stderr.strip()[-300:]}")
    return tree


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
    """Run one shard. request: bundle_url (an http(s) URL of a git bundle holding the
    commit), sha, tests (ids in order), known (every id the plan may see), and optionally
    pytest_args, record_all, capture_budget_mb (the trusted base's, which overrides the
    commit's own configuration) and uncaptured (the tests whose calls are not captured for
    pruning, and the others' capture allowance: {"below": seconds, "tests": ids,
    "allowance": {id: seconds}}).

    pytest runs in the sandbox (`sandbox.py`) and records into a scratch store in the job's
    folder, never the shared one; what it recorded comes back as JSON, which the selection
    side validates and stores. A test that fails is run once more before it counts: if it
    passes then, it is flaky (listed in `flaky`, its passing record kept, its first failure in
    `flaky_failures`)."""
    started = time.time()
    sandbox = Sandbox.from_env()
    url = request.get("bundle_url")
    if url is None:
        raise RunError("the shard's request carries no bundle_url: a runner takes its "
                       "commit only from an http(s) URL, never from a path")
    with job_folder(sandbox, "job-", url, "commit.bundle", MAX_BUNDLE_BYTES) as (job, home):
        root = checkout(sandbox, job / "commit.bundle", request["sha"], home)
        if request.get("record_all"):
            proc = _pytest(sandbox, root, job, home, request, None, "all")
            recording, problem = _read(home, "all")
            return {"sha": request["sha"], "exit_code": proc.returncode,
                    "recording": recording, "problem": problem,
                    "captures": _captures(home, ["all"], recording),
                    "output_tail": (proc.stdout + proc.stderr)[-4000:],
                    "seconds": time.time() - started, "worker_pid": os.getpid()}
        proc = _pytest(sandbox, root, job, home, request, request["tests"], "first")
        recording, problem = _read(home, "first")
        flaky_failures: dict = {}
        failed = flaky.failed_ids(recording)
        if recording is not None and failed:
            _pytest(sandbox, root, job, home, request, failed, "again")
            recording, flaky_failures = flaky.confirm(recording, _read(home, "again")[0])
        captured = _captures(home, ["first", "again"], recording)
    return {"sha": request["sha"], "exit_code": proc.returncode, "recording": recording,
            "problem": problem, "captures": captured, "flaky": sorted(flaky_failures),
            "flaky_failures": flaky_failures,
            "output_tail": (proc.stdout + proc.stderr)[-4000:],
            "seconds": time.time() - started, "worker_pid": os.getpid()}


@contextmanager
def job_folder(sandbox: Sandbox, prefix: str, url: str, name: str, max_bytes: int
               ) -> Iterator[tuple[Path, Path]]:
    """A runner job's folder (job, home): `url` downloaded into job/`name`, readable by the
    sandbox, and home/ the sandbox's to write in; removed when the job ends, however it
    ends. Marks the job as running here, so a dead worker is noticed."""
    _mark_running()
    job = Path(tempfile.mkdtemp(prefix=prefix, dir=runner_dir()))
    os.chmod(job, 0o755)
    home = job / "work"
    try:
        fetch.download(fetch.check_url(url), job / name, max_bytes)
        os.chmod(job / name, 0o644)  # the sandbox user reads it
        home.mkdir()
        sandbox.give(home)
        yield job, home
    finally:
        _clean(sandbox, job, home)


def pause(seconds: float) -> None:
    """A job that only waits (at most a minute): what `bench/scale.py` measures queues with."""
    time.sleep(max(0.0, min(float(seconds), 60.0)))


def _pytest(sandbox: Sandbox, root: Path, job: Path, home: Path, request: dict,
            tests: list[str] | None, name: str) -> subprocess.CompletedProcess:
    """pytest in the sandbox, recording into a scratch store in `home`; with `tests` None,
    the whole suite."""
    args = [sys.executable, "-m", "pytest", f"--rootdir={root}", "-p", "no:cacheprovider",
            "--fastci-record", f"--fastci-store={home / f'scratch-{name}.db'}",
            f"--fastci-out={home / f'{name}.json'}"]
    if tests is not None:
        plan = job / f"plan-{name}.json"
        plan.write_text(json.dumps(make_plan(tests, request.get("known", []), only=True)))
        os.chmod(plan, 0o644)
        args.append(f"--fastci-plan={plan}")
    budget = request.get("capture_budget_mb")
    if budget is not None:  # the trusted base's: on the command line, it beats the head's file
        args.append(f"--fastci-capture-budget-mb={float(budget)!r}")
    if request.get("uncaptured"):  # from the selection side's store: scratch has no durations
        uncaptured = job / f"uncaptured-{name}.json"
        uncaptured.write_text(json.dumps(request["uncaptured"]))
        os.chmod(uncaptured, 0o644)
        args.append(f"--fastci-uncaptured={uncaptured}")
    args += list(request.get("pytest_args", ()))
    return sandbox.run(args, cwd=root, home=home)


def _read(home: Path, name: str) -> tuple[dict | None, str | None]:
    """The recording pytest wrote (None, with the reason, when there is none to use)."""
    out = home / f"{name}.json"
    try:
        size = out.stat().st_size
        if size > MAX_RECORDING_BYTES:
            return None, f"the recording is {size} bytes, over {MAX_RECORDING_BYTES}"
        return json.loads(out.read_text()), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"the recording cannot be read: {exc}"[:300]


def _captures(home: Path, names: list[str], recording: dict | None) -> dict[str, str]:
    """The module captures the recording's tests kept, read out of the scratch stores as
    bytes (base64: they travel in JSON; nothing here loads a pickle), up to
    MAX_CAPTURES_RETURNED in all. What stays behind is missing on the trusted side, and
    pruning keeps the tests that would need it."""
    wanted: set[str] = set()
    for test in (recording or {}).get("tests") or []:
        modules = test.get("modules") if isinstance(test, dict) else None
        for capture in (modules.get("captures") or []) if isinstance(modules, dict) else []:
            digest = capture.get("digest") if isinstance(capture, dict) else None
            if isinstance(digest, str) and CAPTURE_DIGEST.match(digest):
                wanted.add(digest)
    out: dict[str, str] = {}
    total = 0
    for name in names:
        for digest, data in _scratch_captures(home / f"scratch-{name}.db",
                                              sorted(wanted - out.keys())):
            if total + len(data) <= MAX_CAPTURES_RETURNED:
                out[digest] = base64.b64encode(data).decode()
                total += len(data)
    return out


def _scratch_captures(path: Path, digests: list[str]) -> list[tuple[str, bytes]]:
    """(digest, bytes) found in a scratch store the sandbox wrote: opened read-only, never
    through a link the sandbox left in its place; a store that cannot be read gives none."""
    if not digests:
        return []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        db = sqlite3.connect(f"file:/proc/self/fd/{fd}?mode=ro&immutable=1", uri=True)
        try:
            marks = ",".join("?" * len(digests))
            return [(str(d), bytes(b)) for d, b in db.execute(
                f"SELECT digest, data FROM captures WHERE digest IN ({marks})", digests)]
        finally:
            db.close()
    except sqlite3.Error:
        return []
    finally:
        os.close(fd)


def _clean(sandbox: Sandbox, job: Path, home: Path) -> None:
    """Remove the job's folder; what the sandbox wrote there, the sandbox removes."""
    if sandbox.user is not None and home.exists():
        try:
            sandbox.run(["rm", "-rf", "--", str(home)], cwd=job, home=home, timeout=300)
        except (OSError, subprocess.SubprocessError):
            pass
    shutil.rmtree(job, ignore_errors=True)
