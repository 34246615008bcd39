"""Recording overhead: the same suite with plain pytest and with `--fastci-record`.

Runs the suite in every mode once per round, rounds alternating (so machine noise hits all
modes alike), and prints medians and each mode's overhead over plain pytest. Modes: plain
pytest; recording with each line recorder the interpreter has (`coverage`, and `sysmon` on
Python 3.12+); recording with capture for pruning off (`--capture-off`: capture's share);
pytest-testmon when it is installed in that interpreter. Default subject: examples/tinyllm,
copied into a temporary git repository; `--suite` takes any folder with a pytest suite,
`--pytest-args` what it needs (a test path, `-x`, ...). `--sdist NAME==VERSION` measures a
real-world suite from PyPI instead: the project's source distribution (which, unlike its
wheel, holds its tests) is downloaded from the package index and its own tests run from
there, against the installed package of the same version; `--env K=V` sets what such a suite
needs (einops: `EINOPS_TEST_BACKENDS=numpy,torch`).

Each recording starts from a store that two untimed recordings left, as every push after a
repository's first does: the store knows each test's duration, and a test faster than
capture_min_seconds is recorded without capture. `--first` records into an empty store
instead (a repository's first recording, which captures every test).

    python bench/recording_overhead.py [--suite DIR | --sdist NAME==VERSION] [--repeat 3]
        [--python PATH] [--capture-off] [--pytest-args "..."] [--env K=V ...]
        [--only sysmon testmon] [--first]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _has(python: str, code: str) -> bool:
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def modes(python: str, capture_off: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (extra pytest arguments, extra environment)."""
    out: dict[str, tuple[list[str], dict[str, str]]] = {"plain pytest": ([], {})}
    recorders = ["coverage"]
    if _has(python, "import sys; sys.exit(not hasattr(sys, 'monitoring'))"):
        recorders.append("sysmon")
    for recorder in recorders:
        out[f"record ({recorder})"] = (["--fastci-record"], {"FASTCI_RECORDER": recorder})
        if capture_off:
            out[f"record ({recorder}, no capture)"] = (
                ["--fastci-record"], {"FASTCI_RECORDER": recorder, "FASTCI_PRUNE": "off"})
    if _has(python, "import testmon"):
        out["pytest-testmon"] = (["--testmon"], {})  # it needs pytest's cache provider
    return out


def seed(base: list[str], repo: Path, into: Path, env: dict[str, str]) -> Path:
    """A store as the previous pushes left it: two recordings (untimed), so each test's
    duration is known, as the steady state has it (capture_min_seconds needs them)."""
    for _ in range(2):
        proc = subprocess.run(base + ["-p", "no:cacheprovider", "--fastci-record"], cwd=repo,
                              capture_output=True, text=True, env=env)
        if proc.returncode not in (0, 1):
            sys.exit(f"seeding the store failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    shutil.move(repo / ".fastci", into)
    return into


def fetch_sdist(requirement: str, python: str, into: Path) -> Path:
    """The unpacked source distribution of `requirement`, from the configured package index."""
    subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "-d", str(into), requirement], check=True)
    archives = [p for p in into.iterdir() if p.name.endswith((".tar.gz", ".zip"))]
    if len(archives) != 1:
        sys.exit(f"expected one source archive for {requirement}, found {archives}")
    shutil.unpack_archive(str(archives[0]), str(into / "unpacked"))
    (root,) = (into / "unpacked").iterdir()
    return root


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def outcome(stdout: str) -> str:
    """pytest's summary counts ("62 passed, 4 skipped"), without the time it took."""
    lines = [line for line in stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    if not lines:
        return "no summary"
    counts = re.findall(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed)",
                        lines[-1])
    return ", ".join(f"{n} {what}" for n, what in counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    ap.add_argument("--capture-off", action="store_true",
                    help="also record with capture for pruning off (FASTCI_PRUNE=off)")
    ap.add_argument("--pytest-args", default="", help="more pytest arguments (one string)")
    ap.add_argument("--sdist", metavar="NAME==VERSION",
                    help="measure this PyPI project's own test suite (from its sdist)")
    ap.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                    help="measure only the modes whose name holds one of these (and plain)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="environment the suite needs (repeatable)")
    ap.add_argument("--first", action="store_true",
                    help="record into an empty store each round (a repository's first "
                         "recording), not into one that holds the previous recordings")
    args = ap.parse_args()
    suite_env = dict(item.split("=", 1) for item in args.env)
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="fastci-overhead-") as tmp:
        if args.sdist:
            args.suite = str(fetch_sdist(args.sdist, args.python, Path(tmp) / "sdist"))
        repo = Path(tmp) / "suite"
        shutil.copytree(args.suite, repo, ignore=shutil.ignore_patterns(
            "__pycache__", ".fastci", ".pytest_cache", "changes", ".testmondata*"))
        for cmd in (["init", "-q"], ["add", "-A"],
                    ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-q", "-m", "s"]):
            subprocess.run(["git", *cmd], cwd=repo, check=True)
        base = [args.python, "-m", "pytest", "-q", f"--rootdir={repo}",
                *shlex.split(args.pytest_args)]
        runs = modes(args.python, args.capture_off)
        runs = {k: v for k, v in runs.items()
                if k == "plain pytest" or not args.only or any(o in k for o in args.only)}
        seeded = None if args.first else seed(base, repo, Path(tmp) / "seeded",
                                              {**os.environ, **suite_env})
        times: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        outcomes: dict[str, str] = {}
        for i in range(args.repeat):
            for name, (extra, env) in runs.items():
                for leftover in (".fastci", ".testmondata", ".pytest_cache"):
                    path = repo / leftover
                    if path.is_dir():
                        shutil.rmtree(path)
                    elif path.exists():
                        path.unlink()
                if seeded is not None and "--fastci-record" in extra:
                    shutil.copytree(seeded, repo / ".fastci")
                start, before = time.perf_counter(), _children_cpu()
                cache = [] if "--testmon" in extra else ["-p", "no:cacheprovider"]
                proc = subprocess.run(base + cache + extra, cwd=repo, capture_output=True,
                                      text=True, env={**os.environ, **suite_env, **env})
                elapsed, cpu_seconds = time.perf_counter() - start, _children_cpu() - before
                if proc.returncode not in (0, 1):  # 1: some tests of the suite fail
                    sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
                # Every mode must end as plain pytest did, or it measured other work.
                result = outcome(proc.stdout)
                expected = outcomes.setdefault("plain", result)
                if result != expected:
                    sys.exit(f"{name}: pytest ended with {result}, plain pytest with "
                             f"{expected}: recording changed the suite's outcome")
                times[name].append(elapsed)
                cpu[name].append(cpu_seconds)
                print(f"  run {i + 1}/{args.repeat} {name:<32} {elapsed:6.1f}s "
                      f"{cpu_seconds:6.1f}s CPU", flush=True)
        plain = statistics.median(times["plain pytest"])
        plain_cpu = statistics.median(cpu["plain pytest"])
        name = args.sdist or Path(args.suite).name
        print(f"\nPython {version}, suite {name}, {args.repeat} alternating "
              f"rounds; load average {os.getloadavg()[0]:.1f}")
        print(f"{'mode':<34}{'median':>9}{'min':>9}{'max':>9}{'overhead':>10}"
              f"{'CPU median':>12}{'CPU overhead':>14}")
        for name, values in times.items():
            median, cpu_median = statistics.median(values), statistics.median(cpu[name])
            print(f"{name:<34}{median:>8.1f}s{min(values):>8.1f}s{max(values):>8.1f}s"
                  f"{median / plain - 1:>+10.1%}{cpu_median:>11.1f}s"
                  f"{cpu_median / plain_cpu - 1:>+14.1%}")
        print("CPU: user and system seconds of the pytest process and its children, which "
              "a shared machine's load and steal disturb less than wall time")


if __name__ == "__main__":
    main()
