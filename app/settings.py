"""The GitHub side's settings, from the environment and from files it names.

Secrets (the App's private key, the webhook secret, the artifact secret) come only from files
or environment variables, are held in `Secret` (whose repr hides them), and are never logged
or put in a job's arguments: jobs read them again from here, in the worker's own environment.
None has a default: a service that needs one and finds it unset stops with a SettingsError
naming the variable.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from fastci.runner.errors import FastCIError
from fastci.runner.store import resolve_store


class SettingsError(FastCIError):
    """A setting is missing or invalid; the message names the variable."""


class Secret:
    """A secret value that never prints."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)


@dataclass(frozen=True)
class AppSettings:
    app_id: int | None = None
    private_key: Secret | None = field(default=None, repr=False)
    webhook_secret: Secret | None = field(default=None, repr=False)
    github_url: str = "https://api.github.com"  # GitHub Enterprise: https://HOST/api/v3
    redis_url: str = "redis://127.0.0.1:6379/0"
    workspace: Path = Path(".fastci-app")
    """Clones, worktrees and the shared evidence store live here."""
    clone_url: str = "https://github.com/{repo}.git"
    """Where a repository's code is fetched from ({repo}: owner/name). Tests use file://."""
    max_body_bytes: int = 25 * 2**20  # GitHub caps payloads at 25 MB
    queue_prefix: str = "fastci"
    gpus: int = 1  # GPU queues the selection shards over (one worker each)
    store: str | None = None  # FASTCI_STORE: a redis:// URL shares evidence across machines
    allowed_bots: frozenset[str] = frozenset()
    """FASTCI_ALLOWED_BOTS (comma-separated logins): bots whose comments are commands."""
    artifact_secret: Secret | None = field(default=None, repr=False)
    """FASTCI_ARTIFACT_SECRET(_FILE): signs the per-job download URLs of artifacts (the
    selection worker) and checks them (the webhook service); runners never hold it."""
    artifact_url: str | None = None
    """FASTCI_ARTIFACT_URL: the webhook service's base URL as runners reach it."""
    artifact_dir: Path | None = None
    """FASTCI_ARTIFACT_DIR: the files runners may download; default `workspace`/artifacts."""

    @property
    def artifacts(self) -> Path:
        """The artifacts folder (FASTCI_ARTIFACT_DIR, else artifacts/ in the workspace)."""
        return self.artifact_dir or self.workspace / "artifacts"
    retention_days: float = 30.0
    """FASTCI_RETENTION_DAYS: the watchdog's gc keeps this many days of evidence (and each
    branch's newest), as `fastci gc --keep-days` does."""
    gc_interval_hours: float = 24.0
    """FASTCI_GC_INTERVAL_HOURS: how often the watchdogs (together) run gc; 0: never."""
    redelivery_attempts: int = 5
    """FASTCI_REDELIVERY_ATTEMPTS: how many times the watchdog asks GitHub to redeliver one
    failed delivery before it gives up (and records that it did)."""
    redelivery_backoff: float = 60.0
    """FASTCI_REDELIVERY_BACKOFF_S: seconds before the second ask; each later one waits twice
    as long as the one before."""
    github_web_url: str = "https://github.com"
    """FASTCI_GITHUB_WEB_URL: where people sign in (GitHub Enterprise: https://HOST)."""
    oauth_client_id: str | None = None
    """FASTCI_OAUTH_CLIENT_ID: the App's client id (its settings page), for the dashboard's
    sign-in (the user-to-server flow)."""
    oauth_client_secret: Secret | None = field(default=None, repr=False)
    """FASTCI_OAUTH_CLIENT_SECRET(_FILE): the App's client secret."""
    session_secret: Secret | None = field(default=None, repr=False)
    """FASTCI_SESSION_SECRET(_FILE): signs the dashboard's session cookie; 32+ characters."""
    public_url: str | None = None
    """FASTCI_PUBLIC_URL: this service as browsers reach it (https://fastci.example.com); the
    OAuth callback is under it, and the session cookie is Secure when it is https."""

    @property
    def dashboard_enabled(self) -> bool:
        """The dashboard is served only when its sign-in is configured."""
        return bool(self.oauth_client_id and self.oauth_client_secret and self.session_secret)

    @property
    def store_path(self) -> Path | str:
        """FASTCI_STORE as given; else evidence.db in the workspace (a redis:// URL as is)."""
        return resolve_store(self.store, "evidence.db", self.workspace)

    def require_github(self) -> None:
        missing = [name for name, value in (("FASTCI_APP_ID", self.app_id),
                                            ("FASTCI_APP_PRIVATE_KEY(_FILE)", self.private_key))
                   if not value]
        if missing:
            raise SettingsError("talking to GitHub needs " + " and ".join(missing))


def _secret(environ: dict, name: str) -> Secret | None:
    """NAME_FILE (a path) wins over NAME (the value itself)."""
    path = environ.get(f"{name}_FILE")
    if path:
        try:
            return Secret(Path(path).read_text().strip())
        except OSError as exc:
            raise SettingsError(f"{name}_FILE={path}: cannot read it ({exc.strerror})") from None
    value = environ.get(name)
    return Secret(value) if value else None


def _int(environ: dict, name: str, default: int | None) -> int | None:
    raw = environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, not {raw!r}") from None


def _float(environ: dict, name: str, default: float) -> float:
    raw = environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, not {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise SettingsError(f"{name} must be zero or more, not {raw!r}")
    return value


def load(environ: dict | None = None) -> AppSettings:
    env = dict(os.environ if environ is None else environ)
    return AppSettings(
        app_id=_int(env, "FASTCI_APP_ID", None),
        private_key=_secret(env, "FASTCI_APP_PRIVATE_KEY"),
        webhook_secret=_secret(env, "FASTCI_WEBHOOK_SECRET"),
        github_url=env.get("FASTCI_GITHUB_URL", AppSettings.github_url).rstrip("/"),
        redis_url=env.get("FASTCI_REDIS_URL", AppSettings.redis_url),
        workspace=Path(env.get("FASTCI_WORKSPACE", str(AppSettings.workspace))).resolve(),
        clone_url=env.get("FASTCI_CLONE_URL", AppSettings.clone_url),
        max_body_bytes=_int(env, "FASTCI_MAX_BODY_BYTES", AppSettings.max_body_bytes),
        queue_prefix=env.get("FASTCI_QUEUE_PREFIX", AppSettings.queue_prefix),
        gpus=_int(env, "FASTCI_GPUS", AppSettings.gpus),
        store=env.get("FASTCI_STORE") or None,
        allowed_bots=frozenset(name.strip().lower()
                               for name in env.get("FASTCI_ALLOWED_BOTS", "").split(",")
                               if name.strip()),
        artifact_secret=_artifact_secret(env),
        artifact_url=env.get("FASTCI_ARTIFACT_URL", "").rstrip("/") or None,
        artifact_dir=Path(env["FASTCI_ARTIFACT_DIR"]).resolve()
        if env.get("FASTCI_ARTIFACT_DIR") else None,
        retention_days=_float(env, "FASTCI_RETENTION_DAYS", AppSettings.retention_days),
        gc_interval_hours=_float(env, "FASTCI_GC_INTERVAL_HOURS",
                                 AppSettings.gc_interval_hours),
        redelivery_attempts=_int(env, "FASTCI_REDELIVERY_ATTEMPTS",
                                 AppSettings.redelivery_attempts),
        redelivery_backoff=_float(env, "FASTCI_REDELIVERY_BACKOFF_S",
                                  AppSettings.redelivery_backoff),
        github_web_url=env.get("FASTCI_GITHUB_WEB_URL", AppSettings.github_web_url).rstrip("/"),
        oauth_client_id=env.get("FASTCI_OAUTH_CLIENT_ID") or None,
        oauth_client_secret=_secret(env, "FASTCI_OAUTH_CLIENT_SECRET"),
        session_secret=_long_secret(env, "FASTCI_SESSION_SECRET"),
        public_url=env.get("FASTCI_PUBLIC_URL", "").rstrip("/") or None,
    )


MIN_ARTIFACT_SECRET = 32


def _artifact_secret(env: dict) -> Secret | None:
    return _long_secret(env, "FASTCI_ARTIFACT_SECRET")


def _long_secret(env: dict, name: str) -> Secret | None:
    """A signing secret: at least MIN_ARTIFACT_SECRET characters, or a SettingsError."""
    secret = _secret(env, name)
    if secret is not None and len(secret.reveal()) < MIN_ARTIFACT_SECRET:
        raise SettingsError(f"{name}(_FILE) must be at least "
                            f"{MIN_ARTIFACT_SECRET} characters (`openssl rand -hex 32`)")
    return secret
