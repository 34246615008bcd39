"""A pytest plugin for the mutation benchmark: writes the node id of every failing test (and
of every test file that fails to collect) to $FASTCI_BENCH_FAILURES, one per line. Node ids
hold spaces (`test_x[(1, 257)]`), so pytest's summary lines are no way to read them."""

import os


def _write(nodeid: str) -> None:
    with open(os.environ["FASTCI_BENCH_FAILURES"], "a") as fh:
        fh.write(nodeid + "\n")


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        _write(report.nodeid)


def pytest_collectreport(report) -> None:
    if report.failed:
        _write(report.nodeid)
