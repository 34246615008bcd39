"""Pruning what ran in a child process: a test that runs the project's code as a user would
(`python -m net.train`), or as a launcher's rank (RANK set per process), has the child's
module calls captured, and a change that ran only inside them is pruned when their replay
is bit-identical. Each rule is checked against the change that makes the test fail.

One small project is recorded once; each test works on its own copy of the repository.
"""

from __future__ import annotations

import pytest
from conftest import Project

NET = {
    "net/__init__.py": "",
    "net/layers.py": '''
        import os

        import torch
        from torch import nn


        class Scale(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

            def forward(self, x):
                y = x * self.weight
                return y + 1.0


        class Formatter:
            def __init__(self, places):
                self.places = places

            def line(self, loss, shifted):
                return f"{loss:.{self.places}f} {shifted:.1f}\\n"


        class Ranked(nn.Module):
            """Reads its launcher's rank as it runs: a replay must see the same one."""

            def forward(self, x):
                rank = int(os.environ.get("RANK", "0"))
                return x + rank
    ''',
    "net/train.py": '''
        import os
        import sys

        import torch

        from net.layers import Formatter, Ranked, Scale


        def main(out):
            torch.manual_seed(0)
            model = Scale(4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            # Another batch size each step: each call its own signature, captured and
            # replayed (a later call of a captured signature keeps the test: test_prune.py).
            for batch in (8, 6, 4):
                loss = model(torch.randn(batch, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            shifted = Ranked()(torch.zeros(2))
            with open(out, "w") as fh:
                fh.write(Formatter(6).line(loss.item(), shifted.sum().item()))


        if __name__ == "__main__":
            main(sys.argv[1])
    ''',
    "tests/test_train.py": '''
        import os
        import subprocess
        import sys
        from pathlib import Path

        import torch  # noqa: F401 (a suite that uses torch: its calls are captured)

        ROOT = Path(__file__).resolve().parents[1]


        def train(out, **env):
            subprocess.run([sys.executable, "-m", "net.train", str(out)], cwd=ROOT, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT), **env})
            return out.read_text().split()


        def test_training_command(tmp_path):
            loss, shifted = train(tmp_path / "out.txt")
            assert abs(float(loss) - 3.072026) < 1e-4, loss
            assert shifted == "0.0"


        def test_rank_one(tmp_path):
            loss, shifted = train(tmp_path / "out.txt", RANK="1", MASTER_PORT="29511")
            assert shifted == "2.0"
    ''',
}
COMMAND = "tests/test_train.py::test_training_command"
RANK_ONE = "tests/test_train.py::test_rank_one"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return Project.recorded_once(tmp_path_factory.mktemp("base") / "repo", NET, passed=2)


@pytest.fixture
def net(recorded, tmp_path) -> Project:
    return Project.copied(recorded, tmp_path / "repo")


def test_a_change_that_ran_only_in_captured_child_calls_is_pruned(net):
    net.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    tests = net.decisions()
    for test_id in (COMMAND, RANK_ONE):
        assert tests[test_id]["decision"] == "skipped", tests[test_id]
        assert any("Scale" in r and "bit-identical" in r for r in tests[test_id]["reasons"])
    assert not net.fails(COMMAND)


def test_a_child_call_that_computes_otherwise_keeps_its_test(net):
    net.edit("net/layers.py", "return y + 1.0", "return y + 1.5")
    tests = net.decisions()
    assert net.fails(COMMAND)  # the change breaks the test: it must run
    for test_id in (COMMAND, RANK_ONE):
        assert tests[test_id]["decision"] == "selected", tests[test_id]
        assert "differs" in tests[test_id]["not_pruned"]


def test_a_change_outside_any_child_call_keeps_its_test(net):
    net.edit("net/train.py", "for batch in (8, 6, 4):", "for batch in (8, 6, 4, 2):")
    tests = net.decisions()
    assert net.fails(COMMAND)
    assert tests[COMMAND]["decision"] == "selected"
    assert "outside any captured call" in tests[COMMAND]["not_pruned"]


def test_a_rank_s_call_replays_with_that_rank(net):
    """The launcher's variables travel with each call, not in the replay's environment: an
    equivalent change to a call that reads RANK is pruned for rank 1 (its replay saw RANK=1,
    or the old code's replay would not have reproduced 2.0) ..."""
    net.edit("net/layers.py", "return x + rank", "return rank + x")
    tests = net.decisions()
    assert tests[RANK_ONE]["decision"] == "skipped", tests[RANK_ONE]


def test_a_change_only_one_rank_sees_keeps_that_rank_s_test(net):
    """... and a change that only rank 1 computes differently keeps rank 1's test."""
    net.edit("net/layers.py", "return x + rank", "return x + rank * 2")
    tests = net.decisions()
    assert net.fails(RANK_ONE)
    assert tests[RANK_ONE]["decision"] == "selected", tests[RANK_ONE]
    assert "differs" in tests[RANK_ONE]["not_pruned"]
    assert tests[COMMAND]["decision"] == "skipped", tests[COMMAND]  # rank 0: 0 * 2 == 0


def test_a_construction_the_child_program_makes_is_captured_and_pruned(net):
    """`model = Scale(4)` in the program's own function is captured as a test file's call
    is: a change to the constructor that builds the same module is pruned ..."""
    net.edit("net/layers.py", "torch.linspace(0.5, 1.5, dim)",
             "torch.linspace(0.5, 1.5, steps=dim)")
    tests = net.decisions()
    assert tests[COMMAND]["decision"] == "skipped", tests[COMMAND]
    assert any("Scale" in r for r in tests[COMMAND]["reasons"])


def test_a_construction_that_builds_otherwise_keeps_its_test(net):
    """... and one that builds another keeps it."""
    net.edit("net/layers.py", "torch.linspace(0.5, 1.5, dim)", "torch.linspace(0.5, 2.5, dim)")
    tests = net.decisions()
    assert net.fails(COMMAND)
    assert tests[COMMAND]["decision"] == "selected", tests[COMMAND]
    assert "differs" in tests[COMMAND]["not_pruned"]


def test_a_method_the_child_program_calls_is_captured_and_pruned(net):
    """`Formatter(6).line(...)` in the program: the method's call is captured as a test
    file's is, and a change that formats the same text is pruned ..."""
    net.edit("net/layers.py", 'return f"{loss:.{self.places}f} {shifted:.1f}\\n"',
             'return "%.*f %.1f\\n" % (self.places, loss, shifted)')
    tests = net.decisions()
    assert tests[COMMAND]["decision"] == "skipped", tests[COMMAND]
    assert any("line" in r for r in tests[COMMAND]["reasons"]), tests[COMMAND]


def test_a_method_that_returns_otherwise_in_the_child_keeps_its_test(net):
    """... and one that formats otherwise keeps it."""
    net.edit("net/layers.py", 'return f"{loss:.{self.places}f} {shifted:.1f}\\n"',
             'return f"{loss:.{self.places - 4}f} {shifted:.1f}\\n"')
    tests = net.decisions()
    assert net.fails(COMMAND)
    assert tests[COMMAND]["decision"] == "selected", tests[COMMAND]
    assert "line under the new code differs" in tests[COMMAND]["not_pruned"]


def test_with_capture_children_off_a_child_s_code_is_never_pruned(recorded, tmp_path):
    """`capture_children = "off"`: children record lines only (on sys.monitoring where the
    Python has it), and an equivalent change they ran keeps their test, unpruned."""
    project = Project.copied(recorded, tmp_path / "repo")
    project.fastci("record", "-q", "--", "-q", "-p", "no:cacheprovider",
                   env={"FASTCI_CAPTURE_CHILDREN": "off"})
    project.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    tests = project.decisions()
    assert tests[COMMAND]["decision"] == "selected", tests[COMMAND]
    assert tests[COMMAND].get("not_pruned") is None  # no candidate: a child ran it
