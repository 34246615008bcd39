"""The dashboard, under /dashboard of the webhook service: what FastCI saved and caught, per
repository and per pull request, and the queues and workers. Behind GitHub's sign-in
(`oauth.py`); a user sees only the repositories GitHub says they can read.

GET  /dashboard/                          the user's repositories, last 30 days at a glance
GET  /dashboard/<owner>/<name>            GPU-hours run and saved per day, test-seconds
                                          saved, escapes, time to the first failure, flaky tests
GET  /dashboard/<owner>/<name>/pull/<n>   each run: the selection with reasons and pruned
                                          tests, the shards (runner, duration), the check runs
GET  /dashboard/queues                    queue depths and workers
GET  /dashboard/login, /dashboard/callback   the sign-in; POST /dashboard/logout

Not signed in: a redirect to the sign-in, which comes back to the page asked for. A forged,
replayed or expired OAuth state: 400 with the reason. A repository the user cannot read: 404,
the same page as for one that does not exist. The pages read only Redis: the summaries the
selection worker keeps (`ledger.py`), the queues and RQ's workers.
"""

from __future__ import annotations

import json
import logging
import secrets
import statistics
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from functools import wraps
from urllib.parse import urlsplit

from flask import Blueprint, Flask, abort, redirect, render_template, request, session, url_for
from redis import Redis
from redis.exceptions import RedisError
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.worker import Worker

from . import charts, ledger, oauth
from .queue import Queues, fetch
from .settings import AppSettings

log = logging.getLogger("fastci.app")

SESSION_TTL = 3600  # a sign-in holds this long; GitHub's access is asked again after it
DAYS = 30
PALETTE = {"run": "#2f6f9f", "saved": "#8cc5a5", "line": "#2f6f9f", "fail": "#c2410c"}


def install(app: Flask, settings: AppSettings, redis: Redis, queues: Queues) -> None:
    """Serve the dashboard on `app` when its sign-in is configured (else say so, once)."""
    if not settings.dashboard_enabled:
        log.info("the dashboard is off: it needs FASTCI_OAUTH_CLIENT_ID, "
                 "FASTCI_OAUTH_CLIENT_SECRET(_FILE) and FASTCI_SESSION_SECRET(_FILE)")
        return
    app.secret_key = settings.session_secret.reveal()
    app.config.update(SESSION_COOKIE_NAME="fastci_session", SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Lax",
                      SESSION_COOKIE_SECURE=(settings.public_url or "").startswith("https:"),
                      SESSION_COOKIE_PATH="/dashboard")
    app.register_blueprint(blueprint(settings, redis, queues))


class Site:
    """What every view needs: the settings, Redis, the signed-in user and page rendering."""

    def __init__(self, settings: AppSettings, redis: Redis, queues: Queues) -> None:
        self.settings, self.redis, self.queues = settings, redis, queues

    def session_key(self, sid: str) -> str:
        return self.queues.key("dash", "session", sid)

    def current_user(self) -> dict | None:
        sid = session.get("sid")
        if not isinstance(sid, str):
            return None
        raw = self.redis.get(self.session_key(sid))
        return json.loads(raw) if raw else None

    def signed_in(self, view):
        """The view, given the user; a browser not signed in is sent to sign in first."""
        @wraps(view)
        def wrapper(*args, **kwargs):
            user = self.current_user()
            if user is None:
                return redirect(url_for("dashboard.login", next=request.full_path.rstrip("?")))
            return view(user, *args, **kwargs)
        return wrapper

    @staticmethod
    def readable(user: dict, owner: str, name: str) -> str:
        """The repository's name as GitHub spells it, or 404 (also for one that does not
        exist: the two answers are the same)."""
        wanted = f"{owner}/{name}".lower()
        for repo in user["repos"]:
            if repo.lower() == wanted:
                return repo
        abort(404)

    def callback_url(self) -> str:
        if self.settings.public_url:
            return self.settings.public_url + url_for("dashboard.callback")
        return url_for("dashboard.callback", _external=True)

    def page(self, template: str, status: int = 200, **context):
        return render_template(f"dashboard/{template}", user=self.current_user(),
                               **context), status

    def refused(self, message: str, status: int = 400):
        return self.page("message.html", status, title="Sign-in refused", message=message)


def when(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%b %d, %H:%M UTC")


def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.1f} h"


def blueprint(settings: AppSettings, redis: Redis, queues: Queues) -> Blueprint:
    bp = Blueprint("dashboard", __name__, url_prefix="/dashboard",
                   template_folder="templates")
    site = Site(settings, redis, queues)
    bp.add_app_template_filter(when, "when")
    bp.add_app_template_filter(seconds, "seconds")

    @bp.errorhandler(404)
    def not_found(_error):
        return site.page("message.html", 404, title="Not found",
                         message="There is no such page, or no repository of that name you "
                                 "can read.")

    _sign_in_routes(bp, site)
    _page_routes(bp, site)
    return bp


def _sign_in_routes(bp: Blueprint, site: Site) -> None:
    settings, redis = site.settings, site.redis

    @bp.get("/login")
    def login():
        state, made_at = oauth.new_state()
        session.update(oauth_state=state, oauth_state_at=made_at,
                       next=_local(request.args.get("next")))
        return redirect(oauth.authorize_url(settings.github_web_url, settings.oauth_client_id,
                                            site.callback_url(), state))

    @bp.get("/callback")
    def callback():
        kept, made_at = session.pop("oauth_state", None), session.pop("oauth_state_at", None)
        if request.args.get("error"):
            said = request.args.get("error_description") or request.args["error"]
            return site.refused(f"GitHub said: {said}")
        problem = oauth.check_state(request.args.get("state"), kept, made_at)
        if problem is None and not request.args.get("code"):
            problem = "the callback carries no code"
        if problem:
            return site.refused(problem)
        try:
            token = oauth.exchange(settings.github_web_url, settings.oauth_client_id,
                                   settings.oauth_client_secret.reveal(),
                                   request.args["code"], site.callback_url())
        except oauth.SignInError as exc:
            return site.refused(str(exc))
        try:
            user = oauth.whoami(settings.github_url, token)
        except oauth.SignInError as exc:
            return site.refused(str(exc), 502)
        sid = secrets.token_urlsafe(24)
        redis.set(site.session_key(sid), json.dumps({
            "login": user.login, "name": user.name, "avatar_url": user.avatar_url,
            "repos": list(user.repos), "at": time.time()}), ex=SESSION_TTL)
        target = session.pop("next", None) or url_for("dashboard.index")
        session["sid"] = sid
        log.info("dashboard sign-in: %s (%d repositories)", user.login, len(user.repos))
        return redirect(target)

    @bp.post("/logout")
    def logout():
        sid = session.pop("sid", None)
        if isinstance(sid, str):
            redis.delete(site.session_key(sid))
        session.clear()
        return site.page("message.html", title="Signed out", message="You are signed out.")


def _page_routes(bp: Blueprint, site: Site) -> None:
    redis, prefix = site.redis, site.queues.prefix

    @bp.get("/")
    @site.signed_in
    def index(user):
        since = time.time() - DAYS * 86400
        rows = [overview(repo, ledger.runs(redis, prefix, repo, since))
                for repo in user["repos"]]
        return site.page("index.html", rows=rows, days=DAYS)

    @bp.get("/<owner>/<name>")
    @site.signed_in
    def repository(user, owner: str, name: str):
        repo = site.readable(user, owner, name)
        entries = ledger.runs(redis, prefix, repo, time.time() - DAYS * 86400)
        return site.page("repo.html", repo=repo, view=repo_view(entries, time.time()),
                         days=DAYS)

    @bp.get("/<owner>/<name>/pull/<int:number>")
    @site.signed_in
    def pull(user, owner: str, name: str, number: int):
        repo = site.readable(user, owner, name)
        entries = [e for e in ledger.runs(redis, prefix, repo) if e.get("number") == number]
        return site.page("pull.html", repo=repo, number=number, runs=entries[::-1])

    @bp.get("/queues")
    @site.signed_in
    def queue_page(user):
        return site.page("queues.html", **queue_view(redis, site.queues, site.settings.gpus,
                                                     user["repos"]))


def _local(target: str | None) -> str | None:
    """A path of the dashboard to come back to after signing in; anything else is dropped."""
    if not target:
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/dashboard") or \
            target.startswith("//") or "\\" in target:
        return None
    return target


# -- what the pages show: pure functions of the ledger's entries ------------------------------

def gpu_seconds(entry: dict) -> float:
    """What a run used on the GPU runners: its shards' time, else its tests' time."""
    shard_time = sum(s.get("seconds") or 0.0 for s in entry.get("shards", []))
    return shard_time or entry.get("results", {}).get("test_seconds_run", 0.0)


def saved_seconds(entry: dict) -> float:
    """Recorded test-seconds the run did not spend. A shadow or full run spends them all."""
    selection = entry.get("selection")
    if entry.get("kind") != "pull_request" or not selection or entry.get("mode") != "select":
        return 0.0
    return float(selection.get("expected_seconds_saved", 0.0))


def overview(repo: str, entries: list[dict]) -> dict:
    return {"repo": repo, "runs": len(entries),
            "pulls": len({e["number"] for e in entries if e.get("number") is not None}),
            "gpu_hours": sum(map(gpu_seconds, entries)) / 3600,
            "saved_hours": sum(map(saved_seconds, entries)) / 3600,
            "escaped": sum(len(e.get("escaped", [])) for e in entries),
            "last": max((e["at"] for e in entries), default=None)}


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d")


def repo_view(entries: list[dict], now: float, days: int = DAYS) -> dict:
    day_names = [_day(now - 86400 * i) for i in range(days - 1, -1, -1)]
    run, saved = defaultdict(float), defaultdict(float)
    for e in entries:
        run[_day(e["at"])] += gpu_seconds(e) / 3600
        saved[_day(e["at"])] += saved_seconds(e) / 3600
    labels = [d[5:] for d in day_names]
    per_day = charts.stacked_bars(labels, [
        ("GPU-hours run", PALETTE["run"], [run[d] for d in day_names]),
        ("GPU-hours saved", PALETTE["saved"], [saved[d] for d in day_names])],
        "GPU-hours per day", " h", width=1040, height=240)
    pulls = [e for e in entries if e.get("kind") == "pull_request" and e.get("mode") == "select"]
    run_labels = [f"#{e['number']}" for e in pulls]
    saved_chart = charts.line(run_labels, [saved_seconds(e) for e in pulls],
                              "test-seconds saved per pull-request run", " s")
    failing = [e for e in entries if e["results"].get("time_to_first_failure") is not None]
    ttff = [e["results"]["time_to_first_failure"] for e in failing]
    ttff_chart = charts.line(
        [f"#{e['number']}" if e.get("number") else e["head"][:7] for e in failing], ttff,
        "seconds to the first failure", " s", PALETTE["fail"],
        empty="no run has failed in this window")
    flaky: Counter[str] = Counter()
    flaky_last: dict[str, dict] = {}
    for e in entries:
        for test_id in e["results"].get("flaky", []):
            flaky[test_id] += 1
            flaky_last[test_id] = e
    escapes = [{"at": e["at"], "kind": e["kind"], "head": e["head"], "number": e.get("number"),
                "tests": e["escaped"]} for e in entries if e.get("escaped")]
    audited = [e for e in entries if e.get("kind") in ("shadow", "full")]
    recent: dict[int, dict] = {}
    for e in entries:
        if e.get("number") is not None:
            recent[e["number"]] = e
    return {
        "totals": {"runs": len(entries), "gpu_hours": sum(run.values()),
                   "saved_hours": sum(saved.values()),
                   "saved_seconds": sum(map(saved_seconds, entries)),
                   "escaped": sum(len(x["tests"]) for x in escapes), "audited": len(audited),
                   "median_ttff": statistics.median(ttff) if ttff else None,
                   "flaky": len(flaky)},
        "per_day": per_day, "saved_chart": saved_chart, "ttff_chart": ttff_chart,
        "escapes": escapes[::-1],
        "flaky": [{"id": t, "times": n, "last": flaky_last[t]} for t, n in flaky.most_common()],
        "pulls": sorted(recent.values(), key=lambda e: -e["at"]),
    }


def shown(description: str | None, repos: list[str]) -> str:
    """A job's description, unless it names a repository not in `repos`."""
    if not description:
        return "-"
    visible = {r.lower() for r in repos}
    named = [w for w in description.replace("#", " ").replace("@", " ").split() if "/" in w]
    if any(w.lower() not in visible for w in named):
        return "a job of another repository"
    return description


def queue_view(redis: Redis, queues: Queues, gpus: int, repos: list[str]) -> dict:
    """Each queue's depth, running and failed jobs, and each worker; a job description that
    names a repository the user cannot read is not shown."""
    rows, problem = [], None
    try:
        for q in [queues.cpu, queues.background, *(queues.gpu(i) for i in range(gpus))]:
            rows.append({"name": q.name, "queued": q.count,
                         "started": StartedJobRegistry(queue=q).get_job_count(cleanup=False),
                         "failed": FailedJobRegistry(queue=q).get_job_count(cleanup=False)})
        workers = []
        for w in Worker.all(connection=redis):
            job_id = w.get_current_job_id()
            current = None
            if job_id:
                try:
                    current = shown(fetch(job_id, redis).description, repos)
                except Exception:  # a job gone meanwhile
                    current = "-"
            workers.append({"name": w.name, "state": w.get_state(), "queues": w.queue_names(),
                            "current": current, "ok": w.successful_job_count,
                            "failed": w.failed_job_count, "heartbeat": w.last_heartbeat,
                            "host": w.hostname})
    except RedisError as exc:
        problem = f"Redis did not answer ({type(exc).__name__})"
        workers = []
    return {"queues": rows, "workers": workers, "problem": problem}
