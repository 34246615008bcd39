"""Ways a remembered kernel launch could stand in for one that computes otherwise, each
played against `runner/prune/launches.py` with a real Triton kernel under its interpreter:
the first tree's launch is remembered, the second tree changes one thing the key must see
(or the launch reaches memory the key cannot hold), and the second launch must be
interpreted and give what interpreting gives."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
np = pytest.importorskip("numpy")

from fastci.runner.prune.launches import LaunchMemo  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the memo serves Triton's interpreter only")


def _tree(root: Path, files: dict[str, str]):
    """Write a tree and import its modules afresh under the same names as the last tree."""
    tree = root / uuid.uuid4().hex[:8]
    for name, source in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for name in list(sys.modules):
        if name.split(".", 1)[0] in {f.split("/", 1)[0].removesuffix(".py") for f in files}:
            del sys.modules[name]
    sys.path.insert(0, str(tree))
    return tree


def _memo(folder: Path, call):
    memo = LaunchMemo(folder)
    assert memo.install()
    try:
        value = call()
    finally:
        memo.uninstall()
        memo.flush()
    return value, memo


@pytest.fixture
def trees(tmp_path):
    before = list(sys.path)
    yield tmp_path
    sys.path[:] = before


def _old_then_new(trees: Path, old: dict, new: dict, call):
    """Remember the old tree's launch, then launch the new tree's under the memo and
    without it: what the memo gave, how it went, and what interpreting gives."""
    folder = trees / "memo"
    _tree(trees, old)
    _memo(folder, call)
    _tree(trees, new)
    got, memo = _memo(folder, call)
    return got, memo, call()


DICT_KERNEL = """
import torch
import triton
import triton.language as tl
CFG = {{"scale": {scale}}}

@triton.jit
def k(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(x_ptr + offs) * CFG["scale"])

def launch(x):
    o = torch.zeros_like(x)
    k[(1,)](x, o, BLOCK=8)
    return o
"""


def test_a_global_of_a_kind_the_key_cannot_describe_is_never_remembered(trees):
    x = torch.arange(8, dtype=torch.float32)

    def call():
        import lm_dict

        return lm_dict.launch(x)

    got, memo, expected = _old_then_new(trees, {"lm_dict.py": DICT_KERNEL.format(scale=2.0)},
                                        {"lm_dict.py": DICT_KERNEL.format(scale=3.0)}, call)
    assert memo.hits == 0 and torch.equal(got, expected) and torch.equal(got, x * 3)


PACKAGE = {"lm_pkg/__init__.py": "from . import sub\n"}
SUB = """
import triton
import triton.language as tl
FACTOR = {factor}

@triton.jit
def twice(v):
    return v * {factor}

@triton.jit
def scale(v, F: tl.constexpr = FACTOR):
    return v * F
"""
CALLER = """
import collections
import torch
import triton
import triton.language as tl
import lm_pkg
from lm_pkg.sub import scale
P = collections.namedtuple("P", {fields})

@triton.jit
def nested(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, lm_pkg.sub.twice(tl.load(x_ptr + offs)))

@triton.jit
def defaulted(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, scale(tl.load(x_ptr + offs)))

@triton.jit
def fields(p, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(p.a + offs) - tl.load(p.b + offs))

def launch(x, which):
    o = torch.zeros_like(x)
    if which == "nested":
        nested[(1,)](x, o, BLOCK=8)
    elif which == "default":
        defaulted[(1,)](x, o, BLOCK=8)
    else:
        fields[(1,)](P(x, x * 2), o, BLOCK=8)
    return o
"""


@pytest.mark.parametrize("which", ["nested", "default", "namedtuple"])
def test_what_a_kernel_reaches_beyond_its_own_module_is_part_of_the_key(trees, which):
    """A callee two modules deep (`lm_pkg.sub.twice`), a callee's default read from its
    module (`F = FACTOR`), a namedtuple whose fields the new code swapped."""
    x = torch.arange(8, dtype=torch.float32)

    def files(factor, names):
        return {**PACKAGE, "lm_pkg/sub.py": SUB.format(factor=factor),
                "lm_caller.py": CALLER.format(fields=names)}

    def call():
        import lm_caller

        return lm_caller.launch(x, which)

    got, memo, expected = _old_then_new(trees, files(2, '["a", "b"]'),
                                        files(5, '["b", "a"]'), call)
    assert memo.hits == 0, f"the {which} change was served from the memo"
    assert torch.equal(got, expected)


TABLE = """
import triton
import triton.language as tl

@triton.jit
def through_table(table_ptr, BLOCK: tl.constexpr):
    out = tl.load(table_ptr).to(tl.pointer_type(tl.float32))
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(out + offs) + 1.0)

@triton.jit
def copy_on(x_ptr, o_ptr, BLOCK: tl.constexpr):
    for i in range(0, BLOCK):
        tl.store(o_ptr + i, tl.load(x_ptr + i) + 1.0)
"""


def test_a_launch_that_reaches_memory_outside_its_arguments_is_not_remembered(trees):
    """The pointer is loaded from a table (grouped GEMMs): the table's bytes are the same,
    the memory it points to is not the key's, and the second launch must add again."""
    _tree(trees, {"lm_table.py": TABLE})
    import lm_table

    out = torch.zeros(8)
    table = torch.tensor([out.data_ptr()], dtype=torch.int64)

    def twice():
        lm_table.through_table[(1,)](table, BLOCK=8)
        lm_table.through_table[(1,)](table, BLOCK=8)

    _, memo = _memo(trees / "memo", twice)
    assert memo.hits == 0 and torch.equal(out, torch.full((8,), 2.0))
    _, memo = _memo(trees / "memo", twice)
    assert memo.hits == 0 and torch.equal(out, torch.full((8,), 4.0))


def test_distinct_storages_over_one_memory_are_never_remembered(trees):
    """Two `frombuffer` views of one buffer hold the same bytes as two separate tensors,
    but the copy then reads what it wrote."""
    _tree(trees, {"lm_table.py": TABLE})
    import lm_table

    def launch(shared: bool):
        if shared:
            buffer = bytearray(np.arange(12, dtype=np.float32).tobytes())
            x = torch.frombuffer(buffer, dtype=torch.float32, count=8)
            o = torch.frombuffer(buffer, dtype=torch.float32, offset=16, count=8)
        else:
            x = torch.arange(8, dtype=torch.float32)
            o = torch.arange(4, 12, dtype=torch.float32)
        lm_table.copy_on[(1,)](x, o, BLOCK=8)
        return o.clone()

    _memo(trees / "memo", lambda: launch(False))
    got, memo = _memo(trees / "memo", lambda: launch(True))
    assert memo.hits == 0 and torch.equal(got, launch(True))


EXP = """
import triton
import triton.language as tl

@triton.jit
def exp(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.exp(tl.load(x_ptr + offs)))
"""


def test_numpy_error_state_is_part_of_the_key(trees):
    """Under `np.seterr(all="raise")` interpreting an overflow raises: a hit must not
    turn that into a result."""
    _tree(trees, {"lm_exp.py": EXP})
    import lm_exp

    x = torch.full((8,), 100.0)
    with np.errstate(all="ignore"):
        _memo(trees / "memo", lambda: lm_exp.exp[(1,)](x, torch.zeros(8), BLOCK=8))
    with np.errstate(all="raise"), pytest.raises(Exception, match="overflow"):
        _memo(trees / "memo", lambda: lm_exp.exp[(1,)](x, torch.zeros(8), BLOCK=8))


BRANCH = """
import triton
import triton.language as tl

@triton.jit
def never_called(v):
    a = b = v
    return a + b

@triton.jit
def branch(x_ptr, o_ptr, BLOCK: tl.constexpr, USE: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)
    if USE:
        v = never_called(v)
    tl.store(o_ptr + offs, v)
"""


def test_a_hit_rewrites_only_the_jit_functions_the_launch_called(trees):
    """Rewriting a function for the interpreter copies its names into its module (which a
    replay's module globals show); a callee the launch never called stays as it was, and
    one the interpreter cannot rewrite (a chained assignment) does not break the hit."""
    from triton.runtime.interpreter import InterpretedFunction

    x = torch.arange(8, dtype=torch.float32)
    for expect_hits in (0, 1):
        _tree(trees, {"lm_branch.py": BRANCH})
        import lm_branch

        got, memo = _memo(trees / "memo", lambda: lm_branch.branch[(1,)](
            x, o := torch.zeros(8), BLOCK=8, USE=False) or o)
        assert memo.hits == expect_hits and torch.equal(got, x)
        assert lm_branch.never_called.fn not in InterpretedFunction.rewritten_fn
        assert lm_branch.branch.fn in InterpretedFunction.rewritten_fn
