"""The recorded suite's scope: evidence remembers the pytest arguments it was recorded with,
and `select`/`run` decide within them. A test outside is listed, neither selected nor new;
a test inside that a change affects is still selected, and a new test inside is new."""

from __future__ import annotations

import json

import pytest

from fastci.runner.selection.scope import Scope

FILES = {
    "pkg/__init__.py": "",
    "pkg/core.py": """
        def double(x):
            return 2 * x


        def triple(x):
            return 3 * x
        """,
    "tests/unit/test_core.py": """
        from pkg.core import double


        def test_double():
            assert double(2) == 4


        def test_slow_double():
            assert double(3) == 6
        """,
    "tests/integration/test_flow.py": """
        from pkg.core import double, triple


        def test_flow():
            assert triple(double(1)) == 6
        """,
}


@pytest.fixture
def scoped(project):
    project.write(FILES)
    project.commit("a package, unit and integration tests")
    project.record("tests/unit")
    return project


def test_a_subset_recording_does_not_select_the_rest_of_the_repository(scoped):
    out = scoped.select()
    assert out["scope"] == {"paths": ["tests/unit"]}
    assert out["outside_recorded_suite"] == ["tests/integration/test_flow.py::test_flow"]
    assert {t["id"] for t in out["tests"]} == {"tests/unit/test_core.py::test_double",
                                               "tests/unit/test_core.py::test_slow_double"}
    assert not [t for t in out["tests"] if t["new"] or t["decision"] == "selected"]
    assert any("1 test outside the recorded suite (recorded with `tests/unit`)" in n
               for n in out["notes"])
    table = scoped.fastci("select").stdout
    assert "outside the recorded suite" in table and "--all-tests" in table


def test_inside_the_scope_a_change_still_selects_and_a_new_test_is_new(scoped):
    """The promise: a test inside the recorded scope that the change affects runs, and a new
    test file added inside the recorded paths runs as new; only outside tests are left."""
    scoped.edit("pkg/core.py", "return 2 * x", "return x + x + 0")
    scoped.write({"tests/unit/test_added.py": """
        from pkg.core import triple


        def test_triple():
            assert triple(1) == 3
        """})
    out = scoped.select()
    chosen = {t["id"]: t for t in out["tests"] if t["decision"] == "selected"}
    assert set(chosen) == {"tests/unit/test_core.py::test_double",
                           "tests/unit/test_core.py::test_slow_double",
                           "tests/unit/test_added.py::test_triple"}
    assert chosen["tests/unit/test_added.py::test_triple"]["new"]
    assert out["outside_recorded_suite"] == ["tests/integration/test_flow.py::test_flow"]


def test_all_tests_widens_the_scope(scoped):
    out = scoped.select("--all-tests")
    assert out["scope"] == {} and out["outside_recorded_suite"] == []
    flow = [t for t in out["tests"] if t["id"] == "tests/integration/test_flow.py::test_flow"]
    assert flow and flow[0]["new"] and flow[0]["decision"] == "selected"


def test_run_stays_in_the_scope_and_carries_it_and_all_tests_widens_it(scoped):
    scoped.edit("pkg/core.py", "return 2 * x", "return x + x")
    scoped.commit("a refactor")
    report = scoped.root / "run.json"
    scoped.fastci("run", "-q", "--json", str(report), "--", "-q", "-p", "no:cacheprovider")
    ran = {r["test_id"] for r in json.loads(report.read_text())["results"]}
    assert ran == {"tests/unit/test_core.py::test_double",
                   "tests/unit/test_core.py::test_slow_double"}  # not the integration test
    out = scoped.select()  # against the run's evidence: the scope was carried
    assert out["scope"] == {"paths": ["tests/unit"]}
    assert out["outside_recorded_suite"] == ["tests/integration/test_flow.py::test_flow"]

    scoped.fastci("run", "-q", "--all-tests", "--json", str(report), "--", "-q", "-p",
                  "no:cacheprovider")
    ran = {r["test_id"] for r in json.loads(report.read_text())["results"]}
    assert "tests/integration/test_flow.py::test_flow" in ran
    out = scoped.select()
    assert out["scope"] == {} and out["outside_recorded_suite"] == []
    assert not [t for t in out["tests"] if t["new"]]


def test_a_keyword_scope_leaves_out_only_what_it_certainly_excludes(project):
    project.write(FILES)
    project.commit("a package, unit and integration tests")
    project.record("-k", "not slow")
    project.write({"tests/unit/test_more.py": """
        def test_slow_new():
            pass


        def test_fast_new():
            pass
        """})
    out = project.select()
    assert out["scope"] == {"paths": [""], "keyword": "not slow"}
    assert set(out["outside_recorded_suite"]) == {"tests/unit/test_core.py::test_slow_double",
                                                  "tests/unit/test_more.py::test_slow_new"}
    new = {t["id"] for t in out["tests"] if t["new"]}
    assert new == {"tests/unit/test_more.py::test_fast_new"}


@pytest.mark.parametrize("scope, test_id, inside", [
    (Scope(paths=("tests/unit",)), "tests/unit/test_a.py::test_x", True),
    (Scope(paths=("tests/unit",)), "tests/unitx/test_a.py::test_x", False),
    (Scope(paths=("tests/unit/test_a.py::test_x",)), "tests/unit/test_a.py::test_x", True),
    (Scope(paths=("tests/unit/test_a.py::TestA",)), "tests/unit/test_a.py::TestA::test_y",
     True),
    (Scope(paths=("tests/unit/test_a.py::test_x",)), "tests/unit/test_a.py::test_xy", False),
    (Scope(paths=("",), ignore=("tests/slow",)), "tests/slow/test_a.py::test_x", False),
    (Scope(paths=("",), ignore_glob=("*_gpu.py",)), "tests/test_a_gpu.py::test_x", False),
    (Scope(paths=("",), deselect=("tests/test_a.py::test_x",)), "tests/test_a.py::test_x",
     False),
    # -k: a name that matches decides; an identifier no name matches may be a marker
    (Scope(paths=("",), keyword="double"), "tests/test_a.py::test_triple", True),
    (Scope(paths=("",), keyword="double and not double"), "tests/test_a.py::test_x", False),
    (Scope(paths=("",), keyword="test_a.py and not test_x"), "tests/test_a.py::test_x",
     False),
    (Scope(paths=("",), keyword="not (("), "tests/test_a.py::test_x", True),  # pytest refuses
    # -m: markers are known only at collection: never outside here
    (Scope(paths=("",), markexpr="gpu and not gpu"), "tests/test_a.py::test_x", True),
    (Scope(), "anything/at/all.py::test_x", True),
])
def test_scope_membership(scope, test_id, inside):
    assert scope.contains(test_id) is inside
    assert Scope.from_json(scope.to_json()) == scope or scope.whole


def test_scope_round_trips_through_pytest_arguments():
    scope = Scope(paths=("tests/unit", "tests/x.py::test_y"), ignore=("tests/unit/slow",),
                  keyword="not slow", markexpr="not gpu")
    assert scope.pytest_args() == ["tests/unit", "tests/x.py::test_y",
                                   "--ignore=tests/unit/slow", "-k", "not slow", "-m",
                                   "not gpu"]
    assert Scope().pytest_args() == [] and Scope().describe() == "the whole repository"
    assert Scope(paths=("",)).whole
