"""A pytest plugin for the mutation benchmark: writes the node id of every failing test (and
of every test file that fails to collect) to $FASTCI_BENCH_FAILURES, one per line. Node ids
hold spaces (`test_x[(1, 257)]`), so pytest's summary lines are no way to read them.

A mutant can kill the interpreter itself (a Triton kernel reading out of bounds segfaults),
and then no report is written for the test that crashed, nor for any after it. So the
plugin also writes `start <nodeid>` as each test begins and `done <nodeid>` once its
teardown is reported, to $FASTCI_BENCH_FAILURES.progress: the test started and never done
is the one that crashed. $FASTCI_BENCH_ONLY (a file of node ids, one per line) restricts
the run to those tests, so the suite can go on after a crash with the tests not run yet.
"""

import os


def _write(nodeid: str, suffix: str = "", prefix: str = "") -> None:
    with open(os.environ["FASTCI_BENCH_FAILURES"] + suffix, "a") as fh:
        fh.write(prefix + nodeid + "\n")
        fh.flush()  # the process may die before it would close the file


def pytest_collection_modifyitems(config, items) -> None:
    only = os.environ.get("FASTCI_BENCH_ONLY")
    if not only:
        return
    with open(only) as fh:
        wanted = {line.rstrip("\n") for line in fh if line.strip()}
    kept = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in wanted])
    items[:] = kept


def pytest_runtest_logstart(nodeid) -> None:
    _write(nodeid, ".progress", "start ")


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        _write(report.nodeid)
    if report.when == "teardown":
        _write(report.nodeid, ".progress", "done ")


def pytest_collectreport(report) -> None:
    if report.failed:
        _write(report.nodeid)
