"""The fake GitHub for tests: `fastci.testing.fakegithub`, which serves the project's own
fixtures (no ../shared needed)."""

from __future__ import annotations

from fastci.testing.fakegithub import *  # noqa: F401,F403 - the fake's helpers, for the tests
from fastci.testing.fakegithub import FakeGitHub, check_run_problems, rest_fixture  # noqa: F401
