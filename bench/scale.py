"""Scale: how selection latency grows with the suite, and queue overhead with the workers.

1. Selection: `Engine.plan()` on the synthetic evidence of selection_latency.py for 1,000,
   5,000, 20,000 and 50,000 tests (a changed function body; median of --repeat), each test
   with --captures captured module calls and line maps (what a torch suite records; only
   pruning reads them).
2. Queues: N shard-sized no-op jobs (each sleeps --job-ms) spread over W separate
   `fastci worker --gpu i` processes through Redis/RQ, W in 1, 2, 4, 8; wall time against the
   ideal (N x job / W): the difference per job is the queue's overhead (enqueue, dequeue,
   result write-back, and the worker's poll).

    python bench/scale.py [--tests 1000 5000 20000 50000] [--captures 2] [--workers 1 2 4 8]
        [--jobs 400]
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


def selection(tests: int, files: int, functions: int, repeat: int, captures: int = 0
              ) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="fastci-scale-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        make_repo(root, files, functions, tests)
        engine = Engine(root)
        with engine.open_store() as store:
            make_snapshot(root, files, functions, tests, store, captures)
        path, old, new = CHANGES["one function body"]
        target = root / path
        target.write_text(target.read_text().replace(old, new, 1))
        engine.plan()
        times, selected = [], 0
        for _ in range(repeat):
            start = time.perf_counter()
            planned = engine.plan(head=WORKTREE)
            times.append(time.perf_counter() - start)
            selected = len(planned.selection.selected)
        return statistics.median(times), selected


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
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--job-ms", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--redis", default=os.environ.get("FASTCI_REDIS_URL",
                                                      "redis://127.0.0.1:6379/0"))
    args = ap.parse_args()
    print(f"{'tests':>7} {'blocks':>8} {'selected':>9} {'plan median':>12}")
    for tests in args.tests:
        files = max(100, tests // 10)
        seconds, selected = selection(tests, files, 40, args.repeat, args.captures)
        print(f"{tests:>7} {files * 41 + tests:>8} {selected:>9} {seconds * 1000:>10.0f}ms",
              flush=True)
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
