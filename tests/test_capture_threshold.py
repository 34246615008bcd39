"""Capture is paid only where it can pay back: a test whose last run took less than
capture_min_seconds is recorded without capture, since pruning it would save less runner
time than capturing its calls costs on every recording. The first recording, with no
durations on record, captures every test. An uncaptured test stays selected when a change
reaches its calls, and `fastci explain` says why; a slow test is still captured and pruned,
and still selected by a change that breaks it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import Project

FILES = {
    "net/__init__.py": "",
    "net/layers.py": '''
        import torch
        from torch import nn


        class Scale(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 4))

            def forward(self, x):
                return x * self.weight


        class Shift(nn.Module):
            def __init__(self):
                super().__init__()
                self.shift = nn.Parameter(torch.ones(4))

            def forward(self, x):
                return x + self.shift
    ''',
    "tests/test_scale.py": '''
        import time

        import torch

        from net.layers import Scale, Shift

        X = torch.linspace(-1.0, 1.0, 8).reshape(2, 4)
        EXPECTED = X * torch.linspace(0.5, 1.5, 4)


        def test_slow():
            time.sleep(0.8)  # a training step's worth of runner time
            assert torch.equal(Scale()(X), EXPECTED)
            assert torch.equal(Shift()(X), X + 1)


        def test_fast():
            # After the slow test, which pays what a session's first capture costs once
            # (imports): this one takes milliseconds, well under the threshold, even loaded.
            assert torch.equal(Scale()(X), EXPECTED)
    ''',
}
FAST = "tests/test_scale.py::test_fast"
SLOW = "tests/test_scale.py::test_slow"
EQUIVALENT = ("return x * self.weight", "return self.weight * x")


@pytest.fixture
def threshold(monkeypatch):
    monkeypatch.setenv("FASTCI_CAPTURE_MIN_SECONDS", "0.4")  # conftest turns it off


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FASTCI_CAPTURE_MIN_SECONDS", "0.4")
        return Project.recorded_once(tmp_path_factory.mktemp("base") / "repo", FILES,
                                     passed=2)


@pytest.fixture
def net(recorded, tmp_path, threshold) -> Project:
    return Project.copied(recorded, tmp_path / "repo")


def _modules(project: Project, test_id: str) -> dict:
    """The captures part of a test's newest evidence, as the store keeps it."""
    from fastci.runner.store import open_store

    with open_store(project.root / ".fastci" / "evidence.db", create=False) as store:
        head = project.git("rev-parse", "HEAD")
        [(env, _)] = store.snapshot_envs(head)
        return store.load_modules(head, env, [test_id])[test_id]


def test_the_first_recording_captures_every_test(net):
    assert _modules(net, FAST)["captures"] and "uncaptured" not in _modules(net, FAST)
    net.edit("net/layers.py", *EQUIVALENT)
    tests = net.decisions()
    assert tests[FAST]["decision"] == tests[SLOW]["decision"] == "skipped"


def test_a_fast_test_is_recorded_without_capture_once_its_duration_is_known(net):
    net.record()  # the next push: the store now knows how long each test took
    fast = _modules(net, FAST)
    assert fast["captures"] == [] and "capture_min_seconds" in fast["uncaptured"]
    assert _modules(net, SLOW)["captures"]
    net.edit("net/layers.py", *EQUIVALENT)
    tests = net.decisions()
    assert tests[FAST]["decision"] == "selected"
    assert tests[SLOW]["decision"] == "skipped"
    explained = net.fastci("explain", "-q", FAST).stdout
    assert "not captured" in explained and "capture_min_seconds" in explained, explained


def test_a_change_that_breaks_the_slow_test_still_selects_it(net):
    net.record()
    net.edit("net/layers.py", "return x * self.weight", "return x * self.weight * 1.001")
    tests = net.decisions()
    assert tests[FAST]["decision"] == tests[SLOW]["decision"] == "selected"
    failed = net.fastci("run", "-q", check=False)
    assert failed.returncode == 1 and "2 failed" in failed.stdout, failed.stdout


def test_capture_stops_once_a_share_of_the_test_s_last_duration_is_spent(net, monkeypatch):
    """A test's captures may take capture_share of its last run; calls after that run
    uncaptured, and a change they reach keeps the test, with the reason."""
    monkeypatch.setenv("FASTCI_CAPTURE_SHARE", "0.00001")  # 8 µs of 0.8 s: one capture
    net.record()
    slow = _modules(net, SLOW)
    assert len(slow["captures"]) == 1 and "capture_share" in slow["stopped"]
    net.edit("net/layers.py", "return x + self.shift", "return self.shift + x")
    tests = net.decisions()
    assert tests[SLOW]["decision"] == "selected"
    assert "capture stopped" in tests[SLOW]["not_pruned"], tests[SLOW]
    # The same change with no allowance spent: the test's second module call was captured.
    monkeypatch.setenv("FASTCI_CAPTURE_SHARE", "0")
    net.git("stash", "-q")
    net.record()
    net.git("stash", "pop", "-q")
    assert net.decisions()[SLOW]["decision"] == "skipped"


def test_a_threshold_of_zero_captures_every_test(net, monkeypatch):
    monkeypatch.setenv("FASTCI_CAPTURE_MIN_SECONDS", "0")
    net.record()
    assert _modules(net, FAST)["captures"] and "uncaptured" not in _modules(net, FAST)


def _pytest(root, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--rootdir={root}", "--fastci-record", *args], cwd=root,
                          capture_output=True, text=True, timeout=600)


def test_the_app_s_list_decides_on_a_runner_whose_scratch_store_knows_nothing(net, tmp_path):
    """A runner records into an empty scratch store: the selection side's list, from its
    own store, says which tests to record without capture."""
    listed = tmp_path / "uncaptured.json"
    listed.write_text(json.dumps({"below": 0.25, "tests": [SLOW], "allowance": {FAST: 1.0}}))
    out = tmp_path / "recording.json"
    proc = _pytest(net.root, f"--fastci-store={tmp_path / 'scratch.db'}",
                   f"--fastci-out={out}", f"--fastci-uncaptured={listed}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = {t["test_id"]: t for t in json.loads(out.read_text())["tests"]}
    assert tests[SLOW]["modules"]["captures"] == []
    assert "0.25 s" in tests[SLOW]["modules"]["uncaptured"]
    assert tests[FAST]["modules"]["captures"]  # not listed: captured, scratch knows nothing


@pytest.mark.parametrize("content", ["not json", '{"tests": []}', '{"below": "x", "tests": []}',
                                     '[1, 2]'])
def test_a_bad_list_is_a_clear_usage_error(net, tmp_path, content):
    listed = tmp_path / "uncaptured.json"
    listed.write_text(content)
    proc = _pytest(net.root, f"--fastci-store={tmp_path / 'scratch.db'}",
                   f"--fastci-uncaptured={listed}")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "fastci: --fastci-uncaptured" in proc.stderr and "Traceback" not in proc.stderr


def test_the_app_lists_the_fast_tests_from_its_store(net, tmp_path, monkeypatch):
    from fastci.app.shards import uncaptured
    from fastci.runner.engine import Engine

    assert uncaptured(Engine(net.root, tmp_path / "none.db")) is None  # no store yet
    listed = uncaptured(Engine(net.root))
    assert listed == {"below": 0.4, "tests": [FAST], "allowance": {}}  # conftest: share 0
    monkeypatch.setenv("FASTCI_CAPTURE_SHARE", "0.5")
    listed = uncaptured(Engine(net.root), known={SLOW})
    assert listed["tests"] == [] and 0.4 < listed["allowance"][SLOW] < 2.0  # half of ~0.8 s
    monkeypatch.setenv("FASTCI_CAPTURE_MIN_SECONDS", "0")
    monkeypatch.setenv("FASTCI_CAPTURE_SHARE", "0")
    assert uncaptured(Engine(net.root)) is None


def test_the_fingerprints_wait_for_the_first_call_worth_capturing(tmp_path):
    """Capture's fingerprints import Triton through the kernels (0.13 s in each capturing
    process). They are imported at the first call that may be captured, not as capture is
    installed, so a process whose code calls no repository module or function (a child
    running a script from outside the repository, a suite of plain torch tests) never pays."""
    Project.recorded_once(tmp_path / "repo", {
        "calc/__init__.py": "",
        "calc/ops.py": "def double(x):\n    return 2 * x\n",
        "tests/test_order.py": '''
            import sys

            import torch

            from calc.ops import double

            FINGERPRINTS = "fastci.runner.prune.fingerprints"


            def test_torch_alone_imports_no_fingerprints():
                assert torch.ones(2).sum().item() == 2
                assert FINGERPRINTS not in sys.modules and "triton" not in sys.modules


            def test_a_captured_call_imports_them():
                assert double(torch.ones(2)).sum().item() == 4
                assert FINGERPRINTS in sys.modules
        ''',
    }, passed=2)
