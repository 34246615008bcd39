"""Pruning's time budget (`runner/prune/budget.py`): a replay stops when its time is spent,
and a call the budget cut off can never come back as a result, whatever the replayed code
does with the interruption. Each test plays code that would turn a cut-off call into an
answer: one that catches Exception, one that catches everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fastci.runner.prune.budget import OUT_OF_TIME, Deadline, cut_off


def slow(seconds: float = 30.0) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
    return "finished"


def test_no_budget_runs_the_call_to_its_end():
    assert Deadline(None).call(lambda: "answer") == "answer"


def test_a_call_past_the_budget_is_interrupted_and_reports_nothing():
    deadline = Deadline(0.3)
    started = time.monotonic()
    assert deadline.call(slow) is None
    assert deadline.fired and time.monotonic() - started < 5
    assert deadline.call(lambda: "late") is None  # spent: the next call never starts
    assert cut_off(deadline.result()) and OUT_OF_TIME in deadline.result()["error"]


def test_code_that_catches_exception_does_not_see_the_interruption():
    def guarded():
        try:
            return slow()
        except Exception:  # noqa: BLE001 - the replayed code's own handler
            return "default"

    assert Deadline(0.3).call(guarded) is None


def test_code_that_swallows_the_interruption_still_reports_nothing():
    def swallowing():
        try:
            return slow()
        except BaseException:  # noqa: BLE001 - the worst the replayed code can do
            return "default"

    deadline = Deadline(0.3)
    assert deadline.call(swallowing) is None and deadline.fired


def test_a_call_within_the_budget_keeps_its_result_and_the_timer_is_disarmed():
    deadline = Deadline(5.0)
    assert deadline.call(lambda: "quick") == "quick"
    time.sleep(0.05)
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_off_the_main_thread_a_call_is_judged_when_it_ends():
    out = {}

    def run():
        out["value"] = Deadline(0.1).call(slow, 0.3)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert out["value"] is None


CAPTURE = '''
import torch

from net.layers import {cls}

torch.save({{"module": {cls}(), "args": (torch.ones(2),), "kwargs": {{}},
            "rng": torch.get_rng_state(), "cuda_rng": None,
            "settings": {{"grad": True, "threads": 1, "default_dtype": "torch.float32",
                          "deterministic": False, "autocast": []}}}}, "capture.pt")
'''

LAYERS = '''
import time

import torch
from torch import nn


class Slow(nn.Module):
    """Waits (a kernel under Triton's interpreter), catching whatever stops it."""

    def forward(self, x):
        try:
            end = time.monotonic() + 30
            while time.monotonic() < end:
                time.sleep(0.01)
        except BaseException:
            pass
        return x * 2


class Quick(nn.Module):
    def forward(self, x):
        return x * 3
'''


@pytest.mark.parametrize("budget,cls,cut", [(0.5, "Slow", True), (30.0, "Quick", False),
                                            (None, "Quick", False)])
def test_a_replay_process_keeps_to_its_budget(tmp_path, budget, cls, cut):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "__init__.py").write_text("")
    (tmp_path / "net" / "layers.py").write_text(textwrap.dedent(LAYERS))
    subprocess.run([sys.executable, "-c", CAPTURE.format(cls=cls)], cwd=tmp_path, check=True)
    request = {"root": str(tmp_path), "captures": {"d" * 64: str(tmp_path / "capture.pt"),
                                                  "e" * 64: str(tmp_path / "capture.pt")},
               "out": str(tmp_path / "out.json"), "trace": False, "budget": budget}
    (tmp_path / "request.json").write_text(json.dumps(request))
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "fastci.runner.prune.replay",
                    str(tmp_path / "request.json")], cwd=tmp_path, check=True, timeout=120)
    results = json.loads((tmp_path / "out.json").read_text())["captures"]
    assert [cut_off(r) for r in results.values()] == [cut, cut]
    if cut:  # the first call was interrupted, the second never started
        assert time.monotonic() - started < 25
    else:
        assert all(r["error"] is None and r["fingerprints"] for r in results.values())


def test_a_local_deadline_bounds_the_budget_from_the_selection_start():
    from fastci.runner.prune.replay import _budget  # noqa: PLC0415

    now = time.monotonic()
    assert _budget({"budget": 30.0}) == 30.0
    assert _budget({"budget": None}) is None
    assert 0.0 < _budget({"budget": 30.0, "until": now + 1.0}) <= 1.0  # the start-up spent
    assert 0.0 < _budget({"budget": None, "until": now + 1.0}) <= 1.0
    assert _budget({"budget": 30.0, "until": now - 5.0}) == 0.0  # nothing left: cut off
    assert _budget({"budget": 0.5, "until": now + 60.0}) == 0.5
    assert _budget({"budget": 0.5, "until": "soon"}) == 0.5  # not a clock value: ignored
