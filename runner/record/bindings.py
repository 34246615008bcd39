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

Methods are reached through their class, not a name the test file binds: a test calls
`trainer.train_step()` on an object a fixture built. So while a test runs, a repository
class's method whose name the file uses only as the callee of an attribute call
(`x.train_step(...)`, never `x.train_step` alone) is bound, on its class, to a wrapper that
captures the calls made from that file and passes every other call (the repository's own
`self.train_step()`) straight through. It is unbound when the test ends. The capture keeps
the method by its module and qualified name, since pickling it by reference would find the
wrapper.
"""

from __future__ import annotations

import ast
import collections
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


def attributes_called_only(source: str) -> frozenset[str]:
    """The attribute names a test file uses only as the callee of a call (`x.step()`), never
    otherwise (`x.step`, `f(x.step)`, `x.step = ...`); special names (`__init__`) left out."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    callees = {id(node.func) for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    called: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            (called if id(node) in callees else other).add(node.attr)
    return frozenset(n for n in called - other if not n.startswith("__"))


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
        self._attributes: dict[str, frozenset[str]] = {}
        self._wrappers: dict[FunctionType | type, FunctionType] = {}
        self._methods: dict[tuple[type, str], _Method | None] = {}  # None: never bound
        # FASTCI_CAPTURE_METHODS=0 binds functions and classes only: what methods cost
        self.methods = os.environ.get("FASTCI_CAPTURE_METHODS") != "0"
        self._classes: dict[str, tuple[object, list[type]]] = {}  # module -> its classes
        # at how many modules, and the classes by the names in their namespace
        self._scanned: tuple[int, dict[str, list[type]]] = (-1, {})

    @contextmanager
    def wrapped(self, namespace: dict | None, filename: str | None) -> Iterator[int]:
        """While the block runs, `namespace`'s repository functions that the file only calls
        are bound to wrappers; yields how many."""
        swapped = self._swap(namespace, filename) if namespace is not None and filename else {}
        methods = self._swap_methods(filename) if namespace is not None and filename else []
        try:
            yield len(swapped) + len(methods)
        finally:
            for name, fn in swapped.items():
                if namespace.get(name) is self._wrappers.get(fn):  # type: ignore[union-attr]
                    namespace[name] = fn  # type: ignore[index]
            self._unswap_methods(methods, filename)  # type: ignore[arg-type]

    def bind(self, namespace: dict, filename: str, callers: tuple[str, ...] = ()) -> int:
        """Bind for good (a child's program, which ends with its process); how many. The
        program's methods capture calls from `filename` and from each of `callers` (the
        names its code runs under)."""
        return len(self._swap(namespace, filename)) + len(self._swap_methods(filename, callers))

    def _swap(self, namespace: dict, filename: str) -> dict[str, FunctionType | type]:
        names = _of_file(self._names, filename, called_only)
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

    def _swap_methods(self, filename: str, also: tuple[str, ...] = ()) -> list[_Method]:
        """Bind the repository's methods the file only calls (`x.name(...)`) to wrappers
        that capture the calls made from the file (or from `also`); which were bound."""
        names = _of_file(self._attributes, filename, attributes_called_only) \
            if self.methods else frozenset()
        if not names:
            return []
        index = self._classes_by_method()
        callers = (filename, *_real(filename), *also)
        bound = []
        for name in names:
            for cls in index.get(name, ()):
                method = self._method(cls, name)
                if method is not None and method.bind(callers):
                    bound.append(method)
        return bound

    def _unswap_methods(self, bound: list[_Method], filename: str) -> None:
        callers = (filename, *_real(filename))
        for method in bound:
            method.unbind(callers)

    def _method(self, cls: type, name: str) -> _Method | None:
        """The class's own method `name`, made ready to bind once; None where it is not a
        plain function a replay can find again by name."""
        key = (cls, name)
        if key not in self._methods:
            fn = vars(cls).get(name)
            self._methods[key] = _Method(cls, name, fn, self._call) \
                if isinstance(fn, FunctionType) and self.capturable(fn) \
                and not _is_module(cls) else None
        return self._methods[key]

    def _classes_by_method(self) -> dict[str, list[type]]:
        """Method name -> the classes defined at the top of the repository's modules
        imported so far (test files and conftest.py files left out) whose own namespace has
        it. Each module is looked at once, and the modules again only once more are imported:
        a test's set-up then pays microseconds, not the 170 µs a walk over torch's 1,250
        modules takes."""
        from fastci.runner.analysis.discover import is_test_code  # noqa: PLC0415

        if self._scanned[0] == len(sys.modules):
            return self._scanned[1]
        index: dict[str, list[type]] = collections.defaultdict(list)
        for name, module in list(sys.modules.items()):
            known = self._classes.get(name)
            if known is None or known[0] is not module:
                path = os.path.realpath(getattr(module, "__file__", None) or "")
                mine = path.startswith(self.root + os.sep) and "site-packages" not in path \
                    and not is_test_code(os.path.relpath(path, self.root))
                classes = [c for c in list(vars(module).values()) if isinstance(c, type)
                           and c.__module__ == name and "." not in c.__qualname__] \
                    if mine else []
                known = self._classes[name] = (module, classes)
            for cls in known[1]:
                for attribute in vars(cls):
                    index[attribute].append(cls)
        self._scanned = (len(sys.modules), index)
        return index

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


def _of_file(cache: dict[str, frozenset[str]], filename: str,
             names: Callable[[str], frozenset[str]]) -> frozenset[str]:
    found = cache.get(filename)
    if found is None:
        try:
            with open(filename, encoding="utf-8") as f:
                found = names(f.read())
        except (OSError, UnicodeDecodeError):
            found = frozenset()
        cache[filename] = found
    return found


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


class _Method:
    """A repository method, and the wrapper that its class holds while one or more files'
    blocks bind it: it captures a call made directly from one of those files, and runs the
    method itself for any other caller."""

    def __init__(self, cls: type, name: str, fn: FunctionType,
                 call: Callable[..., object]) -> None:
        self.cls, self.name, self.fn = cls, name, fn
        self.callers: collections.Counter = collections.Counter()
        callers, reference = self.callers, (fn.__module__, fn.__qualname__)
        # looked up again at each bind: torch may be imported after the first
        self.compiling = compiling = [_compiling_check()]

        @functools.wraps(fn)
        def captured(*args, **kwargs):
            # First, alone: torch.compile traces this wrapper when compiled code calls the
            # method, and its fullgraph mode fails on what it cannot trace (sys._getframe).
            if compiling[0]() or callers[sys._getframe(1).f_code.co_filename] <= 0:
                return fn(*args, **kwargs)
            return call(fn, args, kwargs, reference)

        self.wrapper = captured

    def bind(self, callers: tuple[str, ...]) -> bool:
        """Capture the calls from `callers` too; False where the class no longer holds the
        method (a test replaced it) or refuses the wrapper (a metaclass)."""
        held = vars(self.cls).get(self.name)
        self.compiling[0] = _compiling_check()
        if held is self.fn:
            try:
                setattr(self.cls, self.name, self.wrapper)
            except (AttributeError, TypeError):
                return False
        elif held is not self.wrapper:
            return False
        self.callers.update(callers)
        return True

    def unbind(self, callers: tuple[str, ...]) -> None:
        self.callers.subtract(callers)
        if +self.callers:
            return  # another file's block still binds it
        self.callers.clear()
        if vars(self.cls).get(self.name) is self.wrapper:
            setattr(self.cls, self.name, self.fn)


def _is_module(cls: type) -> bool:
    """An nn.Module's calls are captured as module calls (`capture.py`), and torch reads
    its methods' code and globals itself (`torch.jit.script` resolves names through the
    function's globals, a wrapper's being FastCI's): its methods are left alone."""
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    return nn is not None and issubclass(cls, nn.Module)


@functools.lru_cache(maxsize=4096)
def _real(filename: str) -> tuple[str, ...]:
    """The file's real path where it is another name (a realpath is 10 µs of lstat calls,
    paid twice per test file per test without the cache)."""
    real = os.path.realpath(filename)
    return (real,) if real != filename else ()


def _compiling_check() -> Callable[[], bool]:
    """torch.compiler.is_compiling where torch is imported (what torch.compile's tracer
    answers True to), else a check that is always False."""
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)
