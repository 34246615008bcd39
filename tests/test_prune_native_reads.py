"""A pruned test's evidence must name the files its new code reads, native readers included.

A pruned test does not run: its evidence is carried forward with what its replays ran under
the new code (`carry.add_replayed`). A replay fingerprints the files a call opened through
Python (`said.files`), so new code that opens a file through `open` differs from the old and
keeps the test. A native reader (the C library, a tokenizer's or a data loader's extension)
raises no audit event: the new code's replay reads the file unseen, computes what the old
code did, and the test is pruned with evidence that never names the file. A later change to
that file then selected nothing, and the test failed.
"""

from __future__ import annotations

import pytest
from conftest import Project

FILES = {
    "net/__init__.py": "",
    "net/scale.txt": "2.0\n",
    "net/layers.py": '''
        from torch import nn


        def factor():
            return 2.0


        class Scale(nn.Module):
            def forward(self, x):
                return x * factor()
    ''',
    "tests/test_net.py": '''
        import torch

        from net.layers import Scale


        def test_scale():
            assert torch.equal(Scale()(torch.ones(2)), torch.full((2,), 2.0))
    ''',
}
TEST = "tests/test_net.py::test_scale"

# The same value, now read from net/scale.txt through the C library's fopen and fread.
NATIVE_FACTOR = '''def factor():
    import ctypes
    import os

    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    name = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.txt")
    stream = libc.fopen(name.encode(), b"r")
    buffer = ctypes.create_string_buffer(64)
    libc.fread(buffer, 1, 63, stream)
    libc.fclose(stream)
    return float(buffer.value.decode())'''


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return Project.recorded_once(tmp_path_factory.mktemp("base") / "repo", FILES, passed=1)


def test_a_file_only_the_new_code_reads_natively_joins_the_pruned_tests_evidence(
        recorded, tmp_path):
    net = Project.copied(recorded, tmp_path / "repo")
    net.edit("net/layers.py", "def factor():\n    return 2.0", NATIVE_FACTOR)
    net.commit("read the factor from a file")
    run = net.fastci("run", "-q")
    assert "1 pruned" in run.stdout or "pruned 1" in run.stdout, run.stdout
    # The factor's file changes: the new code computes otherwise, and the test fails.
    net.write({"net/scale.txt": "3.0\n"})
    net.commit("another factor")
    assert net.fails(TEST)
    decision = net.decisions()[TEST]
    assert decision["decision"] == "selected", decision
    assert any("net/scale.txt" in reason for reason in decision["reasons"]), decision
