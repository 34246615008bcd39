"""50 pull requests in flight through the GitHub App, on 2 selection and 2 runner workers.

    python bench/app_inflight.py [--prs 50] [--python LABEL=INTERPRETER ...] [--json FILE]

For each interpreter given (default: this one, labelled "this tree"; give another's to
measure another checkout of FastCI the same way), it starts, on a redis-server of its own:
the webhook service (`fastci serve`, 2 gunicorn workers), two selection workers (`fastci
worker --cpu`), two runner workers (`fastci worker --gpu 0` and `--gpu 1`, FASTCI_GPUS=2)
and the fake GitHub (fastci.testing), all real processes. It generates a small repository
(5 modules, 2 quick tests each), records the base's evidence, opens `--prs` pull requests
(each changes one module, so 2 tests are selected and sharded over the 2 GPU queues), sends
their `pull_request` webhooks at once, and waits until every one has a completed "FastCI
regressions" check run (it fails otherwise).

It reports the wall time from the first webhook to the last conclusion, when each pull
request's selection and regressions check runs completed (median and 90th percentile), the
most pull requests in flight at once (from the first of their shards enqueued to the last
ended), the selection workers' busy seconds (RQ's start and end of every job they ran), and
the worker-seconds spent waiting: the seconds jobs slept inside `time.sleep`, as
`bench/wait_probe.py` counts them in the workers (a job that waits for another polls and
sleeps between polls; FastCI's jobs sleep nowhere else but in GitHub's retry backoff, which
the fake GitHub never triggers). The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import requests

from fastci.app import workspace
from fastci.app.queue import fetch
from fastci.app.signature import sign
from fastci.demo_app import key_pair
from fastci.testing import FIXTURES
from fastci.testing.fakegithub import FakeGitHub

BENCH = Path(__file__).resolve().parent

REPO, INSTALLATION, APP_ID = "octo/inflight", 41, 4141
SECRET = "bench-webhook-secret"
MODULES = 5
TEST_SECONDS = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=bench@fastci.invalid",
                           "-c", "user.name=bench", "-c", "commit.gpgsign=false", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_repository(root: Path, prs: int) -> tuple[str, list[str]]:
    """The remote: a base on main and one branch per pull request; (base, heads)."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "pkg").mkdir()
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    for k in range(MODULES):
        (root / "pkg" / f"m{k}.py").write_text(f"def f{k}(x):\n    return x + {k}\n")
        (root / "tests" / f"test_m{k}.py").write_text(
            f"import time\n\nfrom pkg.m{k} import f{k}\n\n\n"
            f"def test_f{k}_small():\n    time.sleep({TEST_SECONDS})\n"
            f"    assert f{k}(1) == {1 + k}\n\n\n"
            f"def test_f{k}_large():\n    time.sleep({TEST_SECONDS})\n"
            f"    assert f{k}(100) == {100 + k}\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    base = git(root, "rev-parse", "HEAD")
    heads = []
    for n in range(1, prs + 1):
        k = n % MODULES
        git(root, "checkout", "-q", "-b", f"pr-{n}", base)
        (root / "pkg" / f"m{k}.py").write_text(
            f"def f{k}(x):\n    y = {n} * 0\n    return x + {k} + y\n")
        git(root, "commit", "-q", "-am", f"change {n}")
        heads.append(git(root, "rev-parse", "HEAD"))
    git(root, "checkout", "-q", "main")
    return base, heads


class Fleet:
    """redis-server, the webhook service, 2 selection and 2 runner workers, for one
    interpreter; everything stopped on exit."""

    def __init__(self, work: Path, python: str, fake: FakeGitHub, key_file: Path) -> None:
        self.work, self.python, self.procs = work, python, []
        self.redis_port, port = free_port(), free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.url = f"http://127.0.0.1:{port}"
        self.prefix = f"fastci-bench-{uuid.uuid4().hex[:6]}"
        self.env = {**os.environ, "FASTCI_APP_ID": str(APP_ID),
                    "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file),
                    "FASTCI_WEBHOOK_SECRET": SECRET, "FASTCI_GITHUB_URL": fake.url,
                    "FASTCI_REDIS_URL": self.redis_url,
                    "FASTCI_WORKSPACE": str(work / "workspace"),
                    "FASTCI_CLONE_URL": str(work / "remote") + "/{repo}",
                    "FASTCI_QUEUE_PREFIX": self.prefix, "FASTCI_GPUS": "2",
                    "FASTCI_ARTIFACT_URL": self.url,
                    "FASTCI_ARTIFACT_SECRET": f"bench-artifacts-{uuid.uuid4().hex}",
                    "FASTCI_WARM_REPLAYS": "0", "PYTHONPATH": ""}
        self.env.pop("FASTCI_STORE", None)
        self.port = port

    def __enter__(self) -> "Fleet":
        self._start("redis", ["redis-server", "--port", str(self.redis_port), "--bind",
                              "127.0.0.1", "--save", "", "--appendonly", "no",
                              "--dir", str(self.work)], self.env)
        client = redis.Redis.from_url(self.redis_url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        runner_env = {k: v for k, v in self.env.items()
                      if not k.startswith(("FASTCI_APP_", "FASTCI_WEBHOOK_",
                                           "FASTCI_ARTIFACT_SECRET"))}
        probe = [self.python, str(BENCH / "wait_probe.py")]
        self._start("serve", [self.python, "-m", "fastci", "serve", "--bind",
                              f"127.0.0.1:{self.port}", "--workers", "2"], self.env)
        for n in (1, 2):
            self._start(f"cpu-{n}", [*probe, "worker", "--cpu", "--name",
                                     f"{self.prefix}-cpu-{n}"], self.env)
        for gpu in (0, 1):
            self._start(f"gpu-{gpu}", [*probe, "worker", "--gpu", str(gpu), "--name",
                                       f"{self.prefix}-gpu-{gpu}"], runner_env)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                time.sleep(0.3)
        raise SystemExit("the webhook service did not start:\n" + self.tail("serve"))

    def _start(self, name: str, args: list[str], env: dict) -> None:
        log = open(self.work / f"{name}.log", "w")
        # In the work folder: a checkout's own fastci/ in the current folder would shadow
        # the interpreter's installed FastCI.
        self.procs.append((name, subprocess.Popen(args, env=env, stdout=log, cwd=self.work,
                                                  stderr=subprocess.STDOUT,
                                                  start_new_session=True)))

    def tail(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text()[-3000:]

    def __exit__(self, *exc) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def payload(number: int, head: str, base: str) -> bytes:
    body = json.loads((FIXTURES / "payloads" / "pull_request" / "opened.json").read_bytes())
    body["number"] = body["pull_request"]["number"] = number
    body["pull_request"]["head"].update(sha=head, ref=f"pr-{number}")
    body["pull_request"]["base"].update(sha=base, ref="main")
    body["pull_request"]["head"]["repo"]["full_name"] = REPO
    body["pull_request"]["base"]["repo"]["full_name"] = REPO
    body["pull_request"]["updated_at"] = f"2024-03-01T10:{number // 60:02d}:{number % 60:02d}Z"
    body["repository"]["full_name"] = REPO
    body["installation"]["id"] = INSTALLATION
    return json.dumps(body).encode()


def measure(label: str, python: str, prs: int, timeout: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="fastci-inflight-"))
    try:
        base, heads = make_repository(work / "remote" / REPO, prs)
        subprocess.run([python, "-m", "fastci", "record", "-q", "--store",
                        str(work / "workspace" / "evidence.db"), "--", "-q", "-p",
                        "no:cacheprovider"], cwd=work / "remote" / REPO, check=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": ""})
        # The mirror exists before the fleet starts, as on any host after its first job:
        # both variants measure runs in flight, not a first fetch.
        workspace.sync(work / "workspace", REPO, str(work / "remote" / REPO), [base, *heads])
        private, public = key_pair()
        key_file = work / "app-key.pem"
        key_file.write_text(private)
        with FakeGitHub() as fake:
            fake.register_app(APP_ID, public)
            fake.add_repo(REPO, installation_id=INSTALLATION)
            for n, head in enumerate(heads, 1):
                fake.add_pull(REPO, n, head_sha=head, head_ref=f"pr-{n}", base_sha=base)
            with Fleet(work, python, fake, key_file) as fleet:
                load_before = os.getloadavg()
                started = time.time()
                for n, head in enumerate(heads, 1):
                    data = payload(n, head, base)
                    answer = requests.post(f"{fleet.url}/webhooks", data=data, timeout=10,
                                           headers={"X-GitHub-Event": "pull_request",
                                                    "X-GitHub-Delivery": str(uuid.uuid4()),
                                                    "Content-Type": "application/json",
                                                    "X-Hub-Signature-256": sign(SECRET, data)})
                    assert answer.status_code == 202, answer.text
                seen = follow(fake, set(heads), started, timeout, fleet)
                wall = max(t for t, _ in seen.values()) - started
                load_after = os.getloadavg()
                jobs = rq_jobs(redis.Redis.from_url(fleet.redis_url), fleet.prefix)
                slept = {k.decode(): float(v) for k, v in redis.Redis.from_url(
                    fleet.redis_url).hgetall(f"{fleet.prefix}:bench:slept").items()}
        return report(label, prs, wall, seen, started, jobs, slept,
                      (load_before, load_after))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def follow(fake: FakeGitHub, heads: set[str], started: float, timeout: float, fleet: Fleet
           ) -> dict[str, tuple[float, float]]:
    """head -> (when its regressions run was seen completed, when its selection run was),
    polling the fake GitHub (the bench's own loop; no FastCI job waits here)."""
    selection: dict[str, float] = {}
    regressions: dict[str, float] = {}
    deadline = started + timeout
    while len(regressions) < len(heads):
        now = time.time()
        if now > deadline:
            logs = "\n".join(f"--- {n}\n{fleet.tail(n)}" for n, _ in fleet.procs)
            raise SystemExit(f"only {len(regressions)} of {len(heads)} regressions check runs "
                             f"completed in {timeout:.0f} s\n{logs}")
        for run in fake.check_runs(REPO):
            if run["status"] != "completed" or run["head_sha"] not in heads:
                continue
            target = selection if run["name"] == "FastCI selection" else regressions \
                if run["name"] == "FastCI regressions" else None
            if target is not None:
                target.setdefault(run["head_sha"], now)
        time.sleep(0.5)
    for run in fake.check_runs(REPO):
        if run["name"] == "FastCI regressions":
            assert run["conclusion"] == "success", run["output"]["summary"]
    return {h: (regressions[h], selection.get(h, regressions[h])) for h in heads}


def rq_jobs(client: redis.Redis, prefix: str) -> list[dict]:
    out = []
    for key in client.scan_iter(f"rq:job:{prefix}-*"):
        job_id = key.decode().split("rq:job:", 1)[1]
        if ":" in job_id:
            continue
        job = fetch(job_id, client)
        if job.started_at is None or job.ended_at is None:
            continue
        out.append({"id": job_id, "func": job.func_name, "origin": job.origin,
                    "enqueued": job.enqueued_at.timestamp() if job.enqueued_at else None,
                    "started": job.started_at.timestamp(), "ended": job.ended_at.timestamp(),
                    "sha": (job.args[0] or {}).get("sha") if job.args and isinstance(
                        job.args[0], dict) else None})
    return out


def peak_in_flight(jobs: list[dict]) -> int:
    """The most pull requests with a shard outstanding at once: from the first of its shards
    enqueued to the last one ended."""
    spans: dict[str, list[float]] = {}
    for job in jobs:
        if job["func"].endswith("run_shard") and job["sha"] and job["enqueued"]:
            span = spans.setdefault(job["sha"], [job["enqueued"], job["ended"]])
            span[0], span[1] = min(span[0], job["enqueued"]), max(span[1], job["ended"])
    events = sorted([(a, 1) for a, _ in spans.values()] + [(b, -1) for _, b in spans.values()])
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def report(label, prs, wall, seen, started, jobs, slept, load) -> dict:
    cpu = [j for j in jobs if j["origin"].endswith(("-cpu", "-advance"))]
    gpu = [j for j in jobs if "-gpu-" in j["origin"] or j["origin"].endswith("-background")]

    def pct(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]

    selection = [s - started for _, s in seen.values()]
    done = [r - started for r, _ in seen.values()]
    return {
        "code": label, "prs": prs, "wall_s": round(wall, 1),
        "selection_p50_s": round(statistics.median(selection), 1),
        "selection_p90_s": round(pct(selection, 0.9), 1),
        "regressions_p50_s": round(statistics.median(done), 1),
        "regressions_p90_s": round(pct(done, 0.9), 1),
        "peak_in_flight": peak_in_flight(jobs),
        "cpu_jobs": len(cpu),
        "cpu_busy_s": round(sum(j["ended"] - j["started"] for j in cpu), 1),
        "waiting_s": round(sum(slept.values()), 1),
        "runner_busy_s": round(sum(j["ended"] - j["started"] for j in gpu), 1),
        "load": f"{load[0][0]:.1f} -> {load[1][0]:.1f}",
    }


COLUMNS = [("code", "code"), ("prs", "PRs"), ("wall_s", "wall s"),
           ("selection_p50_s", "selection done p50 s"), ("selection_p90_s", "p90 s"),
           ("regressions_p50_s", "regressions done p50 s"), ("regressions_p90_s", "p90 s"),
           ("peak_in_flight", "peak PRs in flight"), ("cpu_jobs", "selection-worker jobs"),
           ("cpu_busy_s", "their busy s"), ("waiting_s", "worker-s waiting"),
           ("runner_busy_s", "runner busy s"), ("load", "load avg (1 min)")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prs", type=int, default=50)
    parser.add_argument("--python", action="append", metavar="LABEL=INTERPRETER",
                        help="an interpreter with FastCI installed (repeatable; default: "
                             "this one, as 'this tree')")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like an error, so every process and folder of the fleet goes with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.prs < 1:
        parser.error("--prs must be at least 1")
    if shutil.which("redis-server") is None:
        parser.error("redis-server is not installed")
    targets = [tuple(p.split("=", 1)) for p in (args.python or [f"this tree={sys.executable}"])]
    rows = []
    for label, python in targets:
        print(f"measuring {label} ({python}), {args.prs} pull requests …", flush=True)
        rows.append(measure(label, python, args.prs, args.timeout))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[key]) for key, _ in COLUMNS) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
