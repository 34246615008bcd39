"""Flaky tests: a failure is confirmed by one rerun before it counts."""

from __future__ import annotations

import json

from fastci.runner.store import SqliteEvidenceStore

FILES = {
    "pkg/__init__.py": "",
    "pkg/calc.py": "def add(a, b):\n    return a + b\n",
    "tests/test_calc.py": '''
        import os
        from pathlib import Path

        from pkg.calc import add


        def test_add():
            assert add(1, 2) == 3


        def test_flaky():
            marker = Path(os.environ["FLAKY_MARKER"])
            if not marker.exists():
                marker.write_text("failed once")
                assert add(1, 1) == 3, "fails on its first run only"


        def test_broken():
            assert add(2, 2) == 5
    ''',
}


def test_a_failure_that_passes_on_rerun_is_flaky_and_not_counted(project, tmp_path):
    project.write(FILES)
    project.commit("calc")
    env = {"FLAKY_MARKER": str(tmp_path / "marker")}
    run = project.fastci("run", "-q", "--all", "--json", "report.json", check=False, env=env)
    assert run.returncode == 1  # test_broken fails twice: a real failure
    assert "FLAKY  tests/test_calc.py::test_flaky" in run.stdout
    assert "FAILED tests/test_calc.py::test_broken" in run.stdout
    report = json.loads((project.root / "report.json").read_text())
    by_id = {r["test_id"]: r for r in report["results"]}
    assert by_id["tests/test_calc.py::test_flaky"]["flaky"] is True
    assert by_id["tests/test_calc.py::test_broken"]["flaky"] is False
    assert report["summary"]["failed"] == 1 and report["summary"]["flaky"] == 1
    with SqliteEvidenceStore(project.root / ".fastci" / "evidence.db") as store:
        outcomes = store.outcomes()
    # Kept out of the risk model's failure history; the real failure stays in it.
    assert "failed" not in outcomes.get("tests/test_calc.py::test_flaky", [])
    assert outcomes["tests/test_calc.py::test_broken"][0] == "failed"


def _rec(*tests, failures=None, first_failure_at=1.0):
    return {"tests": [{"test_id": t, "outcome": o} for t, o in tests],
            "failures": failures or {}, "first_failure_at": first_failure_at}


def test_confirm_keeps_a_failure_that_fails_again():
    from fastci.runner.execution.flaky import confirm, failed_ids

    first = _rec(("a", "passed"), ("b", "failed"), failures={"b": {"message": "boom"}})
    assert failed_ids(first) == ["b"]
    merged, flaky = confirm(first, _rec(("b", "failed")))
    assert flaky == {} and merged is first


def test_confirm_marks_a_passing_rerun_flaky_with_its_first_failure():
    from fastci.runner.execution.flaky import confirm

    first = _rec(("a", "error"), ("b", "failed"), ("c", "passed"),
                 failures={"a": {"message": "x"}, "b": {"message": "y"}})
    merged, flaky = confirm(first, _rec(("a", "passed"), ("b", "failed")))
    assert flaky == {"a": {"message": "x"}}
    assert merged["failures"] == {"b": {"message": "y"}}
    assert [t["outcome"] for t in merged["tests"]] == ["passed", "failed", "passed"]
    assert merged["first_failure_at"] == 1.0  # b still failed
    merged, flaky = confirm(first, _rec(("a", "passed"), ("b", "passed")))
    assert set(flaky) == {"a", "b"} and merged["first_failure_at"] is None


def test_a_rerun_that_recorded_nothing_confirms_every_failure():
    from fastci.runner.execution.flaky import confirm

    first = _rec(("b", "failed"), failures={"b": {}})
    assert confirm(first, None) == (first, {})
    # a test the rerun did not run (or ran and skipped) is not flaky
    assert confirm(first, _rec(("b", "skipped")))[1] == {}
