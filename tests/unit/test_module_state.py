"""Digests of module state (`runner/prune/state.py`): what a replay's fresh process must find
of every repository module. Each test changes state the way a test or fixture would and
asserts the digest sees it, or shows what two processes legitimately disagree on and asserts
the digest does not."""

from __future__ import annotations

import abc
import functools
import random
import threading
import types

import pytest

from fastci.runner.prune.state import Digester, differing, own_globals


def module(name: str = "pkg.config", **values) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = f"/checkout/{name.replace('.', '/')}.py"
    vars(mod).update(values)
    return mod


def helper(x):
    return x


def other(x):
    return x


@pytest.mark.parametrize("change", [
    lambda m: m.MODE.__setitem__("factor", 5.0),     # a configuration dict set by a test
    lambda m: setattr(m, "LIMIT", 4),                 # a constant rebound
    lambda m: setattr(m, "step", other),              # a function monkeypatched in
    lambda m: m.ITEMS.append(3),                      # a list grown
    lambda m: setattr(m.Settings, "debug", True),     # a class attribute set
    lambda m: setattr(m.DEFAULT, "lr", 0.5),          # an instance's attribute
    lambda m: setattr(m.Base, "count", 1),            # an abc.ABC's class attribute
    lambda m: m.Settings.totals.add_(1.0),            # a class's tensor, in place
    lambda m: setattr(m.Settings.Inner, "depth", 2),  # a nested class's attribute
    lambda m: setattr(m.warn_once, "done", True),     # a function's attribute set
    lambda m: m.hooks.registered.append(print),       # ... and one it holds, grown
    lambda m: m.CONFIG["model"]["encoder"]["layers"]["sizes"].__setitem__(1, 32),  # deep
    lambda m: m.PYRNG.random(),                       # generators drawn from: their state,
    lambda m: m.NPRNG.random(),                       # which their repr hides
    lambda m: m.NPSTATE.rand(),
    lambda m: __import__("torch").rand(1, generator=m.TGEN),
])
@pytest.mark.parametrize("one_digester", [False, True], ids=["fresh", "session"])
def test_a_change_a_test_could_make_changes_the_digest(change, one_digester):
    # `session`: one Digester digests before and after, as a recording does, so what it
    # remembers of values whose identity settles their digest must not hide a change.
    import numpy  # noqa: PLC0415 (torch's dependency here)
    import torch  # noqa: PLC0415 (a dependency of FastCI: never skipped)

    class Settings:
        debug = False
        totals = torch.zeros(2)

        class Inner:
            depth = 1

        def method(self):
            return self

    class Base(abc.ABC):
        count = 0

    def warn_once():
        return None

    def hooks():
        return None

    hooks.registered = []  # type: ignore[attr-defined]
    for own in (Settings, Settings.Inner, Base, warn_once, hooks):
        own.__module__ = "pkg.config"
    default = types.SimpleNamespace(lr=0.1)
    mod = module(MODE={"factor": 1.0}, LIMIT=3, step=helper, ITEMS=[1, 2],
                 Settings=Settings, DEFAULT=default, Base=Base, warn_once=warn_once,
                 hooks=hooks, CONFIG={"model": {"encoder": {"layers": {"sizes": [64, 64]}}}},
                 PYRNG=random.Random(0), NPRNG=numpy.random.default_rng(0),
                 NPSTATE=numpy.random.RandomState(0), TGEN=torch.Generator().manual_seed(0))
    first = Digester("/checkout")
    before = first.module(mod)
    change(mod)
    assert differing(before, (first if one_digester else Digester("/checkout")).module(mod))


def test_what_two_checkouts_and_processes_disagree_on_does_not_count():
    one = module(ROOT="/one/data", lock=threading.Lock(), obj=object(), __file__="/one/x.py",
                 __cached__="/one/x.pyc")
    two = module(ROOT="/two/data", lock=threading.Lock(), obj=object(), __file__="/two/x.py")
    vars(two)["@py_builtins"] = __builtins__  # pytest's assertion rewriting in a test module
    assert Digester("/one").module(one) == Digester("/two").module(two)


def test_a_container_that_holds_itself_is_read_once():
    registry: dict = {"n": 1}
    registry.update({f"self{i}": registry for i in range(64)})  # 64 ** 16 paths, unbounded
    digester = Digester("/checkout")
    before = digester.module(module(REGISTRY=registry))
    registry["n"] = 2
    assert digester.module(module(REGISTRY=registry)) != before


def test_a_method_bound_to_a_wrapper_is_code_not_state():
    # While a test runs, method capture binds its class's method to FastCI's wrapper, which
    # a replay's fresh process never has; descriptors are code, compared apart.
    class Trainer(abc.ABC):
        steps = 0

        def step(self):
            return self

        @property
        def size(self):
            return 1

    Trainer.__module__ = "pkg.config"
    digester = Digester("/checkout")
    before = digester.module(module(Trainer=Trainer))
    original = Trainer.step

    @functools.wraps(original)
    def wrapper(self):
        return original(self)

    Trainer.step = wrapper
    Trainer.size = property(lambda self: 2)
    assert digester.module(module(Trainer=Trainer)) == before


class Slotted:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def test_an_object_s_slots_are_its_state():
    # A repository object: its class's module is a file under the checkout.
    digester = Digester(__file__.rsplit("/", 1)[0])
    tally = Slotted()
    before = digester.module(module(TALLY=tally))
    tally.n = 1
    assert digester.module(module(TALLY=tally)) != before


def test_a_tensor_changed_in_place_changes_the_digest():
    import torch  # noqa: PLC0415 (a dependency of FastCI: never skipped)
    table = torch.arange(6.0)
    mod = module(TABLE=table)
    digester = Digester("/checkout")
    before = digester.module(mod)
    assert digester.module(mod) == before  # cached by version: read again, the same
    table[2] = 100.0  # in place: the version moves
    assert digester.module(mod) != before
    assert Digester("/checkout").module(module(TABLE=torch.arange(6.0))) == before


def test_a_global_deleted_or_added_while_running_counts():
    digester = Digester("/checkout")
    recorded = digester.module(module(LIMIT=3, OVERRIDE=5))  # the test added OVERRIDE
    assert differing(recorded, digester.module(module(LIMIT=3))) == ["OVERRIDE"]  # fresh
    assert differing(digester.module(module()), digester.module(module(LIMIT=3))) == ["LIMIT"]


def test_a_loggers_level_is_configuration_not_module_state():
    # caplog.set_level sets the root logger's level; a fresh process has the default one.
    import logging

    logger = logging.getLogger("pkg.config.digest-test")
    digester = Digester("/checkout")
    before = digester.module(module(log=logger))
    logger.setLevel(logging.DEBUG)
    try:
        assert digester.module(module(log=logger)) == before
    finally:
        logger.setLevel(logging.NOTSET)
    assert digester.module(module(log=logging.getLogger("pkg.other"))) != before


def test_triton_interpreter_helpers_a_replay_process_gained_do_not_count(monkeypatch):
    """Triton's interpreter copies its own namespace into a kernel's module at the first
    launch. A call recorded before any launch (a child's first) replays in a process where an
    earlier replay launched one: those names are no state of the module's own. A name the
    module holds of its own, which the recording lacks, still counts (a test deleted it).
    The other way round too: a recording made after a launch leaves the names out."""
    interpreter = types.ModuleType("triton.runtime.interpreter")
    interpreter.GridExecutor = type("GridExecutor", (), {})
    interpreter.LIMIT = 3
    monkeypatch.setitem(__import__("sys").modules, "triton.runtime.interpreter", interpreter)
    kernels = types.ModuleType("kernels")
    kernels.SCALE = 2.0
    digester = Digester("/nowhere")
    recorded = own_globals(digester, kernels)
    kernels.GridExecutor = interpreter.GridExecutor  # what the interpreter copied in
    kernels.LIMIT = 4  # the module's own value under a name the interpreter also has
    kernels.EXTRA = 1  # the module's own, which the recording lacks
    now = own_globals(digester, kernels, recorded)
    assert differing(recorded, now) == ["EXTRA", "LIMIT"]
    del kernels.LIMIT, kernels.EXTRA
    fresh = types.ModuleType("kernels")
    fresh.SCALE = 2.0
    assert differing(own_globals(digester, kernels), own_globals(digester, fresh)) == []


def test_globals_after_a_call_leave_out_what_the_interpreter_copied_in(monkeypatch):
    """The old code's replay and the new code's run their calls in different orders (the
    new side splits them over two processes): the call that launches a kernel first in one
    process is not the first in the other, so one module gained the interpreter's names
    during the call and the other before it. Its own globals still compare: a change to
    one of them is a difference."""
    import sys

    from fastci.runner.prune import replay

    interpreter = types.ModuleType("triton.runtime.interpreter")
    interpreter.ASTTransformer = type("ASTTransformer", (), {})
    monkeypatch.setitem(sys.modules, "triton.runtime.interpreter", interpreter)
    kernels = types.ModuleType("pkg.kernels")
    kernels.SCALE = 2.0
    monkeypatch.setitem(sys.modules, "pkg.kernels", kernels)
    recorded = {"pkg.kernels": ["pkg/kernels.py", Digester("/nowhere").module(kernels)]}
    before_any_launch = replay._globals_after(recorded, "/nowhere")
    kernels.ASTTransformer = interpreter.ASTTransformer
    after_a_launch = replay._globals_after(recorded, "/nowhere")
    assert after_a_launch == before_any_launch
    kernels.SCALE = 3.0
    changed = replay._globals_after(recorded, "/nowhere")
    assert [k for k in changed if changed[k] != before_any_launch.get(k)] == \
        ["globals.pkg.kernels.SCALE"]
    kernels.ASTTransformer = "the module's own"  # not the interpreter's object: compared
    assert "globals.pkg.kernels.ASTTransformer" in replay._globals_after(recorded, "/nowhere")


def test_what_a_module_holds_is_named_for_identity(monkeypatch):
    """`own_objects`: the globals a returned object or a kept argument may be, by name, and
    the data its own classes hold (nested classes' too), not its code, not other modules,
    and not what Triton's interpreter copied in."""
    import sys

    from fastci.runner.prune.state import own_objects

    interpreter = types.ModuleType("triton.runtime.interpreter")
    interpreter.GridExecutor = type("GridExecutor", (), {})
    monkeypatch.setitem(sys.modules, "triton.runtime.interpreter", interpreter)
    table = [1.0, 2.0]

    class Scales:
        BASE = table

        class Inner:
            LIMITS = {"max": 3}

        def method(self):
            return self.BASE

        @property
        def doubled(self):
            return 2

    Scales.__module__ = Scales.Inner.__module__ = "pkg.tables"
    tables = module("pkg.tables", TABLE=table, Scales=Scales, abc=abc, helper=helper,
                    GridExecutor=interpreter.GridExecutor)
    named = dict(own_objects(tables))
    assert set(named) == {"TABLE", "Scales", "Scales.BASE", "Scales.Inner",
                          "Scales.Inner.LIMITS", "helper"}
    assert named["Scales.BASE"] is table and named["Scales.Inner.LIMITS"] == {"max": 3}
