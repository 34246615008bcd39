"""Equivalent-context pruning, end to end: real torch modules recorded by a real pytest run,
replayed in real subprocesses under the old and the new code.

One small project is recorded once; each test works on its own copy of the repository.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import Project

NET = {
    "net/__init__.py": "",
    "net/layers.py": '''
        import torch
        from torch import nn

        SCALE = 2.0
        MODE = {"factor": 1.0}


        def double(x):
            return x * SCALE


        class Scale(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

            def forward(self, x):
                y = x * self.weight
                return y + 1.0


        class Stack(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.a = Scale(dim)
                self.b = Scale(dim)

            def forward(self, x):
                return self.b(torch.tanh(self.a(x)))


        class Gate(nn.Module):
            def forward(self, x):
                if float(x.sum()) > 0:
                    return x * 2.0
                return x * 3.0


        class Flat(nn.Module):
            def forward(self, x):
                return x.view(-1)


        class Split(nn.Module):
            def forward(self, x):
                return x.view(-1), x.sum()


        class Result:
            def __init__(self, flat):
                self.flat = flat


        class Packed(nn.Module):
            def forward(self, x):
                return Result(x.view(-1))


        class Contextual(nn.Module):
            def forward(self, x):
                return x * MODE["factor"]


        class Doubling(nn.Module):
            def forward(self, x):
                return x + x


        class Secretive(nn.Module):
            def forward(self, x):
                import os

                return x * (2.0 if os.environ.get("GITHUB_TOKEN") else 1.0)


        class Tally(nn.Module):
            def forward(self, x):
                return x + 1.0
    ''',
    "tests/test_net.py": '''
        import torch

        import os

        from net.layers import (MODE, Contextual, Doubling, Flat, Gate, Packed, Scale, Secretive,
                                Split, Stack, Tally, double)


        def test_scale(monkeypatch):
            monkeypatch.setenv("NET_MODE", "fast")  # replayed in an environment of its own
            torch.manual_seed(0)
            m = Scale(4)
            x = torch.randn(3, 4, requires_grad=True)
            m(x).sum().backward()
            assert torch.equal(m(torch.zeros(1, 4)), torch.ones(1, 4))


        def test_stack_step():
            torch.manual_seed(0)
            m = Stack(4)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            loss = m(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            assert loss.item() < 10


        def test_stack_trains():
            torch.manual_seed(0)
            m = Stack(4)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(3):
                loss = m(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            assert loss.item() < 10


        def test_stack_trains_long():
            torch.manual_seed(0)
            m = Stack(4)
            opt = torch.optim.SGD(m.parameters(), lr=0.01)
            for _ in range(10):  # past MAX_REPEATS: the last two steps are not captured
                loss = m(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            assert loss.item() < 10


        def test_gate_both_signs():
            g = Gate()
            assert torch.equal(g(torch.ones(2)), torch.full((2,), 2.0))
            assert torch.equal(g(-torch.ones(2)), torch.full((2,), -3.0))


        def test_flat_writes_through():
            x = torch.zeros(2, 2)
            Flat()(x)[0] = 1.0
            assert x[0, 0] == 1.0


        def test_split_writes_through():
            x = torch.zeros(2, 2)
            flat, total = Split()(x)
            flat[0] = 1.0
            assert x[0, 0] == 1.0 and total == 0.0


        def test_packed_writes_through():
            x = torch.zeros(2, 2)
            Packed()(x).flat[0] = 1.0
            assert x[0, 0] == 1.0


        def test_contextual():
            MODE["factor"] = 5.0
            try:
                assert Contextual()(torch.ones(2)).sum() == 10.0
            finally:
                MODE["factor"] = 1.0


        def test_doubling_under_a_mode():
            MODE["factor"] = 5.0
            try:
                assert Doubling()(torch.ones(2)).sum() == 4.0
            finally:
                MODE["factor"] = 1.0


        def test_double_directly():
            assert double(torch.ones(1)).item() == 2.0


        def test_secretive():
            assert Secretive()(torch.ones(2)).shape == (2,)


        def test_tally_leaves_no_trace():
            assert torch.equal(Tally()(torch.zeros(2)), torch.ones(2))
            assert MODE["factor"] == 1.0
            assert not os.path.exists("tally.log")
    ''',
}
SCALE = "tests/test_net.py::test_scale"
STACK = "tests/test_net.py::test_stack_step"
TRAINS = "tests/test_net.py::test_stack_trains"
TRAINS_LONG = "tests/test_net.py::test_stack_trains_long"
GATE = "tests/test_net.py::test_gate_both_signs"
FLAT = "tests/test_net.py::test_flat_writes_through"
SPLIT = "tests/test_net.py::test_split_writes_through"
PACKED = "tests/test_net.py::test_packed_writes_through"
CONTEXT = "tests/test_net.py::test_contextual"
CONTEXT_FREE = "tests/test_net.py::test_doubling_under_a_mode"
SECRETIVE = "tests/test_net.py::test_secretive"
TALLY = "tests/test_net.py::test_tally_leaves_no_trace"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("base") / "repo")
    project.write(NET)
    project.commit("net")
    project.record()
    return project.root


@pytest.fixture
def net(recorded, tmp_path) -> Project:
    return Project.copied(recorded, tmp_path / "repo")


def decisions(project: Project, *args: str) -> dict[str, dict]:
    return {t["id"]: t for t in project.select(*args)["tests"]}


def test_an_equivalent_change_is_pruned_with_its_evidence(net):
    net.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    tests = decisions(net)
    for test_id in (SCALE, STACK, TRAINS):
        assert tests[test_id]["decision"] == "skipped"
        pruned = tests[test_id]["pruned"]
        assert pruned["mode"] == "exact"
        modules = {r["module"] for r in pruned["replayed"]}
        # The outermost kept call is replayed: the Scales inside a Stack run with it.
        assert modules == {"net.layers.Scale" if test_id == SCALE else "net.layers.Stack"}
        for call in pruned["replayed"]:
            assert call["before"] == call["after"]
            assert any(p.startswith("grads") for p in call["before"])
        assert tests[test_id]["reasons"][0].startswith("pruned: ")
    # test_scale's calls were replayed with NET_MODE set, the others' without: two pairs
    # of replay processes.
    # The training step made one Stack call (two Scale calls inside it): the Stack call was
    # replayed, its Scales with it. Three steps, three calls: each was captured, with the
    # weights and the batch of its step, and replayed.
    assert len(tests[STACK]["pruned"]["replayed"]) == 1
    assert len(tests[TRAINS]["pruned"]["replayed"]) == 3
    explained = net.fastci("explain", "-q", SCALE).stdout
    assert "pruning evidence (exact)" in explained and "==" in explained
    assert "!=" not in explained
    # Without pruning, the same change selects both.
    plain = decisions(net, "--no-prune")
    assert plain[SCALE]["decision"] == plain[STACK]["decision"] == "selected"
    assert plain[TRAINS]["decision"] == "selected"


KEPT = {
    # The numbers change: the new-code replay differs, and the test fails.
    "numbers": (SCALE, "return y + 1.0", "return y + 1.5",
                "not pruned: Scale under the new code differs at out", True),
    # The second Gate call, of the first one's shape, ran the other branch: it was captured
    # on its own, and its replay shows the change.
    "a later call's branch": (GATE, "return x * 3.0", "return x * 3.5",
                              "not pruned: Gate under the new code differs at out", True),
    # Ten training steps, one Stack call each: the first eight were captured, the last two
    # (same shapes, other weights and batches) were not, and the eight replays prove nothing
    # about them, equivalent though the change is.
    "steps past the captured ones": (
        TRAINS_LONG, "y = x * self.weight", "y = self.weight * x",
        "in calls that were not captured (calls of a captured signature past the first 8)",
        False),
    # Equal values, but a copy where the test wrote through a view of its input.
    "a copy for a view": (FLAT, "return x.view(-1)", "return x.flatten().clone()",
                          "Flat under the new code differs at out.is", True),
    # The same inside a returned tuple: the tuple is a value, the view in it is not.
    "a copy for a view in a tuple": (
        SPLIT, "return x.view(-1), x.sum()", "return x.flatten().clone(), x.sum()",
        "Split under the new code differs at out.is", True),
    # ... and inside a plain output object.
    "a copy for a view in an output object": (
        PACKED, "return Result(x.view(-1))", "return Result(x.flatten().clone())",
        "Packed under the new code differs at out.is", True),
    # The test set a module global the replay cannot see: the capture's digest of the
    # module's globals differs from what a fresh process imports, so the capture is not the
    # call's whole context.
    "global state": (CONTEXT, 'return x * MODE["factor"]', 'return MODE["factor"] * x',
                     "module state differs from what the test had at the call: net.layers.MODE",
                     False),
    # The same, where only the new code reads the global: the evidence's code reproduces
    # what the test computed (it never read MODE), and a fresh process's MODE makes the new
    # code agree with it; in the test, MODE["factor"] is 5 and the new code fails it.
    "global only the new code reads": (
        CONTEXT_FREE, "return x + x", 'return (x + x) * MODE["factor"]',
        "module state differs from what the test had at the call: net.layers.MODE", True),
    # Equal outputs, but the new forward leaves state behind that the test goes on with: a
    # module global it mutates, a file it writes.
    "a global the new forward writes": (
        TALLY, "return x + 1.0", 'MODE["factor"] = 2.0\n        return x + 1.0',
        "Tally under the new code differs at globals.net.layers.MODE", True),
}


@pytest.mark.parametrize("case", KEPT)
def test_a_test_is_kept_when_pruning_cannot_prove_it_unchanged(net, case):
    test_id, old, new, why, fails = KEPT[case]
    net.edit("net/layers.py", old, new)
    assert decisions(net)[test_id]["decision"] == "selected"
    explained = net.fastci("explain", "-q", test_id).stdout
    assert why in explained, explained
    if fails:
        assert net.fastci("run", "-q", check=False).returncode == 1


def test_a_file_the_new_forward_writes_keeps_its_test(net):
    # The replay runs in the tree's root and writes the file there too: once it exists, the
    # test's own check for it selects the test as well, so the first selection is the one
    # that shows the effect.
    net.edit("net/layers.py", "return x + 1.0",
             'open("tally.log", "w").close()\n        return x + 1.0')
    decision = decisions(net)[TALLY]
    assert decision["decision"] == "selected"
    assert "has an effect a replay cannot compare: wrote 'tally.log'" in \
        decision.get("not_pruned", ""), decision
    assert net.fastci("run", "-q", check=False).returncode == 1


def test_a_view_for_a_view_in_a_tuple_is_pruned(net):
    # reshape of a contiguous tensor is a view of it, as view is: the same object, element by
    # element, so the identity compared above does not keep an equivalent change.
    net.edit("net/layers.py", "return x.view(-1), x.sum()", "return x.reshape(-1), x.sum()")
    assert decisions(net)[SPLIT]["decision"] == "skipped"


def test_a_replay_stops_where_it_can_change_no_decision(net):
    # test_scale needs two Scale calls (two shapes). The numbers change: the first call
    # replayed under the new code differs, which keeps the test whatever the second shows,
    # so the second is not replayed there; the reason names the first.
    # (The equivalent change above, where both calls are replayed and the test pruned, is
    # the other half: nothing a pruning decision needs is ever skipped.)
    net.edit("net/layers.py", "return y + 1.0", "return y + 1.5")
    result = net.select()
    assert {t["id"]: t for t in result["tests"]}[SCALE]["decision"] == "selected"
    assert any("replays skipped, as every test that needed them stayed selected" in n
               for n in result["notes"])
    explained = net.fastci("explain", "-q", SCALE).stdout
    assert "Scale under the new code differs at out" in explained
    assert "not replayed" not in explained
    assert net.fastci("run", "-q", check=False).returncode == 1


def test_an_added_method_is_pruned_unless_it_overrides_an_inherited_one(net):
    net.edit("net/layers.py", "    def forward(self, x):\n        y = x * self.weight",
             "    def describe(self):\n        return 'scale'\n\n"
             "    def forward(self, x):\n        y = x * self.weight")
    tests = decisions(net)
    assert tests[SCALE]["decision"] == "skipped"
    assert tests[SCALE]["pruned"]["classes"][0]["added"] == ["describe"]
    assert "only gained describe, overriding nothing" in \
        net.fastci("explain", "-q", SCALE).stdout

    net.edit("net/layers.py", "    def describe(self):\n        return 'scale'",
             "    def train(self, mode=True):\n        return super().train(False)")
    tests = decisions(net)
    assert tests[SCALE]["decision"] == "selected"
    assert "gained train, overriding an inherited attribute" in \
        net.fastci("explain", "-q", SCALE).stdout


def test_a_pruned_test_keeps_evidence_of_the_code_its_replay_ran(net):
    # A refactor moves the arithmetic into a new helper: pruned. After the run, the head's
    # evidence for the test must include the helper, so that changing it selects the test.
    net.edit("net/layers.py", "        y = x * self.weight\n        return y + 1.0",
             "        return self._affine(x)\n\n"
             "    def _affine(self, x):\n        y = x * self.weight\n        return y + 1.0")
    net.fastci("run", "-q", "--json", "report.json")
    report = json.loads((net.root / "report.json").read_text())
    pruned = {t["id"] for t in report["selection"]["tests"] if t.get("pruned")}
    assert {SCALE, STACK} <= pruned
    ran = {r["test_id"] for r in report["results"]}
    assert SCALE not in ran and STACK not in ran
    net.commit("refactor")
    net.edit("net/layers.py", "        return y + 1.0", "        return y + 0.5")
    tests = decisions(net)
    assert tests[SCALE]["decision"] == "selected"
    assert "Scale._affine" in " ".join(tests[SCALE]["reasons"])


def test_tolerance_mode_prunes_a_rounding_difference_that_exact_mode_keeps(net):
    net.edit("net/layers.py", "y = x * self.weight", "y = x * (self.weight * 3.0) / 3.0")
    exact = decisions(net)
    assert exact[SCALE]["decision"] == "selected"
    tolerant = {t["id"]: t for t in Project.select(
        _with_env(net, FASTCI_PRUNE="tolerance"))["tests"]}
    assert tolerant[SCALE]["decision"] == "skipped"
    assert tolerant[SCALE]["pruned"]["mode"] == "tolerance"


def test_calls_past_the_budget_are_not_replayable(net):
    net.fastci("record", "-q", "--", "-q", "-p", "no:cacheprovider",
               env={"FASTCI_CAPTURE_BUDGET_MB": "0.0001"})
    net.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    tests = decisions(net)
    assert tests[SCALE]["decision"] == "selected"
    assert "over the capture budget" in net.fastci("explain", "-q", SCALE).stdout


def test_replays_past_pruning_time_budget_keep_their_tests(net):
    # The same equivalent change that is pruned above, with no time to replay it: every
    # replay stops before its first call, and the tests stay selected, saying why.
    net.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    hurried = _with_env(net, FASTCI_PRUNE_BUDGET="0.000001")
    result = Project.select(hurried)
    tests = {t["id"]: t for t in result["tests"]}
    assert tests[SCALE]["decision"] == tests[STACK]["decision"] == "selected"
    assert any("stopped at pruning's time limit" in n for n in result["notes"])
    assert "before pruning's time limit ran out" in hurried.fastci("explain", "-q", SCALE).stdout


def test_pruning_off_records_no_captures_and_prunes_nothing(net):
    net.fastci("record", "-q", "--", "-q", "-p", "no:cacheprovider",
               env={"FASTCI_PRUNE": "off"})
    net.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    tests = decisions(net)
    assert tests[SCALE]["decision"] == "selected"
    assert "not pruned" not in net.fastci("explain", "-q", SCALE).stdout


def test_replays_never_see_credentials(net):
    # The replay runs the change's code: it gets the scrubbed environment tests get. Were
    # GITHUB_TOKEN passed on, the old-code replay would not reproduce what the test computed.
    net.edit("net/layers.py", 'return x * (2.0 if os.environ.get("GITHUB_TOKEN") else 1.0)',
             'return (2.0 if os.environ.get("GITHUB_TOKEN") else 1.0) * x')
    tests = {t["id"]: t for t in Project.select(
        _with_env(net, GITHUB_TOKEN="ghs_not_for_replays"))["tests"]}
    assert tests[SECRETIVE]["decision"] == "skipped" and tests[SECRETIVE]["pruned"]


class _with_env(Project):
    """The same repository, its fastci calls made with extra environment variables."""

    def __init__(self, project: Project, **env: str) -> None:
        self.root, self._env = project.root, env

    def fastci(self, *args, check=True, env=None):
        return super().fastci(*args, check=check, env={**self._env, **(env or {})})


@pytest.fixture
def warm(monkeypatch):
    """Warm replays on, with a zygote of this test's own (its own socket folder, a short
    idle time), stopped at teardown whatever happens."""
    import tempfile

    from fastci.runner.prune import zygote

    folder = Path(tempfile.mkdtemp(prefix="fz-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    monkeypatch.setenv("FASTCI_WARM_REPLAYS", "1")
    monkeypatch.setenv("FASTCI_ZYGOTE_IDLE", "60")
    try:
        yield folder
    finally:
        for sock in folder.glob("*/*.sock"):
            zygote.stop(sock)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_recording_starts_the_zygotes_its_next_selection_uses(net, warm):
    """`fastci record` ends by starting, in the background, a zygote per session
    environment its captures hold: the next selection finds them (no other starts)."""
    import time

    net.record()
    deadline = time.monotonic() + 120
    while len(list(warm.glob("*/*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = sorted(p.read_text() for p in warm.glob("*/*.pid"))
    assert len(pids) == 2  # test_scale's replays set NET_MODE: two environments
    net.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    tests = decisions(net)
    assert tests[SCALE]["decision"] == tests[STACK]["decision"] == "skipped"
    assert sorted(p.read_text() for p in warm.glob("*/*.pid")) == pids


def test_warm_replays_decide_what_cold_ones_do_and_reuse_their_zygotes(net, warm):
    from fastci.runner.prune import zygote

    net.edit("net/layers.py", "y = x * self.weight", "y = self.weight * x")
    net.edit("net/layers.py", "return x * 3.0", "return x * 3.5")  # Gate: kept
    cold = decisions(net, "--no-prune")  # nothing replayed: no zygote
    assert not list(warm.glob("*/*.sock"))
    first = decisions(net)
    # A zygote per environment (test_scale's replays set NET_MODE): each served its group.
    pids = sorted(p.read_text() for p in warm.glob("*/*.pid"))
    assert len(pids) == 2
    assert first[SCALE]["decision"] == first[STACK]["decision"] == "skipped"
    assert first[GATE]["decision"] == "selected"
    assert {t for t, d in cold.items() if d["decision"] == "selected"} >= {SCALE, STACK, GATE}
    # Each zygote learned what its children imported lazily (torch's deterministic switch
    # pulls in dynamo), and nothing of the repository: every child imports its own tree.
    for sock in warm.glob("*/*.sock"):
        learned = zygote.warmed(sock)
        assert learned and "torch._dynamo" in learned
        assert not [n for n in learned if n == "net" or n.startswith("net.")]
    # A later change replays again, in the same zygote: the same decisions.
    net.edit("net/layers.py", "return y + 1.0", "return 1.0 + y")
    again = decisions(net)
    assert again[SCALE]["decision"] == again[STACK]["decision"] == "skipped"
    assert again[GATE]["decision"] == "selected"
    assert sorted(p.read_text() for p in warm.glob("*/*.pid")) == pids  # the same zygotes
