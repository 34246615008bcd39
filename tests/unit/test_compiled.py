"""compiled.py's pieces: which lines a traced code object stands for, and what happens where
torch's dynamo cannot be hooked (the tests that may have run compiled code are selected on
any change, with the reason). End to end: tests/test_compiled_evidence.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from fastci.runner.record import compiled

SOURCE = textwrap.dedent('''
    def outer(x):
        y = x + 1
        inner = lambda z: z * 2
        return [inner(v) for v in (y,)]
''')


def test_a_traced_code_object_stands_for_its_body_and_the_code_nested_in_it():
    namespace: dict = {}
    exec(compile(SOURCE, "/repo/mod.py", "exec"), namespace)
    out: dict[str, set[int]] = {}
    compiled._add_lines(namespace["outer"].__code__, out, set())
    # The def line belongs to the enclosing block; the lambda's one line is its body.
    assert out == {"/repo/mod.py": {3, 4, 5}}


def _fresh(script: str) -> str:
    """Run `script` in a fresh interpreter (compiled.py's hooks are once per process)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_dynamo_without_its_entry_hook_is_said_and_every_compile_counts_as_an_entry():
    out = _fresh('''
        import types
        from fastci.runner.record import compiled

        entries = []
        compiled.start(lambda kind, origin: entries.append((kind, origin)), lambda s: None)
        assert compiled.unseen() == ""
        compiled.install(types.ModuleType("torch._dynamo"))  # no eval_frame, no callback
        print(compiled.unseen())
        compiled._compiling(True)
        print(entries)
    ''')
    reason, entries = out.splitlines()
    assert reason == "torch.compile ran, and this torch's dynamo entry could not be hooked"
    assert entries == "[('torch.compile', '')]"


def test_scripting_torchs_own_code_is_no_entry_and_the_repositorys_is():
    out = _fresh('''
        import os, tempfile
        import torch
        from fastci.runner.record import compiled

        entries = []
        compiled.start(lambda kind, origin: entries.append((kind, origin)), lambda s: None)
        compiled.install_script(torch.jit)
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "repo_mod.py"), "w") as fh:
            fh.write("def twice(x):\\n    return x * 2\\n")
        import sys; sys.path.insert(0, folder)
        import repo_mod
        torch.jit.script(repo_mod.twice)
        print(entries == [("torch.jit.script", repo_mod.__file__)])
        print(sorted(compiled.traced_lines(compiled.SCRIPT).get(repo_mod.__file__, ())))
        print(torch.jit.script.__name__)
    ''')
    assert out.splitlines() == ["True", "[2]", "script"]

