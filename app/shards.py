"""Runner jobs as a run uses them: bundles published for runners, shards (and pruning's
replays) enqueued on the GPU queues for a run, a finished shard's result validated into a
summary when its run is advanced, a shard whose worker died enqueued again, and the
recordings validated once more when the run publishes. Nothing here waits for a job: the
run is advanced when one ends (`run_state`). The runner side is
`fastci.runner.execution.shard`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job

from fastci.runner.analysis.inventory import Inventories
from fastci.runner.execution import validate
from fastci.runner.execution.flaky import not_run
from fastci.runner.execution.flaky import results as test_results
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.git import Repo
from fastci.runner.selection.report import Decision, TestResult
from fastci.runner.store import EvidenceStore, SqliteEvidenceStore, StoreError

from . import artifacts, github, workspace
from .context import Context, installation_token, superseded
from .events import Work
from .queue import SEEN_TTL, fetch, queue
from .run_state import CANCELLED, TIMED_OUT, Run, RunStore
from .runs import unwatch

log = logging.getLogger("fastci.app")


SHARD_TIMEOUT = 6 * 3600


MAX_SHARD_RUNS = 3


FUNCTIONS = {"shard": "fastci.runner.execution.shard.run_shard",
             "replay": "fastci.runner.execution.replays.run_replays"}
ENDED = ("finished", "failed", "stopped", "canceled")


@dataclass
class Check:
    """What shards' results are validated against, all from the trusted side's git objects;
    the reasons of any rejected, and the captures that passed (for the store)."""

    sha: str
    head_tree: dict
    inventories: object  # Mapping[str, FileBlocks]
    rejected: list = field(default_factory=list)
    captures: dict = field(default_factory=dict)
    """digest -> bytes of the module captures shards sent back, digest-checked."""


def shard_id(ctx: Context) -> str:
    """Shard jobs' ids share a prefix, so the runners' Redis user may reach only them."""
    return f"{ctx.queues.prefix}-shard-{uuid.uuid4().hex}"


def publish_bundle(ctx: Context, mirror: Path, sha: str) -> tuple[Path, str]:
    """A bundle of `sha` for runners, and its signed URL, valid as long as a shard may run."""
    bundle = workspace.bundle(mirror, sha, artifacts.directory(ctx.settings))
    try:
        return bundle, artifacts.publish(ctx.settings, bundle, SHARD_TIMEOUT)
    except BaseException:
        bundle.unlink(missing_ok=True)
        raise


def enqueue(ctx: Context, run: Run, function: str, request: dict, target_name: str, *,
            timeout: int = SHARD_TIMEOUT, description: str = "", runs: int = 1,
            replaces: str | None = None, kept: dict | None = None) -> str:
    """Put one runner job of `run` on a GPU queue and note it in the run (what it was sent,
    less the parts kept once for the run: `kept`, e.g. every test id the plan knows). Its
    worker enqueues `advance(run)` once RQ has stored how it ended (`serve.FastCIWorker`)."""
    job_id = (f"{ctx.queues.prefix}-shard-replay-{uuid.uuid4().hex}" if function == "replay"
              else shard_id(ctx))
    parent = _current_job()
    queue(target_name, ctx.redis).enqueue(
        FUNCTIONS[function], {**request, **(kept or {})}, job_id=job_id, job_timeout=timeout,
        result_ttl=SEEN_TTL, failure_ttl=SEEN_TTL, description=description,
        meta={"run": run.id, "shard_runs": runs, "replaces": replaces, "parent": parent})
    run.jobs[job_id] = {"function": function, "queue": target_name, "request": request,
                        "with_kept": sorted(kept or {}), "timeout": timeout, "runs": runs,
                        "description": description, "done": False, "replaced_by": None,
                        "enqueued": time.time()}
    return job_id


def uncaptured(engine, known: set[str] | None = None) -> dict | None:
    """What a recording shard captures nothing of, and how long each other test may spend
    capturing (its `--fastci-uncaptured`): by the trusted base's capture_min_seconds and
    capture_share and the App's store, since a runner records into scratch and so knows no
    durations. `known`: only these tests."""
    below, share = engine.settings.capture_min_seconds, engine.settings.capture_share
    if not (below or share):
        return None
    try:
        with engine.open_store(create=False) as store:
            durations = store.durations()
    except StoreError:
        return None  # no evidence yet: every test is captured
    if known is not None:
        durations = {t: took for t, took in durations.items() if t in known}
    return {"below": below, "tests": sorted(t for t, took in durations.items() if took < below),
            "allowance": {t: share * took for t, took in sorted(durations.items())
                          if share and took >= below}}


def enqueue_shards(ctx: Context, run: Run, shards: list[list[Decision]], request: dict,
                   kept: dict, background: bool = False) -> list[str]:
    ids = []
    for i, shard in enumerate(shards):
        target = ctx.queues.background if background else ctx.queues.gpu(i % ctx.settings.gpus)
        ids.append(enqueue(ctx, run, "shard", {**request, "tests": [d.test_id for d in shard]},
                           target.name, kept=kept,
                           description=f"shard {i + 1}/{len(shards)} of {request['sha'][:12]}"))
    return ids


def observe(ctx: Context, run: Run, job_id: str, kept: dict) -> tuple[str, str | None]:
    """A runner job's state, read once, and the id of a new job if its worker died, or lost
    Redis, while running it: the job is enqueued again, on the same queue, for any worker
    listening there (at most MAX_SHARD_RUNS runs in all), and the orphan cancelled, so a late
    result does not count twice. One read: with two, a job seen running by the first and
    failed as abandoned (by its worker, back from an outage) by the second was reported as
    a failure instead of being run again."""
    try:
        job = fetch(job_id, ctx.redis)
    except NoSuchJobError:
        return "gone", None
    raw = job.get_status(refresh=True)
    state = getattr(raw, "value", raw) or "gone"  # RQ's JobStatus is a str enum
    abandoned = state == "failed" and "abandoned" in (job_error(job) or "").lower()
    if state != "started" and not abandoned:
        return state, None
    if state == "started" and worker_alive(ctx, job):
        return state, None
    info = run.jobs[job_id]
    if info["runs"] >= MAX_SHARD_RUNS:
        return state, None
    log.warning("runner job %s lost its worker; running it again (%d)", job_id,
                info["runs"] + 1)
    again = enqueue(ctx, run, info["function"], info["request"], info["queue"],
                    timeout=info["timeout"], runs=info["runs"] + 1, replaces=job_id,
                    kept={k: kept[k] for k in info["with_kept"] if k in kept},
                    description=f"{info['description']} (run again)")
    info["replaced_by"] = again
    try:
        job.cancel()
    except InvalidJobOperation as exc:  # it finished meanwhile: its result is not awaited
        log.info("orphaned job %s could not be cancelled: %s", job_id, exc)
    return state, again


def worker_alive(ctx: Context, job: Job) -> bool:
    host, pid = job.meta.get("host"), job.meta.get("pid")
    if host == socket.gethostname() and pid:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, ValueError, OverflowError):
            return True
        return True
    if job.worker_name:  # another machine: its worker's key expires when it stops beating
        return ctx.redis.exists(f"rq:worker:{job.worker_name}") > 0
    return True


def job_error(job: Job) -> str:
    info = (job.latest_result().exc_string if job.latest_result() else None) or "no details"
    return info.strip().splitlines()[-1][:300]


def cancel_pending(ctx: Context, run: Run) -> None:
    """Cancel the run's runner jobs still awaited (a running one finishes unheard)."""
    for job_id in run.pending():
        try:
            fetch(job_id, ctx.redis).cancel()
        except (NoSuchJobError, InvalidJobOperation) as exc:
            log.info("runner job %s not cancelled: %s", job_id, exc)
        run.jobs[job_id]["done"] = True


def result_digest(raw) -> str:
    """What a result was when it was checked: its publish re-reads it and must find it so."""
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def summarize(ctx: Context, job_id: str, state: str, tests: list[str], check: Check,
              budget, blocking: bool) -> dict:
    """A runner job that ended, as the run keeps it: its results (validated before any use:
    one that fails is reported, its tests count as not run), and the digest of what it
    returned (`recorded` says whether it holds a recording to store)."""
    if state != "finished":
        job = fetch(job_id, ctx.redis) if state != "gone" else None
        why = job_error(job) if job is not None else "its job is gone from Redis"
        return _summary(not_run(tests, f"the shard running it {state}: {why}", when="shard",
                                blocking=blocking))
    raw = fetch(job_id, ctx.redis).return_value()
    try:
        recording, failures, _, flaky, firsts = validate.shard(
            raw, head_tree=check.head_tree, inventories=check.inventories,
            planned=set(tests), sha=check.sha, capture_budget_mb=budget)
        if recording is not None:
            validate.captures(raw, recording, budget)
    except InvalidResult as exc:
        log.warning("rejected a shard's result for %s: %s", check.sha[:12], exc)
        return _summary(not_run(tests, f"the shard's result was rejected: {exc}", when="shard",
                                blocking=blocking), rejected=str(exc))
    if recording is None:
        tail = raw.get("output_tail") if isinstance(raw.get("output_tail"), str) else ""
        return _summary(not_run(tests, f"pytest exited {str(raw.get('exit_code'))[:20]} before "
                                       f"recording: {tail[-300:]}", when="shard",
                                blocking=blocking))
    return _summary(test_results(recording, failures, {t: firsts.get(t) for t in flaky},
                                 blocking=blocking), digest=result_digest(raw))


def _summary(results: list[TestResult], rejected: str | None = None,
             digest: str | None = None) -> dict:
    return {"results": [asdict(r) for r in results], "rejected": rejected,
            "digest": digest, "at": time.time()}


def results_of(summaries) -> list[TestResult]:
    return [TestResult(**r) for s in summaries for r in s["results"]]


def run_results(store: RunStore, run: Run) -> list[TestResult]:
    """The results of the run's jobs that ended so far, in the order they were enqueued."""
    summaries = store.results(run.id, run.current())
    return results_of(summaries[j] for j in run.current() if j in summaries)


def recorded(ctx: Context, job_id: str, tests: list[str], check: Check, budget,
             digest: str) -> tuple[object, list[str]] | None:
    """A shard's recording, read again and validated again when the run stores it (what it
    collected; its captures go to `check.captures`); None, with the reason in
    `check.rejected`, if it changed since it was first checked."""
    try:
        raw = fetch(job_id, ctx.redis).return_value()
    except NoSuchJobError:
        raw = None
    if raw is None or result_digest(raw) != digest:
        check.rejected.append(f"the result of {job_id} changed after it was checked")
        return None
    try:
        recording, _, collected, _, _ = validate.shard(
            raw, head_tree=check.head_tree, inventories=check.inventories,
            planned=set(tests), sha=check.sha, capture_budget_mb=budget)
        if recording is not None:
            check.captures.update(validate.captures(raw, recording, budget))
    except InvalidResult as exc:
        check.rejected.append(str(exc))
        return None
    return (recording, collected) if recording is not None else None


def save_captures(store: EvidenceStore, captures: dict[str, bytes]) -> None:
    """Store digest-checked capture bytes (content-addressed; never unpickled here)."""
    if not captures:
        return
    with tempfile.TemporaryDirectory(prefix="fastci-captures-") as tmp:
        files = {}
        for digest, data in captures.items():
            files[digest] = Path(tmp) / digest
            files[digest].write_bytes(data)
        store.save_captures(files)


def _current_job() -> str | None:
    """The id of the job this code runs in, if any (noted on the jobs it enqueues)."""
    from rq import get_current_job  # noqa: PLC0415

    job = get_current_job()
    return job.id if job is not None else None



# -- advancing a run's runner jobs -----------------------------------------------------------
def collect_ended(ctx: Context, store: RunStore, run: Run, blocking: bool = True) -> list[str]:
    """Run again the run's runner jobs whose worker died, and validate the results of those
    that ended since it was last advanced (each kept in Redis as a summary); the jobs that
    changed (empty: nothing new, and nothing was read from git or GitHub)."""
    kept = store.request(run.id)
    changed, ended = [], {}
    for job_id in list(run.pending()):
        state, again = observe(ctx, run, job_id, kept)
        if again is not None:
            changed.append(job_id)
        elif state in (*ENDED, "gone"):
            ended[job_id] = state
    if not ended:
        return changed
    with checked(ctx, run, blocking) as check:
        for job_id, state in ended.items():
            tests = run.jobs[job_id]["request"].get("tests", [])
            store.put_result(run.id, job_id, summarize(
                ctx, job_id, state, tests, check, run.data.get("capture_budget_mb"),
                blocking))
            run.jobs[job_id]["done"] = True
    return [*changed, *ended]


class checked:
    """What a run's shard results are checked against, from git's objects in the mirror:
    the head's tree and (for the blocking dimensions) its inventories, parsed into a
    scratch store that is gone afterwards."""

    def __init__(self, ctx: Context, run: Run, blocking: bool = True) -> None:
        self.ctx, self.run, self.blocking = ctx, run, blocking
        self.scratch: tempfile.TemporaryDirectory | None = None
        self.store: SqliteEvidenceStore | None = None

    def __enter__(self) -> Check:
        work = Work.from_json(self.run.work)
        mirror = workspace.ensure(self.ctx.settings.workspace, work.repo,
                                  self.ctx.settings.clone_url.format(repo=work.repo),
                                  [self.run.head], number=work.number,
                                  token=lambda: installation_token(self.ctx.online(work), work))
        head_tree = workspace.tree(mirror, self.run.head)
        if not self.blocking:  # as the background dimensions were always checked
            return Check(self.run.head, head_tree, {})
        self.scratch = tempfile.TemporaryDirectory(prefix="fastci-check-")
        self.store = SqliteEvidenceStore(Path(self.scratch.name) / "inventories.db")
        return Check(self.run.head, head_tree, Inventories(Repo(mirror), self.run.head,
                                                           head_tree, self.store))

    def __exit__(self, *exc) -> None:
        if self.store is not None:
            self.store.close()
        if self.scratch is not None:
            self.scratch.cleanup()


def end_if_over(ctx: Context, store: RunStore, run: Run) -> dict | None:
    """End the run if a newer head superseded it or its deadline passed (saved); its
    outcome then, else None."""
    work = Work.from_json(run.work)
    newer = superseded(ctx, work, run.head)
    if not newer and time.time() <= run.deadline:
        return None
    online = ctx.online(work)
    end(online, run, github.CheckRuns(online.repo, run.data.get("sent")),
        CANCELLED if newer else TIMED_OUT)
    store.save(run)
    return run.outcome


def end(ctx: Context, run: Run, runs, state: str) -> None:
    """End a run that will not publish: a newer head superseded it, or its deadline passed.
    Its runner jobs still queued are cancelled; its open check runs say why. `ctx` is
    online (GitHub)."""
    cancel_pending(ctx, run)
    if state == CANCELLED:
        output = github.CheckRunOutput("Superseded by a newer push", "A newer commit was "
                                       "pushed to this pull request; its run replaces this one.")
    else:
        output = github.CheckRunOutput("Timed out", "FastCI did not hear back from every "
                                       "runner job before the run's deadline. Nothing is "
                                       "assumed to have passed: comment `/fastci retest`.")
    conclusion = "cancelled" if state == CANCELLED else "timed_out"
    for name in ("selection_run", "regressions_run", "check_run"):
        if run.data.get(name) is None:
            continue
        check_run = github.retrying(lambda n=name: ctx.repo.get_check_run(run.data[n]))
        if check_run.status != "completed":
            runs.update(check_run, conclusion=conclusion, output=output)
        unwatch(ctx, check_run)
    run.data["sent"] = runs.sent()
    discard_artifacts(ctx, run)
    run.state = state
    run.outcome = {"status": "superseded" if state == CANCELLED else "timed out",
                   "head": run.head}


def discard_artifacts(ctx: Context, run: Run) -> None:
    """The run's bundle and replay pack: their links outlive no run."""
    artifacts.discard(ctx.settings, run.data.get("bundle"))
    artifacts.discard(ctx.settings, (run.data.get("replay") or {}).get("pack"))
