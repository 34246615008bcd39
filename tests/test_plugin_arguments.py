"""pytest finds its rootdir and configuration before it loads plugins, so a FastCI option's
value given apart (`--fastci-out /elsewhere/run.json`) counts as a test path there once
the file exists (a second run): the rootdir moves above the repository and its
configuration is lost. The plugin says so plainly, rather than failing later on a
conftest that cannot import the package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _repository(root: Path) -> Path:
    files = {
        "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\ntestpaths = ["tests"]\n',
        "pkgx/__init__.py": "VALUE = 3\n",
        "tests/conftest.py": "from pkgx import VALUE  # needs the configuration's pythonpath\n",
        "tests/test_value.py": "from pkgx import VALUE\n\n\ndef test_value():\n"
                               "    assert VALUE == 3\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"],
                   cwd=root, check=True)
    return root


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    # The pytest script, as a developer runs it: its folder, not the repository, starts
    # sys.path, so only the configuration's pythonpath lets the conftest import the package.
    script = Path(sys.executable).parent / "pytest"
    return subprocess.run([str(script), "-q", "-p", "no:cacheprovider", *args], cwd=root,
                          capture_output=True, text=True, timeout=300)


def _record(root: Path, *args: str) -> subprocess.CompletedProcess:
    return _pytest(root, "--fastci-record", *args)


def test_a_value_given_apart_that_moves_the_rootdir_is_a_usage_error(tmp_path):
    root = _repository((tmp_path / "repo"))
    out = tmp_path / "run.json"
    joined = _record(root, f"--fastci-out={out}")
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "1 passed" in joined.stdout and out.exists()
    # Run again: pytest looks for its rootdir among the arguments that exist, which the
    # value now does, so the rootdir would be tmp_path, without the repository's pythonpath.
    out.write_text("the last run's")
    apart = _record(root, "--fastci-out", str(out))
    assert apart.returncode == 4, apart.stdout + apart.stderr
    assert "--fastci-out=VALUE" in apart.stderr and "Traceback" not in apart.stderr
    assert "No module named" not in apart.stdout + apart.stderr
    assert out.read_text() == "the last run's"


def test_a_value_given_apart_inside_the_repository_still_records(tmp_path):
    root = _repository((tmp_path / "repo"))
    done = _record(root, "--fastci-out", "run.json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / "run.json").exists()


def test_a_plan_given_apart_that_moves_the_rootdir_is_a_usage_error(tmp_path):
    root = _repository((tmp_path / "repo"))
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    apart = _pytest(root, "--fastci-plan", str(plan))
    assert apart.returncode == 4, apart.stdout + apart.stderr
    assert "--fastci-plan=VALUE" in apart.stderr and "Traceback" not in apart.stderr
