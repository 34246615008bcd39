"""A function's replay is judged by `exact_digest` of what it returned: equal values must
give equal digests in every process, or no replay could ever prune (a test is kept)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from fastci.runner.prune.fingerprints import exact_digest  # noqa: E402

PROGRAM = """
import torch
from fastci.runner.prune.fingerprints import exact_digest
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
model.register_buffer("scratch", torch.zeros(2), persistent=False)
config = {"names": {"alpha", "beta", "gamma", "delta", "epsilon"}, "ids": frozenset({3, 1, 2}),
          "mixed": {"a", 1, ("t", 2)}}
print(exact_digest(model), exact_digest(config))
"""


def _digests(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, text=True, check=True,
                          capture_output=True).stdout


def test_equal_values_give_one_digest_whatever_the_string_hashes():
    # an nn.Module holds a set of names (its non-persistent buffers), iterated in an order
    # the process's string hashes decide: a recorded model never matched its replay
    assert len({_digests(seed) for seed in ("1", "2", "3", "4")}) == 1


def test_a_set_that_differs_gives_another_digest():
    assert exact_digest({"a", "b"}) != exact_digest({"a", "c"})
    assert exact_digest({"a", "b"}) != exact_digest(frozenset({"a", "b"}))
    assert exact_digest({1, 2}) != exact_digest([1, 2])


def test_a_path_under_the_checkout_digests_alike_wherever_the_checkout_is(monkeypatch):
    """A loaded config keeps `base_dir` (an absolute path): the evidence's code replayed in a
    folder of its own must reproduce what the test computed in its checkout. A path outside
    the checkout, or another file in it, still differs."""
    from pathlib import Path

    from fastci.runner.prune import fingerprints

    monkeypatch.setattr(fingerprints, "_CHECKOUT", ())
    fingerprints.set_checkout("/work/repo")
    recorded = exact_digest({"base_dir": Path("/work/repo/configs"), "name": "/work/repo/a.yaml"})
    fingerprints.set_checkout("/tmp/replay/old", "/work/repo")
    assert exact_digest({"base_dir": Path("/tmp/replay/old/configs"),
                         "name": "/tmp/replay/old/a.yaml"}) == recorded
    assert exact_digest({"base_dir": Path("/tmp/replay/old/data"),
                         "name": "/tmp/replay/old/a.yaml"}) != recorded
    assert exact_digest({"base_dir": Path("/elsewhere/configs"),
                         "name": "/tmp/replay/old/a.yaml"}) != recorded
