"""Pruning and objects a call shares with what the repository's modules hold: a view of a
module-level tensor or array, a config's inner dict, a class attribute, an argument a module
list keeps, a module default stored into an argument.

An attacker review found each of these pruned while its test failed: the replay compared
what the result and the arguments hold by value, and by identity only against the arguments
and the function's own globals by name, so a copy where the old code handed out (or kept)
the shared object itself looked the same. Each change here fails its test: a replay that
described less would let the failure escape.
"""

from __future__ import annotations

from conftest import Project
from soundness_world import copied_once, failing

LIB = {
    "lib/__init__.py": "",
    "lib/tables.py": '''
        import numpy
        import torch

        TABLE = torch.arange(8.0)
        GRID = numpy.arange(8.0)


        class Options:
            def __init__(self):
                self.opts = {"lr": 0.1}


        class Scales:
            BASE = torch.ones(4)


        CONFIG = Options()
        DEFAULTS = {"eps": 1e-5}


        def head(n):
            return TABLE[:n].clone()


        def grid_head(n):
            return GRID[:n].copy()


        def options():
            return dict(CONFIG.opts)


        def base_scale():
            return Scales.BASE.clone()


        def merge(cfg):
            cfg["shared"] = dict(DEFAULTS)
    ''',
    "lib/layers.py": '''
        import torch

        from lib.tables import TABLE


        class Lookup(torch.nn.Module):
            def forward(self, n):
                return TABLE[:n].clone()
    ''',
    "tests/test_tables.py": '''
        import torch

        from lib.layers import Lookup
        from lib.tables import (CONFIG, DEFAULTS, GRID, TABLE, Scales, base_scale, grid_head,
                                head, merge, options)


        def test_head_is_a_copy():
            h = head(2)
            h.zero_()
            assert TABLE[:2].tolist() == [0.0, 1.0]


        def test_grid_head_is_a_copy():
            g = grid_head(2)
            g[:] = 5.0
            assert GRID[:2].tolist() == [0.0, 1.0]


        def test_options_are_a_copy():
            o = options()
            o["lr"] = 1.0
            assert CONFIG.opts["lr"] == 0.1


        def test_base_scale_is_a_copy():
            s = base_scale()
            s.mul_(3)
            assert Scales.BASE.tolist() == [1.0, 1.0, 1.0, 1.0]


        def test_merged_defaults_are_a_copy():
            c = {}
            merge(c)
            c["shared"]["eps"] = 0.5
            assert DEFAULTS["eps"] == 1e-5


        def test_lookup_is_a_copy():
            out = Lookup()(3)
            out.fill_(9)
            assert TABLE[:3].tolist() == [0.0, 1.0, 2.0]
    ''',
}

# (file, old, new, test): the new code shares what the old code copied.
SHARED = {
    "a view of a module's tensor": ("lib/tables.py", "TABLE[:n].clone()", "TABLE[:n]",
                                    "head_is_a_copy"),
    "a view of a module's array": ("lib/tables.py", "GRID[:n].copy()", "GRID[:n]",
                                   "grid_head_is_a_copy"),
    "a config's inner dict": ("lib/tables.py", "dict(CONFIG.opts)", "CONFIG.opts",
                              "options_are_a_copy"),
    "a class attribute": ("lib/tables.py", "Scales.BASE.clone()", "Scales.BASE",
                          "base_scale_is_a_copy"),
    "a module default stored in an argument": ("lib/tables.py", "dict(DEFAULTS)", "DEFAULTS",
                                               "merged_defaults_are_a_copy"),
    "a module call's view of a module's tensor": ("lib/layers.py", "TABLE[:n].clone()",
                                                  "TABLE[:n]", "lookup_is_a_copy"),
}


def node(name: str) -> str:
    return f"tests/test_tables.py::test_{name}"


recorded, lib = copied_once(LIB, passed=6)


def test_sharing_what_a_module_holds_keeps_the_test(lib):
    for path, old, new, _ in SHARED.values():
        lib.edit(path, old, new)
    tests = lib.decisions()
    wrong = {case: tests[node(name)].get("not_pruned") or tests[node(name)]["decision"]
             for case, (_, _, _, name) in SHARED.items()
             if tests[node(name)]["decision"] != "selected"}
    assert not wrong, wrong
    nodes = {node(name) for _, _, _, name in SHARED.values()}
    assert failing(lib, *nodes) == nodes


def test_copies_made_by_other_code_are_pruned(lib):
    """The same copies by other code: nothing to keep the tests for."""
    lib.edit("lib/tables.py", "TABLE[:n].clone()", "TABLE[:n].detach().clone()")
    lib.edit("lib/tables.py", "dict(CONFIG.opts)", "{**CONFIG.opts}")
    lib.edit("lib/tables.py", "dict(DEFAULTS)", "DEFAULTS.copy()")
    tests = lib.decisions()
    for name in ("head_is_a_copy", "options_are_a_copy", "merged_defaults_are_a_copy"):
        assert tests[node(name)]["decision"] == "skipped", tests[node(name)]


# A call that changes a module's globals leaves the process's later replays unable to
# start from what their tests had; so this one has a repository of its own.
KEEPS = {
    "lib/__init__.py": "",
    "lib/registry.py": '''
        SEEN = []


        def remember(x):
            SEEN.append(x.clone())
    ''',
    "tests/test_registry.py": '''
        import torch

        from lib.registry import SEEN, remember


        def test_remembered_before_the_change():
            t = torch.ones(2)
            remember(t)
            t.zero_()
            assert SEEN[-1].tolist() == [1.0, 1.0]
    ''',
}


def test_an_argument_a_module_keeps_keeps_the_test(tmp_path):
    lib = Project.at(Project.recorded_once(tmp_path / "repo", KEEPS, passed=1))
    test = "tests/test_registry.py::test_remembered_before_the_change"
    lib.edit("lib/registry.py", "SEEN.append(x.clone())", "SEEN.append(x.detach().clone())")
    assert lib.decisions()[test]["decision"] == "skipped"  # the same copy: pruned
    lib.edit("lib/registry.py", "SEEN.append(x.detach().clone())", "SEEN.append(x)")
    decision = lib.decisions()[test]
    assert decision["decision"] == "selected", decision
    assert "remember under the new code differs at args.is" in decision["not_pruned"], decision
    assert lib.fails(test)
