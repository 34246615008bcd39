"""What the exact rules cost: the import-call hook during collection, and the line loading of
the statement rule, each against running without it.

1. collection: `pytest --collect-only` of a suite (default examples/tinyllm, copied into a
   temporary git repository), with the import-call hook following every test file's
   collection and without (alternated, `--repeat` rounds); and the same for a one-test
   package whose module body imports torch during collection (the hook's worst case).
2. selection: `Engine.plan` on `--mutants` mutants of the suite, recorded once, with every
   exact rule on and with the statement rule off (which loads no lines).
3. line loading: `load_lines` of a synthetic SQLite snapshot for 1,000 to 20,000 candidates
   (each test 480 lines in 8 files), the statement rule's worst case (a hub function changed
   away from its first statement).

    python bench/exact_rules_cost.py [--suite DIR --package NAME] [--mutants 12] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mutants import generate  # noqa: E402
from selection import git  # noqa: E402

from fastci.runner.analysis.environment import current  # noqa: E402
from fastci.runner.engine import Engine  # noqa: E402
from fastci.runner.evidence import Snapshot, TestRecord  # noqa: E402
from fastci.runner.store import open_store  # noqa: E402

ROOT = HERE.parent
PLUGIN = '''
import os, time
import pytest
from fastci.runner.record.import_calls import ImportCalls

STATE = {"calls": None, "spent": 0.0}


def pytest_configure(config):
    if os.environ.get("FASTCI_BENCH_HOOK") == "1":
        root = str(config.rootpath)
        tree = {os.path.relpath(os.path.join(d, f), root): "" for d, _, fs in os.walk(root)
                for f in fs if f.endswith(".py")}
        STATE["calls"] = ImportCalls(root, tree)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    if not isinstance(collector, pytest.File):
        return (yield)
    start, calls = time.perf_counter(), STATE["calls"]
    if calls is not None:
        calls.follow("collect:" + str(collector.path))
    try:
        return (yield)
    finally:
        if calls is not None:
            calls.stop()
        STATE["spent"] += time.perf_counter() - start


def pytest_unconfigure(config):
    print(f"\\nFASTCI-BENCH-COLLECT {STATE['spent']:.4f}")
'''


def collection_seconds(root: Path, hook: bool, plugin_dir: Path) -> float:
    env = {**os.environ, "FASTCI_BENCH_HOOK": "1" if hook else "0",
           "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "-p", "fastci_bench_hook"], cwd=root,
                         env=env, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("FASTCI-BENCH-COLLECT"))
    return float(line.split()[1])


def collection(suite: Path, work: Path, repeat: int) -> None:
    plugin_dir = work / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "fastci_bench_hook.py").write_text(PLUGIN)
    torch_pkg = work / "torch-at-collection"
    (torch_pkg / "pk").mkdir(parents=True)
    (torch_pkg / "tests").mkdir()
    (torch_pkg / "pk" / "__init__.py").write_text(
        "import torch\n\nSCALE = torch.ones(2).sum().item()\n")
    (torch_pkg / "tests" / "test_x.py").write_text(
        "from pk import SCALE\n\n\ndef test_x():\n    assert SCALE == 2\n")
    print("collection, seconds in test files' collection (median of "
          f"{repeat}, alternated)\n\n| suite | without the hook | with it |\n| --- | ---: | ---: |")
    for name, root in ((suite.name, work / "suite"), ("a module body importing torch", torch_pkg)):
        runs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeat):
            for hook in (False, True):
                runs[hook].append(collection_seconds(root, hook, plugin_dir))
        print(f"| {name} | {statistics.median(runs[False]):.2f} s | "
              f"{statistics.median(runs[True]):.2f} s |")


def selection(suite: Path, package: str, work: Path, mutants: int, repeat: int) -> None:
    repo = work / "suite"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--fastci-record"], cwd=repo, check=True, capture_output=True)
    base = git(repo, "rev-parse", "HEAD").strip()
    engine = Engine(repo)
    settings = engine.settings
    times: dict[str, list[float]] = {"every exact rule": [], "statement rule off": []}
    for m in generate(suite, package, mutants, 0):
        m.apply(repo)
        for _ in range(repeat):
            for name, exact in (("every exact rule", settings.exact),
                                ("statement rule off", ("import-time",))):
                engine.settings = replace(settings, exact=exact)
                start = time.perf_counter()
                engine.plan(base)
                times[name].append(time.perf_counter() - start)
        git(repo, "checkout", "-q", "--", m.path)
    print(f"\nselection on {mutants} mutants x {repeat} ({suite.name})\n\n"
          "| rules | median | worst |\n| --- | ---: | ---: |")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values) * 1000:.0f} ms | "
              f"{max(values) * 1000:.0f} ms |")


def line_loading(work: Path, counts: list[int]) -> None:
    env = current("bench")
    rng = random.Random(0)
    tests = {}
    for i in range(max(counts)):
        lines = {f"pkg/m{j}.py": tuple(sorted(rng.sample(range(1, 400), 60))) for j in range(8)}
        test_id = f"tests/t{i % 200}.py::test_{i}"
        tests[test_id] = TestRecord(test_id, "passed", 0.1, {p: ("f",) for p in lines},
                                    lines=lines, credited={})
    with open_store(work / "lines.db") as store:
        store.save_snapshot(Snapshot("c1", env, {}, tests))
        ids = list(tests)
        print("\nline loading (one request, one file's lines kept)\n\n"
              "| candidates | seconds |\n| ---: | ---: |")
        for n in counts:
            start = time.perf_counter()
            store.load_lines("c1", env.digest, ids[:n], {"pkg/m3.py"})
            print(f"| {n:,} | {time.perf_counter() - start:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--package", default="tinyllm", help="the suite's package (mutated)")
    ap.add_argument("--mutants", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--candidates", type=int, nargs="+", default=[1000, 5000, 20000])
    args = ap.parse_args()
    suite = Path(args.suite).resolve()
    print(f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="fastci-exact-") as tmp:
        work = Path(tmp)
        copy = work / "suite"
        shutil.copytree(suite, copy,
                        ignore=shutil.ignore_patterns("__pycache__", ".fastci", "changes"))
        git(copy, "init", "-q", "-b", "main")
        git(copy, "add", "-A")
        git(copy, "commit", "-q", "-m", "subject")
        collection(suite, work, args.repeat)
        selection(suite, args.package, work, args.mutants, args.repeat)
        line_loading(work, args.candidates)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
