"""A repository recorded once per test module, restored after each case, and the failures
a real run of its tests finds: what the soundness tests of the exact rules share."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import Project


def recorded_once(name: str, files: dict[str, str], prefix: str = ""):
    """Fixtures `<prefix>recorded` (the repository recorded once for the module) and
    `<prefix>repo` (the same repository for one case, every edit undone afterwards)."""

    @pytest.fixture(scope="module", name=f"{prefix}recorded")
    def recorded(tmp_path_factory) -> Project:
        project = Project(tmp_path_factory.mktemp(name) / "repo")
        project.write(files)
        project.commit()
        project.record()
        return project

    @pytest.fixture(name=f"{prefix}repo")
    def repo(request):
        project = request.getfixturevalue(f"{prefix}recorded")
        yield project
        project.git("checkout", "-q", "--", ".")

    return recorded, repo


def copied_once(files: dict[str, str], passed: int):
    """Fixtures `recorded` (the repository's folder, recorded once for the module, all
    `passed` tests passing) and `lib` (a copy of it, evidence and all, for one test to
    change): pruning writes what it carries into the store, which undoing edits would not
    undo."""

    @pytest.fixture(scope="module", name="recorded")
    def recorded(tmp_path_factory):
        return Project.recorded_once(tmp_path_factory.mktemp("base") / "repo", files, passed)

    @pytest.fixture(name="lib")
    def lib(recorded, tmp_path) -> Project:
        return Project.copied(recorded, tmp_path / "repo")

    return recorded, lib


def failing(project: Project, *paths: str) -> set[str]:
    """The tests (of `paths`, or all) that fail at the working tree: the escape is real."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                           *paths], cwd=project.root, capture_output=True, text=True, timeout=600)
    return {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")}


PACKAGE = {"pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n", "pk/__init__.py": ""}
"""The package every soundness world is: `pk`, installed from the repository's root."""

REGISTRY = '''
    OPTIMIZERS = {}


    def register(name):
        def add(fn):
            OPTIMIZERS[name] = fn
            return fn
        return add
'''
"""A registry a decorator fills as its module is imported (`@register("adam")`)."""


def assert_selects(project: Project, victim: str, unrelated: str, why: str | None = None,
                   *paths: str) -> None:
    """The change in the working tree fails `victim` under plain pytest (run on `paths`, or
    on the victim's file), and FastCI selects it (for a reason naming `why`), while
    `unrelated`, which ran nothing of the change, stays skipped."""
    assert victim in failing(project, *(paths or (victim.split("::")[0],)))
    decisions = project.decisions()
    assert decisions[victim]["decision"] == "selected", decisions[victim]
    if why is not None:
        assert any(why in r for r in decisions[victim]["reasons"]), decisions[victim]["reasons"]
    assert decisions[unrelated]["decision"] == "skipped", decisions[unrelated]
