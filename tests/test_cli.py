"""The command line: help everywhere, clear errors, documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fastci.runner.errors import EXIT_GIT, EXIT_STORE, EXIT_USAGE


def fastci(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fastci", *args], cwd=cwd, text=True,
                          capture_output=True)


@pytest.mark.parametrize("command", ["", "record", "select", "run", "explain"])
def test_help_everywhere(command):
    proc = fastci(*([command] if command else []), "--help")
    assert proc.returncode == 0
    assert "usage: fastci" in proc.stdout


def test_no_command_prints_help_and_exits_2():
    proc = fastci()
    assert proc.returncode == EXIT_USAGE and "usage: fastci" in proc.stdout


def test_outside_a_repository_is_a_git_error(tmp_path):
    proc = fastci("select", cwd=tmp_path)
    assert proc.returncode == EXIT_GIT
    assert "not inside a git repository" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_revision_is_a_git_error(library):
    proc = library.fastci("select", "--base", "no-such-branch", check=False)
    assert proc.returncode == EXIT_GIT
    assert "unknown revision 'no-such-branch'" in proc.stderr and "Traceback" not in proc.stderr


def test_corrupt_store_is_a_store_error_and_the_file_is_kept(library):
    store = library.root / ".fastci" / "evidence.db"
    for suffix in ("-wal", "-shm"):
        (library.root / ".fastci" / f"evidence.db{suffix}").unlink(missing_ok=True)
    store.write_bytes(b"\x00garbage" * 1000)
    proc = library.fastci("select", check=False)
    assert proc.returncode == EXIT_STORE
    assert "not a FastCI evidence store" in proc.stderr and "Traceback" not in proc.stderr
    assert store.read_bytes().startswith(b"\x00garbage")


def test_unreadable_store_path_is_a_store_error(library, tmp_path):
    proc = library.fastci("select", "--store", str(tmp_path), check=False)
    assert proc.returncode == EXIT_STORE and "not a file" in proc.stderr


def test_explain_unknown_test_suggests_close_ids(library):
    proc = library.fastci("explain", "tests/test_norms.py::test_rmz", check=False)
    assert proc.returncode == EXIT_USAGE
    assert "tests/test_norms.py::test_rms" in proc.stderr


def test_explain_shows_reasons_and_evidence(library):
    library.edit("calc/norms.py", "EPS = 1e-6", "EPS = 1e-3")
    out = library.fastci("explain", "tests/test_norms.py::test_rms").stdout
    assert "SELECTED" in out and "reads EPS" in out
    assert "calc/norms.py: rms" in out


def test_explain_accepts_a_unique_prefix(library):
    out = library.fastci("explain", "tests/test_model.py::test_config").stdout
    assert "tests/test_model.py::test_config_file: skipped" in out
    assert "configs/small.cfg" in out


def test_invalid_configuration_is_a_usage_error(library):
    library.edit("pyproject.toml", "[tool.pytest.ini_options]",
                 "[tool.fastci]\nblocking = 3\nno_such_key = 1\n\n[tool.pytest.ini_options]")
    proc = library.fastci("select", check=False)
    assert proc.returncode == EXIT_USAGE
    assert "no_such_key" in proc.stderr and "Traceback" not in proc.stderr


def test_table_output_names_mode_counts_and_reasons(library):
    library.edit("calc/norms.py", "EPS = 1e-6", "EPS = 1e-3")
    out = library.fastci("select").stdout
    assert "mode trace-diff" in out and "selected 2/8 tests" in out
    assert "reads EPS" in out


@pytest.mark.parametrize("command", ["select", "explain x", "audit", "watchdog --once"])
def test_arguments_after_dashes_are_refused_by_commands_that_run_no_pytest(command, tmp_path):
    proc = fastci(*command.split(), "--", "-k", "x", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert "takes no arguments after `--` (got: -k x)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_arguments_after_dashes_reach_pytest(project):
    project.write({"pkg/__init__.py": "", "tests/test_a.py": "def test_x():\n    pass\n\n"
                   "def test_y():\n    pass\n"})
    project.commit("two tests")
    project.fastci("record", "--", "-k", "test_x")
    out = project.fastci("select", "--format", "json")
    tests = {d["id"]: d for d in json.loads(out.stdout)["tests"]}
    # -k reached pytest: only test_x was recorded, so test_y has no evidence yet
    assert tests["tests/test_a.py::test_y"]["new"] and not tests["tests/test_a.py::test_x"]["new"]
