"""Selection latency on a synthetic evidence set (default 5,000 tests x 20,000 blocks).

Builds a real git repository of generated modules (500 files x 40 functions), a snapshot in
which each test executed ~60 blocks across ~8 files and read a data file, then times
`Engine.plan()` (the whole selection: git trees, inventories, change analysis, rules, risk
order) for a few kinds of change. Prints a table; medians of --repeat runs.

    python bench/selection_latency.py [--tests 5000] [--files 500] [--functions 40]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastci.runner.analysis import inventory
from fastci.runner.analysis.environment import current
from fastci.runner.engine import Engine
from fastci.runner.evidence import Snapshot, TestRecord
from fastci.runner.git import WORKTREE, Repo


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout


def make_repo(root: Path, files: int, functions: int, tests: int) -> None:
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "bench@fastci.invalid")
    git(root, "config", "user.name", "bench")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for f in range(files):
        lines = [f"from pkg.m{(f + 1) % files} import f0 as _next", f"CONST_{f} = {f}", ""]
        for i in range(functions):
            lines += [f"def f{i}(x):", f"    y = x * {i} + CONST_{f}", f"    return y - {f}", ""]
        (pkg / f"m{f}.py").write_text("\n".join(lines))
    tdir = root / "tests"
    tdir.mkdir()
    per_file = 50
    for t in range(0, tests, per_file):
        body = [f"def test_{k}():\n    assert True\n" for k in range(t, min(t + per_file, tests))]
        (tdir / f"test_{t // per_file}.py").write_text("\n".join(body))
    (root / "data").mkdir()
    for d in range(20):
        (root / "data" / f"d{d}.txt").write_text(f"{d}\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "synthetic")


def make_snapshot(root: Path, files: int, functions: int, tests: int, store,
                  captures: int = 0, hub: float = 0.0, failed: float = 0.0,
                  file_events: bool = False) -> None:
    """`captures`: module calls captured per test, each with the lines it ran (about 30 in
    each of 4 files), and the test's own line map: the shape of a torch suite's evidence.
    `hub`: the share of tests that also execute pkg/m0.py (a module most of a real suite
    runs, such as its model); `failed`: the share that failed last time; `file_events`: the
    tests' files were seen by the kernel's file events (as Linux records them)."""
    repo = Repo.find(root)
    commit = repo.head()
    tree = repo.tree(commit)
    inventory.load(repo, commit, tree, store)  # parse once, as recording does
    rng = random.Random(0)
    records = {}
    per_file = 50
    for t in range(tests):
        test_id = f"tests/test_{t // per_file}.py::test_{t}"
        blocks: dict[str, list[str]] = {}
        spread = rng.sample(range(files), 8)
        if rng.random() < hub and 0 not in spread:
            spread[0] = 0
        for f in spread:
            blocks[f"pkg/m{f}.py"] = sorted({f"f{rng.randrange(functions)}" for _ in range(8)})
        blocks[f"tests/test_{t // per_file}.py"] = [f"test_{t}"]
        data = f"data/d{rng.randrange(20)}.txt"
        modules = None
        lines: dict[str, tuple[int, ...]] | None = None
        if captures:
            ran = {p: tuple(sorted(rng.sample(range(1, 200), 30))) for p in blocks}
            lines = ran
            modules = {"captures": [
                {"index": i, "module": f"pkg.m{i}.Net", "digest": f"{t:032x}{i:032x}",
                 "size": 4096, "why": None, "env": {},
                 "out": {"out": {"shape": [8, 16], "dtype": "float32", "hash": f"{i:016x}"}},
                 "lines": {p: sorted(rng.sample(range(1, 200), 30))
                           for p in rng.sample(sorted(blocks), 4)}}
                for i in range(captures)],
                "outside": {p: list(ls[:10]) for p, ls in ran.items()},
                "inside": {}, "sys_path": ["."]}
        records[test_id] = TestRecord(
            test_id=test_id, outcome="failed" if rng.random() < failed else "passed",
            duration=rng.lognormvariate(-3, 1.5),
            blocks={p: tuple(q) for p, q in blocks.items()}, files={data: tree[data]},
            lines=lines, modules=modules, file_events=file_events)
    store.save_snapshot(Snapshot(commit=commit, environment=current(), tree=tree,
                                 tests=records))


CHANGES = {
    "one function body": ("pkg/m7.py", "    y = x * 3 + CONST_7", "    y = x * 3 + CONST_7 + 1"),
    "a module constant": ("pkg/m9.py", "CONST_9 = 9", "CONST_9 = 10"),
    "comment only": ("pkg/m11.py", "def f5(x):", "def f5(x):  # note"),
    "a data file": ("data/d3.txt", "3", "4"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=5000)
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--functions", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastci-bench-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        t0 = time.perf_counter()
        make_repo(root, args.files, args.functions, args.tests)
        engine = Engine(root)
        with engine.open_store() as store:
            make_snapshot(root, args.files, args.functions, args.tests, store)
        setup = time.perf_counter() - t0
        blocks = args.files * (args.functions + 1) + args.tests
        print(f"synthetic set: {args.tests} tests, {blocks} blocks in {args.files} modules "
              f"(built in {setup:.1f}s)")
        print(f"{'change':<20} {'selected':>9} {'plan median':>12} {'plan min':>9} "
              f"{'CLI median':>11}")
        for name, (path, old, new) in CHANGES.items():
            target = root / path
            original = target.read_text()
            target.write_text(original.replace(old, new, 1))
            times, selected = [], 0
            engine.plan()  # warm: the changed file's inventory is parsed and cached once
            for _ in range(args.repeat):
                start = time.perf_counter()
                planned = engine.plan(head=WORKTREE)
                times.append(time.perf_counter() - start)
                selected = len(planned.selection.selected)
            cli = []
            for _ in range(max(args.repeat // 2, 1)):
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "fastci", "select", "-q", "--format",
                                "ids"], cwd=root, check=True, capture_output=True)
                cli.append(time.perf_counter() - start)
            target.write_text(original)
            print(f"{name:<20} {selected:>9} {statistics.median(times) * 1000:>10.0f}ms "
                  f"{min(times) * 1000:>7.0f}ms {statistics.median(cli) * 1000:>9.0f}ms")
        print("plan = Engine.plan() in-process (git, store, analysis, rules, order); "
              "CLI = `fastci select` as a new process, Python start-up included")


if __name__ == "__main__":
    main()
