"""What binding a test file's callees costs each test: `CallBindings.wrapped` (record/
bindings.py) on every test file of a suite, with the suite's package and torch imported, as a
recording's test pays it at set-up and teardown (once per file whose names it binds).

    python bench/binding_cost.py [--suite DIR] [--package NAME ...] [--repeat 200]

Prints, per test file, how many methods it binds (its functions would need the file
imported) and the median time of one bind and unbind, in microseconds.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--package", nargs="+", default=[
        "tinyllm.train.trainer", "tinyllm.train.distributed", "tinyllm.data.tokenizer",
        "tinyllm.model.transformer"], help="modules to import first (the code under test)")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    suite = os.path.realpath(args.suite)
    sys.path.insert(0, suite)
    for name in args.package:
        importlib.import_module(name)

    from fastci.runner.record.bindings import CallBindings

    bindings = CallBindings(suite, lambda fn, a, k, *_: fn(*a, **k))
    print(f"{'test file':42} {'bound':>5} {'median µs':>10}")
    for path in sorted(glob.glob(os.path.join(suite, "tests", "**", "test_*.py"),
                                 recursive=True)):
        namespace: dict = {}  # methods only: a namespace needs the file imported
        with bindings.wrapped(namespace, path):  # the first: parses the file, finds classes
            pass
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            with bindings.wrapped(namespace, path) as bound:
                pass
            times.append(time.perf_counter() - started)
        print(f"{os.path.relpath(path, suite):42} {bound:5d} "
              f"{statistics.median(times) * 1e6:10.1f}")
    print(f"({len(sys.modules)} modules imported)")


if __name__ == "__main__":
    main()
