"""Kernel launches remembered across replays (`runner/prune/launches.py`), on real Triton
kernels under its interpreter: a remembered launch stands in for a launch only when nothing
it depends on differs, and each thing a launch depends on gets a test where only that thing
changes, so a key that left it out would hand back the old result."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fastci.runner.prune.launches import LaunchMemo  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the memo serves Triton's interpreter only")

HELPER = """
import triton
import triton.language as tl

@triton.jit
def twice(v):
    return v * {factor}
"""

KERNEL = """
import triton
import triton.language as tl
import {helper} as helper

SCALE = {scale}

@triton.jit
def scaled(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    prior = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, helper.twice(x) * {body} + prior, mask=mask)


def launch(x, out, block=8):
    n = x.numel()
    scaled[(triton.cdiv(n, block),)](x, out, n, BLOCK=block)
    return out
"""


def _module(folder: Path, name: str, source: str):
    """A fresh module from its own file (the interpreter reads a kernel's source)."""
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _kernels(folder: Path, scale="2.0", body="SCALE", factor="2"):
    """The two modules, imported from a folder of their own under the same names each time:
    the old and the new tree of one repository."""
    tree = folder / uuid.uuid4().hex[:8]
    tree.mkdir()
    helper = _module(tree, "lm_helper", HELPER.format(factor=factor))
    return _module(tree, "lm_kernel", KERNEL.format(helper=helper.__name__, scale=scale,
                                                    body=body))


def _run(memo_folder: Path, kernels, x, out=None, block=8):
    """One replay process's view: a fresh memo over the folder, flushed at its end."""
    memo = LaunchMemo(memo_folder)
    assert memo.install()
    try:
        out = torch.zeros_like(x) if out is None else out
        kernels.launch(x, out, block)
    finally:
        memo.uninstall()
        memo.flush()
    return out, memo


@pytest.fixture
def x():
    return torch.arange(20, dtype=torch.float32)


def test_the_same_launch_again_is_remembered_and_gives_the_same_bytes(tmp_path, x):
    kernels = _kernels(tmp_path)
    first, memo = _run(tmp_path / "memo", kernels, x)
    assert (memo.hits, memo.misses) == (0, 1)
    again, memo = _run(tmp_path / "memo", _kernels(tmp_path), x)  # the same code, anew
    assert (memo.hits, memo.misses) == (1, 0)
    assert torch.equal(again, first) and torch.equal(first, x * 4)


@pytest.mark.parametrize("change", [
    "input bytes", "prior output", "scalar", "constexpr", "global value", "global reassigned",
    "kernel body", "callee body"])
def test_a_launch_that_differs_in_anything_it_reads_is_run_again(tmp_path, x, change):
    memo = tmp_path / "memo"
    _run(memo, _kernels(tmp_path), x)
    kernels = _kernels(tmp_path, scale="3.0" if change == "global value" else "2.0",
                       body="(SCALE + 1.0)" if change == "kernel body" else "SCALE",
                       factor="5" if change == "callee body" else "2")
    if change == "global reassigned":
        kernels.SCALE = 7.0  # as a replayed call could, before it launches
    out = torch.ones_like(x) if change == "prior output" else None
    inputs = x + 1 if change == "input bytes" else x
    if change == "scalar":
        inputs = x[:17].clone()
    block = 4 if change == "constexpr" else 8
    got, used = _run(memo, kernels, inputs, out, block)
    expected = _reference(inputs, out, change)
    assert used.hits == 0, f"a launch whose {change} changed was served from the memo"
    assert torch.equal(got, expected)


def _reference(x, prior, change):
    factor = 5.0 if change == "callee body" else 2.0
    scale = {"global value": 3.0, "kernel body": 3.0, "global reassigned": 7.0}.get(change, 2.0)
    return x * factor * scale + (torch.zeros_like(x) if prior is None else 1.0)


def test_entries_are_written_at_flush_only_and_a_corrupt_one_is_a_miss(tmp_path, x):
    kernels, folder = _kernels(tmp_path), tmp_path / "memo"
    memo = LaunchMemo(folder)
    assert memo.install()
    try:
        kernels.launch(x, torch.zeros_like(x))
        assert not list(folder.glob("*/*")), "an entry written inside a replayed call is an effect"
    finally:
        memo.uninstall()
    assert memo.flush() == 1
    [entry] = [p for p in folder.glob("*/*")]
    entry.write_bytes(b"\x07\x00\x00\x00garbage")
    got, used = _run(folder, kernels, x)
    assert (used.hits, used.misses) == (0, 1) and torch.equal(got, x * 4)


def test_arguments_that_share_a_storage_are_part_of_the_key(tmp_path):
    """Two storages with the same bytes, or one storage both arguments view: a program's
    store then changes what a later program loads."""
    kernels, folder = _kernels(tmp_path), tmp_path / "memo"
    apart = torch.arange(12, dtype=torch.float32)
    _run(folder, kernels, apart[:8], apart.clone()[4:], block=4)
    shared = torch.arange(12, dtype=torch.float32)
    got, used = _run(folder, kernels, shared[:8], shared[4:], block=4)
    expected = torch.arange(12, dtype=torch.float32)
    kernels.launch(expected[:8], expected[4:], 4)  # no memo installed: interpreted
    assert used.hits == 0
    assert torch.equal(got, expected[4:])


def test_a_folder_others_may_write_to_is_not_used(tmp_path, x):
    """Another user could plant entries there: results the replay would take as its own."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not LaunchMemo(shared).install()
    kernels = _kernels(tmp_path)
    private = tmp_path / "private" / "memo"
    got, memo = _run(private, kernels, x)
    assert memo.misses == 1 and oct(private.stat().st_mode & 0o777) == oct(0o700)
    assert torch.equal(got, x * 4)


MIX = """
import triton
import triton.language as tl

@triton.jit
def mix(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=mask) * 2, mask=mask)
    tl.store(b_ptr + offs, tl.load(b_ptr + offs, mask=mask) + 1, mask=mask)


def launch(a, b, c):
    mix[(1,)](a, b, c, a.numel(), BLOCK=8)
"""


def test_which_storage_each_argument_views_is_part_of_the_key(tmp_path):
    """Two storages with equal bytes: the third argument views the first, then the second.
    A key that described each argument's own storage alone would not tell them apart."""
    folder = tmp_path / "memo"

    def launch(third: int):
        tree = tmp_path / uuid.uuid4().hex[:8]
        tree.mkdir()
        kernels = _module(tree, "lm_mix", MIX)
        s1, s2 = torch.arange(8, dtype=torch.float32), torch.arange(8, dtype=torch.float32)
        memo = LaunchMemo(folder)
        assert memo.install()
        try:
            kernels.launch(s1, s2, s1 if third == 1 else s2)
        finally:
            memo.uninstall()
            memo.flush()
        return s1, s2, memo

    launch(third=1)
    s1, s2, memo = launch(third=2)
    assert memo.hits == 0
    base = torch.arange(8, dtype=torch.float32)
    assert torch.equal(s1, base) and torch.equal(s2, base * 2 + 1)


def test_a_launch_under_the_memo_leaves_its_module_as_interpreting_does(tmp_path, x):
    """Rewriting a kernel copies the interpreter's names into its module, and a replay's
    module-state check digests them: the memo's watch must not be among what is copied."""
    from triton.runtime import interpreter

    plain = _kernels(tmp_path)
    plain.launch(x, torch.zeros_like(x))
    watched = _kernels(tmp_path)
    _run(tmp_path / "memo", watched, x)  # a miss: interpreted under the watch
    copied = {n for n in set(vars(interpreter)) & set(vars(plain)) if not n.startswith("__")}
    assert copied and set(vars(watched)) == set(vars(plain))
    assert [n for n in copied if vars(watched)[n] is not vars(plain)[n]] == []
