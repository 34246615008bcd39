"""Process-wide hooks that see what a test touches beyond Python lines.

`sys.addaudithook` hooks cannot be removed, so one hook is installed once and forwards to
whichever recorder is active. The hook runs on every `open` in the process: it does the
least it can (a prefix test on the path) and hashes nothing until the session ends.
"""

from __future__ import annotations

import dis
import functools
import importlib
import importlib.abc
import inspect
import os
import stat
import sys
import sysconfig
from importlib.util import find_spec
from types import FrameType, FunctionType, ModuleType
from typing import TYPE_CHECKING, Any, Callable, ContextManager

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

_sink: Callable[[str, str], None] | None = None
_exec_sink: Callable[[object], None] | None = None
_installed = False
_SKIP_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pyd")


def _audit(event: str, args: tuple) -> None:
    if event == "exec":  # a module body (or other code) about to run
        on_exec = _exec_sink
        if on_exec is not None and args:
            on_exec(args[0])
        return
    sink = _sink
    if sink is None:
        return
    if event in _SPAWNS:
        sink("spawn", _describe_spawn(event, args))
        return
    seen = file_event(event, args)
    if seen is not None:
        sink(*seen)


def file_event(event: str, args: tuple) -> tuple[str, str] | None:
    """What an audited event says a process read: ("open", path) for a file opened to read,
    ("list", path) for a folder listed; None for any other event, a file written (its
    contents are not a dependency) or a file descriptor (no path to name). The recorder and
    a child (`child.py`, which has its own hook) read the events alike through this."""
    if event == "open":
        path = args[0] if args else None
        mode = args[1] if len(args) > 1 else None
        if isinstance(path, int) or path is None:
            return None
        if isinstance(mode, str) and ("w" in mode or "a" in mode or "x" in mode) \
                and "+" not in mode:
            return None
        return "open", os.fsdecode(path)
    if event in ("os.listdir", "os.scandir"):
        path = args[0] if args else "."
        if isinstance(path, int):
            return None
        return "list", "." if path is None else os.fsdecode(path)
    return None


def evidence_of(kind: str, path: str, root: str) -> tuple[str, str] | None:
    """Which evidence a file event is (`file_event`'s, or a stat probe's "probe" and
    "absent"), with the path made absolute and normal: "files" (a data file, or a
    repository Python file read as text, opened or asked about), "folders" (a folder asked
    about), "absent" (a path looked for and not found, which a change may add) or "listed"
    (a folder's entries read); None when it is no evidence. One answer for the recorder and
    for a child, so a read counts the same wherever it happens."""
    full = path if path.startswith("/") else os.path.join(os.getcwd(), path)
    if kind == "list":
        full = os.path.normpath(full)
        return ("listed", full) if full == root or full.startswith(root + os.sep) else None
    if kind == "absent":
        return ("absent", os.path.normpath(full)) if may_appear(full, root) else None
    # A repository Python file counts when code opened it or asked about it
    # (`os.path.isfile("legacy.py")`), not when an import looked for it.
    if not (wants(full, root) or wants_source(full, root)):
        return None
    if is_file(full):
        return "files", os.path.normpath(full)
    if kind == "probe":
        return ("folders", os.path.normpath(full)) if is_dir(full) else None
    if not lexists(full) and opened_by_test():  # an open that failed: the file may appear
        return "absent", os.path.normpath(full)
    return None


# -- os.stat: a file asked about, never opened ----------------------------------------------
# Python raises no audit event for stat, and the kernel no file event. A test that learns a
# data file's size (`os.path.getsize` of a token file) or whether a path exists (an override
# file, a cache someone may add) depends on it all the same. While recording, os.stat,
# os.lstat and os.access (what os.path.exists, getsize, isfile, glob and pathlib's exists,
# stat and is_file call) report a question about a path under the repository to the sink:
# "probe" for a path that answered, "absent" for one that did not exist. importlib stats
# through the posix module, which stays as it is: imports cost nothing more.
_probe_sink: Callable[[str, str], None] | None = None
_probe_root = "\0"
_stat_originals: dict[str, Callable] = {}


def _probing(name: str, original: Callable) -> Callable:
    missing = (FileNotFoundError, NotADirectoryError)

    def probe(path, *args, **kwargs):
        sink = _probe_sink
        if sink is None or isinstance(path, int) or kwargs.get("dir_fd") is not None:
            return original(path, *args, **kwargs)
        try:
            answer = original(path, *args, **kwargs)
        except missing:
            _asked(sink, path, "absent")
            raise
        if answer is False:  # os.access: no such path, or no permission
            try:
                _stat_originals["lstat"](path)
            except missing:
                _asked(sink, path, "absent")
            except OSError:
                pass
            return answer
        _asked(sink, path, "probe")
        return answer

    probe.__wrapped__ = original  # type: ignore[attr-defined]  # as functools.wraps
    probe.__name__ = probe.__qualname__ = name
    probe.__doc__ = original.__doc__
    return probe


def _asked(sink: Callable[[str, str], None], path, kind: str) -> None:
    try:
        full = os.fsdecode(os.fspath(path))
    except TypeError:
        return
    if not full.startswith("/"):
        full = os.path.join(os.getcwd(), full)
    if full.startswith(_probe_root) and not os.path.basename(full).startswith("<") and \
            _probe_counts(_getframe(2)):
        sink(kind, full)


def _probe_counts(frame: FrameType | None) -> bool:
    """A question counts unless tooling asked it (pytest finding conftest files, coverage
    resolving a file name, FastCI itself), or the standard library looked up a module's
    file (linecache and inspect, for a warning, a traceback or `inspect.getmodule`; the
    import system scanning `sys.path`)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in _display_files or filename in _probe_quiet or \
                filename.startswith(_helper_dirs):
            return False
        if not (filename.startswith(_stdlib) or filename.startswith("<frozen")) or \
                filename.startswith(_site_packages):
            return not (filename in _tool_files or filename.startswith(_tool_dirs))
        frame = frame.f_back
    return False


def _opener(frame: FrameType | None) -> FrameType | None:
    """The frame that made the open the audit hook saw: past FastCI's own frames (the
    hook that asks, and what it called), up to and including `_audit`. What called the
    hook opened the file, FastCI's own code too (capture reading a source to bind names):
    that is tooling, not a test's read."""
    ours = _tool_dirs[0] if _tool_dirs else "\0"
    while frame is not None and frame.f_code.co_filename.startswith(ours):
        skipped, frame = frame, frame.f_back
        if skipped.f_code.co_name == "_audit":
            break
    return frame


def opened_by_test() -> bool:
    """For a sink the audit hook called on an open: whether the code that opened counts
    (`_probe_counts`)."""
    return _probe_counts(_opener(_getframe(1)))


def probe_files(root: str, sink: Callable[[str, str], None] | None) -> None:
    """Report stat questions about paths under `root` to `sink(kind, path)`; None stops."""
    global _probe_sink, _probe_root
    if not _stat_originals:
        for name in ("stat", "lstat", "access"):
            original = _stat_originals[name] = getattr(os, name)
            setattr(os, name, _probing(name, original))
    _probe_root = root.rstrip("/") + "/"
    if sink is not None and not _tool_dirs:
        _locate()
    _probe_sink = sink


def lexists(path: str) -> bool:
    """os.path.lexists without asking the probes."""
    try:
        _stat_originals.get("lstat", os.lstat)(path)
    except (OSError, ValueError):
        return False
    return True


def is_file(path: str) -> bool:
    """os.path.isfile without asking the probes (the recorder's own question)."""
    try:
        return stat.S_ISREG(_stat_originals.get("stat", os.stat)(path).st_mode)
    except (OSError, ValueError):
        return False


def is_dir(path: str) -> bool:
    """os.path.isdir without asking the probes."""
    try:
        return stat.S_ISDIR(_stat_originals.get("stat", os.stat)(path).st_mode)
    except (OSError, ValueError):
        return False


_raw_start: Callable | None = None


def trace_raw_threads() -> None:
    """Give a thread started with `_thread.start_new_thread` the tracer `threading` gives its
    own (`threading.settrace`'s hook, which coverage.py sets): started from `threading`, a
    thread runs the hook first; started raw, its lines went unrecorded. Installed once, for
    the process; with no hook set it only calls through."""
    global _raw_start
    import _thread  # noqa: PLC0415

    if _raw_start is not None:
        return
    original = _raw_start = _thread.start_new_thread

    def start_new_thread(function, args, kwargs=None):
        def traced(*a, **k):
            hook = getattr(sys.modules.get("threading"), "_trace_hook", None)
            if hook is not None and sys.gettrace() is None:
                sys.settrace(hook)
            return function(*a, **k)

        return original(traced, args, {} if kwargs is None else kwargs)

    start_new_thread.__doc__ = original.__doc__
    _thread.start_new_thread = start_new_thread
    if getattr(_thread, "start_new", None) is original:
        _thread.start_new = start_new_thread


def trace_ctypes_callbacks(module) -> None:
    """A ctypes callback is Python that C code calls, on whichever thread that code runs:
    one it started itself (`pthread_create`, a library's worker pool) has no tracer, so on
    Python 3.11 what the callback ran went unrecorded. Each Python callable made into a C
    function pointer through `CFUNCTYPE` or `PYFUNCTYPE` is given the thread's hook as it
    starts (`_traced_hook`), as autograd's hooks are. Installed once, with ctypes (the
    function types those factories make are wrapped as they are made; one made before,
    or a `_CFuncPtr` subclass written by hand, is not)."""
    for name in ("CFUNCTYPE", "PYFUNCTYPE", "WINFUNCTYPE"):
        factory = getattr(module, name, None)
        if factory is not None and not getattr(factory, "fastci_traced", False):
            setattr(module, name, _marked(_traced_callbacks(factory, module)))


def _traced_callbacks(factory, ctypes):
    base = getattr(ctypes, "_CFuncPtr", None)

    @functools.wraps(factory)
    def make(*args, **kwargs):
        cls = factory(*args, **kwargs)
        if base is not None and not getattr(cls, "fastci_traced", False):
            def __new__(kind, *values, **options):
                if len(values) == 1 and callable(values[0]):
                    values = (_traced_hook(values[0]),)
                return base.__new__(kind, *values, **options)

            cls.__new__ = __new__  # the type is the factory's, cached: wrapped once
            cls.fastci_traced = True
        return cls

    return make


def trace_autograd_threads(module=None) -> None:  # noqa: ARG001 (`after_import`'s argument)
    """A backward runs Python on whichever thread the autograd engine picks: on a GPU, a
    device thread the engine started in C++, which `threading`'s hook never reaches, so its
    lines went unrecorded on Python 3.11. The Python it runs there: a custom
    `autograd.Function`'s backward, and the hooks a backward calls (a tensor's
    `register_hook` and post-accumulate-grad hooks, a module's backward hooks,
    `register_multi_grad_hook`, a `saved_tensors_hooks` unpack). Each is given the thread's
    hook as it starts, as `trace_raw_threads` does for raw threads. Installed once, once
    torch is imported; with no hook set (sys.monitoring records every thread) each only
    calls through.

    Each hook is wrapped where it is handed to torch (the engine calls it from C++, past any
    Python we could wrap). A module's full backward hooks and pre-hooks need none: torch
    calls them after its `BackwardHookFunction`'s backward, a custom Function, on the same
    thread. A registration torch does not offer in Python (`grad_fn.register_hook`, a C
    method) is not wrapped."""
    try:
        import torch  # noqa: PLC0415
        from torch.autograd.function import BackwardCFunction  # noqa: PLC0415
    except ImportError:
        return
    graph = sys.modules.get("torch.autograd.graph")
    module = sys.modules.get("torch.nn.modules.module")
    for owner, name, wrap in (
            (BackwardCFunction, "apply", _traced_hook),
            (torch.Tensor, "register_hook", _hooks_at(1, "hook")),
            (torch.Tensor, "register_post_accumulate_grad_hook", _hooks_at(1, "hook")),
            (graph, "register_multi_grad_hook", _hooks_at(1, "fn")),
            (getattr(graph, "saved_tensors_hooks", None), "__init__",
             _hooks_at(1, "pack_hook", 2, "unpack_hook")),
            (getattr(module, "_WrappedHook", None), "__call__", _traced_hook)):
        original = getattr(owner, name, None)
        if original is not None and not getattr(original, "fastci_traced", False):
            setattr(owner, name, _marked(wrap(original)))


def _hooks_at(*where):
    """For a registration whose hooks are these (position counting self, keyword) pairs."""
    positions = dict(zip(where[::2], where[1::2]))

    def wrap(registers):
        @functools.wraps(registers)
        def registering(*args, **kwargs):
            args = tuple(_traced_hook(a) if i in positions else a for i, a in enumerate(args))
            for key in positions.values():
                if key in kwargs:
                    kwargs[key] = _traced_hook(kwargs[key])
            return registers(*args, **kwargs)

        return registering

    return wrap


def _marked(fn):
    fn.fastci_traced = True
    return fn


def _traced_hook(hook):
    """`hook`, giving the thread it runs on the tracer first (also a method, `self` first)."""
    if not callable(hook) or getattr(hook, "fastci_traced", False):
        return hook

    @functools.wraps(hook)
    def traced(*args, **kwargs):
        _give_thread_the_hook()
        return hook(*args, **kwargs)

    return _marked(traced)


def _give_thread_the_hook() -> None:
    """This thread runs Python without a tracer (one native code started): give it
    coverage.py's, from `threading`'s hook, as `threading` gives its own threads."""
    hook = getattr(sys.modules.get("threading"), "_trace_hook", None)
    if hook is not None and sys.gettrace() is None and _from_coverage(hook):
        sys.settrace(hook)


def _from_coverage(hook) -> bool:
    """Whether `threading`'s hook is coverage.py's (which installs its line tracer), not a
    test's own `threading.settrace` profiler, which must not reach threads it never did."""
    owner = getattr(hook, "__self__", None)
    return type(owner).__module__.startswith("coverage.")


_SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.fork",
           "os.forkpty")
_PYTHON_LAUNCHERS = ("python", "torchrun", "pytest", "accelerate", "deepspeed")


def _describe_spawn(event: str, args: tuple) -> str:
    """What a test started, or "" for a child that cannot run the repository's Python code
    (git, nvidia-smi): only children that can are a gap in the evidence."""
    if event in ("os.fork", "os.forkpty"):
        return "a forked child (multiprocessing or os.fork)"
    try:
        executable = os.fsdecode(args[0]) if args and args[0] is not None else ""
        argv = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else []
        words = [executable, *(os.fsdecode(a) for a in argv[:2] if isinstance(a, (str, bytes)))]
    except (TypeError, ValueError):
        return f"a child process ({event})"
    names = [os.path.basename(w) for w in words if w]
    if any(n.startswith(_PYTHON_LAUNCHERS) for n in names) or sys.executable in words:
        return " ".join(w for w in words if w)[:200]
    return ""


def start(sink: Callable[[str, str], None]) -> None:
    """Route file events to `sink(kind, path)` until `stop()`."""
    global _sink, _installed
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True
    _sink = sink


def stop() -> None:
    global _sink
    _sink = None


def route_exec(callback: Callable[[object], None] | None) -> None:
    """Hand the code object of every `exec` (each module body as it is imported) to
    `callback` until it is None."""
    global _exec_sink, _installed
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True
    _exec_sink = callback


def spec_from_others(me: object, name: str, path, target=None) -> ModuleSpec | None:
    """The spec the finders on sys.meta_path other than `me` give for a module (None: no
    finder has it): a finder that wraps a module's loader finds the module this way."""
    for finder in sys.meta_path:
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, path, target)
        if spec is not None:
            return spec
    return None


def wants(path: str, root: str) -> bool:
    """A non-Python file under the repository, outside FastCI's and git's own folders."""
    return not path.endswith(_SKIP_SUFFIXES) and may_appear(path, root)


def may_appear(path: str, root: str) -> bool:
    """A path under the repository, outside FastCI's and git's own folders, whose appearing
    a test could notice: any kind of file, a Python module (a plugin found by its file) too."""
    if not path.startswith(root):
        return False
    rel = path[len(root):].lstrip("/")
    top = rel.split("/", 1)[0]
    return bool(rel) and top not in (".git", ".fastci") and "__pycache__" not in rel \
        and not rel.endswith((".pyc", ".pyo"))


class KernelHook:
    """Notes every Triton kernel launched, by the file and qualname of its Python source.

    On a GPU the kernel body never runs as Python, so line coverage cannot see it; the
    launch is the evidence, hashed with every jit function the kernel calls. Under
    TRITON_INTERPRET=1 the body does run as Python, through millions of calls into Triton's
    interpreter: line tracing is paused for the launch (the same evidence as on a GPU, and
    on examples/tinyllm it removed most of the recording overhead).
    """

    def __init__(self, on_launch: Callable[[str, str], None],
                 untraced: Callable[[], ContextManager[object]] | None = None) -> None:
        self.on_launch = on_launch
        self.untraced = untraced  # a context manager factory: no line tracing inside
        self._patched: list[tuple[type, str, Callable]] = []

    def install(self) -> bool:
        try:
            from triton.runtime import jit as triton_jit  # noqa: PLC0415 (triton is optional)
        except Exception:  # triton missing or broken: kernels are then seen by coverage only
            return False
        targets = [getattr(triton_jit, "JITFunction", None)]
        try:
            from triton.runtime import interpreter  # noqa: PLC0415 (triton is optional)
            targets.append(getattr(interpreter, "InterpretedFunction", None))
        except Exception:
            pass
        for cls in filter(None, targets):
            original = cls.__dict__.get("run")  # a grid launch; a jit call inside is not
            if original is not None:
                cls.run = self._wrap(original)
                self._patched.append((cls, "run", original))
        return bool(self._patched)

    def _wrap(self, original: Callable) -> Callable:
        on_launch, untraced = self.on_launch, self.untraced

        def launch(kernel, *args, **kwargs):
            fn: Any = getattr(kernel, "fn", None)  # the kernel's Python function
            code = getattr(fn, "__code__", None)
            if code is not None:
                on_launch(code.co_filename, getattr(fn, "__qualname__", fn.__name__))
            if untraced is None:
                return original(kernel, *args, **kwargs)
            with untraced():
                return original(kernel, *args, **kwargs)

        launch.__wrapped__ = original  # type: ignore[attr-defined]  # functions take attributes
        return launch

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._patched):
            setattr(cls, name, original)
        self._patched.clear()


# -- memoized repository functions ----------------------------------------------------------
# A cache hit returns a value without running the function's body, so line coverage credits
# the body only to the test that computed the value first. Hits are counted instead.

def _lru_type() -> type | None:
    return getattr(functools, "_lru_cache_wrapper", None)


NESTED_CLASSES = 8  # levels of classes in classes looked into for cached methods
WRAPPED_DEPTH = 16  # decorators followed through __wrapped__


class MemoWatch:
    """The functools.lru_cache / functools.cache wrappers of repository functions found in
    repository modules (module level and class level), and their hit counts around a test.

    `owner(code)` maps a function's code object to its (path, qualname) in the repository,
    or None for code outside it.
    """

    def __init__(self, owner: Callable[[object], tuple[str, str] | None]) -> None:
        self.owner = owner
        self.wrappers: list[tuple[object, tuple[str, str]]] = []
        self._ids: set[int] = set()
        self._seen: set[str] = set()
        self._count = -1
        self._before: list[tuple[int, int]] = []
        self._lru = _lru_type()

    def scan(self, modules: Callable[[], list]) -> None:
        """Look at modules not seen yet; `modules()` lists the repository's (name, module)."""
        if len(sys.modules) == self._count:
            return
        self._count = len(sys.modules)
        for name, module in modules():
            if name not in self._seen:
                self.rescan(name, module)

    def rescan(self, name: str, module) -> None:
        """Look at one module (again, after `importlib.reload` built new caches in it)."""
        self._seen.add(name)
        for value in list(_namespace(module).values()):
            self._consider(value)
            if isinstance(value, type) and value.__dict__.get("__module__") == name:
                self._members(value, name, depth=0)

    def _members(self, cls: type, module: str, depth: int) -> None:
        """A class's cached methods, also under a property (`@property` over a cache),
        classmethod or staticmethod, and in the classes nested in it."""
        for member in list(cls.__dict__.values()):
            if isinstance(member, property):
                for accessor in (member.fget, member.fset, member.fdel):
                    self._consider(accessor)
            else:
                self._consider(getattr(member, "__func__", member))
            if isinstance(member, type) and depth < NESTED_CLASSES and \
                    member.__dict__.get("__module__") == module:
                self._members(member, module, depth + 1)

    def _consider(self, value: object) -> None:
        # A user decorator over the cache (functools.wraps) hides it: follow __wrapped__.
        for _ in range(WRAPPED_DEPTH):
            if value is None or id(value) in self._ids or self._is_cache(value):
                break
            value = getattr(value, "__wrapped__", None) if type(value) is FunctionType \
                else None
        if value is None or id(value) in self._ids or not self._is_cache(value):
            return
        # A decorator under the cache: a hit skips its wrapper and the function it wraps,
        # so each repository function on the chain is credited.
        where = []
        wrapped = getattr(value, "__wrapped__", None)
        for _ in range(WRAPPED_DEPTH):
            code = getattr(wrapped, "__code__", None)
            if code is None:
                break
            owner = self.owner(code)  # by its code: functools.wraps copies the name
            if owner is not None:
                where.append(owner)
            wrapped = getattr(wrapped, "__wrapped__", None)
        if not where:
            return
        self._ids.add(id(value))
        self.wrappers.extend((value, w) for w in where)

    def _is_cache(self, value: object) -> bool:
        """functools' C cache wrapper, or its pure-Python stand-in."""
        return type(value) is self._lru or (type(value) is FunctionType and
                                             "cache_info" in value.__dict__)

    def begin(self) -> None:
        self._before = [_hits(w) for w, _ in self.wrappers]

    def end(self) -> set[tuple[str, str]]:
        """The functions whose cache answered during the test (wrappers found since `begin`
        count from zero hits, which is conservative); a cache cleared meanwhile counts too:
        `cache_clear()` zeroes the counts, so a hit before it would not show."""
        before = self._before
        out = set()
        for i, (wrapper, where) in enumerate(self.wrappers):
            hits, calls = _hits(wrapper)
            hits_before, calls_before = before[i] if i < len(before) else (0, 0)
            if hits > hits_before or calls < calls_before:  # a hit, or a cache_clear()
                out.add(where)
        return out


def _hits(wrapper) -> tuple[int, int]:
    """(hits, hits and misses) of a cache wrapper: `cache_clear()` sets both to zero."""
    try:
        info = wrapper.cache_info()
        return info.hits, info.hits + info.misses
    except Exception:  # a wrapper that no longer answers: count it as hit (selects more)
        return 1 << 62, 1 << 62


def _namespace(module) -> dict:
    """A module's dict without going through a recording module's attribute hook."""
    try:
        return object.__getattribute__(module, "__dict__")
    except Exception:
        return {}


# -- functools.cached_property --------------------------------------------------------------
# Reading a cached property computed earlier never calls the descriptor (the value sits in
# the instance dict and a non-data descriptor loses to it). While recording, the plugin puts
# a data-descriptor subclass in its place, early, so every read of a property defined in a
# repository class passes through `__get__` and is noted for the running context.

_property_reads: set | None = None  # functions whose cached value was read, this context
_original_cached_property: type[functools.cached_property[Any]] | None = None


def _make_recording_cached_property(base: type) -> type:
    class cached_property(base):  # noqa: N801 (the name it stands in for)
        __doc__ = base.__doc__
        __module__ = base.__module__

        def __get__(self, instance, owner=None):
            if instance is None:
                return self
            reads = _property_reads
            if reads is not None:
                reads.add(self.func)
            try:  # a hit, as the original answers it: straight from the instance dict
                return instance.__dict__[self.attrname]
            except (AttributeError, KeyError, TypeError):
                return super().__get__(instance, owner)  # base's, which computes it

        def __set__(self, instance, value):
            # What plain assignment did while this was a non-data descriptor.
            try:
                namespace = instance.__dict__
            except AttributeError:
                raise AttributeError(
                    f"{type(instance).__name__!r} object has no attribute "
                    f"{self.attrname!r}") from None
            namespace[self.attrname] = value

        def __delete__(self, instance):
            try:
                del instance.__dict__[self.attrname]
            except (AttributeError, KeyError):
                raise AttributeError(self.attrname) from None

    cached_property.__qualname__ = base.__qualname__
    return cached_property


def patch_cached_property() -> None:
    """Replace functools.cached_property (until `unpatch_cached_property`)."""
    global _original_cached_property
    if _original_cached_property is None:
        _original_cached_property = functools.cached_property
        recording = _make_recording_cached_property(_original_cached_property)
        functools.cached_property = recording  # type: ignore[misc, assignment]  # on purpose


def unpatch_cached_property() -> None:
    """Classes built meanwhile keep the subclass; with no sink it only reads the cache."""
    global _original_cached_property, _property_reads
    _property_reads = None
    if _original_cached_property is not None:
        functools.cached_property = _original_cached_property  # type: ignore[misc]  # restored
        _original_cached_property = None


# -- names read by string -------------------------------------------------------------------
# `getattr(importlib.import_module("pkg.mod"), "NAME")` reads NAME without the name ever
# appearing in source. While recording, repository modules get a ModuleType subclass whose
# attribute hook notes (module, name) for the running context, except where the static
# analysis already sees the read: `mod.NAME` or `from mod import NAME` written in a
# repository file. `mod.__dict__` and `vars(mod)` are noted as "__dict__" (the whole module).

_module_reads: set | None = None  # (module, name) read by string, this context
_static_ops: frozenset[int] = frozenset()
_repo_root = "\0"
_adopt: Callable[[ModuleType], None] | None = None
_loaded: Callable[[ModuleType], None] | None = None


class RecordingModule(ModuleType):
    """A repository module while recording: notes reads by string for the running test.

    On the hot path (a `mod.NAME` in repository code) it costs one frame look-up and one
    dict look-up of the call site: each site is classified once (`_site_kind`).
    """

    def __getattribute__(self, name):
        reads = _module_reads
        if reads is None:
            return ModuleType.__getattribute__(self, name)
        frame = _getframe(1)
        site = (id(frame.f_code), frame.f_lasti)  # a code object hashes by value: slow
        kind = _sites.get(site)
        if kind is None:
            kind = _sites[site] = _site_kind(frame)
        if kind == _TOOL:
            unseen = False
        elif kind == _SOURCE:
            unseen = name == "__dict__"
        else:
            unseen = name not in MACHINERY and (kind == _OTHER or _helper_read(frame))
        try:
            value = ModuleType.__getattribute__(self, name)
        except AttributeError:
            if unseen:
                reads.add((self, name))  # hasattr(mod, "X"): adding X changes the answer
            raise
        if unseen:
            reads.add((self, name))
        if type(value) is ModuleType and _adopt is not None:
            _adopt(value)  # a submodule reached by attribute: hooked before it is read
        return value


_getframe = sys._getframe
# The name read for a module importlib.import_module answered: evidence.IMPORTED (a child
# imports this module and little else).
IMPORTED = "<import>"
_sites: dict = {}  # (id of code, instruction offset) -> _TOOL | _SOURCE | _OTHER | _HELPER
_site_codes: list = []
_TOOL, _SOURCE, _OTHER, _HELPER = 0, 1, 2, 3
# Names the import system and every tool read from any module: never a value a test uses.
# Every other name counts, dunders included (`__all__` for a star import, `__version__`).
MACHINERY = frozenset({"__spec__", "__loader__", "__path__", "__file__", "__name__",
                       "__package__", "__cached__", "__builtins__", "__class__",
                       "__getattr__", "__dir__"})
# Tooling, by where its code is (never by a word in a path: a repository in a folder named
# `coverage`, or a module of its own named `inspect.py`, is not tooling): callers that look
# at modules to collect or report on them, FastCI's own recording code, and pickling, which
# finds a class or function by its name (torch.save of a captured call; multiprocessing
# sending a function to a child, whose own evidence or its fallback covers what it runs).
# Helpers (inspect, importlib with its entry points, linecache, traceback) read on behalf
# of a caller: they count when the first caller outside the standard library is the
# repository's own code (`_helper_read`).
_tool_dirs: tuple[str, ...] = ()
_tool_files: frozenset[str] = frozenset()
_helper_dirs: tuple[str, ...] = ()
_helper_files: frozenset[str] = frozenset()
_display_files: frozenset[str] = frozenset()  # show source lines: warnings, tracebacks
_probe_quiet: frozenset[str] = frozenset()  # look up modules' files: linecache, inspect
_compilers: tuple[str, ...] = ()  # read signatures to bind a launch or a trace: torch, triton
_stdlib = "\0"
_site_packages: tuple[str, ...] = ()


def _locate() -> None:
    """Where the tooling and the helpers are, from the modules' own specs."""
    global _tool_dirs, _tool_files, _helper_dirs, _helper_files, _stdlib, _site_packages
    global _display_files, _probe_quiet, _compilers
    def origin(name: str) -> list[str]:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            return []
        return [os.path.abspath(spec.origin)] if spec is not None and spec.origin else []

    def folder(name: str) -> list[str]:
        return [os.path.dirname(path) + os.sep for path in origin(name)]

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    _tool_dirs = (ours, *folder("_pytest"), *folder("pluggy"), *folder("coverage"))
    _tool_files = frozenset([*origin("pickle"), *origin("copyreg"),
                             *(path + "reduction.py" for path in folder("multiprocessing")),
                             *(path + "serialization.py" for path in folder("torch"))])
    _helper_dirs = tuple(folder("importlib"))
    _helper_files = frozenset([*origin("inspect"), *origin("linecache"),
                               *origin("traceback")])
    _display_files = frozenset([*origin("warnings"), *origin("traceback")])
    _probe_quiet = frozenset([*origin("linecache"), *origin("inspect")])
    _compilers = (*folder("torch"), *folder("triton"))
    paths = sysconfig.get_paths()
    _stdlib = os.path.abspath(paths["stdlib"]) + os.sep
    _site_packages = tuple(sorted({os.path.abspath(paths[key]) + os.sep
                                   for key in ("purelib", "platlib")}))


def _site_kind(frame) -> int:
    """_TOOL: tooling; _SOURCE: `mod.NAME` or `from mod import NAME` written in a repository
    file (the static analysis sees it); _HELPER: a helper's, decided per read by its caller;
    _OTHER: a read by string (getattr, vars, ...)."""
    code = frame.f_code
    _site_codes.append(code)  # kept alive, so its id is never reused while cached
    filename = code.co_filename
    if filename in _tool_files or filename.startswith(_tool_dirs):
        return _TOOL
    if filename.startswith("<frozen importlib") or filename in _helper_files or \
            filename.startswith(_helper_dirs):
        return _HELPER
    if filename.startswith(_repo_root) and code.co_code[frame.f_lasti] in _static_ops:
        return _SOURCE
    return _OTHER


def wants_source(path: str, root: str) -> bool:
    """A repository Python file opened as data, not imported: a test that reads a file's
    text (`inspect.getsource`, a license-header check, a version read with a regex) depends
    on all of it, comments and docstrings too, which its blocks' fingerprints leave out. It
    counts when the first caller outside the standard library and FastCI is repository code
    (not an import, not pytest rewriting a test file, not a library reading a kernel, not a
    warning or a traceback showing a source line)."""
    if not path.endswith(".py") or not path.startswith(root) or "__pycache__" in path:
        return False
    frame = _opener(_getframe(1))
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen importlib") or filename in _display_files:
            return False  # the import system loading a module; a warning or traceback shown
        if not (filename.startswith(_stdlib) or filename.startswith("<frozen")) \
                or filename.startswith(_site_packages):
            if filename.startswith("<"):
                return True  # code made from a string (`python -c`): the test's, as far as known
            return filename.startswith(_repo_root) and \
                not filename.startswith(_site_packages) and not filename.startswith(_tool_dirs)
        frame = frame.f_back
    return False


def _helper_read(frame) -> bool:
    """Whether a helper's read counts: it does when its first caller outside the standard
    library is repository code (a test's `inspect.getmembers(mod)`, an entry point's
    `load()`), not for pytest's introspection or a library's (Triton reading a kernel's
    source through inspect)."""
    frame = frame.f_back
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith("<frozen") or filename.startswith(_stdlib)) or \
                filename.startswith(_site_packages):
            return filename.startswith(_repo_root) and not filename.startswith(_site_packages) \
                and not filename.startswith(_tool_dirs)
        frame = frame.f_back
    return False


_original_import_module = None
_original_signature: Callable | None = None


def _signature_read(sigcls, func, *args, **kwargs):
    """inspect's signature of a plain function (what `inspect.signature` of a method, a
    bound method, a class's `__init__` or a wrapped function comes down to): the function's
    parameters are read, without its lines running. Counted like a cached property read, so
    the test depends on the function as a whole, unless tooling asked (pytest finding a
    test's fixtures) or a module body is running (a decorator at import: the def's header is
    the module's own, `changes.py` gives module-level functions a changed name for it).
    Nor when torch or Triton asked: they read a signature to bind a kernel launch's
    arguments or to trace the function, and the launch or the trace is evidence already."""
    reads = _property_reads
    if reads is not None and type(func) is FunctionType and \
            getattr(func.__code__, "co_filename", "").startswith(_repo_root) and \
            _signature_counts(_getframe(1)):
        reads.add(func)
    return _original_signature(sigcls, func, *args, **kwargs)  # type: ignore[misc]


def _signature_counts(frame: FrameType | None) -> bool:
    outside = False  # past the standard library: the first caller there was not tooling
    while frame is not None:
        filename = frame.f_code.co_filename
        if frame.f_code.co_name == "<module>" and filename.startswith(_repo_root):
            return False  # import time
        if not outside and (filename.startswith(_site_packages) or not (
                filename.startswith(_stdlib) or filename.startswith("<frozen"))):
            if filename in _tool_files or filename.startswith(_tool_dirs) or \
                    filename.startswith(_compilers):
                return False
            outside = True
        frame = frame.f_back
    return True


class _HookOnImport(importlib.abc.MetaPathFinder):
    """Hands each repository module to `_adopt` as its body ends, before the import that
    asked for it goes on: a star import that imports a module first reads its `__all__` and
    names through the hook, and so does a child process that imports the repository."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, name, path, target=None):
        if self._finding or _adopt is None:
            return None
        self._finding = True
        try:
            spec = spec_from_others(self, name, path, target)
        finally:
            self._finding = False
        origin = getattr(spec, "origin", None)
        if spec is None or not isinstance(origin, str) or not origin.startswith(_repo_root):
            return spec
        loader = spec.loader
        if loader is None or isinstance(loader, type) \
                or not callable(getattr(loader, "exec_module", None)):
            return spec
        original = loader.exec_module

        def exec_module(module):
            try:
                original(module)
            finally:
                try:
                    del loader.exec_module  # the loader's own method again
                except AttributeError:
                    pass  # another finder's wrapper put it back already
            # Hooked once its body has run, before the import statement that asked for it
            # reads from it: reads the body itself made (`@dataclass` looking at the
            # module's namespace) are the module's own, not a test's.
            adopt = _adopt
            if adopt is not None and type(module) is ModuleType:
                adopt(module)
            loaded = _loaded
            if loaded is not None:
                loaded(module)  # a first import or a reload: its caches are new

        loader.exec_module = exec_module  # type: ignore[method-assign]  # on purpose: adopts first
        return spec


_hook_on_import = _HookOnImport()


def start_reading(root: str, adopt: Callable[[ModuleType], None],
                  loaded: Callable[[ModuleType], None] | None = None) -> None:
    """Hook reads by string until `stop_reading`; `adopt(module)` hooks a repository module
    (importlib.import_module's answers are adopted before the caller reads from them, and
    modules imported from now on as they are created); `loaded(module)` is told when a
    repository module's body has run, on its first import or on `importlib.reload`."""
    global _static_ops, _repo_root, _adopt, _loaded, _original_import_module
    global _original_signature
    if _original_import_module is None:
        original = _original_import_module = importlib.import_module

        def import_module(name, package=None):
            module = original(name, package)
            if _adopt is not None and type(module) is ModuleType:
                _adopt(module)
            reads = _module_reads
            if reads is not None and type(module) is RecordingModule:
                # Imported by name: what its body did at import (a plugin registering itself)
                # is what the caller asked for, even when an earlier test ran that body. Not
                # pytest importing a test file, nor any other tool.
                caller = _getframe(1).f_code.co_filename
                if not (caller in _tool_files or caller.startswith(_tool_dirs)):
                    reads.add((module, IMPORTED))
            return module

        import_module.__wrapped__ = original  # type: ignore[attr-defined]  # as functools.wraps
        import_module.__doc__ = original.__doc__
        importlib.import_module = import_module

    if _original_signature is None and \
            callable(getattr(inspect, "_signature_from_function", None)):
        _original_signature = inspect._signature_from_function  # type: ignore[attr-defined]
        inspect._signature_from_function = _signature_read  # type: ignore[attr-defined]
    _static_ops = frozenset(dis.opmap[n] for n in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM",
                                                  "IMPORT_NAME", "STORE_ATTR", "DELETE_ATTR")
                            if n in dis.opmap)
    _repo_root = root.rstrip("/") + "/"
    _adopt = adopt
    _loaded = loaded
    _locate()
    if _hook_on_import not in sys.meta_path:
        sys.meta_path.insert(0, _hook_on_import)


def set_context(module_reads: set | None, property_reads: set | None) -> None:
    """Route reads by string and cached-property reads to the running context's sets."""
    global _module_reads, _property_reads
    _module_reads = module_reads
    _property_reads = property_reads


class Reached:
    """What a child process reaches without running lines, for its evidence file: names it
    reads by string, its cache hits (a fork of the recording process watches the caches the
    recorder found; another process the ones it finds itself) and the cached properties it
    reads."""

    def __init__(self, root: str, memo: MemoWatch | None = None,
                 modules: Callable[[], list] | None = None) -> None:
        self.root = root
        self.memo = memo
        self.modules = modules  # with a memo of this process's own: the modules it watches
        self.module_reads: set = set()
        self.property_reads: set = set()

    def restart(self) -> None:
        """Count from here (a fork's parent reached the rest) into this process's own sets."""
        self.module_reads, self.property_reads = set(), set()
        set_context(self.module_reads, self.property_reads)
        if self.memo is not None:
            self._scan()
            self.memo.begin()

    def _scan(self) -> None:
        """Find the caches of modules imported since the last look (a cache found after
        `begin` counts its hits from zero: more, never less)."""
        if self.memo is not None and self.modules is not None:
            self.memo.scan(self.modules)

    def report(self) -> dict[str, list[tuple[str, str]]]:
        """{"reads": (module file, name) read by string, "credited": (file, qualname) of
        functions whose cache answered or whose cached property was read}, files absolute."""
        reads = set()
        for module, name in self.module_reads:
            filename = _namespace(module).get("__file__")
            if isinstance(filename, str) and name not in MACHINERY:
                reads.add((filename, name))
        credited = set()
        if self.memo is not None:
            self._scan()
            credited = {(os.path.join(self.root, path), qualname)
                        for path, qualname in self.memo.end()}
        for func in self.property_reads:
            code = getattr(func, "__code__", None)
            if code is not None:
                credited.add((code.co_filename, getattr(func, "__qualname__", code.co_name)))
        return {"reads": sorted(reads), "credited": sorted(credited)}


def stop_reading(modules: list[ModuleType]) -> None:
    global _module_reads, _adopt, _loaded, _original_import_module, _original_signature
    _module_reads = None
    _adopt = _loaded = None
    if _hook_on_import in sys.meta_path:
        sys.meta_path.remove(_hook_on_import)
    if _original_import_module is not None:
        importlib.import_module = _original_import_module
        _original_import_module = None
    if _original_signature is not None:
        inspect._signature_from_function = _original_signature  # type: ignore[attr-defined]
        _original_signature = None
    for module in modules:
        if type(module) is RecordingModule:
            module.__class__ = ModuleType  # type: ignore[assignment]  # a plain module again
    _sites.clear()
    _site_codes.clear()
