"""What one recorded child process costs: tinyllm's training command run plain, recorded, and
recorded with capture, alternating.

The command is the one `tests/test_train_command.py` runs (`python -m tinyllm.train
configs/tiny.yaml --steps 4 --device cpu ...`). This process hands it the environment a
recording test hands its children (`runner/record/children.py`: coverage.py's start-up
request naming FastCI's child plugin, the test's folder and tag) and, for the third mode, a
capture request (`child_capture.request`). Run it with the interpreter to measure (on 3.12+
a child records with FastCI's sys.monitoring recorder, before with coverage's C tracer).
Prints the medians of wall and CPU seconds (the child's user and system time) and each
mode's cost over the plain command.

    python bench/child_cost.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("plain", "record", "capture")


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"the command failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "examples" / "tinyllm"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from fastci.runner.record import child_capture  # noqa: PLC0415
    from fastci.runner.record.children import Children  # noqa: PLC0415

    suite = Path(args.suite).resolve()
    with tempfile.TemporaryDirectory(prefix="fastci-child-cost-") as tmp:
        command = [sys.executable, "-m", "tinyllm.train", "configs/tiny.yaml", "--steps", "4",
                   "--device", "cpu", "--metrics", f"{tmp}/metrics.json",
                   "--checkpoint", f"{tmp}/last.pt"]
        plain = {k: v for k, v in os.environ.items()
                 if not k.startswith(("COVERAGE_", "FASTCI_"))}
        plain["PYTHONPATH"] = str(suite)
        os.environ["PYTHONPATH"] = str(suite)
        children = Children(str(suite), [], lambda: None)
        children.start()
        try:
            children.enter("tests/test_train_command.py::bench")
            recorded = dict(os.environ)
            recorded.pop(child_capture.ENV, None)
            capturing = {**recorded, child_capture.ENV: child_capture.request(
                64 * 2**20, None, child_capture.digests(dict(os.environ)))}
            envs = {"plain": plain, "record": recorded, "capture": capturing}
            times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
            for round_ in range(args.repeat):
                for mode in MODES:
                    wall, cpu = _run(command, suite, envs[mode])
                    times[mode].append((wall, cpu))
                    print(f"  run {round_ + 1}/{args.repeat} {mode:8} {wall:6.2f}s wall "
                          f"{cpu:6.2f}s CPU", flush=True)
        finally:
            children.stop()
    base = statistics.median(c for _, c in times["plain"])
    print(f"\nPython {sys.version.split()[0]}, tinyllm's training command, {args.repeat} "
          "alternating rounds")
    print(f"{'mode':10} {'wall median':>12} {'CPU median':>11} {'CPU over plain':>15}")
    for mode in MODES:
        wall = statistics.median(w for w, _ in times[mode])
        cpu = statistics.median(c for _, c in times[mode])
        print(f"{mode:10} {wall:11.2f}s {cpu:10.2f}s {cpu - base:+14.2f}s")


if __name__ == "__main__":
    main()
