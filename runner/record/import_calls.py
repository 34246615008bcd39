"""Which module-level statement called each repository function while a test file was
collected.

A function that runs at import time gives its value to whatever the calling module-level
statement binds (`DEFAULT = Foo()` runs `Foo.__init__` for DEFAULT), so a change to the
function needs to select only the tests that read those names, not every importer. The line
recorders say which functions ran while a test file was imported; this profile hook says
from where: on each call of a repository function it walks the stack out to the innermost
repository module body and notes the line that body was executing (a class body on the way
is noted as such: the selection keeps its wide rule there).

The hook is on only while a repository module body runs during a `collect:` context: an
`exec` audit event (importlib and pytest's rewriting loader both `exec` a module's code)
turns it on, the body's frame returning turns it off. pytest's own collection work (items,
markers, parametrization: two million profile events on tinyllm, which doubled collection)
is not profiled. A repository function can still run outside any module body while a test
file is collected (`pytest_generate_tests`, a parametrize `ids` function, a doctest
finder's attribute reads): its calls are not seen, so the line recorder is switched to a
context of its own there (`collect:<file>` + OUTSIDE), and a function with lines in it is
known to have run with callers unseen (the selection keeps its wide rule). Off at session
start (conftest and plugin imports select everything when they change) and during tests.
Import machinery is not profiled either: an import finder (`_Loaders`) runs each loader
with the hook off, and the module's `exec` turns it on again if that module is the
repository's. pytest's rewriting loader parses and rewrites a test module that another test
module imports (130,000 calls on einops' suite, all profiled before), and torch's import is
a loader running a third-party body. A module whose loader is a class (built-in and frozen
modules) runs profiled. A third-party body executed other than by a loader on Python 3.12+
(runpy, a reload) is not profiled either: the hook goes off as its body starts, and a
sys.monitoring PY_RETURN event on that one code object (or PY_UNWIND, on while such a body
runs) turns it back on. A repository function that runs meanwhile (through an import hook
or a plugin registry) has no caller recorded, and its lines go to the OUTSIDE context: the
wide rule keeps it. On einops' suite (3.12) a recorded `--collect-only` took 6.4 s with
torch's import profiled and 5.5 s without (plain pytest: 4.3 s).
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections import defaultdict
from typing import Any, Callable, Mapping

from fastci.runner.record import tracing
from fastci.runner.record.paths import real_file

monitoring: Any = getattr(sys, "monitoring", None)

_CO_OPTIMIZED = 0x0001  # set on function code objects, not on module or class bodies
OUTSIDE = "|outside-module-bodies"  # the lines of a collection outside repository module bodies
Caller = tuple  # ("module", path, line) | ("class",) | ("?",)
Callee = tuple[str, int, str]  # (path, first line, code name) of a repository function


class ImportCalls:
    """The profile hook and what it saw, per context."""

    def __init__(self, root: str, tree: Mapping,
                 window: Callable[[bool], None] | None = None) -> None:
        self.window = window  # told when the first repository module body starts and ends
        self.root = os.path.realpath(root)
        self._prefix = self.root.rstrip(os.sep) + os.sep
        self.tree = tree
        self.calls: dict[str, dict[Callee, set[Caller]]] = defaultdict(lambda: defaultdict(set))
        self._current: dict[Callee, set[Caller]] | None = None
        self._files: dict[str, str | None] = {}  # co_filename -> path in the tree, or None
        self._codes: dict[Any, Callee | None] = {}
        self._bodies: list[Any] = []  # repository module bodies running, innermost last
        self._foreign: list[Any] = []  # other modules' bodies run from them, hook off meanwhile
        self._tool: int | None = None  # the sys.monitoring tool that sees those bodies end
        self._loading = 0  # loaders running with the hook off
        self._finder = _Loaders(self)
        self._on = False
        self.skipped = ""  # why the hook could not be installed, if it could not

    def follow(self, context: str) -> None:
        """The recorder switched context: watch module bodies in collection contexts only."""
        if context.startswith("collect:"):
            self._current = self.calls[context]
            tracing.route_exec(self._body_starts)
            if self._finder not in sys.meta_path:
                sys.meta_path.insert(0, self._finder)
            self._tell(False)
        else:
            self.stop()

    def _hook(self, on: bool) -> None:
        """Profile from here on (or not), and tell the recorder whether a repository module
        body runs."""
        self._on = on
        sys.setprofile(self._profile if on else None)
        self._tell(on)

    def _tell(self, inside: bool) -> None:
        if self.window is not None:
            self.window(inside)

    def stop(self) -> None:
        tracing.route_exec(None)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._bodies.clear()
        self._current = None
        if self._on:
            sys.setprofile(None)
            self._on = False
        self._unwatch()

    def close(self) -> None:
        """The session is over: give the sys.monitoring tool back."""
        self.stop()
        tool, self._tool = self._tool, None
        if tool is not None:
            monitoring.set_events(tool, 0)
            monitoring.register_callback(tool, monitoring.events.PY_RETURN, None)
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, None)
            monitoring.free_tool_id(tool)

    def _body_starts(self, code) -> None:
        """An `exec` is about to run `code`: profile while a repository module body runs."""
        if self._current is None or getattr(code, "co_name", None) != "<module>":
            return
        filename = getattr(code, "co_filename", "")
        if self._path(filename) is None:
            # Another module's body: not profiled, unless it is a string's (a dataclass's
            # generated methods), which is short and would cost two context switches.
            if self._on and not filename.startswith("<") and self._watch(code):
                self._hook(False)
            return
        if not self._on:
            if sys.getprofile() is not None:  # someone else profiles: leave them be (the
                self.skipped = "another profiler was active"  # lines stay outside)
                return
            self._hook(True)
        self._bodies.append(code)

    def _profile(self, frame, event, arg) -> None:  # noqa: ARG002 (the profiler's signature)
        if event == "return":
            if self._bodies and frame.f_code is self._bodies[-1]:
                self._bodies.pop()
                if not self._bodies or self._loading:  # back in a loader, or done
                    self._hook(False)
            return
        if event != "call":
            return
        code = frame.f_code
        if code in self._codes:
            callee = self._codes[code]
        else:
            callee = self._codes[code] = self._callee(code)
        if callee is not None and self._current is not None:
            self._current[callee].add(self._caller(frame.f_back))

    # -- other modules' bodies (3.12+) --------------------------------------------------------
    def _watch(self, code) -> bool:
        """Be told when `code` (a module body outside the repository) ends; False where
        sys.monitoring cannot tell (before 3.12, no free tool id)."""
        tool = self._tool
        if tool is None:
            tool = self._tool = _take_tool(self._body_ends)
            if tool is None:
                return False
        try:
            monitoring.set_local_events(tool, code, monitoring.events.PY_RETURN)
        except ValueError:
            return False
        if not self._foreign:  # PY_UNWIND cannot be set per code object: on while watching
            monitoring.set_events(tool, monitoring.events.PY_UNWIND)
        self._foreign.append(code)
        return True

    def _body_ends(self, code, *_args) -> None:
        """A watched body returned or raised: profile again if a repository body is still
        running (it imported this one)."""
        if code not in self._foreign:
            return
        while self._foreign:
            done = self._foreign.pop()
            self._stop_watching(done)
            if done is code:
                break
        if not self._foreign and self._tool is not None:
            monitoring.set_events(self._tool, 0)
        if not self._foreign and self._bodies and not self._on and self._current is not None:
            self._hook(True)

    # -- loaders ----------------------------------------------------------------------------
    def loader_starts(self) -> bool:
        """A loader is about to run: the hook goes off until it has, or until a repository
        module body it executes starts (True: it was on)."""
        if not self._on:
            return False
        self._loading += 1
        self._hook(False)
        return True

    def loader_ends(self) -> None:
        """It has loaded: profile again, as before it started (a repository body imported
        it, and goes on; nested loaders went off and came back the same way)."""
        self._loading -= 1
        if self._bodies and not self._on and self._current is not None:
            self._hook(True)

    def _unwatch(self) -> None:
        while self._foreign:
            self._stop_watching(self._foreign.pop())
        if self._tool is not None:
            monitoring.set_events(self._tool, 0)

    def _stop_watching(self, code) -> None:
        if self._tool is not None:
            try:
                monitoring.set_local_events(self._tool, code, 0)
            except ValueError:
                pass

    def _path(self, co_filename: str) -> str | None:
        if co_filename in self._files:
            return self._files[co_filename]
        path = None
        if co_filename and not co_filename.startswith("<"):
            real = real_file(co_filename)
            if real.startswith(self._prefix):
                rel = real[len(self._prefix):].replace(os.sep, "/")
                path = rel if rel in self.tree else None
        self._files[co_filename] = path
        return path

    def _callee(self, code) -> Callee | None:
        if not code.co_flags & _CO_OPTIMIZED:
            return None  # a module or class body, not a function
        path = self._path(code.co_filename)
        return (path, code.co_firstlineno, code.co_name) if path is not None else None

    def _caller(self, frame) -> Caller:
        while frame is not None:
            code = frame.f_code
            if code.co_name == "<module>" and not code.co_flags & _CO_OPTIMIZED:
                path = self._path(code.co_filename)
                return ("module", path, frame.f_lineno) if path is not None else ("?",)
            if not code.co_flags & _CO_OPTIMIZED and self._path(code.co_filename):
                return ("class",)  # a class body of the repository made the call
            frame = frame.f_back
        return ("?",)


class _Loaders(importlib.abc.MetaPathFinder):
    """On while test files are collected: each loader runs with the profile hook off (a
    test module that imports another has pytest rewrite it; a repository module imports
    torch). A repository module's own body turns the hook on again as it starts."""

    def __init__(self, calls: ImportCalls) -> None:
        self.calls = calls
        self._finding = False

    def find_spec(self, name, path, target=None):
        if self._finding or not self.calls._on:
            return None
        self._finding = True
        try:
            spec = tracing.spec_from_others(self, name, path, target)
        finally:
            self._finding = False
        if spec is None:
            return None
        loader = spec.loader
        if loader is None or isinstance(loader, type) \
                or not callable(getattr(loader, "exec_module", None)):
            return spec  # a built-in or frozen module, or a namespace package: as it was
        original = loader.exec_module
        calls = self.calls

        def exec_module(module):
            off = calls.loader_starts()
            try:
                original(module)
            finally:
                if off:
                    calls.loader_ends()
                try:
                    del loader.exec_module  # the loader's own method again
                except AttributeError:
                    pass  # a nested import of the same loader put it back already

        loader.exec_module = exec_module  # type: ignore[method-assign]  # on purpose: the hook off while it runs
        return spec


def _take_tool(on_end: Callable[..., None]) -> int | None:
    """A free sys.monitoring tool id (the line recorder's are taken first), with `on_end`
    called on the PY_RETURN and PY_UNWIND events of the code objects it watches."""
    if monitoring is None:
        return None
    for tool in (3, 4, 5):
        if monitoring.get_tool(tool) is None:
            monitoring.use_tool_id(tool, "fastci-imports")
            monitoring.register_callback(tool, monitoring.events.PY_RETURN, on_end)
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, on_end)
            return tool
    return None
