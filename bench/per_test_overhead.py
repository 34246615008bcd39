"""Where recording's overhead lands, test by test: each test's own duration (pytest's
junit XML) with plain pytest, `--fastci-record`, recording with capture off
(`FASTCI_PRUNE=off`) and pytest-testmon when installed, in alternating rounds on a copy of
the suite in a temporary git repository. Two untimed recordings seed the store first, so
the recordings are a push's, not a repository's first (recording_overhead.py's steady
state). Prints each mode's wall median, the sum of the tests' own durations (what is left
of the wall is collection, start-up and the session's end), and the tests that gained most.

    python bench/per_test_overhead.py [--suite DIR] [--python PY] [--repeat 2] [--top 15]
        [--env K=V ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]


def modes(python: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (pytest arguments, extra environment)."""
    out = {"plain": (BASE, {}), "record": (BASE + ["--fastci-record"], {}),
           "no capture": (BASE + ["--fastci-record"], {"FASTCI_PRUNE": "off"})}
    if subprocess.run([python, "-c", "import testmon"], capture_output=True).returncode == 0:
        out["testmon"] = (["-m", "pytest", "-q", "--testmon-noselect"], {})
    return out


def run(python: str, repo: Path, args: list[str], env: dict[str, str], xml: Path
        ) -> tuple[float, dict[str, float]]:
    """Wall seconds, and each test's own duration."""
    started = time.perf_counter()
    subprocess.run([python, *args, f"--junitxml={xml}"], cwd=repo, env=env,
                   capture_output=True)
    wall = time.perf_counter() - started
    tests = {f"{case.get('classname')}::{case.get('name')}": float(case.get("time") or 0)
             for case in ET.parse(xml).iter("testcase")}
    return wall, tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--env", action="append", default=[], metavar="K=V")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="fastci-per-test-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(args.suite, repo, ignore=shutil.ignore_patterns(".fastci", ".git"))
        for cmd in (["init", "-q"], ["add", "-A"],
                    ["-c", "user.email=bench@fastci", "-c", "user.name=bench", "commit", "-qm",
                     "suite"]):
            subprocess.run(["git", *cmd], cwd=repo, check=True)
        base_env = dict(os.environ, **extra)
        which = modes(args.python)
        for _ in range(2):
            run(args.python, repo, which["record"][0], base_env, Path(tmp) / "seed.xml")
        walls: dict[str, list[float]] = defaultdict(list)
        tests: dict[str, list[dict[str, float]]] = defaultdict(list)
        for round_ in range(args.repeat):
            for name, (pytest_args, env) in which.items():
                wall, durations = run(args.python, repo, pytest_args, dict(base_env, **env),
                                      Path(tmp) / f"{round_}.xml")
                walls[name].append(wall)
                tests[name].append(durations)
                print(f"  round {round_ + 1}/{args.repeat} {name:12s} {wall:6.1f}s", flush=True)
    ids = sorted(set().union(*(set(d) for d in tests["plain"])))
    median = {name: {t: statistics.median(r.get(t, 0.0) for r in runs) for t in ids}
              for name, runs in tests.items()}
    plain_wall = statistics.median(walls["plain"])
    plain_sum = sum(median["plain"].values())
    print(f"\n{len(ids)} tests, {args.repeat} alternating rounds, medians")
    print(f"{'mode':12s} {'wall':>8s} {'over plain':>11s} {'tests own':>10s} "
          f"{'over plain':>11s} {'rest':>7s}")
    for name in which:
        wall = statistics.median(walls[name])
        own = sum(median[name].values())
        print(f"{name:12s} {wall:7.1f}s {100 * (wall - plain_wall) / plain_wall:+10.1f}% "
              f"{own:9.1f}s {own - plain_sum:+10.2f}s {wall - own:6.1f}s")
    others = [n for n in which if n != "plain"]
    print(f"\nthe {args.top} tests that gained most recorded (seconds over plain)")
    print(" ".join(f"{n:>11s}" for n in others) + f" {'plain':>8s}  test")
    gained = sorted(ids, key=lambda t: median["record"][t] - median["plain"][t], reverse=True)
    for test in gained[:args.top]:
        cells = " ".join(f"{median[n][test] - median['plain'][test]:+11.3f}" for n in others)
        print(f"{cells} {median['plain'][test]:7.3f}s  {test}")


if __name__ == "__main__":
    main()
