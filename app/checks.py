"""What the check runs say: titles, summaries, annotations. Pure, over the runner's report.

Three check runs per head: "FastCI selection" (what will run and why), "FastCI regressions"
(the blocking dimensions' results, streamed as shards finish) and "FastCI background"
(convergence and perf: never blocking, conclusion neutral when they fail).
"""

from __future__ import annotations

from jinja2 import Environment, PackageLoader

from fastci.runner.selection.report import Selection, TestResult

from . import markdown
from .events import RERUN_FAILED, RUN_ALL
from .github import CheckRunOutput

SELECTION, REGRESSIONS, BACKGROUND = "FastCI selection", "FastCI regressions", \
    "FastCI background"
LIST_LIMIT = 200
ACTIONS = [
    {"label": "Run all", "identifier": "run_all",
     "description": "Run every test, not the selection"},
    {"label": "Re-run failed", "identifier": "rerun_failed",
     "description": "Run the failed tests again"},
]

_env = Environment(loader=PackageLoader("fastci.app", "templates"), autoescape=False,
                   trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


_env.globals["seconds"] = _seconds
_env.filters["cell"] = markdown.cell
_env.filters["code"] = markdown.code
REQUESTED = {RUN_ALL: "every test runs, as requested (Run all, or `/fastci run all`)",
             RERUN_FAILED: "the tests that failed last run again, as requested (Re-run failed)"}


def selection_output(selection: Selection, change_annotations: list[dict],
                     mode: str = "select") -> CheckRunOutput:
    """``mode``: the run's (events.RUN_ALL and RERUN_FAILED run other tests than selected, and
    the title says what runs, not what the selection would have saved)."""
    s = selection.summary()
    share = s["expected_seconds_saved"] / s["expected_seconds_total"] \
        if s["expected_seconds_total"] else 0.0
    percent = ">99%" if share > 0.99 and s["selected"] else f"{share:.0%}"
    title = (f"{s['selected']} of {s['total']} tests selected"
             + (f", {s['pruned']} pruned" if s["pruned"] else "")
             + f" ({percent} of test time saved)")
    if selection.select_all_reason:
        title = f"all {s['total']} tests selected"
    if mode == RUN_ALL:
        title = f"all {s['total']} tests run on request (the selection: {s['selected']})"
    elif mode == RERUN_FAILED:
        title = "failed tests re-run on request"
    summary = _env.get_template("selection.md.j2").render(
        selection=selection, s=s, percent=percent, changed_files=list(selection.changed_files),
        requested=REQUESTED.get(mode))
    chosen = selection.selected
    text = _env.get_template("selection-list.md.j2").render(
        selected=chosen[:LIST_LIMIT], more=max(0, len(chosen) - LIST_LIMIT),
        pruned=[d for d in selection.decisions if d.pruned is not None][:LIST_LIMIT])
    return CheckRunOutput(title, summary, text, change_annotations)


def change_annotations(changed_blocks: dict, spans: dict, tests_per_block: dict) -> list[dict]:
    """A notice on each changed block: how many tests executed it (and so were considered)."""
    out = []
    for (path, qualname), status in sorted(changed_blocks.items()):
        span = spans.get((path, qualname))
        if span is None:
            continue
        n = tests_per_block.get((path, qualname), 0)
        level = "notice" if n else "warning"
        message = (f"{qualname} ({status}): {n} test{'s' if n != 1 else ''} executed it in the "
                   "evidence" if n else
                   f"{qualname} ({status}): no test executed it in the evidence")
        out.append({"path": path, "start_line": span[0], "end_line": span[1],
                    "annotation_level": level, "title": "FastCI: changed block",
                    "message": message})
    return out


def regressions_output(results: list[TestResult], *, shards: int, shards_done: int,
                       done: bool, coverage=None, blocking: bool = True) -> CheckRunOutput:
    failures = sorted((r for r in results if r.outcome in ("failed", "error") and not r.flaky),
                      key=lambda r: r.test_id)
    flaky = sorted((r for r in results if r.flaky), key=lambda r: r.test_id)
    passed = [r for r in results if r.outcome not in ("failed", "error")]
    label = "blocking dimensions" if blocking else "background dimensions, never blocking"
    if done:
        title = (f"{len(failures)} failed of {len(results)}" if failures
                 else f"{len(results)} passed")
    else:
        title = f"running: {shards_done}/{shards} shards, {len(failures)} failed so far"
    summary = _env.get_template("regressions.md.j2").render(
        done=done, failures=failures, flaky=flaky, passed=passed, ran=len(results),
        shards=shards,
        shards_done=shards_done, coverage=coverage, dimension_label=label)
    annotations = [_failure_annotation(r) for r in failures if r.failure and
                   r.failure.get("path") and r.failure.get("line")]
    if coverage is not None:
        for path, lines in sorted(coverage.uncovered.items()):
            for start, end in _runs(lines):
                annotations.append({
                    "path": path, "start_line": start, "end_line": end,
                    "annotation_level": "warning", "title": "FastCI: untested change",
                    "message": "No test executed this changed line"
                               + ("s" if end > start else "") + "."})
    return CheckRunOutput(title, summary, "", annotations)


def _failure_annotation(result: TestResult) -> dict:
    failure = result.failure
    return {"path": failure["path"], "start_line": int(failure["line"]),
            "end_line": int(failure["line"]), "annotation_level": "failure",
            "title": f"{result.test_id} {result.outcome}",
            "message": (failure.get("message") or result.outcome)[:4000]}


def _runs(lines) -> list[tuple[int, int]]:
    spans: list[list[int]] = []
    for n in sorted(lines):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return [(a, b) for a, b in spans]


def conclusion(results: list[TestResult], blocking: bool = True) -> str:
    failed = any(r.outcome in ("failed", "error") and not r.flaky for r in results)
    if not failed:
        return "success"
    return "failure" if blocking else "neutral"
