"""Processes: the webhook service under gunicorn, and RQ workers.

A worker never forks per job (`rq.SimpleWorker`): a GPU worker pinned with
CUDA_VISIBLE_DEVICES keeps one process, and the tests themselves run in pytest children.

The service's metrics (`metrics.py`) run in prometheus-client's multiprocess mode: the
folder is prepared, and named in the environment, before anything imports
prometheus-client, and gunicorn's `child_exit` hook retires a dead worker's files.
"""

from __future__ import annotations

import logging
import os

from redis import Redis
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from .queue import FastCIJob, queue
from .settings import AppSettings, load


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
    prefix = settings.queue_prefix
    if cpu:
        return [f"{prefix}-cpu"]
    if gpu is not None:
        return [f"{prefix}-gpu-{gpu}", f"{prefix}-background"]
    return [f"{prefix}-cpu", f"{prefix}-gpu-0", f"{prefix}-background"]


def work(gpu: int | None = None, cpu: bool = False, burst: bool = False,
         settings: AppSettings | None = None, name: str | None = None) -> bool:
    """Run a worker until stopped (or, with `burst`, until the queues are empty)."""
    settings = settings or load()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)  # before anything touches CUDA
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    redis = Redis.from_url(settings.redis_url)
    queues = [queue(n, redis) for n in queue_names(settings, gpu, cpu)]
    worker = SimpleWorker(queues, connection=redis, name=name, job_class=FastCIJob,
                          serializer=JSONSerializer)
    return worker.work(burst=burst, with_scheduler=False)
