"""Statement-level selection inside a changed function: a test that ran the function along a
path on which nothing changed is skipped; a test whose path meets the change is selected.

One repository is recorded once. Each case edits a function so that a test really fails
(checked by running its test file), asserts that FastCI selects the failing test, and names
the tests that ran the same function along another path: those must be skipped, with a
reason that says so. Each trap of the rule has its case: compound statements (header vs
body, elif, else, except, finally), multi-line statements (an operator line the tracer
never reports), insertions (between, at the start, at the end, in an unexecuted branch),
deletions, a reordering, exceptions that end a body early, and the paths that are not the
test's own context (a session fixture, a captured module call, a child process, import
time). Cases where the lines cannot tell the path (a generator resumed by another test, a
closure made by another test, a cache another test filled) must select every test that ran
the function: an unsound version of the rule fails them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
from conftest import Project
from soundness_world import failing, recorded_once

from fastci.runner import config
from fastci.runner.engine import Engine

REPO = {
    "pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n",
    "pk/__init__.py": "",
    "pk/paths.py": '''
        import subprocess
        import sys

        _CACHE = {}


        def classify(x):
            if x > 0:
                label = "pos"
            elif x < 0:
                label = "neg"
            else:
                label = "zero"
            return label


        def safe_div(a, b):
            try:
                out = a / b
            except ZeroDivisionError:
                out = 0.0
            finally:
                a = None
            return out


        def total(xs):
            acc = 0
            for x in xs:
                acc += x
            return acc


        def offset(a, flag):
            if flag:
                y = (a
                     +
                     1)
                return y
            return a


        def scaled(x, double=False):
            if double:
                x = x * 2
                x = x + 1
            return x


        def checked(x):
            y = x * 2
            if y > 100:
                raise ValueError("too big")
            return y


        def counter():
            start = 1
            yield start
            yield start * 10


        def make_scale(k):
            factor = k * 2
            return lambda x: x * factor


        def lookup(key):
            if key not in _CACHE:
                _CACHE[key] = key * 2
            return _CACHE[key]


        def in_child(x):
            out = subprocess.run([sys.executable, "-c",
                                  f"from pk.paths import classify; print(classify({x}))"],
                                 capture_output=True, text=True, check=True)
            return out.stdout.strip()


        class Hooks:
            def on_step(self, step):
                """Subclasses stop a run here (a call runs no line of this body)."""

            @staticmethod
            def on_end(n):
                """Decorated: the call is reported on the decorator's line."""


        def run(hooks, steps=5):
            n = 0
            for s in range(steps):
                n += 1
                if hooks.on_step(s):
                    break
            return hooks.on_end(n) or n


        GEN = counter()
        SAVED = []
        NEGATIVE = classify(-3)
    ''',
    "tests/conftest.py": '''
        import pytest


        @pytest.fixture(scope="session")
        def positive():
            from pk.paths import classify

            return classify(5)
    ''',
    "tests/test_classify.py": '''
        from pk.paths import classify


        def test_pos():
            assert classify(1) == "pos"


        def test_neg():
            assert classify(-1) == "neg"


        def test_zero():
            assert classify(0) == "zero"


        def test_session_fixture(positive):
            assert positive == "pos"
    ''',
    "tests/test_const.py": '''
        from pk.paths import NEGATIVE


        def test_const():
            assert NEGATIVE == "neg"
    ''',
    "tests/test_paths.py": '''
        import pytest

        from pk.paths import Hooks, checked, offset, run, safe_div, scaled, total


        def test_div():
            assert safe_div(4, 2) == 2


        def test_div_zero():
            assert safe_div(1, 0) == 0.0


        def test_total():
            assert total([1, 2]) == 3


        def test_total_empty():
            assert total([]) == 0


        def test_offset():
            assert offset(1, True) == 2


        def test_no_offset():
            assert offset(1, False) == 1


        def test_single():
            assert scaled(3) == 3


        def test_double():
            assert scaled(3, double=True) == 7


        def test_checked():
            assert checked(1) == 2


        def test_checked_raises():
            with pytest.raises(ValueError):
                checked(1000)


        def test_hooks():
            assert run(Hooks()) == 5
    ''',
    "tests/test_state.py": '''
        import pk.paths as paths


        def test_first_item():
            assert next(paths.GEN) == 1


        def test_second_item():
            assert next(paths.GEN) == 10


        def test_make():
            paths.SAVED.append(paths.make_scale(1))
            assert paths.make_scale(0)(5) == 0


        def test_use_saved():
            assert paths.SAVED[0](3) == 6


        def test_fill():
            assert paths.lookup(3) == 6


        def test_hit():
            assert paths.lookup(3) == 6
    ''',
    "tests/test_child.py": '''
        from pk.paths import in_child


        def test_child():
            assert in_child(-2) == "neg"
    ''',
}


recorded, repo = recorded_once("statements", REPO)
# A captured module call (a context of its own while recording) runs classify for its test.
NET = {
    **REPO,
    "pk/net.py": '''
        import torch

        from pk.paths import classify


        class Net(torch.nn.Module):
            def forward(self, x):
                return x * (2 if classify(int(x.sum())) == "pos" else 3)
    ''',
    "tests/test_net.py": '''
        import torch

        from pk.net import Net


        def test_net():
            assert Net()(torch.ones(2)).tolist() == [2.0, 2.0]
    ''',
}
net_recorded, net_repo = recorded_once("statements-torch", NET, prefix="net_")


def decisions(project: Project, exact: tuple[str, ...] | None = None) -> dict[str, dict]:
    """What `fastci select` decides at the working tree (in-process: the same engine)."""
    settings = config.load(project.root)
    if exact is not None:
        settings = replace(settings, exact=exact)
    selection = Engine(project.root, settings=settings).plan().selection
    return {d.test_id: {"decision": "selected" if d.selected else "skipped",
                        "reasons": list(d.reasons)} for d in selection.decisions}


C, P, S = "tests/test_classify.py", "tests/test_paths.py", "tests/test_state.py"

# (edit: file, old, new; the test that fails and must be selected; tests that ran the same
# function along a path the edit does not touch, which must be skipped)
EXACT = [
    pytest.param("pk/paths.py", 'label = "neg"', 'label = "NEG"', f"{C}::test_neg",
                 [f"{C}::test_pos", f"{C}::test_zero", f"{C}::test_session_fixture"],
                 id="a-branch-body-the-others-never-took"),
    pytest.param("pk/paths.py", "elif x < 0:", "elif x <= 0:", f"{C}::test_zero",
                 [f"{C}::test_pos", f"{C}::test_session_fixture"],
                 id="an-elif-condition-selects-who-evaluated-it"),
    pytest.param("pk/paths.py", "    elif x < 0:", '    elif x == 0:\n        label = "nil"\n'
                 "    elif x < 0:", f"{C}::test_zero", [f"{C}::test_pos"],
                 id="an-elif-added-before-another"),
    pytest.param("pk/paths.py", 'label = "zero"', 'label = "ZERO"', f"{C}::test_zero",
                 [f"{C}::test_pos", f"{C}::test_neg"], id="the-else-branch"),
    pytest.param("pk/paths.py", "out = 0.0", "out = -1.0", f"{P}::test_div_zero",
                 [f"{P}::test_div"], id="an-except-body"),
    pytest.param("pk/paths.py", "except ZeroDivisionError:", "except TypeError:",
                 f"{P}::test_div_zero", [f"{P}::test_div"], id="an-except-clause-never-tried"),
    pytest.param("pk/paths.py", "acc += x", "acc += 2 * x", f"{P}::test_total",
                 [f"{P}::test_total_empty"], id="a-loop-body-never-entered"),
    pytest.param("pk/paths.py", "        acc += x\n", "        acc += x\n        acc += 1\n",
                 f"{P}::test_total", [f"{P}::test_total_empty"],
                 id="inserted-at-the-end-of-a-body"),
    pytest.param("pk/paths.py", "    if x > 0:", "    x = x + 1\n    if x > 0:", f"{C}::test_zero",
                 [], id="inserted-at-the-start-of-the-function"),
    pytest.param("pk/paths.py", " +\n", " -\n", f"{P}::test_offset",
                 [f"{P}::test_no_offset"], id="a-multi-line-statement-on-a-line-never-reported"),
    pytest.param("pk/paths.py", "    if flag:\n", "    if flag:\n        a = a * 5\n",
                 f"{P}::test_offset", [f"{P}::test_no_offset"],
                 id="inserted-in-a-branch-the-other-test-never-took"),
    pytest.param("pk/paths.py", "        x = x * 2\n        x = x + 1\n", "        x = x + 1\n",
                 f"{P}::test_double", [f"{P}::test_single"], id="a-deleted-statement"),
    pytest.param("pk/paths.py", "        x = x * 2\n        x = x + 1\n",
                 "        x = x + 1\n        x = x * 2\n", f"{P}::test_double",
                 [f"{P}::test_single"], id="two-statements-swapped"),
    pytest.param("pk/paths.py", '("too big")\n    return y\n', '("too big")\n    return y + 1\n',
                 f"{P}::test_checked",
                 [f"{P}::test_checked_raises"], id="after-an-exception-ended-the-body"),
    pytest.param("pk/paths.py", 'here (a call runs no line of this body)."""\n',
                 'here (a call runs no line of this body)."""\n        return step >= 2\n',
                 f"{P}::test_hooks", [], id="a-body-that-was-a-docstring-alone"),
    pytest.param("pk/paths.py", 'decorator\'s line."""\n',
                 'decorator\'s line."""\n        return n + 1\n',
                 f"{P}::test_hooks", [], id="a-decorated-body-that-was-a-docstring-alone"),
    pytest.param("pk/paths.py", 'label = "pos"', 'label = "POS"', f"{C}::test_session_fixture",
                 [f"{C}::test_neg", f"{C}::test_zero"], id="run-in-a-session-fixture"),
    pytest.param("pk/paths.py", 'label = "neg"', 'label = "NEG"', "tests/test_const.py::test_const",
                 [f"{C}::test_zero"], id="run-at-import-for-a-name-the-test-reads"),
]


@pytest.mark.parametrize("path, old, new, victim, spared", EXACT)
def test_a_test_that_ran_the_change_runs_and_one_on_another_path_does_not(
        repo, path, old, new, victim, spared):
    repo.edit(path, old, new)
    assert victim in failing(repo, victim.split("::")[0])
    found = decisions(repo)
    assert found[victim]["decision"] == "selected", found[victim]["reasons"]
    for test in spared:
        assert found[test]["decision"] == "skipped", (test, found[test]["reasons"])
        assert "none of their changed statements" in found[test]["reasons"][0], \
            found[test]["reasons"]


def test_the_reason_names_the_changed_statement_line(repo):
    repo.edit("pk/paths.py", 'label = "neg"', 'label = "NEG"')
    found = decisions(repo)
    assert found[f"{C}::test_neg"]["reasons"] == [
        "executed changed code: pk/paths.py::classify (modified: line 11 changed)"]
    assert found[f"{C}::test_pos"]["reasons"] == [
        "it ran changed functions, but none of their changed statements and no statement "
        "beside an insertion: pk/paths.py::classify (line 11 changed); nothing else it "
        "executed or read changed"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_a_module_call_captured_for_pruning_is_part_of_the_tests_path(net_repo):
    """Net.forward calls classify inside a captured module call (a context of its own)."""
    net_repo.edit("pk/paths.py", 'label = "pos"', 'label = "POS"')
    assert "tests/test_net.py::test_net" in failing(net_repo, "tests/test_net.py")
    found = decisions(net_repo)
    assert found["tests/test_net.py::test_net"]["decision"] == "selected"
    assert found[f"{C}::test_neg"]["decision"] == "skipped"


def test_a_function_a_child_process_ran_counts_as_a_whole(repo):
    repo.edit("pk/paths.py", 'label = "neg"', 'label = "NEG"')
    assert "tests/test_child.py::test_child" in failing(repo, "tests/test_child.py")
    found = decisions(repo)["tests/test_child.py::test_child"]
    assert found["decision"] == "selected"
    assert "a child process ran it" in " ".join(found["reasons"]), found["reasons"]


# (edit, the test that fails though it never ran the changed line, why it counts)
WHOLE = [
    pytest.param("start = 1", "start = 2", f"{S}::test_second_item", "generator or coroutine",
                 id="a-generator-resumed-by-another-test"),
    pytest.param("factor = k * 2", "factor = k * 3", f"{S}::test_use_saved",
                 "closure over its locals", id="a-closure-another-test-made"),
    pytest.param("_CACHE[key] = key * 2", "_CACHE[key] = key * 3", f"{S}::test_hit",
                 "writes state that outlives the call", id="a-cache-another-test-filled"),
    pytest.param("def scaled(x, double=False):", "def scaled(x, double=True):",
                 f"{P}::test_single", "signature", id="a-changed-default"),
]


@pytest.mark.parametrize("old, new, victim, why", WHOLE)
def test_what_lines_cannot_tell_selects_every_test_that_ran_the_function(
        repo, old, new, victim, why):
    repo.edit("pk/paths.py", old, new)
    assert victim in failing(repo, victim.split("::")[0])
    found = decisions(repo)[victim]
    assert found["decision"] == "selected"
    assert why in " ".join(found["reasons"]), found["reasons"]


def test_with_the_statement_rule_off_every_test_that_ran_the_function_runs(repo):
    repo.edit("pk/paths.py", 'label = "neg"', 'label = "NEG"')
    found = decisions(repo, exact=("import-time",))
    assert found[f"{C}::test_pos"]["decision"] == "selected"
    assert found[f"{C}::test_pos"]["reasons"] == [
        "executed changed code: pk/paths.py::classify (modified)"]
