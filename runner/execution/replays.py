"""The runner job that replays captured module calls for the App's pruning, in the sandbox.

Replaying a capture runs the change's code (and unpickles a capture a test process wrote), so
on the App's side it happens here, on a runner, as the sandbox user with the allowlisted
environment, exactly like a test shard, and never on the selection worker that holds the
App's key. The job gets a replay pack (`fastci.runner.prune.replayers.pack`: the trees and
captures the selection side wrote out of git and the store) and the steps to run in it;
it returns each replay's JSON output, which the selection side validates before comparing
fingerprints. It knows nothing of GitHub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastci.runner.errors import RunError
from fastci.runner.execution.sandbox import Sandbox
from fastci.runner.execution.shard import job_folder
from fastci.runner.prune.replayers import REPLAY_TIMEOUT, ReplayItem, items_from, read_output

MAX_PACK_BYTES = 1024 * 2**20


def run_replays(request: dict) -> dict:
    """request: pack_url (a signed URL of the replay pack), steps (as `pack` returned them).
    Returns
    {"outputs": {item name: replay.py's output}, "seconds": ...}."""
    started = time.time()
    sandbox = Sandbox.from_env()
    url = request.get("pack_url")
    if not isinstance(url, str):
        raise RunError("the replay request carries no pack_url: a runner takes its files "
                       "only by a signed http(s) URL")
    with job_folder(sandbox, "replay-", url, "replays.tar.gz", MAX_PACK_BYTES) as (job, home):
        base = home / "pack"
        unpacked = sandbox.run(["sh", "-c", 'mkdir -p "$1" && tar -xzf "$2" -C "$1" '
                                '--no-same-owner --no-same-permissions', "sh", str(base),
                                str(job / "replays.tar.gz")], cwd=home, home=home, timeout=600)
        if unpacked.returncode != 0:
            raise RunError(f"the replay pack cannot be unpacked: "
                           f"{unpacked.stderr.strip()[-300:]}")
        try:
            steps = items_from(request["steps"], base)
        except (KeyError, TypeError, ValueError) as exc:
            raise RunError(f"the replay request is malformed: {exc}"[:300]) from None
        outputs: dict[str, dict] = {}
        for step in steps:
            for item in step:  # the sandbox user writes its tensors and results here
                for folder in (item.save, item.compare):
                    if folder is not None:
                        sandbox.run(["mkdir", "-p", str(folder)], cwd=home, home=home)
            with ThreadPoolExecutor(max_workers=max(1, len(step))) as pool:
                done = pool.map(lambda item: (item.name, _replay(sandbox, job, home, base, item)),
                                step)
                outputs.update(done)
    return {"outputs": outputs, "seconds": time.time() - started, "worker_pid": os.getpid()}


def _replay(sandbox: Sandbox, job: Path, home: Path, base: Path, item: ReplayItem) -> dict:
    """One replay process in the sandbox; its output, or a per-capture error."""
    out = base / f"{item.name}.json"
    request_file = job / f"{item.name}-request.json"  # the worker's, readable by the sandbox
    request_file.write_text(json.dumps(item.request(out)))
    os.chmod(request_file, 0o644)
    try:
        proc = sandbox.run([sys.executable, "-m", "fastci.runner.prune.replay",
                            str(request_file)], cwd=item.root, home=home,
                           timeout=REPLAY_TIMEOUT,
                           setenv={**item.env, "PYTHONDONTWRITEBYTECODE": "1"})
    except subprocess.TimeoutExpired:
        return item.failed(f"the replay took over {REPLAY_TIMEOUT} s")
    return read_output(item, proc.returncode, proc.stdout + proc.stderr, out)
