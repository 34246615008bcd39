"""Flaky tests: a failure is confirmed by one rerun before it counts."""

from __future__ import annotations

import json

from fastci.runner.store.sqlite import EvidenceStore

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
    with EvidenceStore(project.root / ".fastci" / "evidence.db") as store:
        outcomes = store.outcomes()
    # Kept out of the risk model's failure history; the real failure stays in it.
    assert "failed" not in outcomes.get("tests/test_calc.py::test_flaky", [])
    assert outcomes["tests/test_calc.py::test_broken"][0] == "failed"
