"""Where recording's time goes, part by part, on a suite (default examples/tinyllm).

Alternating rounds of four sessions on a copy of the suite in a temporary git repository:
plain pytest; `--fastci-record`; the same with capture for pruning off (`FASTCI_PRUNE=off`:
capture's whole share, by difference); and `--fastci-record` with the recorder's parts timed
(`FASTCI_RECORD_PROFILE`, runner/record/profile.py). Sessions are measured in CPU seconds
(the pytest process's user and system time, every thread), which a shared machine's load
disturbs far less than wall time (printed too). The overhead is recording's median less
plain pytest's; each part's share is its median CPU seconds in the timed sessions (main
thread) over that overhead. The line recorder (coverage.py's tracer, or sys.monitoring's
callbacks) runs inside the test's own code where no timer can sit: its share is what the
timed parts leave. Read the shares, not the seconds.

    python bench/recording_profile.py [--suite DIR] [--repeat 3] [--python PATH]
        [--recorder auto|coverage|sysmon]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recording_overhead import outcome  # bench/ is this script's first sys.path entry

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "FASTCI_RECORD_PROFILE"


def _session(python: str, repo: Path, extra: list[str], env: dict[str, str]
             ) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, pytest's outcome) of one pytest session."""
    for leftover in (".fastci", ".pytest_cache"):
        shutil.rmtree(repo / leftover, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--rootdir={repo}", *extra], cwd=repo, capture_output=True,
                          text=True, env={**os.environ, **env})
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):  # 1: some tests of the suite fail
        sys.exit(f"pytest {' '.join(extra)} failed:\n{proc.stdout[-3000:]}\n"
                 f"{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, outcome(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    ap.add_argument("--recorder", default="auto", choices=["auto", "coverage", "sysmon"])
    args = ap.parse_args()
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    record = {"FASTCI_RECORDER": args.recorder}
    names = ("plain", "record", "record, no capture", "record, timed")
    walls: dict[str, list[float]] = {name: [] for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}  # CPU seconds
    profiles: list[dict] = []
    outcomes: dict[str, str] = {}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="fastci-profile-") as tmp:
        repo = Path(tmp) / "suite"
        shutil.copytree(args.suite, repo, ignore=shutil.ignore_patterns(
            "__pycache__", ".fastci", ".pytest_cache", "changes"))
        for cmd in (["init", "-q"], ["add", "-A"],
                    ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-q", "-m", "s"]):
            subprocess.run(["git", *cmd], cwd=repo, check=True)
        out = Path(tmp) / "profile.json"
        sessions = {"plain": ([], {}), "record": (["--fastci-record"], record),
                    "record, no capture": (["--fastci-record"], {**record,
                                                                 "FASTCI_PRUNE": "off"}),
                    "record, timed": (["--fastci-record"], {**record, PROFILE: str(out)})}
        for i in range(args.repeat):
            for name, (extra, env) in sessions.items():
                elapsed, cpu, result = _session(args.python, repo, extra, env)
                # A session whose tests end otherwise than plain pytest's measured other
                # work (the timers once made torch.compile(fullgraph=True) tests fail).
                expected = outcomes.setdefault("plain", result)
                if result != expected:
                    sys.exit(f"{name}: pytest ended with {result}, plain pytest with "
                             f"{expected}: recording changed the suite's outcome")
                walls[name].append(elapsed)
                times[name].append(cpu)
                if name == "record, timed":
                    profiles.append(json.loads(out.read_text()))
                loads.append(os.getloadavg()[0])
                print(f"  round {i + 1}/{args.repeat} {name:<20} {elapsed:6.1f}s wall "
                      f"{cpu:6.1f}s CPU", flush=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    overhead = median["record"] - median["plain"]
    capture = median["record"] - median["record, no capture"]
    names = sorted({p for prof in profiles for p in prof["parts"]})
    parts = {p: statistics.median(prof["parts"].get(p, {}).get("seconds", 0.0)
                                  for prof in profiles) for p in names}
    calls = {p: max(prof["parts"].get(p, {}).get("calls", 0) for prof in profiles)
             for p in names}
    print(f"\nPython {version}, recorder {args.recorder}, suite {Path(args.suite).name}, "
          f"{args.repeat} alternating rounds; load average {min(loads):.1f} to "
          f"{max(loads):.1f}")
    for name, value in median.items():
        rounds = ", ".join(f"{v:.1f}" for v in times[name])
        print(f"  {name:<20} CPU median {value:6.1f}s ({rounds}); "
              f"wall median {statistics.median(walls[name]):6.1f}s")
    wall = statistics.median(walls["record"]) / statistics.median(walls["plain"]) - 1
    print(f"  overhead: {overhead:.1f} CPU s ({overhead / median['plain']:+.1%} over plain; "
          f"wall {wall:+.1%}); the timers' own cost: "
          f"{median['record, timed'] - median['record']:+.1f} CPU s")
    print(f"\n{'part':<40}{'calls':>10}{'share of the overhead':>24}")
    timed = 0.0
    for name in sorted(names, key=lambda p: -parts[p]):
        timed += parts[name]
        print(f"{name:<40}{calls[name]:>10}{parts[name] / overhead:>23.1%}")
    captured = sum(v for p, v in parts.items() if p.startswith("capture:"))
    print(f"{'line recorder, and what no timer sees':<40}{'':>10}"
          f"{(overhead - timed) / overhead:>23.1%}")
    print(f"\ncapture (module calls for pruning): {captured / overhead:.1%} of the overhead by "
          f"its timers, {capture / overhead:.1%} by difference (no capture: "
          f"{median['record, no capture']:.1f} CPU s)")


if __name__ == "__main__":
    main()
