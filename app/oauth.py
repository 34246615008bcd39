"""Signing in to the dashboard with GitHub: the App's user-to-server flow (OAuth's web flow).

    1. `authorize_url`: the browser goes to GitHub's authorize page with the App's client id,
       the callback and a `state` bound to the browser's session (`new_state`);
    2. GitHub sends it back with a code and that state (`check_state`: a forged, replayed or
       expired state is refused with the reason);
    3. `exchange`: the code for a user access token (POST login/oauth/access_token);
    4. `whoami` and `readable_repos`: the user, and the repositories of the App's
       installations they can read (GET /user/installations, then each one's repositories):
       GitHub's answer, never a guess from the webhooks.

The token is used for those calls and dropped: the session keeps the login and the list of
repositories (in Redis, for SESSION_TTL), so a revoked access ends with the session.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlencode

import requests

from fastci.runner.errors import FastCIError

STATE_TTL = 600  # seconds from the redirect to GitHub to its callback
TIMEOUT = 10
MAX_PAGES = 20  # 100 installations or repositories a page


class SignInError(FastCIError):
    """The sign-in cannot go on; the message says why (shown with a 400 or a 502)."""


@dataclass(frozen=True)
class User:
    login: str
    name: str | None
    avatar_url: str | None
    repos: tuple[str, ...]
    """owner/name of every repository the user can read where the App is installed."""


def new_state() -> tuple[str, float]:
    """A state for one sign-in and when it was made (both kept in the session)."""
    return secrets.token_urlsafe(24), time.time()


def check_state(given: str | None, kept: str | None, made_at: float | None,
                now: float | None = None) -> str | None:
    """Why the callback's state is refused, or None when it is the session's own and fresh."""
    if not given:
        return "the callback carries no OAuth state"
    if not kept or made_at is None:
        return ("no sign-in was started in this browser session (or it was already used): "
                "the OAuth state is forged or replayed")
    if not hmac.compare_digest(given.encode(), kept.encode()):
        return "the OAuth state does not match this browser session's: it is forged"
    if (now or time.time()) - made_at > STATE_TTL:
        return f"the OAuth state expired (older than {STATE_TTL // 60} minutes): sign in again"
    return None


def authorize_url(web_url: str, client_id: str, redirect_uri: str, state: str) -> str:
    return f"{web_url}/login/oauth/authorize?" + urlencode(
        {"client_id": client_id, "redirect_uri": redirect_uri, "state": state})


def exchange(web_url: str, client_id: str, client_secret: str, code: str,
             redirect_uri: str) -> str:
    """The user access token for `code`. GitHub answers a bad code with 200 and an error."""
    try:
        answer = requests.post(f"{web_url}/login/oauth/access_token", timeout=TIMEOUT,
                               headers={"Accept": "application/json"},
                               data={"client_id": client_id, "client_secret": client_secret,
                                     "code": code, "redirect_uri": redirect_uri})
        body = answer.json()
    except (requests.RequestException, ValueError) as exc:
        raise SignInError(f"GitHub did not answer the code exchange ({type(exc).__name__})"
                          ) from None
    if not isinstance(body, dict) or "access_token" not in body:
        error = body.get("error_description") or body.get("error") \
            if isinstance(body, dict) else None
        raise SignInError(f"GitHub refused the sign-in code: {error or answer.status_code}")
    return str(body["access_token"])


def _get(api_url: str, token: str, path: str, params: dict | None = None):
    try:
        answer = requests.get(f"{api_url}{path}", params=params, timeout=TIMEOUT, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json"})
    except requests.RequestException as exc:
        raise SignInError(f"GitHub did not answer GET {path} ({type(exc).__name__})") from None
    if answer.status_code != 200:
        raise SignInError(f"GitHub answered GET {path} with {answer.status_code}")
    return answer


def _pages(api_url: str, token: str, path: str, field: str) -> list[dict]:
    """Every item of a listing that wraps its page in an object (`field`), following
    GitHub's `Link: rel="next"` pages."""
    items: list[dict] = []
    for page in range(1, MAX_PAGES + 1):
        answer = _get(api_url, token, path, {"per_page": 100, "page": page})
        items += answer.json().get(field, [])
        if 'rel="next"' not in answer.headers.get("Link", ""):
            break
    return items


def whoami(api_url: str, token: str) -> User:
    user = _get(api_url, token, "/user").json()
    repos: set[str] = set()
    for installation in _pages(api_url, token, "/user/installations", "installations"):
        listed = _pages(api_url, token, f"/user/installations/{int(installation['id'])}"
                        "/repositories", "repositories")
        repos.update(repo["full_name"] for repo in listed
                     if (repo.get("permissions") or {}).get("pull", True))
    return User(str(user["login"]), user.get("name"), user.get("avatar_url"),
                tuple(sorted(repos, key=str.lower)))
