"""What evidence from children and native readers costs while recording.

1. Kernel file events (inotify): records a suite (default examples/tinyllm) in this process
   with the recorder's drains timed, and prints the watches, the drains and their cost per
   test.
2. Children: a torchrun test (`python -m torch.distributed.run --nproc_per_node=2`, gloo on
   the CPU, as in tests/test_children.py), run with plain pytest and with `--fastci-record`,
   alternating, and the overhead of recording it.

    python bench/child_evidence.py [--suite DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TORCHRUN_SUITE = {
    "pyproject.toml": "[project]\nname = 'dp'\nversion = '0'\n",
    "dp/__init__.py": "",
    "dp/dist.py": '''
        def on_rank0(x):
            return x + 1


        def on_every_rank(x):
            return x * 2
    ''',
    "scripts/train.py": '''
        import torch
        import torch.distributed as dist

        from dp.dist import on_every_rank, on_rank0

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        t = torch.tensor([float(on_every_rank(rank))])
        dist.all_reduce(t)
        if rank == 0:
            assert on_rank0(t.item()) == 3.0
        dist.destroy_process_group()
    ''',
    "tests/test_torchrun.py": '''
        import os
        import socket
        import subprocess
        import sys


        def test_torchrun():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = str(s.getsockname()[1])
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                            "--master_port", port, "scripts/train.py"], check=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    ''',
}


def _repo(tmp: Path, files: dict | None = None, suite: str | None = None) -> Path:
    repo = tmp / "suite"
    if suite:
        shutil.copytree(suite, repo, ignore=shutil.ignore_patterns(
            "__pycache__", ".fastci", ".pytest_cache", "changes"))
    for path, text in (files or {}).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(textwrap.dedent(text).lstrip("\n"))
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-q", "-m", "s"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def file_events(suite: str) -> None:
    """Time every drain of the kernel's file events during one recorded run (in-process)."""
    with tempfile.TemporaryDirectory(prefix="fastci-events-") as tmp:
        repo = _repo(Path(tmp), suite=suite)
        code = textwrap.dedent(f"""
            import json, sys, time
            import pytest
            from fastci.runner.record import fileaccess
            from fastci.runner.record.recorder import Recorder

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
            pytest.main(["-q", "-p", "no:cacheprovider", "--fastci-record",
                         "--rootdir={repo}"], plugins=[Count()])
            spent["tests"] = len(tests)
            print("RESULT " + json.dumps(spent))
        """)
        proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True,
                              text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            sys.exit(f"recording failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        import json  # noqa: PLC0415

        r = json.loads(line[0][7:])
        print(f"kernel file events on {Path(suite).name}: {r['watches']} folders watched for "
              f"{r['files']} non-Python files, set up in {r['start'] * 1e3:.2f} ms; "
              f"{r['drains']} drains over {r['tests']} tests took {r['drain'] * 1e3:.2f} ms "
              f"in all, {r['drain'] / max(r['tests'], 1) * 1e6:.0f} us per test")


def torchrun_overhead(repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fastci-torchrun-") as tmp:
        repo = _repo(Path(tmp), files=TORCHRUN_SUITE)
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                f"--rootdir={repo}"]
        runs = {"plain pytest": base, "pytest --fastci-record": base + ["--fastci-record"]}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for i in range(repeat):
            for name, command in runs.items():
                start = time.perf_counter()
                proc = subprocess.run(command, cwd=repo, capture_output=True, text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})
                elapsed = time.perf_counter() - start
                if proc.returncode != 0:
                    sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}")
                times[name].append(elapsed)
                print(f"  run {i + 1}/{repeat} {name:<24} {elapsed:6.1f}s", flush=True)
        plain = statistics.median(times["plain pytest"])
        recorded = statistics.median(times["pytest --fastci-record"])
        print(f"\n{'torchrun test (2 ranks, gloo)':<30}{'median':>9}{'min':>9}{'max':>9}")
        for name, values in times.items():
            print(f"{name:<30}{statistics.median(values):>8.1f}s{min(values):>8.1f}s"
                  f"{max(values):>8.1f}s")
        print(f"\nrecording overhead of the torchrun test: {recorded / plain - 1:+.1%} "
              f"(median {recorded:.1f}s vs {plain:.1f}s, {repeat} alternating runs; the agent "
              "and both ranks record)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    file_events(args.suite)
    torchrun_overhead(args.repeat)


if __name__ == "__main__":
    main()
