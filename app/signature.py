"""X-Hub-Signature-256: HMAC-SHA256 of the raw body with the webhook secret."""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    return PREFIX + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> str | None:
    """None when the signature is right, else why it is not (for the 401's body)."""
    if not header:
        return "missing X-Hub-Signature-256 header: the request is unsigned"
    if not header.startswith(PREFIX):
        return "X-Hub-Signature-256 must start with 'sha256='"
    if not header.isascii():  # compare_digest refuses non-ASCII text (a TypeError, a 500)
        return "X-Hub-Signature-256 must be 'sha256=' and hex digits"
    if not hmac.compare_digest(sign(secret, body), header.strip()):
        return "X-Hub-Signature-256 does not match the body (wrong secret, or altered body)"
    return None
