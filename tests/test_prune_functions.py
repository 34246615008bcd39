"""Pruning beyond nn.Module: calls a test makes to plain repository functions are captured
(`record/bindings.py`, `record/capture.py`) and replayed under both trees, end to end.

One small project is recorded once; each test works on its own copy. Every change that
keeps a test also fails that test: a version of the rule that pruned it would let a failure
escape.
"""

from __future__ import annotations

import pytest
from soundness_world import copied_once, failing

LIB = {
    "lib/__init__.py": "",
    "lib/sched.py": '''
        import math
        import os
        import random

        import torch

        WARMUP = 10
        SETTINGS = {"level": 0}


        class Config:
            def __init__(self, dim):
                self.dim = dim
                self.hidden = 4 * dim


        def lr_at(step, base=1.0, total=100):
            if step < WARMUP:
                return base * (step + 1) / WARMUP
            progress = (step - WARMUP) / max(1, total - WARMUP)
            return base * 0.5 * (1 + math.cos(math.pi * progress))


        def describe(cfg):
            return "config:" + ",".join(f"{k}={v}" for k, v in sorted(cfg.items())) + "-" * 200


        def make_config(dim):
            return Config(dim)


        def width(cfg):
            return cfg.hidden * (1 if cfg.dim < 16 else 2)


        def scale_(t, factor):
            t.mul_(factor)


        def loss(pred, target):
            return ((pred - target) ** 2).mean()


        def noisy(x):
            return x + torch.randn(x.shape)


        def jitter(x):
            random.random()
            return x


        def configure(level):
            SETTINGS["level"] = level


        def sign(x):
            if float(x.sum()) > 0:
                return 1
            return -1


        def clip(t):
            return t.clamp(max=1.0)


        _DEFAULTS = {"lr": 0.1}


        def defaults():
            return _DEFAULTS


        def window(a):
            return a[1:]


        def flat_state(holder):
            return holder["w"].view(-1)


        def project(x, w):
            return x @ w


        def precision():
            return "fp32"


        def prepare():
            return 1
    ''',
    "lib/talk.py": '''
        import logging
        import warnings

        log = logging.getLogger("lib.talk")


        def quiet(x):
            return x


        def announce(x):
            log.info("step %d", x)
            return x


        def show(x):
            print(f"x={x}")
            return x
    ''',
    "lib/shapes.py": '''
        class Grid:
            def __init__(self, rows, cols=4):
                self.rows = rows
                self.cols = cols
                self.cells = rows * cols

            def area(self):
                return self.cells

            def grow(self):
                self.rows += 1
                self.cells = self.rows * self.cols


        class Holder:
            def __init__(self):
                self.box = {"n": 0}

            def bump(self):
                self.box["n"] += 1


        class Vocab:
            """Pickles without its lookup cache, as tokenizers do."""

            def __init__(self, words):
                self.words = list(words)
                self._index = None

            def __getstate__(self):
                state = dict(self.__dict__)
                state["_index"] = None
                return state

            def index(self):
                if self._index is None:
                    self._index = {w: i for i, w in enumerate(self.words)}
                return self._index

            def add(self, word):
                self.words.append(word)
                self._index = None
    ''',
    "tests/test_shapes.py": '''
        from lib.shapes import Grid, Holder, Vocab


        def test_grid():
            grid = Grid(3)
            assert grid.cells == 12


        def test_grid_area():
            assert Grid(2).area() == 8


        def test_grid_grows():
            grid = Grid(2)
            grid.grow()
            assert grid.cells == 12


        def test_holder_bumps_its_box():
            holder = Holder()
            box = holder.box
            holder.bump()
            assert box["n"] == 1


        def test_vocab_grows():
            vocab = Vocab(["a", "b"])
            assert vocab.index()["b"] == 1
            vocab.add("c")
            assert vocab.index()["c"] == 2
    ''',
    "lib/vocab.py": '''
        def build_vocab(words):
            return {w: i for i, w in enumerate(sorted(words))}
    ''',
    "tests/conftest.py": '''
        import pytest

        from lib.vocab import build_vocab


        @pytest.fixture
        def vocab():
            # a set argument: its order differs from process to process
            return build_vocab({"delta", "alpha", "charlie", "bravo", "echo", "golf", "hotel",
                                "india", "juliett", "kilo"})
    ''',
    "tests/test_vocab.py": '''
        def test_vocab_from_a_fixture(vocab):
            assert vocab["alpha"] == 0 and len(vocab) == 10
    ''',
    "lib/report.py": '''
        import os
        import sys


        def write_report(path, value):
            with open(path, "w") as f:
                f.write(str(value))
            return value


        def start_step(total):
            return 0


        def max_steps(requested):
            return requested
    ''',
    "tests/test_sched.py": '''
        import logging
        import os
        import random
        import warnings

        import numpy
        import torch

        from lib.report import max_steps, start_step, write_report
        from lib.sched import (
            _DEFAULTS, SETTINGS, Config, configure, defaults, describe, jitter, loss, lr_at,
            make_config, noisy, scale_, clip, sign, width, window, flat_state, project,
            precision, prepare,
        )
        from lib.talk import announce, quiet, show


        def test_lr():
            assert lr_at(0) == 0.1
            assert abs(lr_at(55) - 0.5) < 1e-9


        def test_lr_over_a_schedule():
            values = [lr_at(step) for step in range(20)]
            assert values[9] == 1.0


        def test_widths():
            assert width(Config(8)) == 32
            assert width(Config(32)) == 256


        def test_describe():
            assert describe({"a": 1}) == "config:a=1" + "-" * 200


        def test_config():
            assert make_config(8).hidden == 32


        def test_scale_in_place():
            t = torch.ones(3)
            scale_(t, 2.0)
            assert float(t.sum()) == 6.0


        def test_loss_backward():
            pred = torch.ones(3, requires_grad=True)
            loss(pred, torch.zeros(3)).backward()
            assert torch.allclose(pred.grad, torch.full((3,), 2 / 3))


        def test_noise_then_draw():
            torch.manual_seed(0)
            noisy(torch.zeros(2))
            assert float(torch.rand(1)) == 0.30742281675338745


        def test_jitter_then_draw():
            random.seed(0)
            assert jitter(1) == 1
            assert random.random() == 0.7579544029403025


        def test_quiet():
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert quiet(2) == 2


        def test_announce(caplog):
            caplog.set_level(logging.INFO)
            assert announce(3) == 3
            assert caplog.messages == ["step 3"]


        def test_show(capsys):
            assert show(2) == 2
            assert capsys.readouterr().out == "x=2\\n"


        def test_configure():
            configure(3)
            try:
                assert SETTINGS["level"] == 3
            finally:
                configure(0)


        def test_report(tmp_path):
            assert write_report(tmp_path / "r.txt", 3) == 3
            assert (tmp_path / "r.txt").read_text() == "3"


        def test_sign():
            assert sign(torch.ones(2)) == 1
            assert sign(-torch.ones(2)) == -1


        def test_shared_defaults():
            assert defaults() is _DEFAULTS


        def test_clip():
            assert clip(torch.tensor([0.5])).tolist() == [0.5]
            assert clip(torch.tensor([1.5])).tolist() == [1.0]


        def test_resume(monkeypatch, tmp_path):
            monkeypatch.chdir(tmp_path)  # a run's own folder, which a replay does not have
            (tmp_path / "last.ckpt").write_text("7")
            assert start_step(10) == 0


        def test_max_steps():
            assert max_steps(1000) == 1000


        def test_window_writes_through():
            a = numpy.zeros(4)
            window(a)[0] = 1.0
            assert a[1] == 1.0


        def test_project_under_autocast():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = project(torch.ones(2, 2), torch.ones(2, 2))
            assert out.dtype == torch.bfloat16


        def test_precision_keeps_the_default_dtype():
            assert precision() == "fp32"
            assert torch.ones(1).dtype == torch.float32


        def test_prepare_leaves_the_environment():
            assert prepare() == 1
            assert "LIB_MODE" not in os.environ


        def test_flat_state_writes_through():
            state = {"w": torch.zeros(2, 2)}
            flat_state(state)[0] = 1.0
            assert state["w"][0, 0] == 1.0
    ''',
    "tests/test_registry.py": '''
        from lib.sched import lr_at

        REGISTRY = {"lr": lr_at}


        def test_registry_holds_the_function_itself():
            assert REGISTRY["lr"] is lr_at
            assert lr_at(0) == 0.1
    ''',
}


def node(name: str, file: str = "test_sched") -> str:
    """A test's id from its name (test_sched.py's by default), or the id itself."""
    return name if "::" in name else f"tests/{file}.py::test_{name}"


recorded, lib = copied_once(LIB, passed=31)


PRUNED = {
    # Same numbers by another expression: every call the test made replays bit-identically.
    "a schedule": ("lib/sched.py", "return base * (step + 1) / WARMUP",
                   "return (step + 1) * base / WARMUP", node("lr")),
    # An object returned: compared whole, attribute by attribute.
    "a constructor": ("lib/sched.py", "self.hidden = 4 * dim", "self.hidden = dim * 4",
                      node("config")),
    # A class the test file constructs: what its constructor built is compared whole.
    "a class constructed": ("lib/shapes.py", "self.cells = rows * cols",
                            "self.cells = cols * rows", node("grid", "test_shapes")),
    # A call a function-scoped fixture made (in conftest.py), with a set for argument.
    "a fixture's call": ("lib/vocab.py", "enumerate(sorted(words))",
                         "enumerate(sorted(list(words)))",
                         node("vocab_from_a_fixture", "test_vocab")),
    # Two calls of one signature (other values): each was captured and is replayed.
    "a function called twice alike": ("lib/sched.py", "t.clamp(max=1.0)", "t.clamp(None, 1.0)",
                                      node("clip")),
    # A call the test made under autocast, replayed under it: without, the replay of the
    # evidence's own code returned float32 where the test computed bfloat16.
    # A method the test calls on an object it built: the object is an argument.
    "a method": ("lib/shapes.py", "return self.cells", "return self.rows * self.cols",
                 node("grid_area", "test_shapes")),
    # A method that changes its object: the object after the call is compared whole.
    "a method changing its object": ("lib/shapes.py", "self.cells = self.rows * self.cols",
                                     "self.cells = self.cols * self.rows",
                                     node("grid_grows", "test_shapes")),
    "a call under autocast": ("lib/sched.py", "    return x @ w", "    return torch.matmul(x, w)",
                              node("project_under_autocast")),
}
REGISTRY = node("registry_holds_the_function_itself", "test_registry")


def test_equivalent_changes_to_functions_a_test_calls_are_pruned(lib):
    for path, old, new, _ in PRUNED.values():
        lib.edit(path, old, new)
    tests = lib.decisions()
    for case, (*_, test) in PRUNED.items():
        assert tests[test]["decision"] == "skipped", (case, tests[test])
        replayed = tests[test]["pruned"]["replayed"]
        assert all(call["before"] == call["after"] for call in replayed), case
        assert any(key.startswith("out#") for key in replayed[0]["before"]), case
    assert len(tests[node("clip")]["pruned"]["replayed"]) == 2
    # test_registry compares lr_at by identity: its file's lr_at was never wrapped (it
    # passed while recording), so lr_at's lines ran in the test's own context: kept. So
    # are the schedule's calls past the limit of captures per function.
    for test in (REGISTRY, node("lr_over_a_schedule")):
        assert tests[test]["decision"] == "selected"
        assert "ran outside any captured call" in tests[test]["not_pruned"]


KEPT = {
    # A string that differs only past the first 120 characters: the exact digest sees it.
    "a long return value": ("lib/sched.py", '"-" * 200', '"-" * 201', "describe",
                            "describe under the new code differs at out#"),
    # Nothing returned; the argument changed in place differently.
    "an argument written in place": ("lib/sched.py", "t.mul_(factor)",
                                     "t.mul_(factor).add_(0.5)", "scale_in_place",
                                     "scale_ under the new code differs at args#"),
    # The value is the same; the gradient is not.
    "a gradient": ("lib/sched.py", "return ((pred - target) ** 2).mean()",
                   "return ((pred.detach() - target) ** 2).mean() + 0 * pred.sum()",
                   "loss_backward", "loss under the new code differs at grads"),
    # The value is the same; one more random draw moves the test's next one.
    "the RNG": ("lib/sched.py", "return x + torch.randn(x.shape)",
                "torch.randn(1)\n    return x + torch.randn(x.shape)", "noise_then_draw",
                "noisy under the new code differs at"),
    # The same return value; a different file written.
    "a file written": ("lib/report.py", "f.write(str(value))", 'f.write(str(value) + "!")',
                       "report", "the call has an effect a replay cannot compare: wrote"),
    # Calls past the limit per function (a loop over steps) run outside any capture: the
    # change is on a line captured calls ran too, and alters only the later steps.
    "a call past the capture limit": (
        "lib/sched.py", "return base * (step + 1) / WARMUP",
        "return base * (step + 1) / WARMUP if step < 9 else 0.0", "lr_over_a_schedule",
        "ran outside any captured call"),
    # Two configs of one class are two contexts: the change alters only the second's value
    # on a line both ran, which a signature of argument types alone would have left unseen.
    "a second config of the same type": (
        "lib/sched.py", "(1 if cfg.dim < 16 else 2)", "(1 if cfg.dim < 40 else 2)", "widths",
        "width under the new code differs at out"),
    # The same value; one more draw from Python's generator moves the test's next one.
    "Python's RNG": ("lib/sched.py", "    random.random()\n    return x",
                     "    random.random()\n    random.random()\n    return x", "jitter_then_draw",
                     "jitter under the new code differs at pyrng"),
    # The same value, and what else a test can assert on: a warning, a log record, a print.
    "a warning": ("lib/talk.py", "def quiet(x):\n    return x",
                  'def quiet(x):\n    warnings.warn("deprecated")\n    return x', "quiet",
                  "quiet under the new code differs at said.warnings"),
    "a log record": ("lib/talk.py", 'log.info("step %d", x)', 'log.info("step %d!", x)',
                     "announce", "announce under the new code differs at said.logs"),
    "a print": ("lib/talk.py", 'print(f"x={x}")', 'print(f"x = {x}")', "show",
                "show under the new code differs at said.stdout"),
    # A fixture's call returns another value.
    "a fixture's call": ("lib/vocab.py", "enumerate(sorted(words))",
                         "enumerate(sorted(words), 1)", node("vocab_from_a_fixture", "test_vocab"),
                         "build_vocab under the new code differs at out#"),
    # The second call, of the first one's signature, ran the other branch: captured on its
    # own, its replay shows the change.
    "a later call's branch": ("lib/sched.py", "    return -1", "    return -2", "sign",
                              "sign under the new code differs at out, out#"),
    # An equal value, but a new object where the test got the shared one.
    "an identity": ("lib/sched.py", "    return _DEFAULTS", "    return dict(_DEFAULTS)",
                    "shared_defaults", "defaults under the new code differs at out.is"),
    # Equal values, but a copy where the test wrote through a view of a numpy argument ...
    "a numpy copy for a view": ("lib/sched.py", "return a[1:]", "return a[1:].copy()",
                                "window_writes_through",
                                "window under the new code differs at out.is"),
    # ... or of a tensor an argument holds.
    "a copy for a view of what an argument holds": (
        "lib/sched.py", 'return holder["w"].view(-1)', 'return holder["w"].flatten().clone()',
        "flat_state_writes_through", "flat_state under the new code differs at out.is"),
    # The same numbers without autocast; under the test's autocast, another dtype.
    "autocast turned off": ("lib/sched.py", "    return x @ w",
                            '    with torch.autocast("cpu", enabled=False):\n        return x @ w',
                            "project_under_autocast", "project under the new code differs at out"),
    # The second call, of the same signature and the same lines, has other values: only
    # they reach the new bound. The first call's replay proves nothing about it; its own
    # does.
    "a later call's values": ("lib/sched.py", "t.clamp(max=1.0)", "t.clamp(max=2.0)", "clip",
                              "clip under the new code differs at out, out#"),
    # A constructor's default changed: the object built is another.
    # New code looks for a file in the working folder: the test's has one, a replay's
    # (the tree's root) has none, and would compute what the old code did.
    "a file looked for": ("lib/report.py", "def start_step(total):\n    return 0",
                          "def start_step(total):\n    return int(open('last.ckpt').read()) "
                          "if os.path.exists('last.ckpt') else 0", "resume",
                          "start_step under the new code differs at said.files"),
    # New code asks what the process imported: pytest is in the test's, not in a replay's.
    "sys.modules": ("lib/report.py", "    return requested",
                    '    return min(requested, 10) if "pytest" in sys.modules else requested',
                    "max_steps", "reads sys.modules under the new code"),
    "a constructed object": ("lib/shapes.py", "def __init__(self, rows, cols=4):",
                             "def __init__(self, rows, cols=5):", node("grid", "test_shapes"),
                             "Grid under the new code differs at out#"),
}


# Methods a test calls on an object it built, apart from "a constructed object" (which
# changes every Grid those tests build).
METHODS = {
    # A method returns another value.
    "a method of a constructed object": ("lib/shapes.py", "return self.cells",
                                         "return self.cells + 1",
                                         node("grid_area", "test_shapes"),
                                         "area under the new code differs at out"),
    # A method returns nothing, and leaves its object otherwise.
    "a method changing its object otherwise": ("lib/shapes.py", "self.rows += 1",
                                               "self.rows += 2",
                                               node("grid_grows", "test_shapes"),
                                               "grow under the new code differs at args"),
    # Equal values, but a copy where the object was: the test's reference to the box no
    # longer sees the count.
    "an equal copy put in the object's place": (
        "lib/shapes.py", '        self.box["n"] += 1',
        '        self.box = dict(self.box)\n        self.box["n"] += 1',
        node("holder_bumps_its_box", "test_shapes"), "bump under the new code differs at args.is"),
    # The object pickles without its cache: no replay can see the stale one the new code
    # leaves, so its calls are never captured.
    "an object that pickles part of its state": (
        "lib/shapes.py", "        self.words.append(word)\n        self._index = None",
        "        self.words.append(word)", node("vocab_grows", "test_shapes"),
        "ran outside any captured call"),
}


# Nothing returned; a module global is set differently. Apart from the others: a replay
# process that ran the new `configure` holds the new SETTINGS, and every later call it
# replays finds module state unlike the test's, which keeps those tests for that reason
# (configure(0), the test's second call, among them: whichever of its two calls is judged
# first names SETTINGS).
GLOBAL = ("lib/sched.py", 'SETTINGS["level"] = level', 'SETTINGS["level"] = level + 1',
          "configure", "lib.sched.SETTINGS")  # differs after configure(3), or before configure(0)


# The same line as "a numpy copy for a view": a view of the same memory, elsewhere in it.
ELSEWHERE = ("lib/sched.py", "return a[1:]", "return a[:-1]", "window_writes_through",
             "window under the new code differs at out.is")


# What a call leaves set for the rest of the process: apart, since the test that runs next
# in the failing run would see it too.
PROCESS = {
    "torch's default dtype": ("lib/sched.py", '    return "fp32"',
                              '    torch.set_default_dtype(torch.float64)\n    return "fp32"',
                              "precision_keeps_the_default_dtype",
                              "precision under the new code differs at process.torch"),
    "a variable set": ("lib/sched.py", "def prepare():\n    return 1",
                       'def prepare():\n    os.environ["LIB_MODE"] = "fast"\n    return 1',
                       "prepare_leaves_the_environment",
                       "prepare under the new code differs at process.environ"),
}


@pytest.mark.parametrize("cases", [KEPT, {"a global assigned": GLOBAL},
                                   {"a view elsewhere in the same memory": ELSEWHERE}, METHODS,
                                   PROCESS],
                         ids=["each", "global", "elsewhere", "methods", "process"])
def test_function_changes_pruning_cannot_prove_equal_keep_their_tests(lib, cases):
    """Each change fails its test: a rule that pruned it would let a failure escape."""
    for path, old, new, _, _ in cases.values():
        lib.edit(path, old, new)
    tests = lib.decisions()
    for case, (_, _, _, name, why) in cases.items():
        test = tests[node(name)]
        assert test["decision"] == "selected", (case, test)
        assert why in test.get("not_pruned", ""), (case, test)
    nodes = {node(name) for *_, name, _ in cases.values()}
    assert failing(lib, *nodes) == nodes
