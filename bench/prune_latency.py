"""What pruning adds to a selection, cold and warm, on examples/tinyllm.

Records tinyllm once, applies its `refactor_identical` change (a bit-identical refactor of
attention, which pruning can prove), and times `fastci select` three ways, alternated in
one run: without pruning (`--no-prune`), pruning with cold replay processes
(FASTCI_WARM_REPLAYS=0: each replay a fresh interpreter importing torch), and pruning with
warm replays (forks of a zygote that imported torch once; started by an untimed first run).
The store's cached replays are dropped before each pruning run, so every run replays both
the evidence's code and the new code. Prints medians and the worst run (p99 at this count).

    python bench/prune_latency.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINYLLM = ROOT / "examples" / "tinyllm"


def run(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=cwd, env=env, check=True, capture_output=True,
                          text=True)


def setup(tmp: Path) -> tuple[Path, Path]:
    repo = tmp / "tinyllm"
    shutil.copytree(TINYLLM, repo, ignore=shutil.ignore_patterns(".fastci", "__pycache__"))
    run(repo, "git", "init", "-q", "-b", "main")
    run(repo, "git", "-c", "user.email=b@fastci.invalid", "-c", "user.name=bench", "add", "-A")
    run(repo, "git", "-c", "user.email=b@fastci.invalid", "-c", "user.name=bench", "commit",
        "-qm", "base")
    store = tmp / "evidence.db"
    run(repo, sys.executable, "-m", "fastci", "record", "-q", "--store", str(store), "--",
        "-q", "-p", "no:cacheprovider")
    run(repo, "git", "apply", str(TINYLLM / "changes" / "refactor_identical.patch"))
    return repo, store


def select(repo: Path, store: Path, env: dict, *extra: str) -> tuple[float, str]:
    """Seconds for `fastci select`, and what it decided (selected, pruned)."""
    started = time.perf_counter()
    out = run(repo, sys.executable, "-m", "fastci", "select", "-q", "--format", "json",
              "--store", str(store), *extra, env=env).stdout
    seconds = time.perf_counter() - started
    summary = json.loads(out)["summary"]
    return seconds, f"{summary['selected']} selected, {summary['pruned']} pruned"


def forget_replays(store: Path) -> None:
    with sqlite3.connect(store) as db:
        db.execute("DELETE FROM replays")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from fastci.runner.prune import zygote

    with tempfile.TemporaryDirectory(prefix="fastci-prune-bench-") as name:
        tmp = Path(name)
        sockets = Path(tempfile.mkdtemp(prefix="fz-"))
        base = {**os.environ, "XDG_RUNTIME_DIR": str(sockets), "FASTCI_ZYGOTE_IDLE": "120"}
        modes = {"no pruning": ({**base}, ("--no-prune",)),
                 "pruning, cold replays": ({**base, "FASTCI_WARM_REPLAYS": "0"}, ()),
                 "pruning, warm replays": ({**base, "FASTCI_WARM_REPLAYS": "1"}, ())}
        try:
            repo, store = setup(tmp)
            forget_replays(store)
            first, _ = select(repo, store, modes["pruning, warm replays"][0])  # starts it
            times: dict[str, list[float]] = {m: [] for m in modes}
            summary = {}
            for _ in range(args.repeat):
                for mode, (env, extra) in modes.items():
                    forget_replays(store)
                    seconds, line = select(repo, store, env, *extra)
                    times[mode].append(seconds)
                    summary[mode] = line
        finally:
            for sock in sockets.glob("*/*.sock"):
                zygote.stop(sock)
            shutil.rmtree(sockets, ignore_errors=True)
    plain = statistics.median(times["no pruning"])
    print(f"tinyllm, refactor_identical, {args.repeat} runs each, alternated "
          f"(first warm run, starting the zygote: {first:.2f} s)\n")
    print(f"| {'mode':<24} | median s | worst s | added by pruning (median) | selection |")
    print(f"| {'-' * 24} | ---: | ---: | ---: | --- |")
    for mode, values in times.items():
        median = statistics.median(values)
        print(f"| {mode:<24} | {median:.2f} | {max(values):.2f} | {median - plain:+.2f} s | "
              f"{summary[mode]} |")


if __name__ == "__main__":
    main()
