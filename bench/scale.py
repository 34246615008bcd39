"""Scale: how selection latency grows with the suite, and queue overhead with the workers.

1. Selection: `Engine.plan()` on the synthetic evidence of selection_latency.py for 1,000,
   5,000, 20,000 and 50,000 tests, shaped like a real torch suite's: each test with
   --captures captured module calls and line maps (only pruning reads them), --hub of the
   tests also executing one module most of a suite runs (pkg/m0.py, its "model"), --failed
   of them failed last time, files recorded with the kernel's file events. Two changes: a
   function body in a module few tests run (pkg/m7.py) and one in the hub; medians of
   --repeat, wall and CPU time. Selection decodes only the tests a change can reach (the
   snapshot's index), so the second costs more: the "decoded" column says how many it read.
2. Queues: N shard-sized no-op jobs (each sleeps --job-ms) spread over W separate
   `fastci worker --gpu i` processes through Redis/RQ, W in 1, 2, 4, 8; wall time against the
   ideal (N x job / W): the difference per job is the queue's overhead (enqueue, dequeue,
   result write-back, and the worker's poll).

    python bench/scale.py [--tests 1000 5000 20000 50000] [--captures 2] [--hub 0.5]
        [--failed 0.01] [--workers 1 2 4 8] [--jobs 400]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from selection_latency import CHANGES, make_repo, make_snapshot  # noqa: E402

from fastci.runner.engine import Engine  # noqa: E402
from fastci.runner.git import WORKTREE  # noqa: E402

SCALE_CHANGES = {
    "one function body": CHANGES["one function body"],
    "a hub function body": ("pkg/m0.py", "    y = x * 3 + CONST_0", "    y = x * 3 + CONST_0 + 1"),
}


def selection(tests: int, files: int, functions: int, repeat: int, captures: int = 0,
              hub: float = 0.0, failed: float = 0.0
              ) -> list[tuple[str, float, float, int, int]]:
    """(change, median plan seconds, median CPU seconds of this process, tests selected,
    tests decoded) per change."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastci-scale-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        make_repo(root, files, functions, tests)
        engine = Engine(root)
        with engine.open_store() as store:
            make_snapshot(root, files, functions, tests, store, captures, hub=hub,
                          failed=failed, file_events=True)
        for name, (path, old, new) in SCALE_CHANGES.items():
            target = root / path
            original = target.read_text()
            target.write_text(original.replace(old, new, 1))
            engine.plan()  # the changed file's inventory is parsed and cached once
            times, cpu, selected, decoded = [], [], 0, 0
            for _ in range(repeat):
                start, start_cpu = time.perf_counter(), time.process_time()
                planned = engine.plan(head=WORKTREE)
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
                selected = len(planned.selection.selected)
                decoded = getattr(planned.snapshot.tests, "decoded", len(planned.snapshot.tests))
            target.write_text(original)
            rows.append((name, statistics.median(times), statistics.median(cpu), selected,
                         decoded))
    return rows


def queues(workers: int, jobs: int, job_ms: float, redis_url: str) -> float:
    from redis import Redis

    from fastci.app.queue import queue

    prefix = f"fastci-scale-{uuid.uuid4().hex[:8]}"
    redis = Redis.from_url(redis_url)
    env = {**os.environ, "FASTCI_QUEUE_PREFIX": prefix, "FASTCI_REDIS_URL": redis_url}
    procs = [subprocess.Popen([sys.executable, "-m", "fastci", "worker", "--gpu", str(i),
                               "--burst"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
             for i in range(workers)]
    for proc in procs:  # let them register before timing (start-up is not queue overhead)
        proc.send_signal(signal.SIGSTOP)
    time.sleep(2.0)
    try:
        targets = [queue(f"{prefix}-gpu-{i}", redis) for i in range(workers)]
        for n in range(jobs):  # workers run only FastCI's jobs: `pause` is the one that waits
            targets[n % workers].enqueue("fastci.runner.execution.shard.pause", job_ms / 1000,
                                         result_ttl=60)
        start = time.perf_counter()
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
        for proc in procs:
            proc.wait(timeout=600)
        return time.perf_counter() - start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for key in redis.scan_iter(f"*{prefix}*"):
            redis.delete(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, nargs="+", default=[1000, 5000, 20000, 50000])
    ap.add_argument("--captures", type=int, default=2, help="captured calls per test")
    ap.add_argument("--hub", type=float, default=0.5,
                    help="share of tests that also run the hub module")
    ap.add_argument("--failed", type=float, default=0.01,
                    help="share of tests that failed last time")
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--job-ms", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--redis", default=os.environ.get("FASTCI_REDIS_URL",
                                                      "redis://127.0.0.1:6379/0"))
    args = ap.parse_args()
    os.environ.pop("FASTCI_CHECK_INDEX", None)  # the index's self-check doubles the work
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{'tests':>7} {'blocks':>8} {'change':<20} {'selected':>9} {'decoded':>8} "
          f"{'plan median':>12} {'CPU median':>11}")
    for tests in args.tests:
        files = max(100, tests // 10)
        for name, seconds, cpu, selected, decoded in selection(
                tests, files, 40, args.repeat, args.captures, args.hub, args.failed):
            print(f"{tests:>7} {files * 41 + tests:>8} {name:<20} {selected:>9} "
                  f"{decoded:>8} {seconds * 1000:>10.0f}ms {cpu * 1000:>9.0f}ms", flush=True)
    print("plan = Engine.plan() wall time; CPU = its process's CPU time (git's subprocesses "
          "not counted), which a loaded machine disturbs less")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    if not args.workers:
        return
    print(f"\n{'workers':>7} {'jobs':>5} {'wall':>8} {'ideal':>8} {'overhead/job':>13} "
          f"{'jobs/s':>7}")
    for workers in args.workers:
        wall = queues(workers, args.jobs, args.job_ms, args.redis)
        ideal = args.jobs * args.job_ms / 1000 / workers
        print(f"{workers:>7} {args.jobs:>5} {wall:>7.2f}s {ideal:>7.2f}s "
              f"{(wall - ideal) / args.jobs * workers * 1000:>11.1f}ms "
              f"{args.jobs / wall:>7.0f}", flush=True)
    print("overhead/job = (wall - ideal) x workers / jobs: the time a worker spends per job "
          "beyond the job itself")


if __name__ == "__main__":
    main()
