"""FastCI's runner settings: `[tool.fastci]` in pyproject.toml, then `FASTCI_*` variables.

A typed, keyword-only dataclass, so a misspelt key is an error with its name, not a
silently ignored setting.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib


from fastci.runner.errors import ConfigError  # re-exported: settings raise it


@dataclass(frozen=True, kw_only=True)
class Settings:
    store: str = ".fastci/evidence.db"
    """Evidence store path, relative to the repository root."""
    dimensions: tuple[str, ...] = ("correctness", "convergence", "perf")
    """Markers that name a test's dimension; an unmarked test has `default_dimension`."""
    default_dimension: str = "correctness"
    blocking: tuple[str, ...] = ("correctness",)
    """Dimensions whose failures block the verdict; the others run in the background."""
    failure_half_life: float = 10.0
    """Runs after which a past failure weighs half as much in a test's risk."""
    prune: str = "exact"
    """Equivalent-context pruning: "exact" (bit-identical replays), "tolerance" (within the
    per-dtype tolerances of `fastci.kernels.compare`) or "off"."""
    prune_budget: float = 2.0
    """Seconds each replay process may replay for once started (0: no limit); its start-up
    (importing torch, which a warm zygote has done) is not counted. Calls still running then
    stop, and the tests they would have decided stay selected. A suite of long GPU tests,
    where one pruned test saves minutes, can afford more."""
    capture_budget_mb: float = 64.0
    """Bytes of captured module calls kept per test while recording (past it: not replayable)."""
    capture_min_seconds: float = 0.1
    """A test whose last run took less is recorded without capture: pruning it would save
    less runner time than capturing its calls costs on every recording, and its replays
    cost in each selection. A test with no duration on record is captured (0: capture all)."""
    capture_share: float = 0.1
    """This share of a test's last duration goes to capturing its calls while it is recorded,
    plus what earlier tests of the session left unspent of theirs (up to ten times its own);
    past it, calls not captured yet run uncaptured (and keep the test selected when a change
    reaches them). The session's captures take at most this share of the tests' durations
    in all. A test with no duration on record has no limit (0: none)."""
    capture_children: str = "on"
    """"on": a captured test's child processes (a torchrun rank, a training command run as a
    user runs it) capture their calls too, so what they ran can be pruned; their coverage
    then runs on the C tracer, which costs more than sys.monitoring on Python 3.12+. "off":
    children only record lines, and what they ran is never pruned."""
    ignore: tuple[str, ...] = ("*.md", "*.rst", "docs/*", "doc/*", "LICENSE*", "COPYING*",
                               "AUTHORS*", "CHANGELOG*", "NOTICE*")
    """Globs (on the repository path, or the file name) of non-Python files no test reads
    (documentation): where a test's evidence saw no native readers, any other changed
    non-Python file selects it."""
    retention_days: float = 30.0
    """`fastci gc` keeps the snapshots of the last this many days, and the newest of each
    branch and environment however old (`store/retention.py`)."""
    recorder: str = "auto"
    """How lines are measured while recording: "sysmon" (sys.monitoring, Python 3.12+),
    "coverage" (coverage.py's C tracer) or "auto" (sysmon where the Python has it). Both give
    the same evidence; sysmon costs far less. `FASTCI_RECORDER` overrides it."""
    exact: tuple[str, ...] = ("import-time", "statements")
    """The exact rules on (`EXACT_RULES`): "import-time" attributes a function run while a
    test file was imported to the statement that called it, "statements" compares a changed
    function statement by statement. Each one only ever selects fewer tests than the rule it
    refines; turning one off (`FASTCI_EXACT=statements`, or empty) is for measuring them."""
    mode: str = "enforce"
    """"enforce": run the selection. "shadow": select, but run every test, and record in the
    store's audit what the selection would have missed (`fastci audit`): how a team earns
    trust in FastCI before enforcing it."""

    def dimension_of(self, markers: tuple[str, ...] | list[str]) -> str:
        for marker in markers:
            if marker in self.dimensions:
                return marker
        return self.default_dimension

    def is_blocking(self, dimension: str) -> bool:
        return dimension in self.blocking

    def ignores(self, path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(name, g)
                   for g in self.ignore)


_TUPLES = {"dimensions", "blocking", "ignore", "exact"}
_NUMBERS = {"failure_half_life", "capture_budget_mb", "capture_min_seconds", "capture_share",
            "retention_days", "prune_budget"}
PRUNE_MODES = ("exact", "tolerance", "off")
RECORDERS = ("auto", "sysmon", "coverage")
EXACT_RULES = ("import-time", "statements")


def load(root: Path, environ: dict[str, str] | None = None) -> Settings:
    environ = dict(os.environ if environ is None else environ)
    values: dict = {}
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{pyproject}: not valid TOML ({exc})") from None
        values.update(data.get("tool", {}).get("fastci", {}))
    known = {f.name for f in fields(Settings)}
    for f in known:
        key = f"FASTCI_{f.upper()}"
        if key in environ:
            values[f] = environ[key]
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"{pyproject}: unknown [tool.fastci] key(s): {', '.join(sorted(unknown))}"
                          f"; known: {', '.join(sorted(known))}")
    checked: dict[str, Any] = {name: _checked(name, value) for name, value in values.items()}
    return Settings(**checked)


def _checked(name: str, value: object) -> str | float | tuple[str, ...]:
    """One setting's value in its type, or a ConfigError that names the key."""
    if name in _TUPLES:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"[tool.fastci] {name} must be a list of names")
        unknown = [v for v in value if name == "exact" and v not in EXACT_RULES]
        if unknown:
            raise ConfigError(f"[tool.fastci] exact: unknown rule(s) {', '.join(unknown)}; "
                              f"known: {', '.join(EXACT_RULES)}")
        return tuple(value)
    if name in _NUMBERS:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(f"[tool.fastci] {name} must be a number") from None
        if not number >= 0:
            raise ConfigError(f"[tool.fastci] {name} must not be negative")
        return number
    if name == "mode" and value not in ("enforce", "shadow"):
        raise ConfigError(f"[tool.fastci] mode must be 'enforce' or 'shadow', not {value!r}")
    if name == "prune" and value not in PRUNE_MODES:
        raise ConfigError(f"[tool.fastci] prune must be one of {', '.join(PRUNE_MODES)}, "
                          f"not {value!r}")
    if name == "capture_children" and value not in ("on", "off"):
        raise ConfigError(f"[tool.fastci] capture_children must be 'on' or 'off', not {value!r}")
    if name == "recorder" and value not in RECORDERS:
        raise ConfigError(f"[tool.fastci] recorder must be one of {', '.join(RECORDERS)}, "
                          f"not {value!r}")
    if not isinstance(value, str):
        raise ConfigError(f"[tool.fastci] {name} must be a string")
    return value
