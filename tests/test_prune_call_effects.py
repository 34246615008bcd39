"""Pruning and what a call leaves behind besides its return value: the gradients and Python
attributes of the tensors it was given, memory two arguments share, and settings of the
process the test goes on under (a logger's level, the warnings filters, torch's default
device and print options, numpy's error handling), and the working folder a call reads,
which a replay does not share.

An attacker review found each of these pruned while its test failed: the capture dropped
gradients and tensor attributes, cloned an argument passed twice into two, and the replay
compared none of these settings. Each change here fails its test: a replay that compared
less would let the failure escape.
"""

from __future__ import annotations

import pytest
from soundness_world import copied_once, failing

LIB = {
    "lib/__init__.py": "",
    "lib/train.py": '''
        import logging
        import os
        import warnings

        import numpy
        import torch

        log = logging.getLogger("lib.train")


        def set_grad(p, g):
            p.grad = g.clone()


        def clip(params, max_norm):
            torch.nn.utils.clip_grad_norm_(params, max_norm)


        def mark_no_decay(params):
            for p in params:
                p.no_decay = p.dim() < 2


        def ema_(avg, new, decay=0.5):
            avg.copy_(avg * decay + new * (1 - decay))


        def set_verbosity(verbose):
            log.setLevel(logging.DEBUG if verbose else logging.INFO)


        def report(step):
            log.info("step %d", step)


        def quiet():
            return 1


        def prepare():
            return 1


        def numerics():
            return 1


        def count(t):
            return t.numel()


        def config_path():
            return "cfg.json"
    ''',
    "tests/test_train.py": '''
        import logging
        import warnings

        import numpy
        import torch

        from lib.train import (clip, config_path, count, ema_, mark_no_decay, numerics, prepare,
                               quiet, report, set_grad, set_verbosity)


        def test_set_grad():
            p = torch.zeros(3, requires_grad=True)
            set_grad(p, torch.ones(3))
            assert p.grad.tolist() == [1.0, 1.0, 1.0]


        def test_clip():
            w = torch.ones(3, requires_grad=True)
            (w * torch.tensor([3.0, 4.0, 0.0])).sum().backward()
            clip([w], 10.0)
            assert w.grad.tolist() == [3.0, 4.0, 0.0]


        def test_no_decay_marks():
            w, b = torch.ones(2, 2), torch.ones(2)
            mark_no_decay([w, b])
            assert not w.no_decay and b.no_decay


        def test_ema_of_itself_is_a_fixed_point():
            w = torch.ones(3)
            ema_(w, w)
            assert w.tolist() == [1.0, 1.0, 1.0]


        def test_report_at_info(caplog):
            caplog.set_level(logging.INFO)
            set_verbosity(False)
            report(3)
            assert caplog.messages == ["step 3"]


        def test_quiet_then_warn():
            assert quiet() == 1
            with warnings.catch_warnings(record=True) as caught:
                warnings.warn("careful", UserWarning)
            assert len(caught) == 1


        def test_prepare_then_compute():
            assert prepare() == 1
            assert torch.ones(2).sum().item() == 2.0


        def test_numerics_then_divide():
            assert numerics() == 1
            assert numpy.geterr()["divide"] == "warn"


        def test_count_then_print():
            assert count(torch.ones(3)) == 3
            assert str(torch.tensor([1.2345])) == "tensor([1.2345])"


        def test_config_path_from_another_folder(monkeypatch, tmp_path):
            monkeypatch.chdir(tmp_path)
            assert config_path() == "cfg.json"
    ''',
}


def node(name: str) -> str:
    return f"tests/test_train.py::test_{name}"


recorded, lib = copied_once(LIB, passed=10)


# What a call does to the tensors it was given.
ARGUMENTS = {
    # A gradient the call sets.
    "a gradient written": ("p.grad = g.clone()", "p.grad = g * 2", "set_grad",
                           "set_grad under the new code differs at args#"),
    # Gradients the test had before the call, which the call clips: a capture that dropped
    # them replayed a clip of nothing on both sides.
    "gradients clipped": ("clip_grad_norm_(params, max_norm)",
                          "clip_grad_norm_(params, max_norm / 10)", "clip",
                          "clip under the new code differs at args#"),
    # A Python attribute the call sets on a tensor (the optimizer's groups read such marks).
    "a tensor's attribute": ("p.dim() < 2", "p.dim() <= 2", "no_decay_marks",
                             "mark_no_decay under the new code differs at args#"),
    # One tensor passed twice: the update reads what it writes only where both are one.
    "an argument passed twice": ("avg.copy_(avg * decay + new * (1 - decay))",
                                 "avg.mul_(decay).add_(new, alpha=1 - decay)",
                                 "ema_of_itself_is_a_fixed_point",
                                 "ema_ under the new code differs at args"),
}

# What a call sets for the rest of the process. Apart from torch's default device: a
# replay process whose new code set it to "meta" cannot compute the calls after it.
SETTINGS = {
    "a logger's level": ("logging.DEBUG if verbose else logging.INFO",
                         "logging.DEBUG if verbose else logging.WARNING", "report_at_info",
                         "set_verbosity under the new code differs at process.settings"),
    "the warnings filters": ("def quiet():\n    return 1",
                             'def quiet():\n    warnings.simplefilter("ignore")\n    return 1',
                             "quiet_then_warn",
                             "quiet under the new code differs at process.settings"),
    "numpy's error handling": ("def numerics():\n    return 1",
                               'def numerics():\n    numpy.seterr(all="raise")\n    return 1',
                               "numerics_then_divide",
                               "numerics under the new code differs at process.settings"),
    "torch's print options": ("    return t.numel()",
                              "    torch.set_printoptions(precision=2)\n    return t.numel()",
                              "count_then_print",
                              "count under the new code differs at process.settings"),
    # The working folder, read through `os.path.relpath`: the test's is not the replay's.
    "the working folder": ('    return "cfg.json"',
                           "    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))"
                           '\n    return os.path.relpath(os.path.join(here, "cfg.json"))',
                           "config_path_from_another_folder",
                           "config_path under the new code failed: RuntimeError: the call read "
                           "the working folder (getcwd)"),
}
DEVICE = {"torch's default device": (
    "def prepare():\n    return 1",
    'def prepare():\n    torch.set_default_device("meta")\n    return 1',
    "prepare_then_compute", "prepare under the new code differs at process.settings")}


@pytest.mark.parametrize("cases", [ARGUMENTS, SETTINGS, DEVICE],
                         ids=["arguments", "settings", "device"])
def test_what_a_call_leaves_behind_keeps_its_test(lib, cases):
    for old, new, _, _ in cases.values():
        lib.edit("lib/train.py", old, new)
    tests = lib.decisions()
    wrong = {case: tests[node(name)].get("not_pruned") or tests[node(name)]["decision"]
             for case, (_, _, name, why) in cases.items()
             if why not in tests[node(name)].get("not_pruned", "")}
    assert not wrong, wrong
    nodes = {node(name) for _, _, name, _ in cases.values()}
    assert failing(lib, *nodes) == nodes


def test_the_same_effects_by_other_code_are_pruned(lib):
    """Gradients, attributes, shared memory and settings the new code leaves as the old
    code did: nothing to keep the tests for."""
    lib.edit("lib/train.py", "p.grad = g.clone()", "p.grad = g.detach().clone()")
    lib.edit("lib/train.py", "torch.nn.utils.clip_grad_norm_(params, max_norm)",
             "torch.nn.utils.clip_grad_norm_(list(params), max_norm)")
    lib.edit("lib/train.py", "p.dim() < 2", "not p.dim() >= 2")
    lib.edit("lib/train.py", "logging.DEBUG if verbose else logging.INFO",
             "logging.INFO if not verbose else logging.DEBUG")
    tests = lib.decisions()
    for name in ("set_grad", "clip", "no_decay_marks", "report_at_info"):
        assert tests[node(name)]["decision"] == "skipped", tests[node(name)]
