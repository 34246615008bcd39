"""The pytest plugin in-process, through pytester: what `--fastci-record` stores, what
`--fastci-plan` keeps and in which order, and that without its options it does nothing.

All runs here are in-process (`runpytest_inprocess`): coverage.py starts and stops cleanly
inside a pytester session, and pytester restores `sys.modules` after each run, so the inner
repository's modules are imported (and measured) afresh every time.
"""

from __future__ import annotations

import json
import subprocess

# Imported here, before any inner session: pytester drops the modules a run imported when it
# ends, and coverage's C tracer cannot be imported a second time into one process
# ("module 'coverage.tracer' has no attribute 'CTracer'" on the next recording run).
import coverage  # noqa: F401
import pytest

# Likewise the fingerprints, which import Triton (whose native module aborts the process when
# initialised twice): once an earlier test imported torch, an inner recording captures the
# calls its tests make to the inner repository's functions, and fingerprints them.
import fastci.runner.prune.fingerprints  # noqa: F401
from fastci.runner.evidence import ImportCaller
from fastci.runner.record.recorder import blob_sha, recording_from_json
from fastci.runner.selection.plan import make_plan
from fastci.runner.store import open_store

pytest_plugins = ["pytester"]

# Module names unlikely to exist in the outer session (pytester restores sys.modules, but a
# clash would still import the wrong module while the inner session runs).
SOURCES = {
    "fastci_calc": '''
        def build_table():
            return [i * i for i in range(4)]


        TABLE = build_table()


        def double(x):
            return 2 * x


        def triple(x):
            return 3 * x
    ''',
    "test_fastci_calc": '''
        from fastci_calc import TABLE, double, triple


        def test_double():
            assert double(2) == 4


        def test_triple():
            assert triple(2) == 6


        def test_scale_file():
            with open("data/scale.txt") as fh:
                assert double(int(fh.read())) == 6


        def test_broken():
            assert triple(1) == 4
    ''',
}
DATA = "3\n"
# Hypothesis' pytest plugin re-imports hypothesis in every in-process run (pytester drops the
# modules a run imported): 2.3 s a run, for a plugin these inner sessions do not use.
NOPLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def git(path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@fastci.invalid", "-c", "user.name=t",
                           "-c", "commit.gpgsign=false", *args], cwd=path, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    """A committed git repository holding a module, its tests and a data file."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(pytester.path.parent))
    pytester.makepyfile(**SOURCES)
    (pytester.path / "data").mkdir()
    (pytester.path / "data" / "scale.txt").write_text(DATA)
    git(pytester.path, "init", "-q")
    git(pytester.path, "add", "-A")
    git(pytester.path, "commit", "-q", "-m", "calc")
    return pytester


def stored_snapshot(repo: pytest.Pytester):
    head = git(repo.path, "rev-parse", "HEAD")
    with open_store(repo.path / ".fastci" / "evidence.db", create=False) as store:
        ((env_key, _),) = store.snapshot_envs(head)
        return store.load_snapshot(head, env_key)


# -- recording ---------------------------------------------------------------------------------

def test_recording_stores_which_functions_each_test_executed(repo):
    result = repo.runpytest_inprocess("--fastci-record", *NOPLUGINS)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([f"fastci: recording evidence in {repo.path} with *",
                                 "fastci: recorded evidence for 4 tests at *"])
    tests = stored_snapshot(repo).tests
    assert tests["test_fastci_calc.py::test_double"].blocks == {
        "fastci_calc.py": ("double",), "test_fastci_calc.py": ("test_double",)}
    assert tests["test_fastci_calc.py::test_triple"].blocks == {
        "fastci_calc.py": ("triple",), "test_fastci_calc.py": ("test_triple",)}


def test_recording_keeps_outcomes_data_files_and_import_time_work(repo):
    repo.runpytest_inprocess("--fastci-record", *NOPLUGINS)
    snapshot = stored_snapshot(repo)
    assert snapshot.tests["test_fastci_calc.py::test_broken"].outcome == "failed"
    assert snapshot.tests["test_fastci_calc.py::test_double"].outcome == "passed"
    # The file a test read, hashed as git hashes it, so it compares with any git tree.
    files = snapshot.tests["test_fastci_calc.py::test_scale_file"].files
    assert files == {"data/scale.txt": git(repo.path, "hash-object", "data/scale.txt")}
    assert files["data/scale.txt"] == blob_sha(DATA.encode())
    assert snapshot.tests["test_fastci_calc.py::test_double"].files == {}
    # build_table() ran while the test file was collected, outside every test, called by
    # the statement that binds TABLE.
    assert snapshot.import_time == {"fastci_calc.py": {"build_table": [
        ImportCaller("assign", "fastci_calc.py", 5, ("TABLE",)).encode(), "test_fastci_calc.py"]}}
    assert "build_table" not in snapshot.tests["test_fastci_calc.py::test_double"].blocks[
        "fastci_calc.py"]
    assert snapshot.tree == {p: git(repo.path, "hash-object", p) for p in
                             ("fastci_calc.py", "test_fastci_calc.py", "data/scale.txt")}


def test_recording_to_a_file_hands_over_the_evidence_and_the_failures(repo):
    out = repo.path / "recording.json"
    repo.runpytest_inprocess("--fastci-record", "--fastci-out", str(out), *NOPLUGINS)
    recording, failures = recording_from_json(json.loads(out.read_text()))
    assert recording.tests["test_fastci_calc.py::test_triple"].blocks["fastci_calc.py"] == (
        "triple",)
    assert recording.order == ["test_fastci_calc.py::test_double",
                               "test_fastci_calc.py::test_triple",
                               "test_fastci_calc.py::test_scale_file",
                               "test_fastci_calc.py::test_broken"]
    failure = failures["test_fastci_calc.py::test_broken"]
    assert failure["path"] == "test_fastci_calc.py" and failure["when"] == "call"
    assert "assert 3 == 4" in failure["message"]
    lines = (repo.path / "test_fastci_calc.py").read_text().splitlines()
    assert failure["line"] == lines.index("    assert triple(1) == 4") + 1
    # --fastci-out hands the recording over instead of storing a snapshot.
    with open_store(repo.path / ".fastci" / "evidence.db") as store:
        assert store.commits_with_evidence() == set()


def test_recording_outside_a_git_repository_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(pytester.path.parent))
    pytester.makepyfile(test_fastci_alone="def test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("--fastci-record", *NOPLUGINS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fastci: cannot record: * is not inside a git repository*"])
    assert not (pytester.path / ".fastci").exists()


# -- inert without its options -------------------------------------------------------------------

def test_without_its_options_the_plugin_only_says_it_is_off(pytester, monkeypatch):
    """No git repository needed, no store created, no session object registered."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(pytester.path.parent))
    pytester.makepyfile(test_fastci_alone="def test_x():\n    pass\n")
    result = pytester.runpytest_inprocess(*NOPLUGINS)
    result.assert_outcomes(passed=1)
    fastci_lines = [line for line in result.outlines if "fastci" in line.lower()
                    and not line.startswith(("plugins:", "rootdir:", "test_fastci_alone"))]
    assert fastci_lines == [
        "fastci: off (pass --fastci-record to record evidence, or use `fastci run`)"]
    assert not (pytester.path / ".fastci").exists()
    config = pytester.parseconfigure()
    assert config.pluginmanager.get_plugin("fastci-session") is None


# -- running a plan ----------------------------------------------------------------------------

def write_plan(pytester, order, known, **extra) -> str:
    plan = {**make_plan(order, known), **extra}
    path = pytester.path / "plan.json"
    path.write_text(json.dumps(plan))
    return str(path)


ALL_IDS = ["test_fastci_calc.py::test_double", "test_fastci_calc.py::test_triple",
           "test_fastci_calc.py::test_scale_file", "test_fastci_calc.py::test_broken"]


def test_a_plan_keeps_its_tests_in_its_order_and_deselects_the_rest(repo):
    plan = write_plan(repo, ["test_fastci_calc.py::test_scale_file",
                             "test_fastci_calc.py::test_double"], ALL_IDS)
    result = repo.runpytest_inprocess("--fastci-plan", plan, "-v", *NOPLUGINS)
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines([f"fastci: running the plan in {plan}",
                                 "test_fastci_calc.py::test_scale_file PASSED*",
                                 "test_fastci_calc.py::test_double PASSED*"])
    assert "test_triple" not in result.stdout.str()
    assert repo.parseconfigure("--fastci-plan", plan).pluginmanager.get_plugin(
        "fastci-session") is not None


def test_a_test_the_plan_does_not_know_runs_first(repo):
    plan = write_plan(repo, ["test_fastci_calc.py::test_double"], ALL_IDS[:3])
    result = repo.runpytest_inprocess("--fastci-plan", plan, "-v", *NOPLUGINS)
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    result.stdout.fnmatch_lines(["test_fastci_calc.py::test_broken FAILED*",
                                 "test_fastci_calc.py::test_double PASSED*"])


def test_a_plan_phase_runs_only_its_dimensions(repo):
    """The blocking phase of `fastci run`: a test marked with another dimension waits."""
    repo.makeini("[pytest]\nmarkers =\n    convergence: slow\n")
    repo.makepyfile(test_fastci_phase='''
        import pytest


        def test_fast():
            pass


        @pytest.mark.convergence
        def test_slow():
            pass
    ''')
    ids = ["test_fastci_phase.py::test_fast", "test_fastci_phase.py::test_slow"]
    plan = write_plan(repo, ids, ids,
                      dimensions={"names": ["correctness"], "exclude": False})
    result = repo.runpytest_inprocess("--fastci-plan", plan, "-v", "test_fastci_phase.py",
                                      *NOPLUGINS)
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["test_fastci_phase.py::test_fast PASSED*"])
    plan = write_plan(repo, ids, ids, dimensions={"names": ["correctness"], "exclude": True})
    result = repo.runpytest_inprocess("--fastci-plan", plan, "-v", "test_fastci_phase.py",
                                      *NOPLUGINS)
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["test_fastci_phase.py::test_slow PASSED*"])
