"""Pruning with kernel launches remembered (`runner/prune/launches.py`), end to end: a
module whose forward launches a Triton kernel under the interpreter, recorded by a real
pytest run and replayed in real subprocesses. The first selection's replays remember the
kernel's launch; a later change that leaves the kernel's inputs as they were takes it from
there and is pruned, and one that changes them interprets the kernel and keeps its test."""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import Project

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton, under its interpreter")

FILES = {
    "pyproject.toml": "[project]\nname = 'kl'\nversion = '0'\n",
    "kl/__init__.py": "",
    "kl/model.py": '''
        import torch
        import triton
        import triton.language as tl
        from torch import nn


        @triton.jit
        def _square(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            tl.store(out_ptr + offs, x * x, mask=mask)


        def square(x):
            out = torch.zeros_like(x)  # torch.empty's bytes are whatever memory held
            _square[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
            return out


        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(torch.full((8,), 0.5))

            def forward(self, x):
                y = x * self.scale
                y = y + 0.0
                return square(y.detach().contiguous())
    ''',
    "tests/conftest.py": '''
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    ''',
    "tests/test_model.py": '''
        import torch

        from kl.model import Head


        def test_head():
            out = Head()(torch.arange(8, dtype=torch.float32))
            assert out.shape == (8,)
    ''',
}
TEST = "tests/test_model.py::test_head"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    monkeypatch.setenv("FASTCI_LAUNCH_CACHE", str(tmp_path / "launches"))
    project = Project(tmp_path / "repo")
    project.write(FILES)
    project.commit("kernel model")
    project.record()
    return project


def _notes(selection: dict) -> str:
    return " ".join(selection.get("notes", []))


def test_a_remembered_launch_serves_an_equivalent_change_and_not_a_different_one(project):
    project.edit("kl/model.py", "y = y + 0.0", "y = y + 0")  # the same float32 values
    first = project.select()
    assert {t["id"]: t["decision"] for t in first["tests"]}[TEST] == "skipped", first
    entries = list((project.root.parent / "launches").glob("*/*"))
    assert entries, "the replays remembered no launch"

    project.edit("kl/model.py", "y = y + 0", "y = y - 0.0")  # equivalent again, new tree
    second = project.select()
    assert {t["id"]: t["decision"] for t in second["tests"]}[TEST] == "skipped", second
    assert "kernel launches taken from earlier replays" in _notes(second), _notes(second)

    # The kernel's input changes: the launch cannot be taken from the memo, and the
    # interpreted square differs, so the test stays selected, though the old replay's
    # launch is remembered.
    project.edit("kl/model.py", "y = y - 0.0", "y = y + 1.0")
    third = {t["id"]: t for t in project.select()["tests"]}
    assert third[TEST]["decision"] == "selected"
    assert "Head under the new code differs at out" in project.fastci("explain", "-q",
                                                                       TEST).stdout
