"""What a test learns without opening a file or calling a function: a data file's size
(`os.path.getsize` of a token file, to count its tokens), whether a file exists (an override
that takes effect once someone adds it), a folder it looked for (missing, or found and then
emptied), a file it tried to open and did not find, and a method's signature
(`inspect.signature(model.forward)`, to drop the batch columns the model does not take).
None of these runs a changed line or opens a changed file, in the test's process or in a
child it starts, so none leaves line or open evidence. Each case changes only that, so that
its test fails; FastCI must select it, and still skip a test that looked at none of it."""

from __future__ import annotations

import pytest
from soundness_world import PACKAGE, assert_selects, recorded_once

PROBES = {
    **PACKAGE,
    "pk/train.bin": "abcdefgh",
    "pk/assets/vocab.txt": "a b\n",
    "pk/legacy.py": "VERSION = 1\n",
    "pk/data.py": '''
        import os
        from pathlib import Path

        HERE = os.path.dirname(__file__)


        def n_tokens(name="train.bin"):
            return os.path.getsize(os.path.join(HERE, name)) // 2


        def mode():
            return "custom" if Path(HERE, "override.txt").exists() else "default"


        def has_plugins():
            return Path(HERE, "plugins").is_dir()


        def has_assets():
            return os.path.isdir(os.path.join(HERE, "assets"))


        def has_legacy():
            return os.path.isfile(os.path.join(HERE, "legacy.py"))


        def extra():
            try:
                with open(os.path.join(HERE, "extra.txt")) as f:
                    return f.read()
            except FileNotFoundError:
                return ""
    ''',
    "pk/model.py": '''
        class Model:
            def forward(self, tokens, mask=None):
                return tokens
    ''',
    "pk/columns.py": '''
        import inspect


        def accepted(fn, batch):
            names = inspect.signature(fn).parameters
            return {k: v for k, v in batch.items() if k in names}
    ''',
    "tests/test_data.py": '''
        from pk.data import extra, has_assets, has_legacy, has_plugins, mode, n_tokens


        def test_tokens():
            assert n_tokens() == 4


        def test_mode():
            assert mode() == "default"


        def test_plugins():
            assert not has_plugins()


        def test_extra():
            assert extra() == ""


        def test_assets():
            assert has_assets()


        def test_legacy():
            assert has_legacy()
    ''',
    "tests/test_columns.py": '''
        from pk.columns import accepted
        from pk.model import Model


        def test_columns():
            assert accepted(Model().forward, {"tokens": 1, "mask": 2, "id": 3}) == \\
                {"tokens": 1, "mask": 2}
    ''',
    "tests/test_child.py": '''
        import subprocess
        import sys


        def test_child_mode():
            code = "from pk.data import mode; print(mode())"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout
            assert out.strip() == "default"


        def test_child_legacy():
            code = "from pk.data import has_legacy; print(has_legacy())"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout
            assert out.strip() == "True"


        def test_child_assets():
            code = "from pk.data import has_assets; print(has_assets())"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout
            assert out.strip() == "True"
    ''',
    "tests/test_other.py": '''
        def test_other():
            assert 1 + 1 == 2
    ''',
}

recorded, repo = recorded_once("probes", PROBES)


@pytest.fixture
def probes(repo):
    yield repo
    repo.git("reset", "-q")  # files a case removed (restored by `repo`)
    repo.git("clean", "-fdq", "--", "pk")  # files a case added


@pytest.mark.parametrize("change, victim, why", [
    # The token file grew: a stat, never an open.
    (("pk/train.bin", "abcdefgh", "abcdefghij"), "tests/test_data.py::test_tokens",
     "read a changed file"),
    # An override file appears where the code looked for one.
    (("pk/override.txt", None, "on\n"), "tests/test_data.py::test_mode",
     "present now: pk/override.txt"),
    # A folder appears, with a file two levels down.
    (("pk/plugins/fast/a.txt", None, "x\n"), "tests/test_data.py::test_plugins",
     "present now: pk/plugins"),
    # ... and in a child process the test started.
    (("pk/override.txt", None, "on\n"), "tests/test_child.py::test_child_mode",
     "present now: pk/override.txt"),
    (("pk/extra.txt", None, "more\n"), "tests/test_data.py::test_extra",
     "present now: pk/extra.txt"),
    # A folder the test found is gone: its last file removed (new None).
    (("pk/assets/vocab.txt", "a b\n", None), "tests/test_data.py::test_assets",
     "found folders no file is in now: pk/assets/"),
    (("pk/assets/vocab.txt", "a b\n", None), "tests/test_child.py::test_child_assets",
     "found folders no file is in now: pk/assets/"),
    # A Python file the code asked about and never imported or opened (a legacy module
    # kept for old checkpoints): removing it changes no block the test ran.
    (("pk/legacy.py", "VERSION = 1\n", None), "tests/test_data.py::test_legacy",
     "pk/legacy.py"),
    (("pk/legacy.py", "VERSION = 1\n", None), "tests/test_child.py::test_child_legacy",
     "pk/legacy.py"),
    # forward's body is unchanged and the test never calls it.
    (("pk/model.py", "mask=None", "attention_mask=None"), "tests/test_columns.py::test_columns",
     "signature"),
])
def test_a_probe_selects_who_looked(probes, change, victim, why):
    path, old, new = change
    if old is None:
        probes.write({path: new})
    elif new is None:
        probes.git("rm", "-q", path)  # its folder goes with its last file, as in a checkout
    else:
        probes.edit(path, old, new)
    assert_selects(probes, victim, "tests/test_other.py::test_other", why)


def test_a_child_that_never_imported_a_module_is_not_its_reader(probes):
    # coverage.py lists every file under the child's source folder, the ones no one ran
    # with no lines: such a file must not count as run. The child that asked about
    # legacy.py read it; the one that only ran pk.data did not. (A module-level statement
    # no name resolves selects every test that ran the module.)
    probes.edit("pk/legacy.py", "VERSION = 1", "VERSION = 1\nfor _ in ():\n    pass")
    decisions = probes.decisions()
    legacy = decisions["tests/test_child.py::test_child_legacy"]
    assert legacy["decision"] == "selected"
    assert any("read a changed file: pk/legacy.py" in r for r in legacy["reasons"]), legacy
    assert decisions["tests/test_child.py::test_child_mode"]["decision"] == "skipped", \
        decisions["tests/test_child.py::test_child_mode"]
