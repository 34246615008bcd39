"""A world for the dashboard's tests: the fake GitHub with the App's OAuth credentials, two
private repositories (alice reads octo/widgets; nobody but its owner reads octo/secret), the
webhook service on a real WSGI server with its own Redis key prefix, and a month of runs in
the ledger, as the selection worker writes them."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace

from fastci.app import ledger
from fastci.app.settings import Secret, load
from fastci.app.web import create_app
from fastci.testing.fakegithub import FakeGitHub

APP_ID = 4242
CLIENT_ID = "Iv1.dashboardtest"
CLIENT_SECRET = "client-secret-for-the-dashboard-tests"
READABLE, HIDDEN = "octo/widgets", "octo/secret"


class World:
    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.prefix = f"dashtest{uuid.uuid4().hex[:10]}"
        self.github = FakeGitHub()

    def __enter__(self) -> World:
        from redis import Redis  # noqa: PLC0415
        from werkzeug.serving import make_server  # noqa: PLC0415

        self.github.__enter__()
        gh = self.github
        gh.register_app(APP_ID, client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
        gh.add_repo(READABLE, installation_id=7, private=True)
        gh.add_repo(HIDDEN, installation_id=7, private=True)
        gh.set_permission(READABLE, "alice", "read")
        self.redis = Redis.from_url(self.redis_url)
        settings = replace(
            load({}), webhook_secret=Secret("webhook-secret"), redis_url=self.redis_url,
            queue_prefix=self.prefix, github_url=gh.url, github_web_url=gh.url,
            oauth_client_id=CLIENT_ID, oauth_client_secret=Secret(CLIENT_SECRET),
            session_secret=Secret("s" * 40))
        self.server = make_server("127.0.0.1", 0, create_app(settings, self.redis),
                                  threaded=True)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,),
                                       daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.github.__exit__(*exc)
        keys = list(self.redis.scan_iter(f"{self.prefix}:*"))
        if keys:
            self.redis.delete(*keys)

    def seed(self) -> None:
        """A month of runs: pull requests (one with a failure, one with a flaky test),
        a shadow run that found an escape, full runs on main; and one run of the hidden
        repository, which alice must never see."""
        now = time.time()
        for entry in sample_runs(READABLE, now):
            ledger.save(self.redis, self.prefix, entry)
        for entry in sample_runs(HIDDEN, now)[:2]:
            ledger.save(self.redis, self.prefix, entry)


def _test(test_id: str, rank: int, risk: float, seconds: float, *reasons: str) -> dict:
    return {"id": test_id, "rank": rank, "risk": risk, "seconds": seconds,
            "dimension": "correctness", "new": False, "reasons": list(reasons)}


def sample_runs(repo: str, now: float) -> list[dict]:
    day = 86400
    tests = [
        _test("tests/test_rope.py::test_rotary_matches_reference[float32]", 1, 0.91, 41.2,
              "executes changed block tinyllm/rope.py::apply_rotary",
              "failed 2 of its last 20 runs"),
        _test("tests/test_attention.py::test_sparse_mask", 2, 0.64, 12.8,
              "executes changed block tinyllm/rope.py::apply_rotary"),
        _test("tests/test_train.py::test_golden_loss", 3, 0.52, 188.0,
              "executes changed block tinyllm/rope.py::RotaryCache.__init__"),
        _test("tests/test_model.py::test_forward_shapes", 4, 0.21, 3.4,
              "reads tinyllm/configs/small.yaml, which changed"),
    ]
    pruned = [_test("tests/test_model.py::test_block_equivalence", None, 0.1, 22.0,
                    "pruned: replayed TransformerBlock.forward under the new code, "
                    "outputs and gradients identical (float32, atol 0)")]
    runs = []
    for k, (days_ago, number, failed, flaky) in enumerate([
            (26, 11, [], []), (21, 12, [], ["tests/test_attention.py::test_sparse_mask"]),
            (15, 14, ["tests/test_rope.py::test_rotary_matches_reference[float32]"], []),
            (9, 15, [], []), (4, 17, [], []), (1, 18, [], [])]):
        total_seconds = 1850.0 + 40 * k
        selected_seconds = 245.4 + 11 * k
        head = f"{k + 1:x}" * 40
        shards = [
            {"job": f"fastci-shard-{k}a", "queue": "fastci-gpu-0",
             "tests": [t["id"] for t in tests[:2]],
             "status": "finished", "worker": "gpu-0.runner-a", "host": "runner-a",
             "seconds": 61.0 + k},
            {"job": f"fastci-shard-{k}b", "queue": "fastci-gpu-1",
             "tests": [t["id"] for t in tests[2:]],
             "status": "finished", "worker": "gpu-1.runner-b", "host": "runner-b",
             "seconds": 197.5 + k}]
        runs.append({
            "kind": "pull_request", "at": now - days_ago * day, "repo": repo, "number": number,
            "head": head, "base": "0" * 40, "mode": "select", "chosen": len(tests),
            "selection": {"total": 357, "selected": len(tests), "skipped": 353, "pruned": 1,
                          "expected_seconds_total": total_seconds,
                          "expected_seconds_selected": selected_seconds,
                          "expected_seconds_saved": total_seconds - selected_seconds,
                          "select_all_reason": None, "changed_files": 2, "notes": [],
                          "tests": tests, "pruned_tests": pruned},
            "results": {"ran": len(tests), "failed": failed, "flaky": flaky,
                        "test_seconds_run": selected_seconds,
                        "time_to_first_failure": 41.2 if failed else None},
            "shards": shards, "escaped": [],
            "check_runs": [
                {"name": "FastCI selection", "conclusion": "success",
                 "url": f"https://github.com/{repo}/runs/{900 + 2 * k}"},
                {"name": "FastCI regressions", "conclusion": "failure" if failed else "success",
                 "url": f"https://github.com/{repo}/runs/{901 + 2 * k}"}]})
    shadow = dict(runs[3], kind="shadow", at=now - 8 * day, number=16, head="c" * 40,
                  escaped=["tests/test_data.py::test_filter_threshold"],
                  results={"ran": 357, "failed": ["tests/test_data.py::test_filter_threshold"],
                           "flaky": [], "test_seconds_run": 1901.0,
                           "time_to_first_failure": 310.5})
    full = [{"kind": "full", "at": now - d * day, "repo": repo, "number": None,
             "head": f"{d:x}".rjust(40, "e"), "base": None, "mode": "all", "selection": None,
             "chosen": 357, "results": {"ran": 357, "failed": [], "flaky": [],
                                        "test_seconds_run": 1880.0 + d,
                                        "time_to_first_failure": None},
             "shards": [{"job": f"fastci-shard-full{d}", "queue": "fastci-gpu-0", "tests": [],
                         "status": "finished", "worker": "gpu-0.runner-a", "host": "runner-a",
                         "seconds": 1905.0 + d}],
             "escaped": [], "check_runs": []} for d in (20, 6)]
    return sorted([*runs, shadow, *full], key=lambda e: e["at"])
