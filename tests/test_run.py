"""`fastci run`: runs the selection in risk order, stores evidence, carries skipped tests."""

from __future__ import annotations

import json

from fastci.runner.execution.carry import remap_lines


def run(project, *args):
    out = project.root / "run.json"
    proc = project.fastci("run", "-q", "--json", str(out), *args, "--", "-q",
                          "-p", "no:cacheprovider", check=False)
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def test_run_executes_only_the_selection_and_stores_head_evidence(library):
    library.edit("calc/norms.py", "return sum(abs(x) for x in xs)",
                 "return sum([abs(x) for x in xs])")
    library.commit("l1 with a list")
    proc, report = run(library)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["test_id"] for r in report["results"]] == ["tests/test_norms.py::test_l1"]
    assert "1 passed, 7 deselected" in proc.stdout
    summary = report["summary"]
    assert summary["selected"] == 1 and summary["total"] == 8 and summary["failed"] == 0
    assert summary["expected_seconds_saved"] > 0
    # The head now has evidence for every test without a full run.
    after = library.select("--base", "HEAD")
    assert after["base"] == library.git("rev-parse", "HEAD")
    assert after["summary"] == {**after["summary"], "total": 8, "selected": 0}


def test_carried_evidence_keeps_selecting_correctly_later(library):
    library.edit("calc/model.py", "TABLE = [i * 2", "\n\nTABLE = [i * 2")  # shifts lines
    library.commit("blank lines")
    run(library)
    library.edit("calc/norms.py", "EPS = 1e-6", "EPS = 1e-2")
    selected = library.selected("--base", "HEAD")
    assert {"tests/test_norms.py::test_rms", "tests/test_model.py::test_forward"} <= selected


def test_failures_are_reported_with_location_and_fail_the_run(library):
    library.edit("calc/norms.py", "return sum(abs(x) for x in xs)", "return sum(x for x in xs)")
    proc, report = run(library)
    assert proc.returncode == 1
    failure = report["results"][0]["failure"]
    assert failure["path"] == "tests/test_norms.py" and failure["line"] == 9
    assert report["summary"]["time_to_first_failure"] is not None
    assert "FAILED tests/test_norms.py::test_l1" in proc.stdout
    # It failed: the next selection picks it again even with nothing else changed.
    library.edit("calc/norms.py", "return sum(x for x in xs)", "return sum(abs(x) for x in xs)")
    assert "tests/test_norms.py::test_l1" in library.selected()


def test_the_historically_failing_test_is_the_riskiest(library):
    library.edit("calc/norms.py", "EPS = 1e-6", "EPS = 1e-9")
    library.edit("tests/test_model.py", "assert len(Model(cfg).forward([1.0, 2.0])) == 2",
                 "assert len(Model(cfg).forward([1.0, 2.0])) == 3")
    proc, report = run(library)
    assert proc.returncode == 1
    library.edit("tests/test_model.py", "forward([1.0, 2.0])) == 3", "forward([1.0, 2.0])) == 2")
    library.commit("fixed")
    library.edit("calc/norms.py", "EPS = 1e-9", "EPS = 1e-8")
    data = library.select("--base", "HEAD")
    # Risk, not rank: the order is risk per second of each test's measured duration, and
    # these tests take about a millisecond, so a loaded machine's noise may swap them.
    risks = {t["id"]: t["risk"] for t in data["tests"] if t["decision"] == "selected"}
    assert max(risks, key=risks.get) == "tests/test_model.py::test_forward", risks
    assert risks["tests/test_model.py::test_forward"] > risks["tests/test_norms.py::test_rms"]


def test_new_tests_run_and_gain_evidence(library):
    library.write({"tests/test_more.py": """
        import pytest

        @pytest.mark.parametrize("k", [1, 2, 3])
        def test_k(k):
            assert k > 0
    """})
    proc, report = run(library)
    assert proc.returncode == 0
    assert sorted(r["test_id"] for r in report["results"]) == [
        "tests/test_more.py::test_k[1]", "tests/test_more.py::test_k[2]",
        "tests/test_more.py::test_k[3]"]
    library.commit("more tests")
    assert library.selected("--base", "HEAD") == set()


def test_run_all_runs_everything(library):
    proc, report = run(library, "--all")
    assert proc.returncode == 0 and len(report["results"]) == 8


def test_remap_lines_moves_and_drops():
    hunks = [(3, 0, 4, 2), (10, 2, 12, 1)]  # 2 lines inserted after 3; 10-11 -> one line
    assert remap_lines((1, 3, 4, 9, 10, 11, 12), hunks) == (1, 3, 6, 11, 13)


def test_background_dimensions_run_after_the_blocking_verdict_and_do_not_block(library):
    library.edit("calc/model.py", "bias = 0.5", "bias = 0.75")  # breaks the convergence test
    proc, report = run(library)
    assert proc.returncode == 0, proc.stdout  # convergence failures do not block
    assert report["summary"]["verdict"] == "passed"
    assert report["summary"]["blocking_failed"] == 0 and report["summary"]["failed"] == 2
    by_id = {r["test_id"]: r for r in report["results"]}
    assert not by_id["tests/test_model.py::test_bias[1]"]["blocking"]
    assert by_id["tests/test_model.py::test_forward"]["blocking"]
    # The verdict is printed before the background session starts.
    verdict_at = proc.stdout.index("FastCI verdict: passed")
    assert proc.stdout.index("2 failed", verdict_at) > verdict_at
    assert "[background]" in proc.stdout


def test_blocking_failure_fails_the_run_even_with_background_passing(library):
    library.edit("calc/model.py", "return self.cfg.width", "return self.cfg.width + 1")
    proc, report = run(library, "--no-background")
    assert proc.returncode == 1
    assert report["summary"]["verdict"] == "failed"
    assert all(r["blocking"] for r in report["results"])


def test_nothing_selected_runs_no_session_and_still_carries_evidence(library):
    library.edit("calc/norms.py", '"""Root mean square."""', '"""Root mean square, again."""')
    library.commit("docstring")
    proc, report = run(library)
    assert proc.returncode == 0
    assert report["results"] == [] and report["pytest_exit_codes"] == {}
    after = library.select("--base", "HEAD")
    assert after["base"] == library.git("rev-parse", "HEAD")
    assert after["summary"]["total"] == 8 and after["summary"]["selected"] == 0
