"""Files a runner downloads for one job, behind a signed URL that expires.

Runners on other machines share no filesystem with the selection worker and hold no
credential of the App's. What a job needs from the selection side (the git bundle of the
commit it tests; other files such as replay packs alike) is written into the artifacts
folder (`AppSettings.artifacts`) and published: `publish` returns a URL of the webhook
service's `GET /artifacts/<name>?expires=<unix time>&sig=<hex>`, where `sig` is an
HMAC-SHA256, under FASTCI_ARTIFACT_SECRET, of that one name and that expiry. The URL opens
that one file until it expires or is removed (`discard`, when the job ends), and nothing else:
names are flat (no folder, no `..`, no leading dot), symbolic links are not followed, and the
mirrors, the store and the key live outside the folder. The secret itself never leaves the
selection worker and the webhook service (not in a URL, a job's arguments or a log line).

    path = settings.artifacts / f"{uuid.uuid4().hex}.tar.gz"      # write the file there
    url = artifacts.publish(settings, path, ttl=3600)                # put `url` in the job
    ...                                                              # the runner downloads it:
    fastci.runner.execution.fetch.download(url, dest, max_bytes=2**30)
    artifacts.discard(settings, url)                                 # when the job has ended
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, urlsplit

from .settings import AppSettings, SettingsError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}(\.[A-Za-z0-9]{1,16}){0,3}\Z")
"""An artifact's name: letters, digits, `-` and `_`, then up to three dotted suffixes."""
EXPIRES = re.compile(r"[0-9]{1,12}\Z")
SIG = re.compile(r"[0-9a-f]{64}\Z")
ROUTE = "/artifacts/"
_DOMAIN = b"fastci-artifact-v1\n"  # these signatures are for artifacts and nothing else


@dataclass(frozen=True)
class Refused:
    """Why a download is refused: the HTTP status and a message that reveals nothing."""

    status: int
    reason: str


def directory(settings: AppSettings) -> Path:
    """The artifacts folder, created if needed: mode 0711, so the webhook service (another
    user) opens a file by its name, and no one but its owner lists the folder."""
    path = settings.artifacts
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o711)
    return path


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(NAME.match(name))


def publish(settings: AppSettings, path: Path, ttl: float) -> str:
    """The signed URL at which runners download `path` for the next `ttl` seconds.

    `path` must be a regular file directly in the artifacts folder (`directory(settings)`),
    with a name `valid_name` accepts; make it unguessable (a uuid in it) all the same.
    Raises SettingsError when FASTCI_ARTIFACT_SECRET or FASTCI_ARTIFACT_URL is unset, and
    ValueError for a path that cannot be published."""
    secret, base = _require(settings)
    path = Path(path)
    if path.parent.resolve() != settings.artifacts.resolve() or not valid_name(path.name):
        raise ValueError(f"not an artifact: {path.name[:80]!r} must be a plainly named file "
                         f"directly in {settings.artifacts}")
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"not an artifact: {path.name!r} is not a regular file")
    expires = int(time.time() + ttl)
    return (f"{base}{ROUTE}{quote(path.name)}?expires={expires}"
            f"&sig={sign(secret, path.name, expires)}")


def sign(secret: str, name: str, expires: int) -> str:
    """HMAC-SHA256 (hex) of one artifact's name and expiry."""
    message = _DOMAIN + f"{name}\n{expires}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def check(settings: AppSettings, name: str, expires: str | None, sig: str | None,
          now: float | None = None) -> Refused | None:
    """None when a request for artifact `name` carries a valid, unexpired signature, else why
    not: 404 for a name that can never be an artifact (or when this service serves none), 403
    for a missing, altered or expired signature. Signatures compare in constant time."""
    if settings.artifact_secret is None or not valid_name(name):
        return Refused(404, "no such artifact")
    if not isinstance(expires, str) or not EXPIRES.match(expires) \
            or not isinstance(sig, str) or not SIG.match(sig):
        return Refused(403, "the link is not signed: expires and sig are required")
    expected = sign(settings.artifact_secret.reveal(), name, int(expires))
    if not hmac.compare_digest(expected.encode(), sig.encode()):
        return Refused(403, "the link's signature does not match")
    if int(expires) < (time.time() if now is None else now):
        return Refused(403, "the link has expired")
    return None


def open_artifact(settings: AppSettings, name: str) -> BinaryIO:
    """The artifact's file, opened for reading without following a symbolic link.
    FileNotFoundError when it is gone (or is not a regular file)."""
    if not valid_name(name):
        raise FileNotFoundError(name)
    try:
        fd = os.open(settings.artifacts / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:  # ELOOP: a symbolic link; ENOENT: gone
        raise FileNotFoundError(name) from exc
    file = os.fdopen(fd, "rb")
    if not _regular(file):
        file.close()
        raise FileNotFoundError(name)
    return file


def discard(settings: AppSettings, url: object) -> None:
    """Remove the artifact a URL of `publish` names (its job has ended). Anything else (a URL
    of another service, a name that is no artifact's) is left alone."""
    if not isinstance(url, str):
        return
    folder, _, name = urlsplit(url).path.rpartition("/")
    if (folder + "/").endswith(ROUTE) and valid_name(name):
        (settings.artifacts / name).unlink(missing_ok=True)


STALE_AFTER = 7 * 3600  # past the longest link FastCI signs (a shard's, 6 h), and an hour


def sweep(settings: AppSettings, older_than: float = STALE_AFTER,
          now: float | None = None) -> int:
    """Remove artifacts whose links have all expired: a selection job that was killed never
    discarded its bundle. Plain files only (a link or folder there is not FastCI's); returns
    how many were removed."""
    folder = settings.artifacts
    if not folder.is_dir():
        return 0
    cutoff = (time.time() if now is None else now) - older_than
    removed = 0
    for entry in os.scandir(folder):
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff:
            Path(entry.path).unlink(missing_ok=True)
            removed += 1
    return removed


def _require(settings: AppSettings) -> tuple[str, str]:
    missing = [name for name, value in (("FASTCI_ARTIFACT_SECRET(_FILE)",
                                         settings.artifact_secret),
                                        ("FASTCI_ARTIFACT_URL", settings.artifact_url))
               if not value]
    if missing:
        raise SettingsError("publishing files for runners needs " + " and ".join(missing)
                            + " (the webhook service's URL as runners reach it)")
    base = str(settings.artifact_url).rstrip("/")
    if urlsplit(base).scheme not in ("http", "https") or not urlsplit(base).netloc:
        raise SettingsError(f"FASTCI_ARTIFACT_URL must be an http(s) URL, not {base[:80]!r}")
    assert settings.artifact_secret is not None
    return settings.artifact_secret.reveal(), base


def _regular(file: BinaryIO) -> bool:
    return stat.S_ISREG(os.fstat(file.fileno()).st_mode)
