"""Names read by string: frameworks build components from configuration strings
(`getattr(importlib.import_module(module), name)`), which no static read shows. Each way of
reading gets a test: the value it reads changes so that its reader fails, and FastCI must
select the reader while still skipping a test that reads nothing of the module."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastci.runner.engine import Engine

STRINGS = {
    "pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n",
    "pk/__init__.py": "",
    "pk/consts.py": '''
        SCALE = 2
        WIDTH = 4
        DEPTH = 8
        HEIGHT = 16
        SPAN = 32
        UNUSED = 0


        class Layer:
            bias = 1
    ''',
    "pk/registry.py": '''
        SIZE = 3


        def lookup(name):
            return globals()[name]
    ''',
    "pk/meta.py": "__version__ = '1.0'\n",
    # A star import that first imports its module reads it before FastCI could hook it
    # after the import: it is hooked as it is created.
    "pk/starry.py": "__all__ = ['STAR', 'OTHER']\nSTAR = 9\nOTHER = 0\n",
    "pk/facade.py": "from pk.starry import *  # noqa: F403\n",
    # Plugins that register themselves as they are imported by name: a later test gets the
    # module an earlier one imported, and what its body registered.
    "pk/zoo.py": '''
        import importlib

        CONFIGS = {}


        def register(name, **config):
            CONFIGS[name] = config


        def get_config(name):
            importlib.import_module(f"pk.zoo_{name}")
            return CONFIGS[name]
    ''',
    "pk/zoo_tiny.py": 'from pk.zoo import register\n\nregister("tiny", hidden=64)\n',
    "tests/test_zoo.py": '''
        from pk.zoo import get_config


        def test_zoo_first():
            assert get_config("tiny")["hidden"] > 0


        def test_zoo_second():
            assert get_config("tiny")["hidden"] == 64
    ''',
    "tests/test_star.py": '''
        import importlib


        def test_star_import():
            name = "STAR"
            assert getattr(importlib.import_module("pk.facade"), name) == 9
    ''',
    "pk/plugins.py": "LIMIT = 5\nRANK = 7\n",
    # The repository's own `inspect` module: a name, not tooling.
    "pk/inspect.py": '''
        import importlib


        def load(target):
            module, _, name = target.rpartition(".")
            return getattr(importlib.import_module(module), name)
    ''',
    # Imported at collection: the tests below find every module already loaded.
    "tests/test_strings.py": '''
        import importlib
        import inspect
        from importlib.metadata import EntryPoint

        import pk.consts  # noqa: F401
        import pk.meta  # noqa: F401
        import pk.plugins  # noqa: F401
        import pk.registry
        from pk.inspect import load


        def build(target):
            module, _, name = target.rpartition(".")
            return getattr(importlib.import_module(module), name)


        def test_getattr_import_module():
            assert build("pk.consts.SCALE") == 2


        def test_vars():
            assert vars(importlib.import_module("pk.consts"))["WIDTH"] == 4


        def test_module_dict():
            assert importlib.import_module("pk.consts").__dict__["DEPTH"] == 8


        def test_dunder_import():
            assert getattr(__import__("pk.consts", fromlist=["x"]), "HEIGHT") == 16


        def test_globals():
            assert pk.registry.lookup("SIZE") == 3


        def test_class_by_string():
            assert build("pk.consts.Layer")().bias == 1


        def test_getmembers():
            assert dict(inspect.getmembers(importlib.import_module("pk.consts")))["SPAN"] == 32


        def test_entry_point():
            assert EntryPoint(name="limit", value="pk.plugins:LIMIT", group="g").load() == 5


        def test_dunder_by_string():
            assert getattr(importlib.import_module("pk.meta"), "__version__") == "1.0"


        def test_own_inspect_module():
            assert load("pk.plugins.RANK") == 7


        def test_unrelated():
            assert 1 + 1 == 2
    ''',
}

ALL_READERS = {f"tests/test_strings.py::{n}" for n in (
    "test_getattr_import_module", "test_vars", "test_module_dict", "test_dunder_import",
    "test_globals", "test_class_by_string")}


@pytest.fixture(scope="module")
def strings(tmp_path_factory):
    from conftest import Project  # noqa: PLC0415

    # In a folder named like a tool: a word in a path never makes code tooling.
    project = Project(tmp_path_factory.mktemp("strings") / "coverage" / "repo")
    project.write(STRINGS)
    project.commit()
    project.record()
    return project


@pytest.fixture
def repo(strings):
    """The recorded repository for one case: its edits are undone afterwards."""
    yield strings
    strings.git("checkout", "-q", "--", ".")


def failing(project) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rf", "tests"], cwd=project.root, capture_output=True, text=True)
    return {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")}


@pytest.mark.parametrize("path, old, new, reader", [
    ("pk/consts.py", "SCALE = 2", "SCALE = 3", "test_getattr_import_module"),
    ("pk/consts.py", "WIDTH = 4", "WIDTH = 5", "test_vars"),
    ("pk/consts.py", "DEPTH = 8", "DEPTH = 9", "test_module_dict"),
    ("pk/consts.py", "HEIGHT = 16", "HEIGHT = 17", "test_dunder_import"),
    ("pk/registry.py", "SIZE = 3", "SIZE = 4", "test_globals"),
    ("pk/consts.py", "bias = 1", "bias = 2", "test_class_by_string"),
    ("pk/consts.py", "SPAN = 32", "SPAN = 33", "test_getmembers"),
    ("pk/plugins.py", "LIMIT = 5", "LIMIT = 6", "test_entry_point"),
    ("pk/meta.py", "'1.0'", "'1.1'", "test_dunder_by_string"),
    ("pk/plugins.py", "RANK = 7", "RANK = 8", "test_own_inspect_module"),
])
def test_a_name_read_by_string_selects_its_reader(repo, path, old, new, reader):
    repo.edit(path, old, new)
    reader = f"tests/test_strings.py::{reader}"
    assert failing(repo) == {reader}
    result = repo.select()
    decisions = {t["id"]: t for t in result["tests"]}
    assert decisions[reader]["decision"] == "selected"
    assert any("by string" in r or "globals()" in r
               for r in decisions[reader]["reasons"])
    assert decisions["tests/test_strings.py::test_unrelated"]["decision"] == "skipped"


@pytest.mark.parametrize("path, old, new, reader, why", [
    # A star import that first imports the module reads it as its body ends.
    ("pk/starry.py", "STAR = 9", "STAR = 10", "tests/test_star.py::test_star_import",
     "pk/starry.py::STAR"),
    # A plugin a later test gets already imported, with what its body registered.
    ("pk/zoo_tiny.py", "hidden=64", "hidden=128", "tests/test_zoo.py::test_zoo_second",
     "imported by name"),
])
def test_a_module_read_as_it_is_imported_selects_its_reader(repo, path, old, new, reader, why):
    repo.edit(path, old, new)
    assert failing(repo) == {reader}
    decisions = repo.decisions()
    assert decisions[reader]["decision"] == "selected"
    assert any("by string" in r and why in r for r in decisions[reader]["reasons"])
    assert decisions["tests/test_strings.py::test_unrelated"]["decision"] == "skipped"


def test_reads_by_string_are_exact_by_name(repo):
    """Reading SCALE by string does not make a test depend on every value of the module."""
    repo.edit("pk/consts.py", "UNUSED = 0", "UNUSED = 1")
    selected = repo.selected()
    assert "tests/test_strings.py::test_getattr_import_module" not in selected
    assert "tests/test_strings.py::test_dunder_import" not in selected
    # vars() and __dict__ read the whole namespace: any changed value selects them.
    assert {"tests/test_strings.py::test_vars",
            "tests/test_strings.py::test_module_dict"} <= selected


def test_evidence_names_what_was_read_by_string(strings):
    snap = Engine(strings.root).plan().snapshot
    dynamic = snap.tests["tests/test_strings.py::test_getattr_import_module"].dynamic
    assert "SCALE" in dynamic["pk/consts.py"]
    assert "*" in snap.tests["tests/test_strings.py::test_vars"].dynamic["pk/consts.py"]
    assert not snap.tests["tests/test_strings.py::test_unrelated"].dynamic
