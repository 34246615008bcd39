"""Lines a test runs where the line tracer cannot see them. A profiling helper that
installs its own tracer and ends with `sys.settrace(None)` leaves coverage.py's tracer
gone, for the rest of its test and for every later test (in a child process, for the rest
of the child); a thread started with `_thread` rather than `threading` never gets one, nor
does one native code starts (a custom autograd Function's backward there is given one).
Each case changes a function only the unseen code ran, so that its test fails; FastCI must
select it (on Python 3.12+, where FastCI records with sys.monitoring, the lines are simply
seen), and still skip a test that ran nothing of it."""

from __future__ import annotations

import pytest
from soundness_world import PACKAGE, assert_selects, recorded_once

UNSEEN = {
    **PACKAGE,
    "pk/calc.py": '''
        def double(x):
            return x * 2


        def triple(x):
            return x * 3


        def half(x):
            return x / 2
    ''',
    "pk/prof.py": '''
        import sys


        def count_calls(fn, *args):
            calls = []

            def tracer(frame, event, arg):
                if event == "call":
                    calls.append(frame.f_code.co_name)

            sys.settrace(tracer)
            try:
                fn(*args)
            finally:
                sys.settrace(None)
            return len(calls)
    ''',
    "pk/bg.py": '''
        import _thread


        def run_in_thread(fn, *args):
            done = _thread.allocate_lock()
            done.acquire()
            out = []

            def body():
                out.append(fn(*args))
                done.release()

            _thread.start_new_thread(body, ())
            done.acquire()
            return out[0]
    ''',
    "pk/child.py": '''
        import subprocess
        import sys


        def python(code):
            """What a Python child running `code` printed."""
            return subprocess.run([sys.executable, "-c", code], capture_output=True,
                                  text=True, check=True).stdout.strip()
    ''',
    "tests/test_a_prof.py": '''
        from pk.calc import half, triple
        from pk.prof import count_calls


        def test_profiled_then_triple():
            assert count_calls(half, 4) >= 1
            assert triple(2) == 6
    ''',
    "tests/test_b_calc.py": '''
        from pk.calc import double


        def test_double():
            assert double(3) == 6
    ''',
    "tests/test_c_bg.py": '''
        from pk.bg import run_in_thread
        from pk.calc import half


        def test_half_in_thread():
            assert run_in_thread(half, 8) == 4
    ''',
    "tests/test_e_child.py": '''
        from pk.child import python

        CODE = ("from pk.calc import half, triple; from pk.prof import count_calls; "
                "count_calls(half, 4); print(triple(2))")


        def test_child_profiles_then_triples():
            assert python(CODE) == "6"
    ''',
    "tests/test_f_fork.py": '''
        from pk.child import python

        # A fork of a child (a data-loading helper's worker, say) that profiles, then
        # triples: the fork records with a tracer of its own, which the helper removes.
        CODE = ("import os; from pk.calc import half, triple; from pk.prof import count_calls\\n"
                "r, w = os.pipe()\\n"
                "pid = os.fork()\\n"
                "if pid == 0:\\n"
                "    count_calls(half, 4); os.write(w, str(triple(2)).encode()); os._exit(0)\\n"
                "os.close(w); print(os.read(r, 10).decode()); os.waitpid(pid, 0)\\n")


        def test_fork_of_child_profiles_then_triples():
            assert python(CODE) == "6"
    ''',
    "pk/grad.py": '''
        import torch


        class Square(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return 2 * x * grad
    ''',
    "pk/native.py": '''
        import ctypes


        def run_on_native_thread(fn):
            """fn on a thread C code started, as the autograd engine starts its device
            threads on a GPU: `threading` never sees it, nor gives it a tracer."""
            out = []
            callback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
                lambda _: out.append(fn()))
            libc = ctypes.CDLL(None)
            thread = ctypes.c_ulong()
            if libc.pthread_create(ctypes.byref(thread), None, callback, None) != 0:
                raise OSError("pthread_create failed")
            libc.pthread_join(thread, None)
            return out[0]
    ''',
    "tests/test_g_native.py": '''
        import torch

        from pk.calc import triple
        from pk.grad import Square
        from pk.native import run_on_native_thread


        def test_backward_on_a_native_thread():
            x = torch.tensor([3.0], requires_grad=True)

            def step():
                Square.apply(x).sum().backward()
                return float(x.grad)

            assert run_on_native_thread(step) == 6.0


        def test_forward_on_a_native_thread():
            x = torch.tensor([3.0])
            assert run_on_native_thread(lambda: float(Square.apply(x))) == 9.0


        def test_function_on_a_native_thread():
            assert run_on_native_thread(lambda: triple(2)) == 6
    ''',
    "pk/gradhooks.py": '''
        CALLS = []


        def halve(grad):
            return grad / 2


        def after_accumulate(param):
            param.grad.mul_(3)


        def scale_input_grad(module, grad_input, grad_output):
            return tuple(g * 5 for g in grad_input)


        def scale_output_grad(module, grad_output):
            return tuple(g * 7 for g in grad_output)


        def legacy(module, grad_input, grad_output):
            CALLS.append("legacy")


        def note_grads(grads):
            CALLS.append(len(grads))


        def pack(x):
            return x


        def unpack(x):
            return x * 1
    ''',
    # The hooks a backward calls run where the backward runs: on a GPU, on the engine's
    # device thread, which native code started. Each hook's body runs only there.
    "tests/test_i_hooks.py": '''
        import torch
        import torch.autograd.graph as graph

        from pk import gradhooks
        from pk.native import run_on_native_thread


        def backward(x, loss):
            def step():
                loss().sum().backward()
                return float(x.grad)

            return run_on_native_thread(step)


        def leaf():
            return torch.tensor([3.0], requires_grad=True)


        def linear():
            lin = torch.nn.Linear(1, 1, bias=False)
            with torch.no_grad():
                lin.weight.fill_(1.0)
            return lin


        def test_tensor_hook():
            x = leaf()

            def loss():
                y = x * 2
                y.register_hook(gradhooks.halve)
                return y

            assert backward(x, loss) == 1.0


        def test_post_accumulate_grad_hook():
            x = leaf()
            x.register_post_accumulate_grad_hook(gradhooks.after_accumulate)
            assert backward(x, lambda: x * 2) == 6.0


        def test_module_backward_hook():
            x, lin = leaf(), linear()
            lin.register_full_backward_hook(gradhooks.scale_input_grad)
            assert backward(x, lambda: lin(x)) == 5.0


        def test_module_backward_pre_hook():
            x, lin = leaf(), linear()
            lin.register_full_backward_pre_hook(gradhooks.scale_output_grad)
            assert backward(x, lambda: lin(x)) == 7.0


        def test_legacy_module_backward_hook():
            x, lin = leaf(), linear()
            lin.register_backward_hook(gradhooks.legacy)
            backward(x, lambda: lin(x))
            assert gradhooks.CALLS[-1] == "legacy"


        def test_multi_grad_hook():
            x, y = leaf(), leaf()
            graph.register_multi_grad_hook((x, y), gradhooks.note_grads)
            backward(x, lambda: x * y)
            assert gradhooks.CALLS[-1] == 2


        def test_saved_tensors_unpack_hook():
            x = leaf()

            def loss():
                with graph.saved_tensors_hooks(gradhooks.pack, gradhooks.unpack):
                    return x * x

            assert backward(x, loss) == 6.0
    ''',
    "tests/test_h_fork_exit.py": '''
        from pk.child import python

        # A fork of a child that ends as a program does (its exit handlers run), with its
        # tracer in place: its evidence is whole.
        CODE = ("import os, sys; from pk.calc import triple\\n"
                "pid = os.fork()\\n"
                "if pid == 0:\\n"
                "    triple(2); sys.exit(0)\\n"
                "os.waitpid(pid, 0); print(triple(2))\\n")


        def test_fork_of_child_exits_normally():
            assert python(CODE) == "6"
    ''',
    "tests/test_d_other.py": '''
        def test_other():
            assert 1 + 1 == 2
    ''',
}

recorded, repo = recorded_once("unseen", UNSEEN)


@pytest.mark.parametrize("old, new, victim", [
    # The helper removed the tracer: triple, called after it in the same test, ran unseen.
    ("return x * 3", "return x * 4", "tests/test_a_prof.py::test_profiled_then_triple"),
    # ... and a later test, which ran with no tracer at all.
    ("return x * 2", "return x * 5", "tests/test_b_calc.py::test_double"),
    # ... and in a child process, whose own tracer the helper removed.
    ("return x * 3", "return x * 4", "tests/test_e_child.py::test_child_profiles_then_triples"),
    # ... and in a fork of a child, which started a tracer of its own.
    ("return x * 3", "return x * 4",
     "tests/test_f_fork.py::test_fork_of_child_profiles_then_triples"),
    # half ran on a raw thread.
    ("return x / 2", "return x / 4", "tests/test_c_bg.py::test_half_in_thread"),
])
def test_lines_the_tracer_missed_select_their_test(repo, old, new, victim):
    repo.edit("pk/calc.py", old, new)
    assert_selects(repo, victim, "tests/test_d_other.py::test_other")


def test_a_backward_on_a_thread_native_code_started_selects_its_test(repo):
    # A custom autograd Function's backward ran on a thread native code started (on a GPU,
    # the autograd engine's device thread runs it).
    repo.edit("pk/grad.py", "return 2 * x * grad", "return 3 * x * grad")
    assert_selects(repo, "tests/test_g_native.py::test_backward_on_a_native_thread",
                   "tests/test_d_other.py::test_other")


@pytest.mark.parametrize("path, old, new, victim", [
    # The thread's first Python is a ctypes callback: what it calls, a plain function or
    # a custom Function's forward, ran with no tracer on 3.11 (a backward there got one).
    ("pk/calc.py", "return x * 3", "return x * 4", "test_function_on_a_native_thread"),
    ("pk/grad.py", "return x * x", "return x * x * 2", "test_forward_on_a_native_thread"),
])
def test_a_ctypes_callback_on_a_native_thread_selects_its_test(repo, path, old, new, victim):
    repo.edit(path, old, new)
    assert_selects(repo, f"tests/test_g_native.py::{victim}", "tests/test_d_other.py::test_other")


@pytest.mark.parametrize("old, new, victim", [
    ("return grad / 2", "return grad / 4", "test_tensor_hook"),
    ("mul_(3)", "mul_(4)", "test_post_accumulate_grad_hook"),
    # A module's full backward hooks run after torch's own custom Function's backward.
    ("g * 5", "g * 6", "test_module_backward_hook"),
    ("g * 7", "g * 8", "test_module_backward_pre_hook"),
    ('CALLS.append("legacy")', 'CALLS.append("full")', "test_legacy_module_backward_hook"),
    ("CALLS.append(len(grads))", "CALLS.append(len(grads) + 1)", "test_multi_grad_hook"),
    ("return x * 1", "return x * 2", "test_saved_tensors_unpack_hook"),
])
def test_a_hook_a_backward_calls_on_a_native_thread_selects_its_test(repo, old, new, victim):
    # On 3.11 the hook is given the thread's tracer as it starts (tracing.py), so its body's
    # lines are its test's evidence; before, only a module's hooks were (five of these
    # seven failed).
    repo.edit("pk/gradhooks.py", old, new)
    assert_selects(repo, f"tests/test_i_hooks.py::{victim}", "tests/test_d_other.py::test_other")


def test_a_fork_that_exits_normally_keeps_its_evidence(repo):
    # The fork inherits its parent's exit handler that looks at the tracer; run after the
    # fork's coverage.py stopped its own, it took the tracer for replaced, and the test
    # stayed selected on any change.
    repo.edit("pk/calc.py", "return x / 2", "return x / 4")
    assert_selects(repo, "tests/test_c_bg.py::test_half_in_thread",
                   "tests/test_h_fork_exit.py::test_fork_of_child_exits_normally")
