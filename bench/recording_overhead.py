"""Recording overhead: the same suite with plain pytest and with `--fastci-record`.

Runs the suite alternately with and without recording (so machine noise hits both alike)
and prints medians and the overhead. Default subject: examples/tinyllm, copied into a
temporary git repository.

    python bench/recording_overhead.py [--suite DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastci-overhead-") as tmp:
        repo = Path(tmp) / "suite"
        shutil.copytree(args.suite, repo, ignore=shutil.ignore_patterns(
            "__pycache__", ".fastci", ".pytest_cache", "changes"))
        for cmd in (["init", "-q"], ["add", "-A"],
                    ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-q", "-m", "s"]):
            subprocess.run(["git", *cmd], cwd=repo, check=True)
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                f"--rootdir={repo}"]
        runs = {"plain pytest": base, "pytest --fastci-record": base + ["--fastci-record"]}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for i in range(args.repeat):
            for name, command in runs.items():
                start = time.perf_counter()
                proc = subprocess.run(command, cwd=repo, capture_output=True, text=True)
                elapsed = time.perf_counter() - start
                if proc.returncode != 0:
                    sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}")
                times[name].append(elapsed)
                print(f"  run {i + 1}/{args.repeat} {name:<24} {elapsed:6.1f}s", flush=True)
        plain = statistics.median(times["plain pytest"])
        recorded = statistics.median(times["pytest --fastci-record"])
        print(f"\n{'mode':<26}{'median':>9}{'min':>9}{'max':>9}")
        for name, values in times.items():
            print(f"{name:<26}{statistics.median(values):>8.1f}s{min(values):>8.1f}s"
                  f"{max(values):>8.1f}s")
        print(f"\nrecording overhead: {recorded / plain - 1:+.1%} "
              f"(median {recorded:.1f}s vs {plain:.1f}s, {args.repeat} alternating runs, "
              f"suite {Path(args.suite).name})")


if __name__ == "__main__":
    main()
