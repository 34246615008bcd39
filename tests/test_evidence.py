"""What recording sees beyond lines: torch modules, Triton kernels, files, directories."""

from __future__ import annotations

import importlib.util

import pytest

from fastci.runner.engine import Engine

TORCH_PROJECT = {
    "pyproject.toml": "[project]\nname = 'tm'\nversion = '0'\n",
    "tm/__init__.py": "",
    "tm/layers.py": '''
        import torch
        from torch import nn


        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(torch.ones(dim))

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


        class MLP(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.up = nn.Linear(dim, 2 * dim)
                self.down = nn.Linear(2 * dim, dim)

            def forward(self, x):
                return self.down(torch.relu(self.up(x)))
    ''',
    "tests/test_layers.py": '''
        import torch

        from tm.layers import MLP, RMSNorm


        def test_rmsnorm_unit_rms():
            torch.manual_seed(0)
            y = RMSNorm(8)(torch.randn(4, 8))
            assert torch.allclose(y.pow(2).mean(-1), torch.ones(4), atol=1e-4)


        def test_mlp_shape():
            assert MLP(8)(torch.randn(2, 8)).shape == (2, 8)
    ''',
}


def test_torch_modules_are_traced_per_test(project):
    project.write(TORCH_PROJECT)
    project.commit()
    project.record()
    project.edit("tm/layers.py", "return self.down(torch.relu(self.up(x)))",
                 "return self.down(torch.nn.functional.gelu(self.up(x)))")
    assert project.selected() == {"tests/test_layers.py::test_mlp_shape"}
    planned = Engine(project.root).plan()
    blocks = planned.snapshot.tests["tests/test_layers.py::test_rmsnorm_unit_rms"].blocks
    assert set(blocks["tm/layers.py"]) == {"RMSNorm.__init__", "RMSNorm.forward"}


KERNEL_PROJECT = {
    "pyproject.toml": "[project]\nname = 'kp'\nversion = '0'\n",
    "kp/__init__.py": "",
    "kp/kernels.py": '''
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def _scale(x, factor):
            return x * factor


        @triton.jit
        def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            tl.store(out_ptr + offs, _scale(x, factor), mask=mask)


        @triton.jit
        def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            y = tl.load(y_ptr + offs, mask=mask)
            tl.store(out_ptr + offs, x + y, mask=mask)


        def scale(x, factor):
            out = torch.empty_like(x)
            scale_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), factor, BLOCK=64)
            return out


        def add(x, y):
            out = torch.empty_like(x)
            add_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
            return out
    ''',
    "tests/conftest.py": "import os\nos.environ.setdefault('TRITON_INTERPRET', '1')\n",
    "tests/test_kernels.py": '''
        import torch

        from kp.kernels import add, scale


        def test_scale():
            x = torch.arange(100, dtype=torch.float32)
            assert torch.equal(scale(x, 2.0), x * 2)


        def test_add():
            x = torch.arange(100, dtype=torch.float32)
            assert torch.equal(add(x, x), x * 2)
    ''',
}


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (pip install -e '.[dev]')")
def test_triton_kernel_changes_select_exactly_the_tests_that_launched_them(project):
    project.write(KERNEL_PROJECT)
    project.commit()
    project.record()
    planned = Engine(project.root).plan()
    kernels = planned.snapshot.tests["tests/test_kernels.py::test_scale"].kernels
    assert set(kernels) == {"kp/kernels.py::scale_kernel"}
    # Tracing pauses during an interpreted launch and resumes after it: the lines after the
    # launch, in the launcher and in the test, are still recorded.
    with Engine(project.root).open_store() as store:
        snap = store.load_snapshot(planned.snapshot.commit, planned.snapshot.env_key,
                                   with_lines=True)
    lines = snap.tests["tests/test_kernels.py::test_scale"].lines
    source = (project.root / "kp/kernels.py").read_text().splitlines()
    after_launch = next(i + 1 for i, text in enumerate(source) if "return out" in text)
    assert after_launch in lines["kp/kernels.py"]
    test_source = (project.root / "tests/test_kernels.py").read_text().splitlines()
    assertion = next(i + 1 for i, t in enumerate(test_source) if "scale(x, 2.0), x * 2" in t)
    assert assertion in lines["tests/test_kernels.py"]
    # A jit helper called by one kernel: only the tests launching that kernel.
    project.edit("kp/kernels.py", "return x * factor", "return factor * x")
    result = project.select()
    chosen = {t["id"]: t for t in result["tests"] if t["decision"] == "selected"}
    assert set(chosen) == {"tests/test_kernels.py::test_scale"}
    reasons = chosen["tests/test_kernels.py::test_scale"]["reasons"]
    assert any("kernel" in r or "_scale" in r for r in reasons)


FILES_PROJECT = {
    "pyproject.toml": "[project]\nname = 'fp'\nversion = '0'\n",
    "fp/__init__.py": "",
    "fp/data.py": '''
        import json
        import os


        def load(name):
            with open(os.path.join("data", name)) as fh:
                return json.load(fh)


        def shards():
            return sorted(os.listdir("shards"))


        def overrides():
            return sorted(n for n in os.listdir(".") if n.endswith(".cfg"))
    ''',
    "data/a.json": '{"value": 1}',
    "data/b.json": '{"value": 2}',
    "shards/0.bin": "x",
    "tests/test_data.py": '''
        from fp.data import load, overrides, shards


        def test_a():
            assert load("a.json")["value"] == 1


        def test_b():
            assert load("b.json")["value"] == 2


        def test_shards():
            assert shards()[0] == "0.bin"


        def test_no_overrides():
            assert overrides() == []
    ''',
}


def test_data_files_and_directory_listings_are_evidence(project):
    project.write(FILES_PROJECT)
    project.commit()
    project.record()
    project.write({"data/b.json": '{"value": 3}'})
    assert project.selected() == {"tests/test_data.py::test_b"}
    project.git("checkout", "data/b.json")
    project.write({"shards/1.bin": "y"})  # a new file where a test listed the directory
    assert project.selected() == {"tests/test_data.py::test_shards"}
    (project.root / "shards" / "1.bin").unlink()
    project.write({"local.cfg": "x"})  # ... where a test listed the repository's root
    assert project.selected() == {"tests/test_data.py::test_no_overrides"}
    (project.root / "local.cfg").unlink()
    (project.root / "data" / "a.json").unlink()
    assert project.selected() == {"tests/test_data.py::test_a"}


SPAWN_PROJECT = {
    "pyproject.toml": "[project]\nname = 'sp'\nversion = '0'\n",
    "sp/__init__.py": "",
    "sp/work.py": '''
        def compute():
            return 42


        def other():
            return 1
    ''',
    "tests/test_spawn.py": '''
        import subprocess
        import sys


        def test_child_computes():
            code = "from sp.work import compute; print(compute())"
            out = subprocess.run([sys.executable, "-c", code],
                                 capture_output=True, text=True, check=True)
            assert out.stdout.strip() == "42"


        def test_git_is_not_a_python_child():
            subprocess.run(["git", "--version"], capture_output=True, check=True)


        def test_plain():
            assert True
    ''',
}


def test_tests_that_start_python_children_are_selected_when_code_changes(project):
    project.write(SPAWN_PROJECT)
    project.commit()
    project.record()
    # The child runs compute(); the parent test never executes it, so only the child's own
    # evidence, merged into the test's, can select it.
    project.edit("sp/work.py", "return 42", "return 43")
    result = project.select()
    chosen = {t["id"]: t for t in result["tests"] if t["decision"] == "selected"}
    assert set(chosen) == {"tests/test_spawn.py::test_child_computes"}
    assert chosen["tests/test_spawn.py::test_child_computes"]["reasons"] == [
        "executed changed code: sp/work.py::compute (modified: line 2 changed)"]
    project.git("checkout", "sp/work.py")
    project.edit("sp/work.py", "def other():", "def other():  # a comment only")
    assert project.selected() == set()
