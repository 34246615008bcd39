"""Code torch runs without running its lines: what torch.compile traced and what
torch.jit.script compiled, per process.

Dynamo runs a compiled function's bytecode symbolically and then runs a graph: the line
recorders see neither the function's lines nor those of the functions it inlined, so a test
that only calls a repository function compiled would name none of it in its evidence, and a
change there would select nothing. Compiled code is also cached per code object, so the
test that compiles is not the only one that depends on it: a later test hits the cache and
runs the same graph without dynamo running at all.

So, once `torch._dynamo` is imported, this module:

- notes every context that enters compiled code (dynamo's `set_eval_frame` with a callback:
  every call of a `torch.compile`d function or module, cache hit or not);
- collects the code objects each compile traced (`TracingContext.traced_code`: the frame and
  every function inlined into it), and lets the recorder give each compile's own Python
  work (what AOTAutograd and the backend ran: a custom autograd.Function's backward, for
  one) a context of its own;
- and the recorder then credits every context that entered compiled code with all of it:
  every line of every traced code object and everything run while compiling, across the
  whole session. That is more than one test may have reached, never less, whatever the
  order in which tests filled or hit the cache.

torch.jit.script is the same story told by TorchScript: it compiles a function's source (and,
recursively, every function and method it calls) and runs it in its own interpreter, with a
cache of its own. Every `torch.jit.script` call counts as an entry, and every function
TorchScript parsed (`torch.jit.frontend.parse_def`) as traced code. A scripted function
that a test only calls is covered through the context that scripted it: at import (a
`@torch.jit.script` decorator) the import-time rules select its importers' tests.

Where this torch offers no such hooks, `unseen()` says why, and the tests that may have
run compiled code are selected on any code change. The hooks are installed once per
process and forward to whichever sink is active, as tracing.py's audit hook does.
"""

from __future__ import annotations

import functools
import sys
from types import CodeType, ModuleType
from typing import Callable

# Called as code runs compiled: with COMPILE or SCRIPT, and the file of what runs ("": unknown).
_on_enter: Callable[[str, str], None] | None = None
_on_compile: Callable[[bool], None] | None = None  # True as a compile starts, False as it ends
_traced: list[list[CodeType]] = []  # each compile's traced_code (filled while it compiles)
_scripted: list[CodeType] = []  # every function TorchScript parsed
_entry_hooked = False
_traced_hooked = False
_installed = False


COMPILE, SCRIPT = "torch.compile", "torch.jit.script"


def start(on_enter: Callable[[str, str], None], on_compile: Callable[[bool], None]) -> None:
    """Route this process's compiled-code events to a recorder (hooks installed once torch's
    dynamo is imported: importing it costs seconds, and most suites never do)."""
    global _on_enter, _on_compile
    _on_enter, _on_compile = on_enter, on_compile


def stop() -> None:
    global _on_enter, _on_compile
    _on_enter = _on_compile = None


def unseen() -> str:
    """Why compiled code may have run unseen in this process, or "" when the hooks see it."""
    if not _installed:
        return ""
    if not _entry_hooked:
        return "torch.compile ran, and this torch's dynamo entry could not be hooked"
    if not _traced_hooked:
        return "torch.compile ran, and this torch does not say which code dynamo traced"
    return ""


def install(dynamo: ModuleType) -> None:
    """Hook dynamo (called once `torch._dynamo` is imported)."""
    global _installed, _entry_hooked, _traced_hooked
    if _installed:
        return
    _installed = True
    _entry_hooked = _hook_entry(getattr(dynamo, "eval_frame", None))
    _traced_hooked = _hook_traced_code()
    _hook_compiles(dynamo)


def traced_lines(kind: str) -> dict[str, set[int]]:
    """co_filename -> every line of every code object TorchScript parsed in this process,
    and for COMPILE also every one dynamo traced (compiled code may call scripted code;
    scripting runs nothing compiled), nested code objects included, so far."""
    out: dict[str, set[int]] = {}
    seen: set[int] = set()
    for codes in (*(_traced if kind == COMPILE else ()), _scripted):
        for code in codes:
            _add_lines(code, out, seen)
    return out


def _add_lines(code: CodeType, out: dict[str, set[int]], seen: set[int]) -> None:
    if id(code) in seen:
        return
    seen.add(id(code))
    lines = {line for _, _, line in code.co_lines() if line is not None}
    if code.co_name != "<lambda>" and len(lines) > 1:
        lines.discard(code.co_firstlineno)  # the def (or decorator) line: the enclosing block's
    out.setdefault(code.co_filename, set()).update(lines)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            _add_lines(const, out, seen)


def install_script(jit: ModuleType) -> None:
    """Hook TorchScript (called once `torch.jit` is imported, which `import torch` does).
    Best effort: where this torch's TorchScript cannot be hooked, scripted code stays unseen
    (README, Known limits)."""
    frontend = getattr(jit, "frontend", None)
    parse = getattr(frontend, "parse_def", None)
    if parse is not None and not getattr(parse, "_fastci_script", False):
        def parse_def(fn, *args, **kwargs):
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if isinstance(code, CodeType):
                _scripted.append(code)
            return parse(fn, *args, **kwargs)

        parse_def._fastci_script = True  # type: ignore[attr-defined]
        frontend.parse_def = parse_def  # type: ignore[union-attr]
    script = getattr(jit, "script", None)
    if script is not None and not getattr(script, "_fastci_script", False):
        @functools.wraps(script)
        def scripted(obj, *args, **kwargs):
            on_enter = _on_enter
            if on_enter is not None:
                on_enter(SCRIPT, _origin(obj))  # torch scripts its own functions as it imports
            return script(obj, *args, **kwargs)

        scripted._fastci_script = True  # type: ignore[attr-defined]
        for module in (jit, getattr(jit, "_script", None)):
            if getattr(module, "script", None) is script:
                module.script = scripted  # type: ignore[union-attr]


def _origin(obj: object) -> str:
    """The file that defines what is being scripted (a function, method, class or module
    instance), or "" when it cannot be told."""
    target = getattr(obj, "__func__", obj)
    code = getattr(target, "__code__", None)
    if isinstance(code, CodeType):
        return code.co_filename
    cls = target if isinstance(target, type) else type(target)
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    filename = getattr(module, "__file__", None)
    return filename if isinstance(filename, str) else ""


# -- the hooks -----------------------------------------------------------------------------
def _hook_entry(eval_frame: ModuleType | None) -> bool:
    """Wrap the functions dynamo's wrappers call to turn frame evaluation on: a call with a
    callback is an entry into compiled code (they are looked up in the module at each call)."""
    if eval_frame is None:
        return False
    hooked = False
    for name in ("_maybe_set_eval_frame", "set_eval_frame"):
        original = getattr(eval_frame, name, None)
        if original is None or getattr(original, "_fastci_entry", False):
            continue

        def entry(callback, *args, _original=original, **kwargs):
            if callback:  # None or False turn it off; a callback (or a stance's) turns it on
                on_enter = _on_enter
                if on_enter is not None:
                    on_enter(COMPILE, "")  # which function dynamo will run is not known here
            return _original(callback, *args, **kwargs)

        entry._fastci_entry = True  # type: ignore[attr-defined]
        setattr(eval_frame, name, entry)
        hooked = True
    return hooked


def _hook_traced_code() -> bool:
    """Keep each TracingContext's `traced_code` list: dynamo appends every code object it
    traces to it while it compiles."""
    try:
        from torch._guards import TracingContext  # noqa: PLC0415 (torch is optional)
    except ImportError:
        return False
    original = TracingContext.__init__
    if getattr(original, "_fastci_traced", False):
        return True

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        codes = getattr(self, "traced_code", None)
        if isinstance(codes, list):
            _traced.append(codes)

    init._fastci_traced = True  # type: ignore[attr-defined]
    TracingContext.__init__ = init  # type: ignore[method-assign]  # on purpose: see above
    probe = getattr(TracingContext, "get_traced_code", None)
    return probe is not None


def _hook_compiles(dynamo: ModuleType) -> None:
    """A compile's start and end (the outermost only: dynamo counts nested ones). Hooked on
    the handler's class rather than registered as callbacks: `torch._dynamo.reset()`, which
    test suites call between tests, drops every registered callback."""
    handler = type(getattr(getattr(dynamo, "callback", None), "callback_handler", None))
    for name, starting in (("run_start_callbacks", True), ("run_end_callbacks", False)):
        original = getattr(handler, name, None)
        if original is None or getattr(original, "_fastci_compile", False):
            continue

        def run(self, *args, _original=original, _starting=starting, **kwargs):
            _compiling(_starting)
            return _original(self, *args, **kwargs)

        run._fastci_compile = True  # type: ignore[attr-defined]
        setattr(handler, name, run)


def _compiling(starting: bool) -> None:
    on_compile = _on_compile
    if on_compile is not None:
        try:
            on_compile(starting)
        except Exception:  # noqa: BLE001 - a compile must never fail for the recorder
            pass
    if starting:
        # Without the entry hook, a compile is the first sign of compiled code.
        on_enter = _on_enter
        if on_enter is not None and not _entry_hooked:
            on_enter(COMPILE, "")
