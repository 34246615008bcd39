"""Terminal renderings of selections and runs (plain text, no colour codes)."""

from __future__ import annotations

from fastci.runner.explain import explain  # noqa: F401 (the CLI's `explain` text)
from fastci.runner.explain import seconds as _seconds
from fastci.runner.report import RunReport, Selection

__all__ = ["explain", "run_summary", "selection_table", "verdict"]


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def selection_table(sel: Selection, *, show_skipped: bool = False, limit: int = 50) -> str:
    s = sel.summary()
    lines = [
        f"FastCI selection  base {(sel.base or '-')[:12]}  head {sel.head[:12]}  mode {sel.mode}",
    ]
    if sel.select_all_reason:
        lines.append(f"every test selected: {sel.select_all_reason}")
    lines.append(f"changed files: {len(sel.changed_files)}  "
                 f"selected {s['selected']}/{s['total']} tests  "
                 f"expected {_seconds(s['expected_seconds_selected'])} of "
                 f"{_seconds(s['expected_seconds_total'])} "
                 f"(saves {_seconds(s['expected_seconds_saved'])})")
    for note in sel.notes:
        lines.append(f"note: {note}")
    chosen = sel.selected
    if chosen:
        lines.append("")
        lines.append(f"{'#':>4}  {'risk':>5}  {'expect':>7}  test / why")
        for d in chosen[:limit]:
            lines.append(f"{d.rank:>4}  {d.risk:5.2f}  {_seconds(d.expected_seconds):>7}  "
                         f"{d.test_id}")
            lines.append(f"{'':>22}{_short(d.reasons[0], 100) if d.reasons else ''}")
        if len(chosen) > limit:
            lines.append(f"  … and {len(chosen) - limit} more selected "
                         "(--format json lists all)")
    if show_skipped and sel.skipped:
        lines.append("")
        lines.append("skipped:")
        for d in sel.skipped[:limit]:
            lines.append(f"  {d.test_id}: {_short(d.reasons[0], 100)}")
    return "\n".join(lines)


def verdict(report: RunReport) -> str:
    """The blocking verdict, printed before background dimensions start."""
    blocking = [r for r in report.results if r.blocking]
    failed = report.blocking_failures
    word = "FAILED" if failed else "passed"
    return (f"\nFastCI verdict: {word} ({len(blocking)} blocking tests, {len(failed)} failed)"
            + "".join(f"\n  FAILED {r.test_id}" for r in failed[:20]))


def run_summary(report: RunReport) -> str:
    s = report.summary()
    lines = [
        "",
        "FastCI run summary",
        f"  tests selected     {s['selected']}/{s['total']} "
        f"({s['total'] - s['selected']} skipped; mode {report.selection.mode})",
        f"  ran                {s['ran']} tests, {_seconds(s['test_seconds_run'])} of test time",
        f"  test time saved    expected {_seconds(s['expected_seconds_saved'])}, "
        f"actual {_seconds(s['actual_seconds_saved'])} "
        f"(full suite ~{_seconds(s['expected_seconds_total'])})",
        f"  verdict            {s['verdict']} ({s['blocking_failed']} blocking failures; "
        f"{s['failed'] - s['blocking_failed']} background failures)",
        f"  first failure at   {_seconds(s['time_to_first_failure'])}",
    ]
    for r in report.failures[:20]:
        where = ""
        if r.failure and r.failure.get("path"):
            where = f"  ({r.failure['path']}:{r.failure['line']})"
        kind = "" if r.blocking else " [background]"
        lines.append(f"  FAILED {r.test_id}{where}{kind}")
    for r in [r for r in report.results if r.flaky][:20]:
        lines.append(f"  FLAKY  {r.test_id} (failed, then passed when run again; not counted)")
    return "\n".join(lines)
