"""torch.compile'd code as evidence: dynamo runs a compiled function's bytecode symbolically
and then a graph, so its lines never run where the line recorders could see them, and its
cache lets a later test run it without compiling at all. Each case writes the change that
makes a test fail and asserts the test is still selected (runtime/compiled.py's rule: every
context that entered compiled code is credited with all that was compiled in the session).

One project is recorded once; each case edits it and restores it.
"""

from __future__ import annotations

import pytest
from soundness_world import failing as failed
from soundness_world import recorded_once

pytest.importorskip("torch")

FILES = {
    "pkg/__init__.py": "",
    "pkg/ops.py": '''
        import torch


        def helper(x):
            return x + 1


        def scale(x):
            return helper(x) * 2


        def unrelated(x):
            return x - 1


        class Triple(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 3

            @staticmethod
            def backward(ctx, grad):
                return grad * 3


        def tripled(x):
            return Triple.apply(x)


        def square(x):
            return x * x
    ''',
    "pkg/backend.py": '''
        def plain_backend(gm, example_inputs):
            """A compiler backend: repository code that runs only while dynamo compiles."""
            return gm.forward
    ''',
    "pkg/net.py": '''
        from torch import nn


        class Block(nn.Module):
            def forward(self, x):
                return x.relu() + 1
    ''',
    "pkg/scripted.py": '''
        import torch


        @torch.jit.script
        def clamp01(x):
            return x.clamp(0.0, 1.0)


        def halve(x):
            return x / 2
    ''',
    "tests/test_scripted.py": '''
        import torch

        from pkg.scripted import clamp01, halve


        def test_decorated_at_import():
            assert torch.equal(clamp01(torch.tensor([2.0])), torch.tensor([1.0]))


        def test_scripts():
            assert torch.equal(torch.jit.script(halve)(torch.tensor([2.0])), torch.tensor([1.0]))


        def test_scripts_from_the_cache():
            # TorchScript keeps what it compiled: this call parses nothing.
            assert torch.equal(torch.jit.script(halve)(torch.tensor([2.0])), torch.tensor([1.0]))
    ''',
    "tests/test_compiled.py": '''
        import multiprocessing

        import torch

        from pkg.backend import plain_backend
        from pkg.net import Block
        from pkg.ops import scale, square, tripled, unrelated

        COMPILED = torch.compile(scale, backend="eager", fullgraph=True)  # compiles when called


        def test_a_compiles():
            assert torch.equal(COMPILED(torch.ones(2)), torch.full((2,), 4.0))


        def test_b_hits_the_cache():
            # The same compiled function: dynamo's cache answers, nothing is traced again.
            assert torch.equal(COMPILED(torch.ones(2)), torch.full((2,), 4.0))


        def test_c_compiles_anew_onto_the_code_cache():
            # A new wrapper of the same function: the cache is kept on its code object.
            again = torch.compile(scale, backend="eager", fullgraph=True)
            assert torch.equal(again(torch.ones(2)), torch.full((2,), 4.0))


        def _in_child(queue):
            queue.put(COMPILED(torch.ones(2)).tolist())


        def test_d_a_forked_child_runs_the_parents_compiled_code():
            ctx = multiprocessing.get_context("fork")
            queue = ctx.Queue()
            child = ctx.Process(target=_in_child, args=(queue,))
            child.start()
            assert queue.get(timeout=120) == [4.0, 4.0]
            child.join(timeout=120)
            assert child.exitcode == 0


        def test_e_block_eager_and_compiled():
            block = Block()
            # The eager call (captured for pruning) only sees positive inputs...
            assert torch.equal(block(torch.ones(2)), torch.full((2,), 2.0))
            # ...the compiled one sees negative ones: a replay of the eager call proves nothing.
            compiled = torch.compile(block, backend="eager", fullgraph=True)
            assert torch.equal(compiled(-torch.ones(2)), torch.ones(2))


        def test_f_backward_compiles():
            f = torch.compile(tripled, backend="aot_eager")
            x = torch.ones(2, requires_grad=True)
            f(x).sum().backward()
            assert torch.equal(x.grad, torch.full((2,), 3.0))


        def test_g_backward_hits_the_cache():
            f = torch.compile(tripled, backend="aot_eager")
            x = torch.ones(2, requires_grad=True)
            f(x).sum().backward()
            assert torch.equal(x.grad, torch.full((2,), 3.0))


        def test_h_custom_backend_compiles():
            f = torch.compile(square, backend=plain_backend)
            assert torch.equal(f(torch.full((2,), 3.0)), torch.full((2,), 9.0))


        def test_i_custom_backend_hits_the_cache():
            f = torch.compile(square, backend=plain_backend)
            assert torch.equal(f(torch.full((2,), 3.0)), torch.full((2,), 9.0))


        def test_unrelated_eager():
            assert torch.equal(unrelated(torch.ones(2)), torch.zeros(2))
    ''',
}

T = "tests/test_compiled.py::"
COMPILING = {T + name for name in ("test_a_compiles", "test_b_hits_the_cache",
                                   "test_c_compiles_anew_onto_the_code_cache",
                                   "test_d_a_forked_child_runs_the_parents_compiled_code",
                                   "test_e_block_eager_and_compiled",
                                   "test_f_backward_compiles", "test_g_backward_hits_the_cache",
                                   "test_h_custom_backend_compiles",
                                   "test_i_custom_backend_hits_the_cache")}
S = "tests/test_scripted.py::"
SCRIPTING = {S + name for name in ("test_decorated_at_import", "test_scripts",
                                   "test_scripts_from_the_cache")}
EAGER = T + "test_unrelated_eager"


recorded, repo = recorded_once("compiled", FILES)


@pytest.mark.parametrize("path,old,new,failing", [
    # the compiled function itself, and a function dynamo inlined into it
    ("pkg/ops.py", "return helper(x) * 2", "return helper(x) * 3",
     ("test_a_compiles", "test_b_hits_the_cache", "test_c_compiles_anew_onto_the_code_cache",
      "test_d_a_forked_child_runs_the_parents_compiled_code")),
    ("pkg/ops.py", "return x + 1", "return x + 2", ("test_b_hits_the_cache",)),
    # a compiled module's forward, on inputs only the compiled call saw
    ("pkg/net.py", "x.relu() + 1", "x.abs() + 1", ("test_e_block_eager_and_compiled",)),
    # a backward AOTAutograd traced while compiling: the cache-hit test never runs it
    ("pkg/ops.py", "return grad * 3", "return grad * 4", ("test_g_backward_hits_the_cache",)),
    # a compiler backend: it runs while compiling, never when a later test hits the cache
    ("pkg/backend.py", "return gm.forward", "raise RuntimeError('backend broke')",
     ("test_i_custom_backend_hits_the_cache",)),
    # TorchScript: a function scripted at import, and one scripted again from its cache
    ("pkg/scripted.py", "clamp(0.0, 1.0)", "clamp(0.0, 2.0)", (S + "test_decorated_at_import",)),
    ("pkg/scripted.py", "x / 2", "x / 3", (S + "test_scripts_from_the_cache",)),
], ids=["compiled-function", "inlined-helper", "module-forward", "aot-traced-backward",
        "compile-time-backend", "script-decorator", "script-cache"])
def test_a_change_to_compiled_code_selects_the_tests_that_ran_it(repo, path, old, new,
                                                                    failing):
    repo.edit(path, old, new)
    report = repo.select()
    decisions = {t["id"]: t["decision"] for t in report["tests"]}
    failing = tuple(n if "::" in n else T + n for n in failing)
    for test_id in failing:
        assert decisions[test_id] == "selected", (test_id, report)
    # Every test that entered compiled code depends on all that was compiled or scripted, and
    # every test that scripted on all that was scripted (a superset, never less;
    # tests/test_scripted.py's tests also through the import-time rules, as its collection
    # scripted a function); a test that only ran other code does not.
    expected = COMPILING | SCRIPTING if path == "pkg/scripted.py" else COMPILING
    assert {t for t, d in decisions.items() if d == "selected"} == expected
    assert failing[-1] in failed(repo, failing[-1])  # the change really breaks the test


def test_code_no_compiled_test_ran_selects_only_its_own_tests(repo):
    repo.edit("pkg/ops.py", "return x - 1", "return x - 2")
    assert repo.selected() == {EAGER}
