"""Terminal renderings of selections and runs (plain text, no colour codes)."""

from __future__ import annotations

from fastci.runner.selection.explain import explain  # noqa: F401 (the CLI's `explain` text)
from fastci.runner.selection.explain import seconds as _seconds
from fastci.runner.selection.report import RunReport, Selection

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
    audit = report.extra.get("audit")
    if audit and audit["kind"] == "shadow":
        lines.append(f"  shadow mode        every test ran; the selection would have run "
                     f"{audit['selected']} and missed {len(audit['missed'])} failure(s)"
                     + (": " + ", ".join(audit["missed"][:5]) if audit["missed"] else ""))
    for r in [r for r in report.results if r.flaky][:20]:
        lines.append(f"  FLAKY  {r.test_id} (failed, then passed when run again; not counted)")
    return "\n".join(lines)


def audit_table(entries: list[dict], since_text: str) -> str:
    """`fastci audit`: escaped failures, GPU-hours saved and time to first failure."""
    if not entries:
        return (f"no audited runs {since_text}: set mode = \"shadow\" under [tool.fastci] "
                "(or run `fastci run --all`) to record what the selection would have missed")
    lines = [f"{'when':<17} {'commit':<12} {'kind':<7} {'selected':>9} {'saved':>8} "
             f"{'failed':>6} {'escaped':>7} {'1st fail':>8}"]
    import datetime as _dt  # noqa: PLC0415

    for e in entries:
        when = _dt.datetime.fromtimestamp(e["at"]).strftime("%Y-%m-%d %H:%M")
        saved = max(e["total_seconds"] - e["selected_seconds"], 0.0)
        lines.append(f"{when:<17} {(e.get('commit') or '-')[:12]:<12} {e['kind']:<7} "
                     f"{e['selected']:>4}/{e['total']:<4} {_seconds(saved):>8} "
                     f"{len(e['failed']):>6} {len(e['missed']):>7} "
                     f"{_seconds(e.get('time_to_first_failure')):>8}")
        for test_id in e["missed"]:
            lines.append(f"    ESCAPED {test_id}")
    escaped = sum(len(e["missed"]) for e in entries)
    failed = sum(len(e["failed"]) for e in entries)
    saved = sum(max(e["total_seconds"] - e["selected_seconds"], 0.0) for e in entries)
    total = sum(e["total_seconds"] for e in entries)
    ttff = sorted(e["time_to_first_failure"] for e in entries
                  if e.get("time_to_first_failure") is not None)
    median = ttff[len(ttff) // 2] if ttff else None
    lines.append("")
    lines.append(f"{len(entries)} audited runs {since_text}: {escaped} escaped failure(s) of "
                 f"{failed}; {saved / 3600:.3f} GPU-hours saved of {total / 3600:.3f} "
                 f"({saved / total if total else 0:.0%}); median time to first failure "
                 f"{_seconds(median)}")
    return "\n".join(lines)


def gc_table(report) -> str:
    """`fastci gc`: kept and deleted per kind, and the bytes freed (a GcReport)."""
    verb = "would delete" if report.dry_run else "deleted"
    lines = [f"{'kind':<12} {'kept':>8} {verb:>12} {'bytes':>10}"]
    for name, k in report.kinds.items():
        lines.append(f"{name:<12} {k.kept:>8} {k.deleted:>12} {_size(k.bytes):>10}")
    freed = "would free" if report.dry_run else "freed"
    lines.append(f"{report.deleted} item(s) {verb}, {_size(report.bytes)} {freed}"
                 + (" (dry run: nothing was deleted)" if report.dry_run else ""))
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
