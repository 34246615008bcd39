"""Import-time work attributed to the statement that called it: a change to a function that
ran while a test file was imported selects the tests that read what that statement bound
(directly or through names computed from it) and the tests that ran the function, not every
importer; where the statement cannot be resolved to names, every importer still runs.

One repository is recorded once; each case edits it so that a test really fails (checked
by running the suite), selects, and restores it. Each exact case also names a test that
imports the changed module but reads nothing the change reaches: it must be skipped (the
wide rule selected it). Each wide case names the failing test that an unsound narrowing
(binding names where the statement has other effects) would skip.
"""

from __future__ import annotations

import json

import pytest
from soundness_world import failing, recorded_once

from fastci.runner.evidence import ImportCaller, import_origins
from fastci.runner.store import open_store

REPO = {
    "pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n",
    "pk/__init__.py": "",
    "pk/model.py": '''
        _REGISTRY = []


        class Foo:
            def __init__(self, eps=1e-6):
                self.eps = eps

            def scaled(self):
                return self.eps * 2


        def make_table():
            return [1, 2, 3]


        def leaf():
            return 5


        def helper():
            return leaf() * 2


        def registered_value():
            return 7


        def register(value):
            _REGISTRY.append(value)
            return value


        def build():
            value = [40, 2]
            _REGISTRY.append(value[0])
            return value[1]


        def label():
            return "a"


        def tag(name):
            def wrap(fn):
                _REGISTRY.append(name)
                return fn
            return wrap


        def compute():
            return 3


        def registered():
            return list(_REGISTRY)


        def param_values():
            return [1, 2]


        def vendor_hook():
            return 11


        _NAMES = []


        def add_to(items, name):
            items += [name]
            return name


        def names():
            return list(_NAMES)
    ''',
    # A module outside the repository (git-ignored, on sys.path through conftest.py) whose
    # body calls back into the repository: on 3.12+ the call hook is off while it runs.
    ".gitignore": "vendor/\n",
    "conftest.py": '''
        import os
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "vendor"))
    ''',
    "vendor/extlib.py": '''
        import pk.model

        VALUE = pk.model.vendor_hook()
    ''',
    "tests/test_f_vendor.py": '''
        import pk.model  # imported first: no repository module body runs inside extlib's

        import extlib


        def test_vendor_value():
            assert extlib.VALUE == 11
    ''',
    "pk/defaults.py": '''
        from pk.model import Foo, build, compute, helper, label, make_table, param_values, register
        from pk.model import _NAMES, add_to, registered_value, tag

        DEFAULT = Foo()
        TABLE = make_table()
        SCALED = TABLE[0] * 10
        CHAIN = helper()
        register(registered_value())
        BUILT = build()


        @tag(label())
        def handler():
            return 1


        class Holder:
            VALUE = compute()


        VALUES = param_values()
        ALPHA = add_to(_NAMES, "alpha")
    ''',
    # Importing this file first runs pk/defaults.py: the collection that calls everything.
    "tests/test_a_default.py": '''
        from pk.defaults import DEFAULT


        def test_default_eps():
            assert DEFAULT.eps == 1e-6
    ''',
    "tests/test_b_table.py": '''
        from pk.defaults import SCALED, TABLE


        def test_table():
            assert TABLE == [1, 2, 3]


        def test_scaled():
            assert SCALED == 10
    ''',
    "tests/test_c_other.py": '''
        from pk import defaults
        from pk.model import Foo, names, registered


        def test_unrelated():
            assert defaults.__name__ == "pk.defaults"


        def test_builds_its_own():
            assert Foo(eps=0.5).eps == 0.5


        def test_builds_with_the_default():
            assert Foo().scaled() == 2e-6


        def test_registry():
            assert registered() == [7, 40, "a"]


        def test_names():
            assert names() == ["alpha"]
    ''',
    # The module body calls param_values (seen), and so does pytest_generate_tests, which
    # pytest calls while collecting, outside any module body (unseen by the call hook).
    "tests/test_e_params.py": '''
        from pk.model import param_values

        DEFAULTS = param_values()


        def pytest_generate_tests(metafunc):
            if "v" in metafunc.fixturenames:
                metafunc.parametrize("v", param_values(), ids=["a", "b"])


        def test_param(v):
            assert v in (1, 2)
    ''',
    "tests/test_d_chain.py": '''
        from pk.defaults import CHAIN, Holder


        def test_chain():
            assert CHAIN == 10


        def test_holder():
            assert Holder.VALUE == 3
    ''',
}


recorded, repo = recorded_once("import-time", REPO)


def test_the_recording_names_the_statement_that_called_each_import_time_function(recorded):
    with open_store(recorded.root / ".fastci" / "evidence.db", create=False) as store:
        (commit,) = store.commits_with_evidence()
        key, _ = store.snapshot_envs(commit)[0]
        import_time = store.load_snapshot(commit, key).import_time["pk/model.py"]
    callers = {q: import_origins(o) for q, o in import_time.items()}
    files, (default,) = callers["Foo.__init__"]
    assert files == ["tests/test_a_default.py"]
    assert default == ImportCaller("assign", "pk/defaults.py", 4, ("DEFAULT",))
    # The chain: leaf ran under helper, both for the statement that binds CHAIN.
    assert callers["leaf"][1] == callers["helper"][1] == [
        ImportCaller("assign", "pk/defaults.py", 7, ("CHAIN",))]
    assert callers["registered_value"][1] == [ImportCaller("other", "pk/defaults.py", 8, ())]
    assert [c.kind for c in callers["label"][1]] == ["def"]
    assert [c.kind for c in callers["compute"][1]] == ["class"]


# (file, old, new, the test that fails, what its reason says, tests that import the module
# but read nothing the change reaches)
EXACT = [
    pytest.param("pk/model.py", "eps=1e-6", "eps=1e-3", "tests/test_a_default.py::test_default_eps",
                 "reads DEFAULT (bound at import time by pk/defaults.py:4, whose call ran "
                 "pk/model.py::Foo.__init__, which changed)",
                 ["tests/test_c_other.py::test_unrelated", "tests/test_b_table.py::test_table"],
                 id="class-instantiated-at-import"),
    pytest.param("pk/model.py", "return [1, 2, 3]", "return [2, 2, 3]",
                 "tests/test_b_table.py::test_scaled", "test_scaled reads SCALED",
                 ["tests/test_c_other.py::test_unrelated",
                  "tests/test_a_default.py::test_default_eps"],
                 id="bound-value-read-only-through-a-name-computed-from-it"),
    pytest.param("pk/model.py", "return 5", "return 6", "tests/test_d_chain.py::test_chain",
                 "reads CHAIN (bound at import time by pk/defaults.py:7, whose call ran "
                 "pk/model.py::leaf, which changed)",
                 ["tests/test_c_other.py::test_unrelated", "tests/test_d_chain.py::test_holder"],
                 id="chain-statement-calls-g-calls-f"),
]


@pytest.mark.parametrize("path, old, new, victim, why, spared", EXACT)
def test_an_import_time_change_selects_the_readers_of_what_its_statement_bound(
        repo, path, old, new, victim, why, spared):
    repo.edit(path, old, new)
    assert victim in failing(repo, victim.split("::")[0])
    selection = repo.select()
    chosen = {t["id"] for t in selection["tests"] if t["decision"] == "selected"}
    assert victim in chosen
    assert not chosen & set(spared), chosen & set(spared)
    reasons = next(t["reasons"] for t in selection["tests"] if t["id"] == victim)
    assert any(why in r for r in reasons), reasons


def test_a_changed_default_also_selects_the_tests_that_ran_the_method(repo):
    repo.edit("pk/model.py", "eps=1e-6", "eps=1e-3")
    assert "tests/test_c_other.py::test_builds_with_the_default" in failing(
        repo, "tests/test_c_other.py")
    chosen = repo.selected()
    assert {"tests/test_c_other.py::test_builds_with_the_default",
            "tests/test_c_other.py::test_builds_its_own"} <= chosen


# (file, old, new, the failing test an unsound narrowing would skip, why it stays wide)
WIDE = [
    pytest.param("pk/model.py", "return 7", "return 8", "tests/test_c_other.py::test_registry",
                 "is a statement that is not a plain definition", id="unresolvable-caller"),
    pytest.param("pk/model.py", 'return "a"', 'return "b"',
                 "tests/test_c_other.py::test_registry", "is a def or class statement",
                 id="decorator-runs-a-changed-function"),
    pytest.param("pk/model.py", "value = [40, 2]", "value = [41, 2]",
                 "tests/test_c_other.py::test_registry", "writes state that outlives the call",
                 id="a-function-the-statement-ran-writes-a-global"),
    # `items += [name]` extends the caller's list: ALPHA, the name it binds, is not all.
    pytest.param("pk/model.py", "items += [name]", "items += [name.upper()]",
                 "tests/test_c_other.py::test_names", "writes state that outlives the call",
                 id="a-function-the-statement-ran-extends-an-argument-in-place"),
    pytest.param("pk/model.py", "return 3", "return 4", "tests/test_d_chain.py::test_holder",
                 "called from a class body", id="class-body-call"),
    pytest.param("pk/model.py", "return [1, 2]", "return [1, 3]",
                 "tests/test_e_params.py::test_param[b]", "no module-level statement",
                 id="also-called-by-pytest-outside-any-module-body"),
    pytest.param("pk/model.py", "return 11", "return 12",
                 "tests/test_f_vendor.py::test_vendor_value", "no module-level statement",
                 id="called-back-from-a-third-party-module-body"),
]


@pytest.mark.parametrize("path, old, new, victim, why", WIDE)
def test_an_unresolvable_import_time_call_keeps_selecting_every_importer(
        repo, path, old, new, victim, why):
    repo.edit(path, old, new)
    assert victim in failing(repo, victim.split("::")[0])
    selection = repo.select()
    chosen = {t["id"] for t in selection["tests"] if t["decision"] == "selected"}
    assert victim in chosen
    # Wide: every test whose file imports pk/model.py, even one that reads nothing of it.
    assert "tests/test_c_other.py::test_unrelated" in chosen
    reasons = next(t["reasons"] for t in selection["tests"]
                   if t["id"] == "tests/test_c_other.py::test_unrelated")
    assert any("runs at import time for" in r and why in r for r in reasons), reasons


def test_with_the_exact_rule_off_every_importer_runs(repo):
    repo.edit("pk/model.py", "eps=1e-6", "eps=1e-3")
    proc = repo.fastci("select", "-q", "--format", "json", env={"FASTCI_EXACT": "statements"})
    chosen = {t["id"] for t in json.loads(proc.stdout)["tests"] if t["decision"] == "selected"}
    assert "tests/test_c_other.py::test_unrelated" in chosen
