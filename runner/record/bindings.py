"""Which repository functions a test module calls, so their calls can be captured for pruning.

A plain function has no `Module.__call__` to wrap. What a test calls it through is a name in
its test module's namespace (`from pkg.sched import lr_at`), so while the test runs that
name is bound to a capturing wrapper, and unbound after. The repository's own modules are
never touched: calls between its functions, and every function's identity there, stay as
they were.

A wrapper is not the function: `fn is registry["x"]` would turn false, and a test that
passes `fn` on (a callback, a registry) would hand out the wrapper. So a name is wrapped
only when every use of it in the test file is a call (`lr_at(...)`); one use of any other
kind (`is lr_at`, `apply(lr_at)`, `lr_at.__name__`) leaves the name alone, and its calls
are not captured. Generator and coroutine functions are left alone too: their body runs
after the call returns, outside what a replay of the call would see. A repository class the
file only calls (`Trainer(cfg)`, never `isinstance(x, Trainer)`) is wrapped the same way: its
construction is a call whose result the replay compares whole.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FunctionType


def called_only(source: str) -> frozenset[str]:
    """The global names a test file uses only as the callee of a call."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    callees: set[int] = set()
    annotations: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            callees.add(id(node.func))
        # An annotation (`-> Trainer`) is no use at a call's time: evaluated as the file is
        # defined, before any binding, or never (`from __future__ import annotations`).
        for part in _annotations_of(node):
            annotations.update(id(n) for n in ast.walk(part))
    called: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in annotations:
            continue
        if isinstance(node, ast.Name):
            (called if id(node) in callees else other).add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            other.update(node.names)
    return frozenset(called - other)


def _annotations_of(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.returns] if node.returns is not None else []
    if isinstance(node, ast.arg):
        return [node.annotation] if node.annotation is not None else []
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


class CallBindings:
    """Per test file: which of its names to wrap, and the wrapping itself."""

    def __init__(self, root: str, call: Callable[..., object]) -> None:
        self.root = root
        self._call = call  # call(fn, args, kwargs): the capture
        self._names: dict[str, frozenset[str]] = {}
        self._wrappers: dict[FunctionType | type, FunctionType] = {}

    @contextmanager
    def wrapped(self, namespace: dict | None, filename: str | None) -> Iterator[int]:
        """While the block runs, `namespace`'s repository functions that the file only calls
        are bound to wrappers; yields how many."""
        swapped = self._swap(namespace, filename) if namespace is not None and filename else {}
        try:
            yield len(swapped)
        finally:
            for name, fn in swapped.items():
                if namespace.get(name) is self._wrappers.get(fn):  # type: ignore[union-attr]
                    namespace[name] = fn  # type: ignore[index]

    def bind(self, namespace: dict, filename: str) -> int:
        """Bind for good (a child's program, which ends with its process); how many."""
        return len(self._swap(namespace, filename))

    def _swap(self, namespace: dict, filename: str) -> dict[str, FunctionType | type]:
        names = self._names.get(filename)
        if names is None:
            try:
                with open(filename, encoding="utf-8") as f:
                    names = called_only(f.read())
            except (OSError, UnicodeDecodeError):
                names = frozenset()
            self._names[filename] = names
        swapped: dict[str, FunctionType | type] = {}
        for name in names:
            fn = namespace.get(name)
            if not isinstance(fn, (FunctionType, type)) or not self.capturable(fn):
                continue
            if type(fn) is not FunctionType and not _constructible(fn):
                continue
            wrapper = self._wrappers.get(fn)
            if wrapper is None:
                wrapper = self._wrappers[fn] = _wrapper(fn, self._call)
            namespace[name] = wrapper
            swapped[name] = fn
        return swapped

    def capturable(self, fn: FunctionType | type) -> bool:
        """A function of a repository module (not a test file or conftest.py) that a replay
        can find again by its module and name, and whose body runs inside the call."""
        if "<locals>" in fn.__qualname__ or fn.__module__ in ("__main__", "__mp_main__"):
            return False  # a replay cannot find it again (its program is not the replay's)
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn) \
                or inspect.isasyncgenfunction(fn):
            return False
        module = sys.modules.get(fn.__module__)
        path = os.path.realpath(getattr(module, "__file__", None) or "")
        if not path.startswith(self.root + os.sep) or "site-packages" in path:
            return False
        from fastci.runner.analysis.discover import is_test_code  # noqa: PLC0415

        if is_test_code(os.path.relpath(path, self.root)):
            return False
        target: object = module
        for part in fn.__qualname__.split("."):
            target = getattr(target, part, None)
        return target is fn  # pickled by reference: the replay must resolve the same name


def _constructible(obj: type) -> bool:
    """A class whose construction is captured like a function's call (`Trainer(cfg)`): what
    its constructor built is compared whole, so a change to construction code (a default, a
    validation, a layer's set-up) can be proved not to change the object. Exceptions are
    left alone: raising one is not what a replay compares."""
    return not issubclass(obj, BaseException)


def _wrapper(fn: FunctionType | type, call: Callable[..., object]) -> FunctionType:
    # A class's own __dict__ (its methods) is not copied onto the wrapper.
    @functools.wraps(fn, updated=() if isinstance(fn, type) else functools.WRAPPER_UPDATES)
    def captured(*args, **kwargs):
        return call(fn, args, kwargs)

    return captured  # type: ignore[return-value]
