"""How many signed webhooks a second the webhook service answers, and how late.

    python bench/webhook_load.py [--rates 100,200,400] [--seconds 30] [--workers 2]

For each offered rate it starts `fastci serve` (gunicorn, `--workers` processes of 8
threads) on a free port against the Redis at FASTCI_REDIS_URL (default the local 6379, under
a queue prefix of its own, removed afterwards), sends `--seconds` x rate `pull_request`
deliveries from 24 threads, about 5% of them redelivered (fastci.testing.webhook_load), and
prints a row: the sends answered a second (redeliveries included), the answer time's median
and 99th percentile, the deliveries lost and those enqueued twice. The target is 200 a
second, none lost; the load test (tests/test_load.py) checks "none lost" at 200 a second in
every CI run.
The load generator shares the machine with the service: quote the rates of one run.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import uuid
from pathlib import Path

import redis as redis_lib

from fastci.testing import webhook_load

SECRET = "bench-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(redis_url: str, rate: float, seconds: float, workers: int) -> dict:
    client = redis_lib.Redis.from_url(redis_url)
    prefix = f"fastci-bench-load-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="fastci-bench-load-") as folder:
            with webhook_load.service(free_port(), secret=SECRET, prefix=prefix,
                                      redis_url=redis_url, workspace=Path(folder),
                                      log=Path(folder) / "serve.log", workers=workers) as url:
                load = webhook_load.send(url, SECRET, seconds, rate)
        queued = [j.decode().removeprefix(f"{prefix}-")
                  for j in client.lrange(f"rq:queue:{prefix}-cpu", 0, -1)]
        return {"offered": rate, "answered": load.rate, "p50": load.latency(0.5),
                "p99": load.latency(0.99), "deliveries": len(load.deliveries),
                "enqueued": len(set(queued)), "lost": len(set(load.deliveries) - set(queued)),
                "twice": len(queued) - len(set(queued)), "failures": len(load.failures)}
    finally:
        for key in client.scan_iter(f"*{prefix}*"):
            client.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,200,400",
                        help="offered deliveries a second, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    args = parser.parse_args()
    redis_url = os.environ.get("FASTCI_REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--rates must be numbers separated by commas, not {args.rates!r}")
    print(f"{'offered/s':>9} {'answered/s':>10} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'deliveries':>10} {'lost':>5} {'twice':>5} {'errors':>6}")
    for rate in rates:
        row = measure(redis_url, rate, args.seconds, args.workers)
        print(f"{row['offered']:>9.0f} {row['answered']:>10.0f} {row['p50'] * 1000:>7.1f} "
              f"{row['p99'] * 1000:>7.1f} {row['deliveries']:>10} {row['lost']:>5} "
              f"{row['twice']:>5} {row['failures']:>6}")
    print(f"load average: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
