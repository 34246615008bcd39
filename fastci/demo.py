"""`fastci demo`: the whole loop on the bundled LLM training framework, nothing else needed.

Copies examples/tinyllm into a temporary git repository, records evidence once, then applies
each change in examples/tinyllm/changes/ to the recorded base (each in its own git worktree,
`jobs` at a time, sharing the one evidence store) and runs FastCI on it: what it selected and
why, the test-seconds saved against the full suite, the failures caught (against the known
failing tests of each change) and the time to the first failure. Writes an HTML report
with a chart of the savings.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fastci.runner.engine import Engine
from fastci.runner.errors import EXIT_PYTEST, EXIT_USAGE, FastCIError
from fastci.runner.git import END, run_git
from fastci.runner.selection.report import RunReport

SUBJECT_IGNORE = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".fastci", "changes",
                                        "*.pyc")
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider"]


class DemoError(FastCIError):
    """The demo cannot run; the message says why."""

    exit_code = EXIT_PYTEST


class DemoUsageError(DemoError):
    """The demo was asked for something it does not have."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Change:
    name: str
    patch: Path
    description: str
    kind: str
    failing_tests: tuple[str, ...] = ()


@dataclass
class Outcome:
    change: Change
    report: RunReport
    full_seconds: float
    seconds: float
    why: list[tuple[str, int]] = field(default_factory=list)

    @property
    def summary(self) -> dict:
        return self.report.summary()

    @property
    def failed(self) -> set[str]:
        return {r.test_id for r in self.report.failures}

    @property
    def caught(self) -> set[str]:
        return set(self.change.failing_tests) & self.failed

    @property
    def missed(self) -> set[str]:
        return set(self.change.failing_tests) - self.failed

    @property
    def test_seconds(self) -> float:
        return self.summary["test_seconds_run"]

    @property
    def saved(self) -> float:
        """The share of the suite's recorded test-seconds the selection skipped."""
        s = self.summary
        return s["expected_seconds_saved"] / s["expected_seconds_total"] \
            if s["expected_seconds_total"] else 0.0


def example_dir() -> Path:
    """examples/tinyllm of a source checkout, else the copy a wheel installs (fastci/examples)."""
    package = Path(__file__).resolve().parent
    for here in (package.parent / "examples" / "tinyllm", package / "examples" / "tinyllm"):
        if (here / "changes").is_dir():
            return here
    raise DemoError(f"examples/tinyllm not found beside {package}: reinstall FastCI "
                    "(`pip install fastci`, or `pip install -e .` in a checkout)")


def load_changes(example: Path) -> list[Change]:
    data = yaml.safe_load((example / "changes" / "changes.yaml").read_text())
    entries = data["changes"] if isinstance(data, dict) else data
    return [Change(name=e["name"], patch=example / "changes" / e["patch"],
                   description=e.get("description", ""), kind=e.get("kind", ""),
                   failing_tests=tuple(e.get("failing_tests") or ()))
            for e in entries]


def _git(root: Path, *args: str) -> str:
    return run_git(list(args), root).decode(errors="surrogateescape").strip()


def _category(reason: str) -> str:
    for prefix in ("executed changed code",
                   "executed code that reads a changed module or class value",
                   "the test's own code changed", "read a changed file", "new test",
                   "launched a Triton kernel", "listed", "dependency manifest",
                   "pytest configuration", "it failed", "it error"):
        if reason.startswith(prefix):
            return prefix
    return reason.split(":")[0][:60]


def _why(report: RunReport) -> list[tuple[str, int]]:
    if report.selection.select_all_reason:
        return [(report.selection.select_all_reason, len(report.selection.selected))]
    counts = collections.Counter(_category(d.reasons[0]) for d in report.selection.selected)
    return counts.most_common(3)


def run_demo(workdir: Path | None = None, out: Path | None = None, say=print,
             jobs: int = 2, only: list[str] | None = None) -> list[Outcome]:
    example = example_dir()
    changes = load_changes(example)
    if only:
        unknown = set(only) - {c.name for c in changes}
        if unknown:
            raise DemoUsageError(f"unknown change(s) {', '.join(sorted(unknown))}; the bundled "
                            f"ones: {', '.join(c.name for c in changes)}")
        changes = [c for c in changes if c.name in only]
    started = time.perf_counter()
    root_parent = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fastci-demo-"))
    root = root_parent / "tinyllm"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(example, root, ignore=SUBJECT_IGNORE)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "demo@fastci.invalid")
    _git(root, "config", "user.name", "FastCI demo")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "tinyllm: base")
    base = _git(root, "rev-parse", "HEAD")
    logs = root_parent / "logs"
    logs.mkdir(exist_ok=True)
    say(f"[1/{len(changes) + 2}] recording evidence on the full tinyllm suite "
        f"(in {root}) …")
    engine = Engine(root)
    t0 = time.perf_counter()
    with open(logs / "record.log", "w") as log:
        code = subprocess.run([sys.executable, "-m", "pytest", f"--rootdir={root}",
                               "--fastci-record", *PYTEST_ARGS], cwd=root, stdout=log,
                              stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise DemoError(f"the tinyllm suite failed while recording (pytest exit {code}); "
                        f"see {logs / 'record.log'}")
    with engine.open_store() as store:
        snapshot = store.load_snapshot(base, store.snapshot_envs(base)[0][0])
    full_seconds = sum(t.duration for t in snapshot.tests.values())
    say(f"      {len(snapshot.tests)} tests, {full_seconds:.1f} test-seconds, recorded in "
        f"{time.perf_counter() - t0:.0f}s")
    say(f"[2/{len(changes) + 2}] running FastCI on {len(changes)} changes, {jobs} at a time "
        "(each in its own git worktree, against the same recorded base)")
    store_path = engine.store_path
    done = []

    def prepare(change: Change) -> None:
        tree = root_parent / "changes" / change.name
        _git(root, "worktree", "add", "-q", "-B", f"change/{change.name}", END, str(tree), base)
        _git(tree, "apply", str(change.patch))
        _git(tree, "add", "-A")
        _git(tree, "commit", "-q", "-m", f"change: {change.name}")

    def one(change: Change) -> Outcome:
        tree = root_parent / "changes" / change.name
        t0 = time.perf_counter()
        with open(logs / f"{change.name}.log", "w") as log:
            report = Engine(tree, store_path).run(base, PYTEST_ARGS, stream=log)
        outcome = Outcome(change, report, full_seconds, time.perf_counter() - t0, _why(report))
        done.append(change.name)
        s = outcome.summary
        ttff = s["time_to_first_failure"]
        say(f"      ({len(done)}/{len(changes)}) {change.name}: selected "
            f"{s['selected']}/{s['total']} ({percent(outcome.saved, s['selected'])} of the "
            "suite's test-seconds "
            f"skipped), ran in {outcome.seconds:.0f}s, {len(outcome.failed)} failed"
            + (f" (first after {ttff:.1f}s)" if ttff is not None else "")
            + (f"; MISSED {sorted(outcome.missed)}" if outcome.missed else ""))
        return outcome

    # One after another: git does not take concurrent `worktree add`s in one repository (a
    # second one read the first's half-written .git/worktrees entry and failed in CI).
    for change in changes:
        prepare(change)
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # each run is its own processes
        outcomes = list(pool.map(one, changes))
    say(f"[{len(changes) + 2}/{len(changes) + 2}] report")
    say(table(outcomes))
    report_path = Path(out) if out else root_parent / "report.html"
    report_path.write_text(render_html(outcomes, full_seconds,
                                       time.perf_counter() - started))
    say(f"\nHTML report: {report_path}\nwork tree and logs: {root_parent}\n"
        f"total time {time.perf_counter() - started:.0f}s")
    return outcomes


def percent(share: float, selected: int) -> str:
    """A share as a whole percentage that never rounds a selection away: 5 tests selected
    out of 368 is ">99%" saved, not "100%"."""
    if selected and share > 0.99:
        return ">99%"
    return f"{share:.0%}"


def table(outcomes: list[Outcome]) -> str:
    head = (f"{'change':<26} {'selected':>9} {'pruned':>6} {'test-s run':>10} {'saved':>6} "
            f"{'failed':>6} {'caught':>7} {'1st fail':>8}  why")
    lines = [head, "-" * len(head)]
    for o in outcomes:
        s = o.summary
        saved = o.saved
        expected = len(o.change.failing_tests)
        caught = f"{len(o.caught)}/{expected}" if expected else "-"
        ttff = s["time_to_first_failure"]
        why = "; ".join(f"{n}× {w}" for w, n in o.why) or "nothing it affects"
        lines.append(f"{o.change.name:<26} {s['selected']:>4}/{s['total']:<4} "
                     f"{s['pruned']:>6} "
                     f"{o.test_seconds:>10.1f} {percent(saved, s['selected']):>6} "
                     f"{len(o.failed):>6} {caught:>7} "
                     f"{(f'{ttff:.1f}s' if ttff is not None else '-'):>8}  {why[:90]}")
    total = sum(o.summary["expected_seconds_total"] for o in outcomes)
    skipped = sum(o.summary["expected_seconds_saved"] for o in outcomes)
    missed = sum(len(o.missed) for o in outcomes)
    pruned = sum(o.summary["pruned"] for o in outcomes)
    lines.append("-" * len(head))
    lines.append(f"over {len(outcomes)} changes: skipped {skipped:.1f} of {total:.1f} recorded "
                 f"test-seconds ({skipped / max(total, 1e-9):.0%} saved); {pruned} tests "
                 f"pruned by replaying their captured calls; known failures missed: {missed}")
    lines.append("saved = recorded test-seconds of the skipped tests / of the whole suite; "
                 "test-s run = what the selected tests took in this run; pruned = tests the "
                 "trace diff selected whose captured calls replayed bit-identically")
    return "\n".join(lines)


def render_html(outcomes: list[Outcome], full_seconds: float, wall: float) -> str:
    from jinja2 import Environment, PackageLoader, select_autoescape  # noqa: PLC0415

    env = Environment(loader=PackageLoader("fastci", "templates"),
                      autoescape=select_autoescape(["html"]))
    rows = []
    for o in outcomes:
        s = o.summary
        rows.append({
            "name": o.change.name, "description": o.change.description, "kind": o.change.kind,
            "selected": s["selected"], "total": s["total"], "run": o.test_seconds,
            "pruned": [{"id": d.test_id, "reason": d.reasons[0]}
                       for d in o.report.selection.decisions if d.pruned is not None],
            "saved": o.saved, "saved_text": percent(o.saved, s["selected"]),
            "failed": sorted(o.failed), "expected": list(o.change.failing_tests),
            "missed": sorted(o.missed), "ttff": s["time_to_first_failure"],
            "why": o.why, "mode": o.report.selection.mode,
            "tests": [{"id": d.test_id, "rank": d.rank, "risk": d.risk,
                       "reason": d.reasons[0] if d.reasons else ""}
                      for d in o.report.selection.selected[:25]],
        })
    return env.get_template("demo.html").render(rows=rows, full_seconds=full_seconds,
                                                wall=wall)
