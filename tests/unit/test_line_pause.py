"""A line recorder's pause covers the calling thread only, and ends where it began.

Captures pause line recording around their own bookkeeping (fingerprints, pickles). coverage's
`Collector.pause` and `resume` act on every thread's tracer and start them all on the calling
thread: after a test had started a thread, its own frame went on under the other thread's
tracer, and the lines it ran after a captured call were missing from its evidence (a test
wrongly skipped later). Each recorder runs here in this process, on a module written to a
temporary folder.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from fastci.runner.record.lines import CoverageLines, SysmonLines, monitoring

SOURCE = textwrap.dedent('''
    import threading


    def work(n):
        total = 0
        for i in range(n):
            total += i
        return total


    def late(n):
        return [n] * n


    def scenario(lines):
        work(2)
        go = threading.Event()
        thread = threading.Thread(target=lambda: go.wait() and late(3))
        thread.start()
        lines.pause()
        lines.pause()
        lines.resume()
        go.set()
        thread.join()  # it ran late() while this thread was paused
        work(1)  # still paused: the outer pause holds
        lines.resume()
        after = 1
        return after + 1
''')

RECORDERS = ["coverage"] + (["sysmon"] if monitoring is not None else [])


def _line(text: str) -> int:
    return next(n for n, line in enumerate(SOURCE.splitlines(), 1) if line.strip() == text)


@pytest.mark.parametrize("kind", RECORDERS)
def test_a_pause_holds_for_its_own_thread_only(tmp_path, kind):
    path = tmp_path / "scenario.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("fastci_scenario", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = CoverageLines(str(tmp_path), omit=[]) if kind == "coverage" else SysmonLines(
        str(tmp_path))
    before = sys.gettrace()
    lines.start()
    try:
        lines.switch("test")
        module.scenario(lines)
    finally:
        lines.stop()
        sys.settrace(before)
    seen = lines.lines()["test"][str(path)]
    assert {_line("after = 1"), _line("return after + 1")} <= seen  # after the pause
    assert _line("return [n] * n") in seen  # the other thread, during it
    assert _line("work(1)  # still paused: the outer pause holds") not in seen
