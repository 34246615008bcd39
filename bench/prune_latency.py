"""What pruning adds to a selection, cold and warm, on examples/tinyllm.

Records tinyllm once, applies its `refactor_identical` change (a bit-identical refactor of
attention, which pruning can prove), and times `fastci select` three ways, alternated in
one run: without pruning (`--no-prune`), pruning with cold replay processes
(FASTCI_WARM_REPLAYS=0: each replay a fresh interpreter importing torch), and pruning with
warm replays (forks of a zygote that imported torch once; started by an untimed first run).
The store's cached replays are dropped before each pruning run, so every run replays both
the evidence's code and the new code. Prints medians and the worst run (p99 at this count).

With `--mutants N` it times instead the mutation benchmark's mutants (bench/mutants.py,
the same seed and counts as bench/selection.py) one after another: `fastci select` without
and with pruning (warm) on each, the cached replays dropped first. It prints p50, p99 and
the worst, and a row per mutant where pruning pruned a test or added over half a second.
No ground truth is needed: this measures latency, and bench/selection.py what the
selections are worth.

    python bench/prune_latency.py [--repeat 5]
    python bench/prune_latency.py --mutants 40 --benign 8 --seed 0
    python bench/prune_latency.py --mutants 40 --benign 8 --seed 0 --only cross_entropy-218
    python bench/prune_latency.py --mutants 40 --benign 8 --seed 0 --escapes

With `--escapes` each mutant's pruned tests are also run under it: a pruned test that fails
is a regression pruning let through (the check bench/selection.py makes, without running
the whole suite per mutant).
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
from typing import Collection

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
    seconds, result = select_json(repo, store, env, *extra)
    summary = result["summary"]
    return seconds, f"{summary['selected']} selected, {summary['pruned']} pruned"


def select_json(repo: Path, store: Path, env: dict, *extra: str) -> tuple[float, dict]:
    started = time.perf_counter()
    out = run(repo, sys.executable, "-m", "fastci", "select", "-q", "--format", "json",
              "--store", str(store), *extra, env=env).stdout
    return time.perf_counter() - started, json.loads(out)


def escapes(repo: Path, result: dict) -> list[str]:
    """The pruned tests that fail under the change: each one a regression pruning let
    through (running them is the whole check: a test that was not pruned ran anyway)."""
    pruned = [t["id"] for t in result["tests"] if t.get("pruned")]
    if not pruned:
        return []
    report = repo / ".fastci-escapes.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-p", "no:randomly", "--junitxml", str(report),
                    *pruned], cwd=repo, capture_output=True, text=True)
    import xml.etree.ElementTree as ET  # noqa: PLC0415 (only --escapes reads reports)

    failed, ran = [], 0
    for case in ET.parse(report).iter("testcase"):
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    report.unlink()
    if ran < len(pruned):  # a parametrized id expands: never fewer than asked
        failed.append(f"only {ran} of {len(pruned)} pruned tests ran")
    return failed


def forget_replays(store: Path) -> None:
    with sqlite3.connect(store) as db:
        db.execute("DELETE FROM replays")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mutants", type=int, default=0,
                        help="time the mutation benchmark's mutants instead")
    parser.add_argument("--benign", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--escapes", action="store_true",
                        help="with --mutants: also run each mutant's pruned tests under it "
                             "and count those that fail (escapes)")
    parser.add_argument("--only", nargs="+", default=(), metavar="ID",
                        help="with --mutants: time only these mutants (ids, or the "
                             "file-line prefix the tables print)")
    args = parser.parse_args()
    if args.mutants:
        return over_mutants(args.mutants, args.benign, args.seed, set(args.only),
                            args.escapes)
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


def over_mutants(count: int, benign: int, seed: int, only: Collection[str] = (),
                 check_escapes: bool = False) -> None:
    """p50 and p99 of `fastci select` without and with pruning over the mutants (or only
    the ones named: the same mutants, for one slow case); with `check_escapes`, the pruned
    tests that fail under their mutant."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mutants import generate  # noqa: PLC0415 (bench/ is no package)

    from fastci.runner.prune import zygote  # noqa: PLC0415

    mutants = generate(TINYLLM, "tinyllm", count, benign, seed)
    if only:  # an id, or its file-and-line prefix as the tables print it (rope-39)
        def named(m, name: str) -> bool:
            return m.id == name or m.id.startswith(f"{name}-")

        unknown = [n for n in only if not any(named(m, n) for m in mutants)]
        if unknown:
            sys.exit(f"prune_latency: no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if any(named(m, n) for n in only)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastci-prune-bench-") as name:
        sockets = Path(tempfile.mkdtemp(prefix="fz-"))
        env = {**os.environ, "XDG_RUNTIME_DIR": str(sockets), "FASTCI_ZYGOTE_IDLE": "120",
               "FASTCI_WARM_REPLAYS": "1"}
        try:
            repo, store = setup(Path(name))
            # the refactor's replays start the zygote and teach it torch's lazy imports,
            # as any earlier change would have: not a mutant's cost
            started, _ = select(repo, store, env)
            run(repo, "git", "checkout", "-q", "--", ".")  # the recorded tree again
            total_pruned = 0
            for m in mutants:
                m.apply(repo)
                plain, line = select(repo, store, env, "--no-prune")
                forget_replays(store)
                pruning, result = select_json(repo, store, env)
                summary = result["summary"]
                pruned_line = f"{summary['selected']} selected, {summary['pruned']} pruned"
                escaped = escapes(repo, result) if check_escapes else []
                run(repo, "git", "checkout", "-q", "--", m.path)
                rows.append((m.id, plain, pruning, line, pruned_line, escaped))
                total_pruned += summary["pruned"]
        finally:
            for sock in sockets.glob("*/*.sock"):
                zygote.stop(sock)
            shutil.rmtree(sockets, ignore_errors=True)
    print(f"tinyllm, {len(mutants)} mutants (seed {seed}), `fastci select` per mutant, "
          f"cached replays dropped before each pruning run (the warm-up that started the "
          f"zygote: {started:.2f} s)\n")
    print("| selection | p50 s | p99 s | worst s |")
    print("| --- | ---: | ---: | ---: |")
    for label, values in (("without pruning", [r[1] for r in rows]),
                          ("with pruning (warm)", [r[2] for r in rows])):
        print(f"| {label} | {statistics.median(values):.2f} | {_p99(values):.2f} | "
              f"{max(values):.2f} |")
    print(f"\ntests pruned over all mutants: {total_pruned}")
    if check_escapes:
        escaped = [(r[0], t) for r in rows for t in r[5]]
        print(f"pruned tests that fail under their mutant (escapes): {len(escaped)}")
        for mid, test in escaped:
            print(f"  ESCAPE {mid}: {test}")
    print("\n| mutant | without s | with s | without | with |")
    print("| --- | ---: | ---: | --- | --- |")
    for mid, plain, pruning, line, pruned_line, _ in rows:
        if pruned_line != line or pruning - plain > 0.5:
            print(f"| {mid} | {plain:.2f} | {pruning:.2f} | {line} | {pruned_line} |")


def _p99(values: list[float]) -> float:
    """The 99th percentile, interpolated (with under 100 values, near the worst)."""
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 \
        else values[0]


if __name__ == "__main__":
    main()
