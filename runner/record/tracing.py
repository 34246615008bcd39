"""Process-wide hooks that see what a test touches beyond Python lines.

`sys.addaudithook` hooks cannot be removed, so one hook is installed once and forwards to
whichever recorder is active. The hook runs on every `open` in the process: it does the
least it can (a prefix test on the path) and hashes nothing until the session ends.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

_sink: Callable[[str, str], None] | None = None
_installed = False
_SKIP_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pyd")


def _audit(event: str, args: tuple) -> None:
    sink = _sink
    if sink is None:
        return
    if event == "open":
        path = args[0]
        mode = args[1] if len(args) > 1 else None
        if isinstance(path, int) or path is None:
            return
        if isinstance(mode, str) and ("w" in mode or "a" in mode or "x" in mode) \
                and "+" not in mode:
            return  # writing a file does not make a test depend on its contents
        sink("open", os.fsdecode(path))
    elif event in _SPAWNS:
        sink("spawn", _describe_spawn(event, args))
    elif event in ("os.listdir", "os.scandir"):
        path = args[0] if args else "."
        if isinstance(path, int):
            return
        sink("list", os.fsdecode(path) if path is not None else ".")


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


def wants(path: str, root: str) -> bool:
    """A non-Python file under the repository, outside FastCI's and git's own folders."""
    if not path.startswith(root) or path.endswith(_SKIP_SUFFIXES):
        return False
    rel = path[len(root):].lstrip("/")
    top = rel.split("/", 1)[0]
    return bool(rel) and top not in (".git", ".fastci") and "__pycache__" not in rel


class KernelHook:
    """Notes every Triton kernel launched, by the file and qualname of its Python source.

    On a GPU the kernel body never runs as Python, so line coverage cannot see it; the
    launch is the evidence, hashed with every jit function the kernel calls. Under
    TRITON_INTERPRET=1 the body does run as Python, through millions of calls into Triton's
    interpreter: line tracing is paused for the launch (the same evidence as on a GPU, and
    on examples/tinyllm it removed most of the recording overhead).
    """

    def __init__(self, on_launch: Callable[[str, str], None],
                 untraced: Callable[[], object] | None = None) -> None:
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
            from triton.runtime import interpreter  # noqa: PLC0415
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
            fn = getattr(kernel, "fn", None)
            code = getattr(fn, "__code__", None)
            if code is not None:
                on_launch(code.co_filename, getattr(fn, "__qualname__", fn.__name__))
            if untraced is None:
                return original(kernel, *args, **kwargs)
            with untraced():
                return original(kernel, *args, **kwargs)

        launch.__wrapped__ = original
        return launch

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._patched):
            setattr(cls, name, original)
        self._patched.clear()
