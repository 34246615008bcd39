"""Items whose code is not a Python function: a doctest's code is its docstring, which block
fingerprints leave out; a --doctest-glob text file and a plugin's YAML item carry their
code in their own file. Each edit below breaks one such item, which FastCI must select,
while items and tests the edit cannot reach stay skipped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastci.runner.engine import Engine

DOCTESTS = {
    "pyproject.toml": '''
        [project]
        name = "pk"
        version = "0"

        [tool.pytest.ini_options]
        addopts = "--doctest-modules --doctest-glob=*.txt"
        testpaths = ["pk", "tests", "docs"]
    ''',
    "pk/__init__.py": "",
    "pk/arith.py": '''
        """Arithmetic.

        >>> 1 + 1
        2
        """


        def double(x):
            """Double it.

            >>> double(2)
            4
            """
            return x * 2


        def halve(x):
            """Halve it.

            >>> halve(4)
            2.0
            """
            return x / 2


        class Box:
            def size(self):
                """
                >>> Box().size()
                3
                """
                return 3
    ''',
    "docs/usage.txt": '''
        >>> from pk.arith import double
        >>> double(3)
        6
    ''',
    "docs/other.txt": '''
        >>> 2 * 2
        4
    ''',
    "tests/conftest.py": '''
        import pytest


        class SumItem(pytest.Item):
            def __init__(self, *, expected, terms, **kwargs):
                super().__init__(**kwargs)
                self.expected, self.terms = expected, terms

            def runtest(self):
                assert sum(self.terms) == self.expected


        class SumFile(pytest.File):
            """A line `name: expected = a + b + ...` is a test (a YAML-style plugin)."""

            def collect(self):
                for line in self.path.read_text().splitlines():
                    name, _, spec = line.partition(":")
                    expected, _, terms = spec.partition("=")
                    yield SumItem.from_parent(
                        self, name=name.strip(), expected=int(expected),
                        terms=[int(t) for t in terms.split("+")])


        def pytest_collect_file(parent, file_path):
            if file_path.suffix == ".sums":
                return SumFile.from_parent(parent, path=file_path)
    ''',
    "tests/a.sums": "small: 3 = 1 + 2\n",
    "tests/b.sums": "large: 30 = 10 + 20\n",
    "tests/test_plain.py": "def test_plain():\n    assert True\n",
}


@pytest.fixture(scope="module")
def doctests(tmp_path_factory):
    from conftest import Project  # noqa: PLC0415

    project = Project(tmp_path_factory.mktemp("doctests") / "repo")
    project.write(DOCTESTS)
    project.commit()
    project.record()
    return project


def failing(project) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rf"], cwd=project.root, capture_output=True, text=True)
    return {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")}


def test_every_item_kind_is_recorded_with_its_code(doctests):
    tests = Engine(doctests.root).plan().snapshot.tests
    assert tests["pk/arith.py::pk.arith.double"].code["object"] == "double"
    assert tests["pk/arith.py::pk.arith.Box.size"].code["object"] == "Box.size"
    assert tests["pk/arith.py::pk.arith"].code["object"] == ""
    assert tests["docs/usage.txt::usage.txt"].code["kind"] == "doctest"
    assert tests["tests/a.sums::small"].code["kind"] == "SumItem"
    assert not tests["tests/test_plain.py::test_plain"].code


@pytest.mark.parametrize("path, old, new, victim, spared", [
    ("pk/arith.py", ">>> double(2)\n    4", ">>> double(2)\n    5",
     "pk/arith.py::pk.arith.double", "pk/arith.py::pk.arith.halve"),
    ("pk/arith.py", ">>> Box().size()\n        3", ">>> Box().size()\n        4",
     "pk/arith.py::pk.arith.Box.size", "pk/arith.py::pk.arith.double"),
    # The module's docstring is also its `__doc__`, which doctest's finder read by string for
    # every item of the file as it was collected: the item of another file is spared.
    ("pk/arith.py", ">>> 1 + 1\n2", ">>> 1 + 1\n3",
     "pk/arith.py::pk.arith", "docs/usage.txt::usage.txt"),
    ("docs/usage.txt", "6", "7", "docs/usage.txt::usage.txt", "docs/other.txt::other.txt"),
    ("tests/a.sums", "3 = 1 + 2", "4 = 1 + 2", "tests/a.sums::small", "tests/b.sums::large"),
])
def test_an_edit_to_an_items_own_code_selects_it(doctests, path, old, new, victim, spared):
    doctests.edit(path, old, new)
    try:
        assert failing(doctests) == {victim}
        decisions = {t["id"]: t for t in doctests.select()["tests"]}
        assert decisions[victim]["decision"] == "selected"
        assert any("own code changed" in r for r in decisions[victim]["reasons"])
        assert decisions[spared]["decision"] == "skipped"
        assert decisions["tests/test_plain.py::test_plain"]["decision"] == "skipped"
    finally:
        doctests.edit(path, new, old)


def test_a_code_edit_beside_a_doctest_leaves_its_docstring_alone(doctests):
    """A body edit selects the doctests that executed it, not the file's other doctests."""
    doctests.edit("pk/arith.py", "return x / 2", "return x / 2.0")
    try:
        selected = doctests.selected()
        assert "pk/arith.py::pk.arith.halve" in selected
        assert "pk/arith.py::pk.arith.double" not in selected
    finally:
        doctests.edit("pk/arith.py", "return x / 2.0", "return x / 2")
