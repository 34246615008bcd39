"""Downloading what a job needs from the selection side: one file, by one URL, bounded.

A runner shares no filesystem with the selection worker. Each job carries signed, expiring
URLs of the files it needs (the git bundle of the commit it tests; other files alike), and
`download` fetches one: http(s) only, no redirect followed, no credential of the runner's
sent, at most `max_bytes`, within `timeout`. Any failure is a RunError that names the URL
without its query (where the signature is). This module knows nothing of GitHub or of how
the URLs are signed (fastci.app.artifacts).
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from fastci.runner.errors import RunError

CHUNK = 1 << 20
SCHEMES = ("http", "https")


def check_url(url: object) -> str:
    """`url` when it is an http(s) URL with a host, else a RunError."""
    if not isinstance(url, str) or len(url) > 4096 or not url.isascii() \
            or any(c.isspace() or ord(c) < 32 for c in url):
        raise RunError("a download URL must be a short ASCII string without spaces")
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise RunError(f"a download URL must be http(s) with a host, not {shown(url)!r}")
    return url


def shown(url: str) -> str:
    """The URL as messages print it: no query (the signature), no user or password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"[:200]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args, **_kwargs):
        return None  # a 3xx is answered as an error below: the URL is the one file


def download(url: str, dest: Path, max_bytes: int, timeout: float = 60.0,
             deadline: float = 3600.0) -> int:
    """Fetch `url` into `dest` (a new file, mode 0600; the caller widens it if it must) and
    return its size in bytes.

    `max_bytes`: a larger file (by Content-Length, or as it streams) is refused;
    `timeout`: seconds for connecting and for each read; `deadline`: seconds for the whole
    download. On any failure `dest` is removed and a RunError says why."""
    check_url(url)
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise RunError(f"cannot write the download to {dest}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            size = _copy(url, out, max_bytes, timeout, deadline)
    except BaseException:
        _remove(dest)
        raise
    return size


def _copy(url: str, out, max_bytes: int, timeout: float, deadline: float) -> int:
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, headers={"User-Agent": "fastci-runner",
                                                   "Accept-Encoding": "identity"})
    started, size = time.monotonic(), 0
    try:
        with opener.open(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise RunError(f"{shown(url)} is {int(length)} bytes, over the "
                               f"{max_bytes} byte limit")
            while chunk := response.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise RunError(f"{shown(url)} exceeds the {max_bytes} byte limit")
                if time.monotonic() - started > deadline:
                    raise RunError(f"{shown(url)} took over {deadline:.0f}s to download")
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise RunError(f"{shown(url)} answered {exc.code} {exc.reason}"
                       + (f": {body}" if (body := _body(exc)) else "")) from None
    except urllib.error.URLError as exc:
        raise RunError(f"{shown(url)} could not be downloaded: {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise RunError(f"{shown(url)} could not be downloaded: "
                       f"{type(exc).__name__}: {exc}"[:400]) from None
    return size


def _body(exc: urllib.error.HTTPError) -> str:
    """The start of an error's body (the App answers JSON with a message)."""
    try:
        return exc.read(300).decode(errors="replace").strip()
    except OSError:
        return ""


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
