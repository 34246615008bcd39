"""Pruning and what an nn.Module call leaves behind beyond its state dict and its output's
tensors, and calls that return an iterator.

A second attacker review found each of these pruned while its test failed: a module
replay compared the output's and arguments' fingerprints and the state dict, so a count or
a cache a forward keeps on the module, `training`, a non-persistent buffer, a submodule it
swapped, a list it grew, a numpy array or set argument it wrote, a random generator it
drew from, and a numpy output were all unseen. And a call that returns an iterator (`map`,
`iter(items)`) returns something that reads what it iterates over later, as the test
consumes it. Each change here fails its test: a replay that compared less would let the
failure escape.
"""

from __future__ import annotations

from soundness_world import copied_once, failing

LIB = {
    "lib/__init__.py": "",
    "lib/mods.py": '''
        import torch
        from torch import nn


        class Counter(nn.Module):
            def __init__(self):
                super().__init__()
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                return x * 2


        class Cache(nn.Module):
            def forward(self, x):
                self._cached = x * 2
                return x + 1


        class Flip(nn.Module):
            def forward(self, x):
                self.train(True)
                return x * 2


        class Steps(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("steps", torch.zeros(1), persistent=False)

            def forward(self, x):
                self.steps += 1
                return x * 2


        class Lazy(nn.Module):
            def forward(self, x):
                self.act = nn.Identity()
                return x * 2


        class History(nn.Module):
            def __init__(self):
                super().__init__()
                self.hist = []

            def forward(self, x):
                self.hist.append(float(x.sum()))
                return x * 2


        class NpNoise(nn.Module):
            def forward(self, x, rng):
                u = rng.random()
                return x + 0 * u


        class Seen(nn.Module):
            def forward(self, x, seen):
                seen.add("a")
                return x * 2


        class ToNumpy(nn.Module):
            def forward(self, x):
                return (x * 2).numpy()


        class FillNp(nn.Module):
            def forward(self, x, buf):
                buf[:] = 1
                return x * 2
    ''',
    "lib/it.py": '''
        import torch

        NAMES = ["a", "b"]


        def _double(x):
            return x * 2


        def doubled(xs):
            return map(_double, xs)


        def names_iter():
            return iter(NAMES)
    ''',
    "tests/test_m.py": '''
        import numpy as np
        import torch

        import lib.it as it
        from lib.it import doubled, names_iter
        from lib.mods import (Cache, Counter, FillNp, Flip, History, Lazy, NpNoise, Seen, Steps,
                              ToNumpy)


        def test_counter():
            m = Counter()
            m(torch.ones(2))
            assert m.calls == 1


        def test_cache():
            m = Cache()
            m(torch.ones(2))
            assert m._cached.tolist() == [2.0, 2.0]


        def test_flip():
            m = Flip().eval()
            m(torch.ones(2))
            assert m.training


        def test_steps():
            m = Steps()
            m(torch.ones(2))
            assert m.steps.item() == 1.0


        def test_lazy():
            m = Lazy()
            m(torch.ones(2))
            assert isinstance(m.act, torch.nn.Identity)


        def test_history():
            m = History()
            m(torch.ones(2))
            assert m.hist == [2.0]


        def test_np_noise():
            rng, ref = np.random.default_rng(0), np.random.default_rng(0)
            ref.random()
            NpNoise()(torch.ones(2), rng)
            assert rng.random() == ref.random()


        def test_seen():
            seen = set()
            Seen()(torch.ones(2), seen)
            assert seen == {"a"}


        def test_to_numpy():
            assert ToNumpy()(torch.ones(2)).tolist() == [2.0, 2.0]


        def test_fill_np():
            buf = np.zeros(2)
            FillNp()(torch.ones(2), buf)
            assert buf.tolist() == [1.0, 1.0]


        def test_map_lazy():
            xs = [1, 2]
            m = doubled(xs)
            xs.append(3)
            assert list(m) == [2, 4, 6]


        def test_names_iter_live():
            i = names_iter()
            it.NAMES.append("z")
            try:
                assert list(i)[-1] == "z"
            finally:
                it.NAMES.pop()
    ''',
}


def node(name: str) -> str:
    return f"tests/test_m.py::test_{name}"


recorded, lib = copied_once(LIB, passed=12)


M = "lib/mods.py"
KEPT = {
    "a count on the module": (M, "self.calls += 1", "self.calls += 2", "counter",
                              "Counter under the new code differs at module#"),
    "a cache on the module": (M, "self._cached = x * 2", "self._cached = x * 3", "cache",
                              "Cache under the new code differs at module#"),
    "training set": (M, "self.train(True)", "self.train(False)", "flip",
                     "Flip under the new code differs at module#"),
    "a non-persistent buffer": (M, "self.steps += 1", "self.steps += 2", "steps",
                                "Steps under the new code differs at"),
    "a submodule swapped": (M, "self.act = nn.Identity()", "self.act = nn.ReLU()", "lazy",
                            "Lazy under the new code differs at module#"),
    "a list grown": (M, "self.hist.append(float(x.sum()))",
                     "self.hist.append(float(x.mean()))", "history",
                     "History under the new code differs at module#"),
    "a generator argument drawn from": (M, "u = rng.random()", "u = rng.random(2)[0]",
                                        "np_noise", "NpNoise under the new code differs at args#"),
    "a set argument": (M, 'seen.add("a")', 'seen.add("b")', "seen",
                       "Seen under the new code differs at args#"),
    "a numpy output": (M, "return (x * 2).numpy()", "return (x * 3).numpy()", "to_numpy",
                       "ToNumpy under the new code differs at out#"),
    "a numpy argument written": (M, "buf[:] = 1", "buf[:] = 2", "fill_np",
                                 "FillNp under the new code differs at args#"),
    "a map over the argument": ("lib/it.py", "return map(_double, xs)",
                                "return map(_double, list(xs))", "map_lazy",
                                "doubled under the new code differs at out.is"),
    "an iterator over a global": ("lib/it.py", "return iter(NAMES)", "return iter(list(NAMES))",
                                  "names_iter_live",
                                  "names_iter under the new code differs at out.is"),
}


def test_what_a_module_call_leaves_behind_keeps_its_test(lib):
    for path, old, new, _, _ in KEPT.values():
        lib.edit(path, old, new)
    tests = lib.decisions()
    wrong = {case: tests[node(name)].get("not_pruned") or tests[node(name)]["decision"]
             for case, (_, _, _, name, why) in KEPT.items()
             if why not in tests[node(name)].get("not_pruned", "")}
    assert not wrong, wrong
    nodes = {node(name) for *_, name, _ in KEPT.values()}
    assert failing(lib, *nodes) == nodes


def test_a_module_that_leaves_the_same_behind_is_pruned(lib):
    lib.edit(M, "self.calls += 1", "self.calls = self.calls + 1")
    lib.edit(M, "self.hist.append(float(x.sum()))", "self.hist += [float(x.sum())]")
    tests = lib.decisions()
    for name in ("counter", "history"):
        assert tests[node(name)]["decision"] == "skipped", tests[node(name)]
