"""The fake GitHub for tests: `fastci.app.fakegithub`, skipping (and saying why) where
../shared is not beside the project."""

from __future__ import annotations

from conftest import shared_dir  # after the star import: the skipping one wins

from fastci.app import fakegithub as _fake
from fastci.app.fakegithub import *  # noqa: F401,F403 - the fake's helpers, for the tests
from fastci.app.fakegithub import check_run_problems, read_exchanges, recorded  # noqa: F401


class FakeGitHub(_fake.FakeGitHub):
    def __init__(self, replay_dir=None, payload_dir=None) -> None:
        super().__init__(replay_dir or shared_dir("github-replay"),
                         payload_dir or shared_dir("github-payloads"))
