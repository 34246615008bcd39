"""Processes: the webhook service under gunicorn, and RQ workers.

A worker never forks per job (`rq.SimpleWorker`): a GPU worker pinned with
CUDA_VISIBLE_DEVICES keeps one process, and the tests themselves run in pytest children.
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

        def load(self):
            return app

    Server().run()


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
