"""The webhook service: verify, route, claim, enqueue, answer 202 in milliseconds.

    gunicorn 'fastci.app.web:create_app()'      (or `fastci serve`)

POST /webhooks   X-Hub-Signature-256 (HMAC-SHA256) is required; then X-GitHub-Event and
                 X-GitHub-Delivery; the body must be a JSON object within the size limit.
                 202 when work was enqueued or deliberately ignored (the body says which),
                 200 for a duplicate delivery and for ping, 4xx for bad requests (the body
                 says why), 503 when Redis cannot be reached (GitHub may redeliver).
GET /healthz     200 when Redis answers, else 503.
GET /metrics     Prometheus exposition by prometheus-client (`metrics.py`): deliveries by
                 status and outcome, job durations by kind, queue depths, check runs in
                 flight, GPU-seconds saved and run, the watchdog's actions.
GET /artifacts/<name>?expires=..&sig=..
                 A file the selection worker published for one job's runners
                 (`artifacts.py`): streamed when the signature is right and unexpired, 403
                 when it is not, 404 for a name that is no artifact or one that is gone.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from flask import Flask, Response, jsonify, request, send_file
from redis import Redis
from redis.exceptions import RedisError
from werkzeug.exceptions import HTTPException

from . import artifacts, dashboard, events, metrics
from .queue import Queues
from .settings import AppSettings, SettingsError, load
from .signature import verify

log = logging.getLogger("fastci.app")
DELIVERY_ID = re.compile(r"^[A-Za-z0-9-]{1,64}$")
EVENT_NAME = re.compile(r"^[a-z_]{1,64}$")


def create_app(settings: AppSettings | None = None, redis: Redis | None = None) -> Flask:
    settings = settings or load()
    if not settings.webhook_secret:
        raise SettingsError("the webhook service needs FASTCI_WEBHOOK_SECRET or "
                            "FASTCI_WEBHOOK_SECRET_FILE")
    redis = redis or Redis.from_url(settings.redis_url, socket_timeout=2,
                                    socket_connect_timeout=2)
    queues = Queues(redis, settings.queue_prefix, settings.gpus)
    app = Flask("fastci.app")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    secret = settings.webhook_secret.reveal()
    if settings.artifact_secret is None:
        log.warning("FASTCI_ARTIFACT_SECRET(_FILE) is unset: GET /artifacts serves nothing, "
                    "and runners on other machines cannot download their jobs' bundles")

    def answer(status: int, message: str, **extra) -> Response:
        """Every answer: JSON with a message, counted in /metrics by status (deliveries to
        /webhooks with their outcome as fastci_deliveries_total, anything else as
        fastci_requests_total)."""
        metrics.count_answer(request.path == "/webhooks", status, message)
        response = jsonify({"message": message, **extra})
        response.status_code = status
        return response

    @app.post("/webhooks")
    def webhook():
        checked = _check_delivery(settings, secret)
        if isinstance(checked, Refused):
            return answer(checked.status, checked.reason)
        event, delivery, payload = checked.event, checked.delivery, checked.payload
        if event == "ping":
            return answer(200, "pong", zen=payload.get("zen") if isinstance(payload, dict)
                          else None)
        try:
            routed = events.route(event, payload, settings.allowed_bots)
        except events.PayloadError as exc:
            return answer(422, str(exc))
        if isinstance(routed, events.Ignored):
            return answer(202, f"ignored: {routed.reason}", delivery=delivery)
        status, message, extra = _enqueue(queues, routed, delivery)
        return answer(status, message, delivery=delivery, **extra)

    _json_errors(app, answer, settings.max_body_bytes)

    @app.get("/healthz")
    def healthz():
        try:
            redis.ping()
        except RedisError as exc:
            return jsonify({"status": "unavailable", "redis": type(exc).__name__}), 503
        return jsonify({"status": "ok", "redis": "ok"})

    scraped = metrics.RedisCollector(redis, settings.queue_prefix, [
        queues.cpu.name, queues.background.name,
        *(queues.gpu(i).name for i in range(settings.gpus))])

    @app.get("/metrics")
    def prometheus_metrics():
        return Response(metrics.exposition(scraped), content_type=metrics.CONTENT_TYPE)

    @app.get(f"{artifacts.ROUTE}<name>")
    def artifact(name: str):
        refused = artifacts.check(settings, name, request.args.get("expires"),
                                  request.args.get("sig"))
        if refused is not None:
            return answer(refused.status, refused.reason)
        try:
            file = artifacts.open_artifact(settings, name)
        except FileNotFoundError:
            return answer(404, "no such artifact: its job has ended")
        response = send_file(file, mimetype="application/octet-stream", download_name=name,
                             max_age=0, conditional=False)
        response.content_length = os.fstat(file.fileno()).st_size
        return response

    dashboard.install(app, settings, redis, queues)
    return app


def _json_errors(app: Flask, answer: Callable[..., Response], max_body_bytes: int) -> None:
    """Every error, Flask's own included, answered in JSON with a message and counted."""
    @app.errorhandler(413)
    def too_large(_error):
        return answer(413, f"body exceeds the {max_body_bytes} byte limit")

    @app.errorhandler(404)
    def not_found(_error):
        return answer(404, "not found: FastCI serves POST /webhooks, GET /healthz, "
                           "GET /metrics and signed GET /artifacts/<name> links")

    @app.errorhandler(405)
    def wrong_method(_error):
        return answer(405, f"{request.method} is not allowed on {request.path}")

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException):
        """Any other error Flask raises (400 for a malformed request, ...), as JSON."""
        return answer(error.code or 500, f"{error.name}: {error.description}")

    @app.errorhandler(Exception)
    def internal_error(error: Exception):
        """A bug: logged with its traceback, answered in JSON; GitHub may redeliver."""
        log.exception("internal error on %s %s", request.method, request.path)
        return answer(500, f"internal error ({type(error).__name__}); the delivery was not "
                           "enqueued and can be redelivered")


@dataclass(frozen=True)
class Refused:
    status: int
    reason: str


@dataclass(frozen=True)
class Delivery:
    event: str
    delivery: str
    payload: object


def _check_delivery(settings: AppSettings, secret: str) -> Delivery | Refused:
    """The request as a delivery, or why it is refused.

    The signature is checked before anything else of the request is read."""
    length = request.content_length
    if length is not None and length > settings.max_body_bytes:
        return Refused(413, f"body of {length} bytes exceeds the {settings.max_body_bytes} "
                            "byte limit")
    body = request.get_data(cache=False)
    problem = verify(secret, body, request.headers.get("X-Hub-Signature-256"))
    if problem:
        return Refused(401, problem)
    event = request.headers.get("X-GitHub-Event", "")
    delivery = request.headers.get("X-GitHub-Delivery", "")
    if not EVENT_NAME.match(event):
        return Refused(400, "missing or malformed X-GitHub-Event header")
    if not DELIVERY_ID.match(delivery):
        return Refused(400, "missing or malformed X-GitHub-Delivery header")
    if not request.mimetype or request.mimetype != "application/json":
        return Refused(415, "Content-Type must be application/json (set the App's webhook "
                            "content type to JSON)")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return Refused(400, f"the body is not valid JSON: {exc}")
    except RecursionError:
        return Refused(400, "the body is not JSON FastCI reads: it is nested too deeply")
    return Delivery(event, delivery, payload)


def _enqueue(queues: Queues, routed: events.Work, delivery: str) -> tuple[int, str, dict]:
    """Claim the delivery, enqueue its work, and say how it went: (status, message, extra).

    The claim is released when the enqueue fails, so a redelivery can still be enqueued."""
    try:
        if not queues.claim(delivery):
            return 200, "duplicate delivery: already enqueued", {}
        try:
            job = queues.enqueue(routed, delivery)
        except Exception:
            queues.release(delivery)
            raise
    except RedisError as exc:
        log.warning("redis unavailable for delivery %s: %s", delivery, type(exc).__name__)
        return 503, ("the queue (Redis) is unavailable; the delivery was not enqueued and can "
                     "be redelivered"), {}
    return 202, f"enqueued {routed.kind}", {"job": job.id}
