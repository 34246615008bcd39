"""Processes: the webhook service under gunicorn, and RQ workers.

A worker never forks per job (`rq.SimpleWorker`): a GPU worker pinned with
CUDA_VISIBLE_DEVICES keeps one process, and the tests themselves run in pytest children.
`FastCIWorker` adds the two things runs need (`run_state`): when a job of a run ends, once
RQ has stored its result or its failure, the worker enqueues `advance(run)` (an RQ callback
would run before that, and in a runner's worker it must do nothing but this); and from the
advance queue, the one queue runners may write, it runs nothing but `advance` jobs.

The service's metrics (`metrics.py`) run in prometheus-client's multiprocess mode: the
folder is prepared, and named in the environment, before anything imports
prometheus-client, and gunicorn's `child_exit` hook retires a dead worker's files.
"""

from __future__ import annotations

import logging
import os
import time

from redis import Redis
from redis.exceptions import RedisError
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from .queue import ADVANCE, FastCIJob, advance_queue_name, enqueue_advance, queue
from .run_state import RunStore
from .settings import AppSettings, load

log = logging.getLogger("fastci.app")
ABANDONED = "AbandonedJobError: abandoned: its worker lost Redis while running it"
OUTAGE_REQUEUES = 2  # times the selection side's job is run again after outages
PUBSUB_POLL = 1.0  # seconds a worker's pubsub thread reads for (its stop waits that long)
RESTART_PAUSE = 1.0  # seconds at least between two starts of the worker's loop


class FastCIWorker(SimpleWorker):
    """A SimpleWorker for FastCI's queues under `prefix` (see the module's docstring)."""

    def __init__(self, *args, prefix: str = "fastci", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fastci_prefix = prefix
        self.stopping = False  # asked to stop (SIGINT, SIGTERM), not stopped by an outage
        self.fastci_running: tuple | None = None  # (job, queue) while RQ executes it

    def hand_back(self) -> None:
        """After an outage took the worker's loop down mid-job, the job is failed as
        abandoned and followed up, since this process is alive and nothing else would
        notice (`_follow_up`); then, on the selection side, the runs this process still
        holds are released, since the job that held them can no longer release them, and
        every run in flight is advanced."""
        running, self.fastci_running = self.fastci_running, None
        if running is not None:
            self._abandon(*running)
        if advance_queue_name(self.fastci_prefix) not in self.queue_names():
            return  # a runner: it holds no run, and its Redis user may read none
        store = RunStore(self.connection, self.fastci_prefix)
        freed = store.free_stranded()
        for run in freed:
            log.warning("run %s was held by a job the outage took down: released", run[:12])
        # Every run in flight is looked at again now, as the watchdog's next cycle would:
        # what the outage interrupted elsewhere (a write lost, an advance dropped) is
        # noticed at once, not one watchdog cycle later, and where no watchdog runs.
        for run in sorted({*freed, *store.in_flight()}):
            enqueue_advance(self.connection, self.fastci_prefix, run, "after an outage")

    def _abandon(self, job, queue) -> None:
        try:
            status = job.get_status(refresh=True)
        except Exception as exc:  # noqa: BLE001 - gone with the outage: the watchdog's deadline
            log.warning("could not read job %s after the outage: %s", job.id, exc)
            return
        if getattr(status, "value", status) not in ("started", "queued"):
            return  # RQ recorded its end before the outage
        log.warning("job %s was running when Redis went away: failing it as abandoned", job.id)
        self.handle_job_failure(job, queue, exc_string=ABANDONED)
        self._follow_up(job, queue)

    def _follow_up(self, job, queue) -> None:
        """What answers an abandoned job: a runner job's run is advanced (which runs the job
        again); an advance is enqueued again; the selection side's own jobs (a delivery's
        pipeline, a command) are requeued, up to OUTAGE_REQUEUES times: they are idempotent
        (a run, a check run and a reply are each found again by their key)."""
        run = job.meta.get("run") if isinstance(job.meta, dict) else None
        if isinstance(run, str):
            enqueue_advance(self.connection, self.fastci_prefix, run,
                            f"{job.id} abandoned in an outage")
        elif queue.name == advance_queue_name(self.fastci_prefix):
            if job.args and isinstance(job.args[0], str):
                enqueue_advance(self.connection, self.fastci_prefix, job.args[0],
                                "an advance abandoned in an outage")
        elif queue.name == f"{self.fastci_prefix}-cpu":
            requeues = int(job.meta.get("outage_requeues", 0))
            if requeues < OUTAGE_REQUEUES:
                job.meta["outage_requeues"] = requeues + 1
                job.save_meta()
                job.requeue()
                log.warning("job %s requeued after the outage (%d)", job.id, requeues + 1)

    def request_stop(self, signum, frame) -> None:
        self.stopping = True
        super().request_stop(signum, frame)

    def subscribe(self) -> None:
        """RQ's, with the pubsub thread (commands such as kill-horse) reading for at most a
        second at a time rather than a minute: since redis-py 8.2, stopping that thread
        waits until its read returns, so every worker's shutdown, a burst worker's end
        included, took up to 60 s (RQ's own join has a 1 s timeout it can no longer keep)."""
        self.log.info("Worker %s: subscribing to channel %s", self.name,
                      self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_POLL, daemon=True,
            exception_handler=self._pubsub_exception_handler)

    def execute_job(self, job, queue) -> None:
        advances = advance_queue_name(self.fastci_prefix)
        try:
            is_advance = (job.id.startswith(f"{advances}-") and job.func_name == ADVANCE
                          and job.instance is None)
        except Exception:  # noqa: BLE001 - not JSON (a pickle): RQ fails it as it runs
            is_advance = False
        if (queue.name == advances) != is_advance:
            # A runner may create advance jobs and push ids on their queue, nothing more:
            # any other job there (or an id pushed twice onto another queue) never runs.
            log.error("refused job %s from %s: only advance jobs run from the advance "
                      "queue, and advance jobs from nowhere else", job.id, queue.name)
            return
        self.fastci_running = (job, queue)  # until RQ has recorded how it ended
        super().execute_job(job, queue)
        self.fastci_running = None
        _log_outcome(job)
        run = job.meta.get("run") if isinstance(job.meta, dict) else None
        if isinstance(run, str) and not is_advance:
            try:
                enqueue_advance(self.connection, self.fastci_prefix, run, f"{job.id} ended")
            except Exception as exc:  # noqa: BLE001 - the watchdog's nudge catches up
                log.warning("could not enqueue the advance of run %s: %s", run[:12], exc)


def _log_outcome(job) -> None:
    """The status a job returned ("running", "in flight", "advanced by another job"): what
    an operator reads to see where a run stands, beside RQ's "Job OK"."""
    try:
        result = job.return_value(refresh=True)
    except Exception:  # noqa: BLE001 - a log line is never worth failing a worker for
        return
    if isinstance(result, dict) and "status" in result:
        log.info("job %s: %s", job.id, str(result["status"])[:120])


def serve(bind: str = "127.0.0.1:8000", workers: int = 2, settings: AppSettings | None = None
          ) -> None:
    from gunicorn.app.base import BaseApplication  # noqa: PLC0415

    prepare_metrics_dir()  # before .web imports prometheus-client
    from .web import create_app  # noqa: PLC0415

    app = create_app(settings or load())

    class Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", bind)
            self.cfg.set("workers", workers)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("threads", 8)
            self.cfg.set("timeout", 30)
            self.cfg.set("accesslog", "-")
            # Never log request headers, bodies or query strings: they carry signatures
            # (an artifact link's is in its query) and payloads.
            self.cfg.set("access_log_format", '%(h)s "%(m)s %(U)s" %(s)s %(b)s %(M)sms')
            self.cfg.set("child_exit", child_exit)

        def load(self):
            return app

    Server().run()


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_metrics_dir(environ: dict | None = None) -> str:
    """prometheus-client's multiprocess folder: PROMETHEUS_MULTIPROC_DIR, or a private
    temporary one, created, emptied of a previous run's files and named in the environment.
    Call it before prometheus-client is imported (it picks its mode at import)."""
    import tempfile  # noqa: PLC0415

    environ = os.environ if environ is None else environ
    path = environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="fastci-prometheus-")
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        if name.endswith(".db"):
            os.unlink(os.path.join(path, name))
    environ[MULTIPROC_ENV] = path
    return path


def child_exit(_server, worker) -> None:
    """gunicorn's child_exit hook: a dead worker's files stop counting as live."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess  # noqa: PLC0415 (multiprocess mode only)

        multiprocess.mark_process_dead(worker.pid)


def queue_names(settings: AppSettings, gpu: int | None, cpu: bool) -> list[str]:
    """A selection worker takes advances first (they finish runs and free nothing up but
    are short), then new work; a GPU worker its own GPU's jobs, then background shards."""
    prefix = settings.queue_prefix
    if cpu:
        return [advance_queue_name(prefix), f"{prefix}-cpu"]
    if gpu is not None:
        return [f"{prefix}-gpu-{gpu}", f"{prefix}-background"]
    return [advance_queue_name(prefix), f"{prefix}-cpu", f"{prefix}-gpu-0",
            f"{prefix}-background"]


def work(gpu: int | None = None, cpu: bool = False, burst: bool = False,
         settings: AppSettings | None = None, name: str | None = None) -> bool:
    """Run a worker until stopped (or, with `burst`, until the queues are empty)."""
    settings = settings or load()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)  # before anything touches CUDA
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    redis = Redis.from_url(settings.redis_url)
    queues = [queue(n, redis) for n in queue_names(settings, gpu, cpu)]
    while True:
        worker = FastCIWorker(queues, connection=redis, name=name, job_class=FastCIJob,
                              serializer=JSONSerializer, prefix=settings.queue_prefix)
        started = time.monotonic()
        try:
            worked = worker.work(burst=burst, with_scheduler=False)
            if burst or worker.stopping:
                return worked
            # RQ's loop ends on its own only on an error it logged ("found an unhandled
            # exception, quitting"): most often an outage, which may be over already.
            log.warning("the worker's loop ended on its own: it comes back")
        except RedisError as exc:
            if burst or worker.stopping:
                raise
            log.warning("Redis went away (%s)", exc)
        # An idle worker quits when Redis goes away; this one comes back with it, as the
        # runs it serves expect (they are advanced by jobs on its queues). It hands back
        # what it held first: a process that exited instead would leave the runs its job
        # held locked until their lease ran out.
        _wait_for(redis)
        try:
            worker.hand_back()
            worker.register_death()  # its name is free again
        except RedisError as exc:
            log.warning("Redis went away again while the worker came back (%s)", exc)
        time.sleep(max(0.0, RESTART_PAUSE - (time.monotonic() - started)))


def _answers(redis: Redis) -> bool:
    try:
        return bool(redis.ping())
    except RedisError:
        return False


def _wait_for(redis: Redis, longest: float = 30.0) -> None:
    """Until Redis answers again (the worker's own loop, not a job's)."""
    wait = 1.0
    while not _answers(redis):
        log.warning("waiting %.0f s for Redis to come back", wait)
        time.sleep(wait)
        wait = min(wait * 2, longest)
