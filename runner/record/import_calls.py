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
A third-party module first imported from a repository module body is profiled with it
(torch: its import takes about twice as long then, once per session).
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from typing import Any, Callable, Mapping

from fastci.runner.record import tracing

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
        self._on = False
        self.skipped = ""  # why the hook could not be installed, if it could not

    def follow(self, context: str) -> None:
        """The recorder switched context: watch module bodies in collection contexts only."""
        if context.startswith("collect:"):
            self._current = self.calls[context]
            tracing.route_exec(self._body_starts)
            self._tell(False)
        else:
            self.stop()

    def _tell(self, inside: bool) -> None:
        if self.window is not None:
            self.window(inside)

    def stop(self) -> None:
        tracing.route_exec(None)
        self._bodies.clear()
        self._current = None
        if self._on:
            sys.setprofile(None)
            self._on = False

    def _body_starts(self, code) -> None:
        """An `exec` is about to run `code`: profile while a repository module body runs."""
        if self._current is None or getattr(code, "co_name", None) != "<module>" \
                or self._path(getattr(code, "co_filename", "")) is None:
            return
        if not self._on:
            if sys.getprofile() is not None:  # someone else profiles: leave them be (the
                self.skipped = "another profiler was active"  # lines stay outside)
                return
            self._on = True
            sys.setprofile(self._profile)
            self._tell(True)
        self._bodies.append(code)

    def _profile(self, frame, event, arg) -> None:  # noqa: ARG002 (the profiler's signature)
        if event == "return":
            if self._bodies and frame.f_code is self._bodies[-1]:
                self._bodies.pop()
                if not self._bodies:
                    sys.setprofile(None)
                    self._on = False
                    self._tell(False)
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

    def _path(self, co_filename: str) -> str | None:
        if co_filename in self._files:
            return self._files[co_filename]
        path = None
        if co_filename and not co_filename.startswith("<"):
            real = os.path.realpath(os.path.abspath(co_filename))
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
