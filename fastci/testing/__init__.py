"""Test support that ships with FastCI: the fake GitHub and the GitHub fixtures it serves.

Not part of a deployment (the App lives in fastci.app); `fastci demo --app` and FastCI's own
tests use it. The fixtures are package data, so it works from an installed wheel.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""rest/: the answers the fake GitHub serves; payloads/<event>/: webhook bodies."""
