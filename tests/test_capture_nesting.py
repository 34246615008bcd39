"""Module calls inside a kept module call are not captured again: the enclosing call's
replay runs them, and saving each nested module (its parameters once more) was most of what
capture cost a recording. Inside a call that could not be kept, or a plain function's call,
nested module calls are captured, so a change to them can still be proved equivalent. Each
rule is tested both ways: an equivalent change to the nested code is pruned through the
right replay, and a change that breaks the test stays selected."""

from __future__ import annotations

import pytest
from conftest import Project

FILES = {
    "net/__init__.py": "",
    "net/layers.py": '''
        import torch
        from torch import nn


        class Inner(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 4))

            def forward(self, x):
                return x * self.weight


        class Outer(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = Inner()

            def forward(self, x):
                return torch.tanh(self.inner(x)) + 1.0


        class Unsaveable(nn.Module):
            """Holds a lambda: torch.save cannot keep it, so its calls are never replayed."""

            def __init__(self):
                super().__init__()
                self.inner = Inner()
                self.activation = lambda t: torch.tanh(t)

            def forward(self, x):
                return self.activation(self.inner(x)) + 1.0


        def through_a_function(x):
            return Outer()(x)
    ''',
    "tests/test_nesting.py": '''
        import torch

        from net.layers import Outer, Unsaveable, through_a_function

        X = torch.linspace(-1.0, 1.0, 8).reshape(2, 4)


        def test_outer():
            expected = torch.tanh(X * torch.linspace(0.5, 1.5, 4)) + 1.0
            assert torch.equal(Outer()(X), expected)


        def test_unsaveable():
            expected = torch.tanh(X * torch.linspace(0.5, 1.5, 4)) + 1.0
            assert torch.equal(Unsaveable()(X), expected)


        def test_through_a_function():
            expected = torch.tanh(X * torch.linspace(0.5, 1.5, 4)) + 1.0
            assert torch.equal(through_a_function(X), expected)
    ''',
}
OUTER = "tests/test_nesting.py::test_outer"
UNSAVEABLE = "tests/test_nesting.py::test_unsaveable"
FUNCTION = "tests/test_nesting.py::test_through_a_function"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return Project.recorded_once(tmp_path_factory.mktemp("base") / "repo", FILES, passed=3)


@pytest.fixture
def net(recorded, tmp_path) -> Project:
    return Project.copied(recorded, tmp_path / "repo")


def test_a_nested_call_is_replayed_through_the_kept_call_around_it(net):
    net.edit("net/layers.py", "return x * self.weight", "return self.weight * x")
    tests = net.decisions()
    assert tests[OUTER]["decision"] == "skipped"
    assert [r["module"] for r in tests[OUTER]["pruned"]["replayed"]] == ["net.layers.Outer"]
    # Outside a kept call, the nested one was captured on its own and is replayed alone.
    assert tests[UNSAVEABLE]["decision"] == "skipped"
    assert [r["module"] for r in tests[UNSAVEABLE]["pruned"]["replayed"]] == \
        ["net.layers.Inner"]
    # Inside a plain function's capture, module calls are captured (such a replay fails
    # more often); the module call is the one replayed.
    assert tests[FUNCTION]["decision"] == "skipped"
    assert [r["module"] for r in tests[FUNCTION]["pruned"]["replayed"]] == ["net.layers.Outer"]


def test_a_nested_change_that_breaks_the_test_stays_selected(net):
    net.edit("net/layers.py", "return x * self.weight", "return x * self.weight * 1.001")
    tests = net.decisions()
    assert tests[OUTER]["decision"] == "selected"
    assert tests[UNSAVEABLE]["decision"] == "selected"
    assert tests[FUNCTION]["decision"] == "selected"
    failed = net.fastci("run", "-q", check=False)
    assert failed.returncode == 1
    assert "3 failed" in failed.stdout, failed.stdout


def test_the_unkept_call_s_own_lines_keep_its_test(net):
    net.edit("net/layers.py", "return self.activation(self.inner(x)) + 1.0",
             "return self.activation(self.inner(x)) + 1.0 + 0.0")
    tests = net.decisions()
    assert tests[UNSAVEABLE]["decision"] == "selected"
    assert "not kept" in net.fastci("explain", "-q", UNSAVEABLE).stdout
