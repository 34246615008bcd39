"""What evidence from children and native readers costs while recording, and what it holds.

On a copy of examples/tinyllm (or `--suite DIR`) in a temporary git repository:

1. Kernel file events (inotify): records the suite in this process's child with the
   recorder's drains timed, and prints the watches, the drains and their cost per test.
2. Children's evidence: from that recording, every test whose evidence came (in part) from
   child processes: its blocks, how many of them ran in children, the process groups
   (ranks) it joined, the kernels it launched and the files it read.
3. A torchrun test (default tinyllm's `tests/test_distributed.py`, two ranks under
   `python -m torch.distributed.run`, gloo on the CPU) run alone with plain pytest and with
   `--fastci-record`, alternating `--repeat` times: the process's wall time and the test's
   own duration (pytest's junit report), medians, and the load average around the runs.

    python bench/child_evidence.py [--suite DIR] [--test NODE_ID] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN_TEST = "tests/test_distributed.py::test_data_parallel_training_matches_golden"
PYTEST = ["-q", "-p", "no:cacheprovider"]


def _repo(tmp: Path, suite: str) -> Path:
    repo = tmp / "suite"
    shutil.copytree(suite, repo, ignore=shutil.ignore_patterns(
        "__pycache__", ".fastci", ".pytest_cache", "changes"))
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-q", "-m", "s"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def file_events(repo: Path) -> None:
    """Time every drain of the kernel's file events during one recorded run (in-process)."""
    code = textwrap.dedent(f"""
        import json, sys, time
        import pytest
        from fastci.runner.record import fileaccess

        spent = {{"drain": 0.0, "drains": 0, "start": 0.0, "watches": 0, "files": 0}}
        drain, start = fileaccess.FileEvents.drain, fileaccess.FileEvents.start

        def timed_drain(self):
            t = time.perf_counter()
            try:
                return drain(self)
            finally:
                spent["drain"] += time.perf_counter() - t
                spent["drains"] += 1

        def timed_start(self):
            t = time.perf_counter()
            try:
                return start(self)
            finally:
                spent["start"] += time.perf_counter() - t
                spent["watches"] = len(self.folders)
                spent["files"] = len(self.files)

        fileaccess.FileEvents.drain, fileaccess.FileEvents.start = timed_drain, timed_start
        tests = []
        class Count:
            def pytest_runtest_logfinish(self, nodeid):
                tests.append(nodeid)
        pytest.main({PYTEST + ["--fastci-record", f"--rootdir={repo}"]!r}, plugins=[Count()])
        spent["tests"] = len(tests)
        print("RESULT " + json.dumps(spent))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True,
                          text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not line:
        sys.exit(f"recording failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    r = json.loads(line[0][7:])
    print(f"kernel file events on {repo.name}: {r['watches']} folders watched for "
          f"{r['files']} non-Python files, set up in {r['start'] * 1e3:.2f} ms; "
          f"{r['drains']} drains over {r['tests']} tests took {r['drain'] * 1e3:.2f} ms "
          f"in all, {r['drain'] / max(r['tests'], 1) * 1e6:.0f} us per test")


def children_evidence(repo: Path) -> None:
    """The tests whose evidence holds children's blocks, from the recording `file_events`
    made."""
    from fastci.runner.store import open_store

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, text=True,
                          capture_output=True, check=True).stdout.strip()
    with open_store(str(repo / ".fastci" / "evidence.db"), create=False) as store:
        key, _ = store.snapshot_envs(head)[0]
        snap = store.load_snapshot(head, key)
    assert snap is not None
    rows = [t for t in snap.tests.values() if t.child_blocks or t.ranks]
    head = "test (evidence from children)"
    print(f"\n{head:<72}{'blocks':>7}{'in children':>12}{'ranks':>9}{'kernels':>8}{'files':>6}")
    for t in sorted(rows, key=lambda t: t.test_id):
        blocks = sum(len(q) for q in t.blocks.values())
        child = sum(len(q) for q in t.child_blocks.values())
        print(f"{t.test_id[:71]:<72}{blocks:>7}{child:>12}{','.join(t.ranks) or '-':>9}"
              f"{len(t.kernels):>8}{len(t.files):>6}")
    native = [t.test_id for t in snap.tests.values() if t.file_events and any(
        p.endswith((".f32", ".bin", ".safetensors", ".model")) for p in t.files)]
    print(f"tests that read a binary asset (seen through the kernel's file events): "
          f"{', '.join(sorted(native)) or 'none'}")


def _run(repo: Path, test: str, record: bool, report: Path) -> tuple[float, float]:
    command = [sys.executable, "-m", "pytest", *PYTEST, f"--rootdir={repo}",
               f"--junitxml={report}", test] + (["--fastci-record"] if record else [])
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}")
    (case,) = ET.parse(report).getroot().iter("testcase")
    return wall, float(case.get("time"))


def torchrun_overhead(repo: Path, test: str, repeat: int) -> None:
    names = {False: "plain pytest", True: "pytest --fastci-record"}
    walls: dict[bool, list[float]] = {False: [], True: []}
    calls: dict[bool, list[float]] = {False: [], True: []}
    loads = [_load()]
    for i in range(repeat):
        for record in (False, True):
            wall, call = _run(repo, test, record, repo.parent / "report.xml")
            walls[record].append(wall)
            calls[record].append(call)
            loads.append(_load())
            print(f"  run {i + 1}/{repeat} {names[record]:<24} {wall:6.1f}s process, "
                  f"{call:6.1f}s test (load {loads[-1]})", flush=True)
    print(f"\n{test}")
    print(f"{'':<26}{'process median':>15}{'min':>8}{'max':>8}{'test median':>13}")
    for record in (False, True):
        w, c = walls[record], calls[record]
        print(f"{names[record]:<26}{statistics.median(w):>14.1f}s{min(w):>7.1f}s"
              f"{max(w):>7.1f}s{statistics.median(c):>12.1f}s")
    plain, recorded = statistics.median(calls[False]), statistics.median(calls[True])
    process = statistics.median(walls[True]) / statistics.median(walls[False]) - 1
    print(f"\nrecording overhead of the test: {recorded / plain - 1:+.1%} (median "
          f"{recorded:.1f}s vs {plain:.1f}s, {repeat} alternating runs; the agent and both "
          f"ranks record); of the whole pytest process: {process:+.1%}; load average "
          f"(1/5/15 min) from {loads[0]} to {loads[-1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--test", default=TORCHRUN_TEST, help="the torchrun test to time")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastci-children-") as tmp:
        repo = _repo(Path(tmp), args.suite)
        file_events(repo)
        children_evidence(repo)
        torchrun_overhead(repo, args.test, args.repeat)


if __name__ == "__main__":
    main()
