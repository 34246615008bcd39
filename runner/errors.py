"""The one error root: every error FastCI raises on purpose derives from `FastCIError`.

Each class carries the exit code the `fastci` command ends with, so the CLI catches
`FastCIError` in one place and never maps classes to codes by hand. Anything else that
escapes is a FastCI bug, and the CLI says so.

Exit codes (stable; scripts may rely on them):
  0  success (for `run`: every selected blocking test passed)
  1  tests failed (`run`, `record`)
  2  usage error: bad arguments, unknown test id, invalid configuration
  3  git error: not a repository, unknown revision
  4  evidence store error: corrupt, foreign or unwritable store
  5  pytest could not run (internal error, interrupted, no tests collected)
 70  a bug in FastCI (the message says so; FASTCI_DEBUG=1 shows the traceback)
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_GIT, EXIT_STORE, EXIT_PYTEST = 0, 1, 2, 3, 4, 5
EXIT_INTERNAL = 70


class FastCIError(Exception):
    """An error FastCI raises on purpose; the message is for the user, as it stands."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(FastCIError):
    """Bad arguments or an unknown name: the user asked for something that is not there."""


class ConfigError(FastCIError):
    """The configuration is invalid; the message names the key and the file."""


class GitError(FastCIError):
    """A git command failed; the message says which and why, for the user."""

    exit_code = EXIT_GIT


class StoreError(FastCIError):
    """The evidence store cannot be used; the message tells the user what to do."""

    exit_code = EXIT_STORE


class RunError(FastCIError):
    """pytest could not run, or a run could not complete; the message says why."""

    exit_code = EXIT_PYTEST
