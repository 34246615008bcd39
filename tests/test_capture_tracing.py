"""Module calls made while torch traces or compiles a program are not captured: their
arguments can be proxies (under torch.jit.trace a tensor's shape is made of tensors), and
a replay would not run what the traced program runs. Found on a real suite (einops): such a
capture made the whole recording fail at save time and lose every test's evidence, and
torch.compile(fullgraph=True) failed on the capture wrapper itself, a test that passes
without FastCI failing under it."""

from __future__ import annotations

from conftest import Project

FILES = {
    "net/__init__.py": "",
    "net/layers.py": '''
        import torch
        from torch import nn


        class Flatten(nn.Module):
            def forward(self, x):
                b, c, h, w = x.shape  # tensors while tracing
                return x.reshape(b, c * h * w) * 2.0
    ''',
    "tests/test_layers.py": '''
        import torch

        from net.layers import Flatten


        def test_traced_module_matches_eager():
            m = Flatten()
            x = torch.arange(24.0).reshape(1, 2, 3, 4)
            traced = torch.jit.trace(m, x)
            assert torch.equal(traced(x), m(x))


        def test_compiled_module_matches_eager():
            # fullgraph: dynamo also traces FastCI's Module.__call__ wrapper while recording,
            # and must not meet anything it cannot trace there.
            m = Flatten()
            x = torch.arange(24.0).reshape(1, 2, 3, 4)
            compiled = torch.compile(m, backend="eager", fullgraph=True)
            assert torch.equal(compiled(x), m(x))


        def test_unrelated():
            assert torch.ones(2).sum() == 2
    ''',
}


def test_a_traced_call_is_not_captured_and_the_recording_is_kept(tmp_path):
    project = Project(tmp_path / "repo")
    project.write(FILES)
    project.commit("base")
    proc = project.record()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout
    # The evidence was stored: an unrelated change selects nothing...
    project.edit("tests/test_layers.py", "sum() == 2", "sum() == 2.0")
    assert project.selected() == {"tests/test_layers.py::test_unrelated"}
    project.git("checkout", "--", ".")
    # ...and a change of the traced module's forward selects its test, never pruned: the
    # traced call ran in the test's own context.
    project.edit("net/layers.py", "* 2.0", "* 3.0")
    report = project.select()
    decisions = {t["id"]: t["decision"] for t in report["tests"]}
    assert decisions["tests/test_layers.py::test_traced_module_matches_eager"] == "selected"
    assert decisions["tests/test_layers.py::test_compiled_module_matches_eager"] == "selected"
