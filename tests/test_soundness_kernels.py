"""Triton kernels read module-level values: a global such as `SCALE = 2.0` is baked into
the compiled kernel on a GPU and read at launch under the interpreter, and so are the
values autotune configs and heuristics read. A kernel's hash covers them, so a changed
value selects exactly the tests that launched the kernel."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from fastci.runner.analysis.blocks import parse_blocks
from fastci.runner.analysis.inventory import kernel_hashes

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (pip install -e '.[dev]')")

KERNELS = {
    "pyproject.toml": "[project]\nname = 'kp'\nversion = '0'\n",
    "kp/__init__.py": "",
    "kp/consts.py": "BASE = 2.0\nOTHER = 1\n",
    "kp/kernels.py": '''
        import torch
        import triton
        import triton.language as tl

        from kp.consts import BASE

        SCALE = BASE * 1.0
        SHIFT: tl.constexpr = 0.0
        UNRELATED = "not read by any kernel"


        def _block(args):
            return 64


        @triton.jit
        def _scaled(x):
            return x * SCALE + SHIFT


        @triton.heuristics({"BLOCK": _block})
        @triton.jit
        def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, _scaled(tl.load(x_ptr + offs, mask=mask)), mask=mask)


        @triton.jit
        def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


        def scale(x):
            out = torch.empty_like(x)
            scale_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel())
            return out


        def copy(x):
            out = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
            return out
    ''',
    "tests/conftest.py": "import os\nos.environ.setdefault('TRITON_INTERPRET', '1')\n",
    "tests/test_kernels.py": '''
        import torch

        from kp.kernels import copy, scale


        def test_scale():
            x = torch.arange(100, dtype=torch.float32)
            assert torch.equal(scale(x), x * 2)


        def test_copy():
            x = torch.arange(100, dtype=torch.float32)
            assert torch.equal(copy(x), x)
    ''',
}


def _hash(files: dict[str, str]) -> str:
    import textwrap  # noqa: PLC0415

    inventories = {p: parse_blocks(textwrap.dedent(t), p[:-3].replace("/", "."))
                   for p, t in files.items() if p.endswith(".py")}
    return kernel_hashes(inventories, {"kp/kernels.py::scale_kernel"})[
        "kp/kernels.py::scale_kernel"]


@pytest.mark.parametrize("path, old, new, changes_hash", [
    ("kp/kernels.py", "SCALE = BASE * 1.0", "SCALE = BASE * 1.5", True),  # read by a callee
    ("kp/kernels.py", "SHIFT: tl.constexpr = 0.0", "SHIFT: tl.constexpr = 1.0", True),
    ("kp/consts.py", "BASE = 2.0", "BASE = 3.0", True),  # through an import and SCALE
    ("kp/kernels.py", "return 64", "return 32", True),  # a function a heuristic calls
    ("kp/kernels.py", '"not read by any kernel"', '"still not read"', False),
    ("kp/consts.py", "OTHER = 1", "OTHER = 2", False),
])
def test_a_kernel_hash_covers_the_values_it_reads_and_only_those(path, old, new,
                                                                  changes_hash):
    changed = {**KERNELS, path: KERNELS[path].replace(old, new)}
    assert KERNELS[path] != changed[path]
    assert (_hash(KERNELS) != _hash(changed)) is changes_hash


@needs_triton
def test_a_changed_global_selects_the_tests_that_launched_the_kernel(project):
    project.write(KERNELS)
    project.commit()
    project.record()
    # Read only by the jit helper, whose lines no test records: the kernel hash sees it.
    project.edit("kp/kernels.py", "SCALE = BASE * 1.0", "SCALE = BASE * 1.5")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests"], cwd=project.root, capture_output=True, text=True)
    assert "FAILED tests/test_kernels.py::test_scale" in proc.stdout
    assert "test_copy" not in proc.stdout.split("short test summary")[-1]
    result = project.select()
    decisions = {t["id"]: t for t in result["tests"]}
    assert decisions["tests/test_kernels.py::test_scale"]["decision"] == "selected"
    assert any("module-level value" in r
               for r in decisions["tests/test_kernels.py::test_scale"]["reasons"])
    assert decisions["tests/test_kernels.py::test_copy"]["decision"] == "skipped"
