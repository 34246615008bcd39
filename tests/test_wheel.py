"""FastCI as a wheel installs it (issue 12, item 9): what `fastci demo --app` needs ships
inside the package, so it runs from an empty folder with nothing of the checkout beside it.

The wheel is built from this checkout and installed, without its dependencies (those of the
running interpreter serve), into a folder of its own; a process started in another empty
folder, with that folder first on its path, starts the fake GitHub and answers from its
packaged fixtures, finds tinyllm and the check-run templates. The whole demo from a wheel in
a fresh virtualenv takes minutes (torch alone is a large install): the command is in the
README ("Try it locally").
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

PROBE = r'''
import json, sys
from pathlib import Path

import fastci
from github import Auth, GithubIntegration
from fastci.demo import example_dir, load_changes
from fastci.demo_app import key_pair
from fastci.app import checks
from fastci.testing import FIXTURES
from fastci.testing.fakegithub import FakeGitHub

here = Path(sys.argv[1]).resolve()
assert Path(fastci.__file__).resolve().is_relative_to(here), fastci.__file__
assert FIXTURES.resolve().is_relative_to(here)
private, public = key_pair()
with FakeGitHub() as fake:
    fake.register_app(5, public)
    fake.add_repo("octo/wheel", installation_id=3)
    gi = GithubIntegration(auth=Auth.AppAuth(5, private), base_url=fake.url)
    repo = gi.get_github_for_installation(3).get_repo("octo/wheel")
    assert repo.full_name == "octo/wheel"
    run = repo.create_check_run("FastCI selection", "a" * 40, status="in_progress")
    assert run.name == "FastCI selection"
opened = json.loads((FIXTURES / "payloads" / "pull_request" / "opened.json").read_text())
assert opened["action"] == "opened"
assert "rope_bug" in {c.name for c in load_changes(example_dir())}
assert example_dir().resolve().is_relative_to(here)
print(checks.regressions_output([], shards=1, shards_done=0, done=False).title)
'''


def test_the_demos_parts_come_from_an_installed_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True, timeout=600)
    [wheel] = wheels.glob("fastci-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("fastci/testing/fakegithub.py",
                   "fastci/testing/fixtures/payloads/pull_request/opened.json",
                   "fastci/app/templates/regressions.md.j2",
                   "fastci/examples/tinyllm/pyproject.toml"):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "shared/")) for n in names)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=600)
    empty = tmp_path / "empty"
    empty.mkdir()
    probe = subprocess.run([sys.executable, "-c", PROBE, str(site)], cwd=empty,
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(site)})
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "running: 0/1 shards" in probe.stdout
