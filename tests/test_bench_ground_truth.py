"""bench/selection.py's ground truth: a mutant that kills pytest itself (a kernel reading out
of bounds segfaults) or hangs it (one rank aborts, the other waits) is a killed mutant. The
test that crashed or hung fails, and the suite goes on past it, so the tests after it count
too. A test that crashed but passes alone was a victim of an earlier one: it is noted, not
counted as failing. Before, such a run counted as no failing test,
so the benchmark never checked that the crashing tests were selected."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _selection_bench():
    path = ROOT / "bench" / "selection.py"
    spec = importlib.util.spec_from_file_location("bench_selection", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SUITE = '''
import os, signal

def test_before():
    pass

def test_segfaults():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_fails_after_the_crash():
    assert False

def test_aborts():
    os.abort()

def test_hangs():
    import time
    time.sleep(600)

def test_passes_last():
    pass
'''


def test_a_crashing_or_hanging_test_fails_and_the_suite_goes_on_past_it(tmp_path):
    bench = _selection_bench()
    (tmp_path / "test_suite.py").write_text(SUITE)
    order = bench.collect_order(tmp_path)
    assert len(order) == 6
    truth = bench.failing_tests(tmp_path, order, timeout=8)
    assert truth.failing == sorted(["test_suite.py::test_segfaults", "test_suite.py::test_aborts",
                                    "test_suite.py::test_fails_after_the_crash",
                                    "test_suite.py::test_hangs"])
    assert truth.status == "ok (2 crashed, 1 hung)" and truth.victims == []


def test_a_suite_without_crashes_is_run_once(tmp_path):
    bench = _selection_bench()
    (tmp_path / "test_suite.py").write_text("def test_a():\n    assert 1 == 2\n\n"
                                            "def test_b():\n    pass\n")
    order = bench.collect_order(tmp_path)
    truth = bench.failing_tests(tmp_path, order, timeout=120)
    assert (truth.failing, truth.status) == (["test_suite.py::test_a"], "ok")


# The first test leaves the process in a state that kills it later (as an out-of-bounds
# write corrupts the heap, and the allocator aborts in the next test); alone, the next test
# passes. It crashed in the suite, but it is not a failing test of its own.
POISONED = '''
import os, signal, sys

def test_poisons():
    sys.modules["poisoned"] = True

def test_victim():
    if "poisoned" in sys.modules:
        os.kill(os.getpid(), signal.SIGABRT)

def test_after():
    pass
'''


def test_a_test_that_crashes_only_after_another_is_a_victim_not_a_failure(tmp_path):
    bench = _selection_bench()
    (tmp_path / "test_suite.py").write_text(POISONED)
    truth = bench.failing_tests(tmp_path, bench.collect_order(tmp_path), timeout=60)
    assert truth.failing == [] and truth.victims == ["test_suite.py::test_victim"]
    assert truth.status == "ok (1 crashed only after other tests)"
