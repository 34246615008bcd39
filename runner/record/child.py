"""Inside a child process of a recorded test: what it runs, reads and launches.

The recording parent hands its children coverage.py's own start-up request
(`COVERAGE_PROCESS_CONFIG`, read by the `.pth` file coverage installs) with this module named
as a coverage plugin, so coverage imports it as the child starts. Forked children
(multiprocessing's fork context, DataLoader workers) start recording again after the fork;
children of a forkserver get their start-up through the process's preparation data.

Which lines ran: before Python 3.12, coverage.py's C tracer. On 3.12+, FastCI's own
sys.monitoring recorder (`lines.SysmonLines`, the one the test process records with), started
as coverage loads this plugin, before coverage's own collector; coverage stops as the main
program starts, having seen nothing ours did not. Coverage's sys.monitoring core pays a Python
callback with its file matching for every new code object (0.3-0.4 s of CPU over torch's
import in each child), keeps no contexts for a capturing child, and restarted every disabled
event, every tool's, each time a capture paused it.

Each child writes two files in its parent test's folder (`FASTCI_CHILD_DIR`, one subfolder per
test context, `FASTCI_CHILD_TAG`):

- `<pid>-<nonce>.start` as it starts: the parent then knows a child ran, whatever follows;
- `<pid>-<nonce>.json` as it ends (normal exit, `os._exit`, SIGTERM): the lines it executed
  under the repository, the non-Python files it opened, the Triton kernels it launched, the
  torch.distributed groups it joined, how many Python children it started itself, the names
  it read by string and, a fork of the test's process, the caches it hit
  (`tracing.Reached`), and whether it entered torch.compile'd code (with the lines dynamo
  traced, `compiled.py`);
  and, when its test captures calls for pruning, the calls it captured once it imported
  torch, with the lines each ran (`child_capture.py`; the saved calls beside it).

The evidence file is written whole and renamed into place, so a child that crashes, is killed
or hangs leaves a start marker without evidence: its parent test then keeps the
select-on-any-change rule, with the reason. This module imports little: it runs in every child.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import json
import os
import signal
import sys
import threading
from types import ModuleType

from fastci.runner.record import compiled, lines, nudge, tracing

ENV_DIR = "FASTCI_CHILD_DIR"
ENV_TAG = "FASTCI_CHILD_TAG"
ENV_ROOT = "FASTCI_CHILD_ROOT"
CONFIG = "COVERAGE_PROCESS_CONFIG"
ENV_KEYS = (ENV_DIR, ENV_TAG, ENV_ROOT, CONFIG)
FORMAT = 1


def tag_folder(folder: str, tag: str) -> str:
    """The subfolder where the children of one test context write (a tag is a test id)."""
    import hashlib  # noqa: PLC0415

    return os.path.join(folder, hashlib.sha1(tag.encode()).hexdigest()[:16])


def started_in(folder: str, pid: int) -> bool:
    """Did process `pid` start recording in `folder` (and so catch SIGTERM in Python)?"""
    prefix = f"{pid}-"
    try:
        for entry in os.scandir(folder):
            if entry.is_dir() and any(n.startswith(prefix) and n.endswith(".start")
                                      for n in os.listdir(entry.path)):
                return True
    except OSError:
        pass
    return False


class _State:
    """This process's recording: one per process (a fork starts a new one)."""

    def __init__(self, tag: str, folder: str, root: str, cov) -> None:
        self.tag, self.folder, self.root, self.cov = tag, folder, root, cov
        self.pid = os.getpid()
        self.ppid = os.getppid()
        self.name = f"{self.pid}-{os.urandom(4).hex()}"
        self.files: set[str] = set()
        self.absent: set[str] = set()  # paths looked for and not found
        self.folders: set[str] = set()  # folders asked about and found
        self.listed: set[str] = set()  # folders under the root listed (os.listdir, scandir)
        self.kernels: set[tuple[str, str]] = set()
        self.ranks: list[dict] = []
        self.spawned = 0
        self.compiled = False  # entered torch.compile'd code
        self.saved = False  # finish has begun (it runs once)
        self.terminated = False  # SIGTERM came while finish ran: it ends the process after
        self.main_started = cov is not None  # the interpreter's start-up is over
        self.written = False  # ... and has ended
        self.capture = None  # module calls captured for pruning (`child_capture.py`)
        self.lines = None  # our own line recorder (`lines.SysmonLines`, 3.12+), or None
        self.tracer = None  # coverage.py's tracer as the main program started (3.11)
        self.unrecorded: str | None = None  # how that tracer went, if it did
        self.tracer_checked = False

    def path(self, suffix: str) -> str:
        return os.path.join(tag_folder(self.folder, self.tag), self.name + suffix)


_state: _State | None = None
_reached: tracing.Reached | None = None  # reads by string (and a fork's cache hits)
_hooks_installed = False
_starting = False  # `start_coverage` runs: its plugin load must not begin a second record
_real_exit = os._exit


def coverage_init(reg, options) -> None:  # noqa: ARG001 (coverage's plugin entry point)
    """Called by coverage.py as it starts in a child that inherited the recording's request."""
    folder, tag, root = (os.environ.get(k) for k in (ENV_DIR, ENV_TAG, ENV_ROOT))
    if folder and root and tag is not None and not _starting:
        try:
            begin(tag, folder, root, cov=None)
        except Exception:  # the child must run as it would: without evidence, it falls back
            pass


def begin(tag: str, folder: str, root: str, cov, recorder=None) -> None:
    """Start this process's evidence: the start marker first, then the hooks that fill it.
    `cov` is the Coverage measuring this process and `recorder` our own, as `record`
    started them; both None when coverage's start-up owns this process (the main program has
    yet to start), and then our recorder starts here where it can."""
    global _state
    _state = _State(tag, folder, root, cov)
    _start_reaching(root)
    if recorder is not None:
        _state.main_started = True
        _state.lines = recorder
    elif cov is None:
        _state.lines = own_lines(root)
    compiled.start(_on_compiled_entry, _on_compile)
    _install_hooks()
    tracing.probe_files(root, _probed)
    tracing.trace_raw_threads()
    _install_sigterm()
    try:
        os.makedirs(tag_folder(folder, tag), exist_ok=True)
        _write(_state.path(".start"), {"pid": _state.pid, "ppid": _state.ppid,
                                       "argv": _argv(), "tag": tag})
    except OSError:
        _state = None  # nowhere to write: no marker, so the parent counts a silent child


def reach_with(reached: tracing.Reached) -> None:
    """A fork of the recording process reports what the recorder's hooks see in it."""
    global _reached
    _reached = reached


def _start_reaching(root: str) -> None:
    """Note reads by string from here on. A fresh interpreter hooks the repository's modules
    itself (those imported already, and each one as its body ends); a fork inherits hooked
    modules and counts afresh. A fresh interpreter watches the repository's caches too: a
    forkserver outlives the test that started it, and a cache it filled while preloading
    answers in every child it forks later, for other tests, whose lines never show it."""
    global _reached
    if _reached is None:
        _reached = tracing.Reached(root, tracing.MemoWatch(_code_owner(root)),
                                   lambda: _repository_modules(root))
        tracing.start_reading(root, _adopt_module)
        for module in list(sys.modules.values()):
            _adopt_module(module)
    _reached.restart()


def _code_owner(root: str):
    """(path, qualname) of a code object under the repository's root, or None."""
    def owner(code) -> tuple[str, str] | None:
        filename = getattr(code, "co_filename", "")
        if not isinstance(filename, str) or not filename.startswith(root + os.sep) or \
                "site-packages/" in filename:
            return None
        return os.path.relpath(filename, root), getattr(code, "co_qualname", code.co_name)

    return owner


def _repository_modules(root: str) -> list[tuple[str, object]]:
    """The (name, module) of the modules whose files lie in the repository."""
    out: list[tuple[str, object]] = []
    for name, module in list(sys.modules.items()):
        filename = tracing._namespace(module).get("__file__") if module is not None else None
        if isinstance(filename, str) and filename.startswith(root + os.sep) and \
                "site-packages/" not in filename and not name.startswith("fastci."):
            out.append((name, module))
    return out


def _adopt_module(module) -> None:
    """Hook a module of the repository for reads by string (its parent keeps those of files
    in the repository's tree, so a module outside it only costs its reads' hook)."""
    state = _state
    if state is None or type(module) is not ModuleType:
        return
    namespace = tracing._namespace(module)
    filename, name = namespace.get("__file__"), namespace.get("__name__")
    if not isinstance(filename, str) or not isinstance(name, str) or \
            name.startswith("fastci.runner.record"):
        return
    rel = filename[len(state.root):].lstrip("/") if filename.startswith(state.root) else ""
    if rel and not rel.startswith(".") and "site-packages/" not in rel:
        module.__class__ = tracing.RecordingModule


def own_lines(root: str):
    """Our sys.monitoring recorder, started for this process (Python 3.12+), or None where it
    cannot run (an older Python, no free tool id): coverage's then."""
    if sys.version_info < (3, 12):
        return None
    from fastci.runner.record.lines import SysmonLines  # noqa: PLC0415 (3.12+ only)

    recorder = SysmonLines(root)
    try:
        recorder.start(late=True)
    except (RuntimeError, ValueError):
        return None
    return recorder


def record(tag: str, folder: str, root: str, config: str) -> None:
    """Record this process from here on, for `tag` (a fork, a forkserver's child): with our
    own recorder where it runs, else with coverage from the serialized `config`."""
    recorder = own_lines(root)
    begin(tag, folder, root, None if recorder is not None else start_coverage(config), recorder)
    if _state is not None and recorder is None:  # the main program ran long ago: no
        _watch_tracer(_state)  # `cpython.run_*` event will say when to note coverage's tracer


def start_coverage(config: str):
    """Start coverage in this process from a serialized config (forks, forkserver children)."""
    global _starting
    from coverage.control import Coverage  # noqa: PLC0415

    _starting = True
    try:
        cov = Coverage(config_file=":data:" + config)
        cov._warn_no_data = False
        cov._warn_unimported_source = False
        cov._warn_preimported_source = False
        cov._auto_save = False  # `finish` reads the data; nothing else needs the data file
        cov.start()
    finally:
        _starting = False
    return cov


def adopt(tag: str, folder: str, root: str, config: str) -> None:
    """A multiprocessing child that coverage's start-up did not reach (a forkserver's child,
    whose server was started without the request): start here, for `tag`."""
    if _state is not None and _state.pid == os.getpid():
        if _state.tag != tag:  # started from inherited variables: the parent knows better
            _retag(tag)
        return
    record(tag, folder, root, config)


def _retag(tag: str) -> None:
    state = _state
    if state is None:
        return
    old = state.path(".start")
    state.tag = tag
    try:
        os.makedirs(tag_folder(state.folder, tag), exist_ok=True)
        _write(state.path(".start"), {"pid": state.pid, "ppid": state.ppid, "argv": _argv(),
                                      "tag": tag})
        os.unlink(old)
    except OSError:
        pass


class Stowaway:
    """Travels in multiprocessing's preparation data; unpickled in the child, it starts the
    child's recording for the test that started the process (coverage.py's own trick)."""

    def __init__(self, tag: str, folder: str, root: str, config: str) -> None:
        self.state = {"tag": tag, "folder": folder, "root": root, "config": config}

    def __getstate__(self) -> dict:
        return self.state

    def __setstate__(self, state: dict) -> None:
        self.state = state
        try:
            adopt(state["tag"], state["folder"], state["root"], state["config"])
        except Exception:  # the child runs on; without evidence its parent falls back
            pass


def _watch_tracer(state: _State) -> None:
    """Where coverage.py's tracer records this process's lines (3.11), code that calls
    `sys.settrace` (a profiler, `sys.settrace(None)` in a `finally`) removes it, and what
    runs after goes unrecorded, unseen. Note the tracer as the main program starts, and look
    again at exit: from a handler registered now, after coverage.py's own, so that it runs
    before coverage.py's stops the tracer."""
    tracer = lines.current_tracer()
    if tracer is None or state.lines is not None:
        return  # sys.monitoring records (3.12+), or nothing traces
    state.tracer = tracer
    atexit.register(_check_tracer)


def _check_tracer() -> None:
    """Once per process: a fork inherits its parent's exit handler too, which runs after
    the fork's coverage.py has stopped its tracer at exit."""
    state = _state
    if state is None or state.pid != os.getpid() or state.tracer is None or state.saved \
            or state.unrecorded or state.tracer_checked:
        return
    state.tracer_checked = True
    state.unrecorded = lines.tracer_gone(state.tracer)


def finish(event: str = "atexit") -> None:
    """Write this process's evidence, once, whole (renamed into place). A SIGTERM that
    lands meanwhile waits for the evidence, then ends the process (`_on_sigterm`)."""
    state = _state
    if state is None or state.saved or state.pid != os.getpid():
        return
    if getattr(_coverage(), "_started", False):
        _check_tracer()  # `os._exit`: no exit handler ran, and the tracer is as the test left it
    try:
        with sigterm_held():
            _finish(state, event)
    finally:
        state.written = True
        if state.terminated:
            _end_by_sigterm()


def _finish(state: _State, event: str) -> None:
    state.saved = True
    cov = state.cov
    if cov is None:
        cov = _startup_coverage()
    ran: dict | None = None if state.main_started else {}  # ended in start-up: ran nothing
    captured = None
    reached: dict = {}
    running = state.lines is not None or cov is not None
    error = None if running or ran is not None else "coverage was not running"
    if state.unrecorded:  # what ran after went unseen: the parent selects on any change
        running, ran, error = False, None, f"lines unrecorded: {state.unrecorded}"
    if running:
        try:
            contexts = _lines_by_context(state, cov)
            merged: dict[str, set[int]] = {}
            for files in contexts.values():
                for filename, ls in files.items():
                    merged.setdefault(filename, set()).update(ls)
            ran = {f: sorted(ls) for f, ls in merged.items()}
            reached = _reached.report() if _reached is not None else {}
            if state.capture is not None:
                from fastci.runner.record import child_capture  # noqa: PLC0415

                captured = child_capture.report(state.capture, contexts)
            if state.compiled:
                if compiled.unseen():
                    ran, error = None, compiled.unseen()  # the parent falls back
                else:
                    for filename, ls in compiled.traced_lines(compiled.COMPILE).items():
                        if filename.startswith(state.root):
                            ran[filename] = sorted({*ran.get(filename, ()), *ls})
        except Exception as exc:
            ran = None  # no line evidence: the parent falls back, as for a crash
            error = f"{type(exc).__name__}: {exc}"[:300]
    try:
        _write(state.path(".json"), {
            "format": FORMAT, "event": event, "pid": state.pid, "ppid": state.ppid,
            "tag": state.tag, "argv": _argv(), "lines": ran, "files": sorted(state.files),
            "absent": sorted(state.absent), "folders": sorted(state.folders),
            "listed": sorted(state.listed),
            "kernels": sorted(state.kernels), "ranks": state.ranks,
            "spawned": state.spawned, "compiled": state.compiled, "error": error,
            "reads": reached.get("reads", []), "credited": reached.get("credited", []),
            "capture": captured if ran is not None else None})
    except OSError:
        pass


def _lines_by_context(state: _State, cov) -> dict[str, dict[str, set[int]]]:
    """context -> file under the root -> lines this process ran (and stop recording them).
    Only a capturing child has contexts other than "": one per captured call."""
    if cov is not None and cov._started:
        cov.stop()
    if state.lines is not None:
        state.lines.stop()
        return state.lines.lines()  # files under the root only
    data = cov.get_data()
    prefix = state.root
    out: dict[str, dict[str, set[int]]] = {}
    for filename in data.measured_files():
        if not filename.startswith(prefix):
            continue
        if state.capture is None:
            ran = set(data.lines(filename) or ())
            if ran or not _has_statements(filename):
                out.setdefault("", {})[filename] = ran
            continue
        for lineno, names in data.contexts_by_lineno(filename).items():
            for context in names:
                out.setdefault(context, {}).setdefault(filename, set()).add(lineno)
    return out


def _has_statements(filename: str) -> bool:
    """Whether importing the file runs a line. coverage.py lists every file under its
    source folder, the ones no one imported with no lines: such a file was not run (an
    empty `__init__.py` was, perhaps, and is kept). The audit hook ignores this open:
    `_finish` set `state.saved` first, so it never counts as the child's own read."""
    try:
        with open(filename, "rb") as fh:
            text = fh.read()
    except OSError:
        return True
    return any(line.strip() and not line.lstrip().startswith(b"#") for line in text.splitlines())


def _write(path: str, obj: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def _argv() -> list[str]:
    return [str(a) for a in getattr(sys, "orig_argv", sys.argv)][:8]


# -- hooks, installed once per process ----------------------------------------------------
def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    sys.addaudithook(_audit)
    atexit.register(finish)
    os._exit = _exit  # type: ignore[assignment]
    os.register_at_fork(after_in_child=_after_fork)
    after_import("triton", _install_kernel_hook)
    after_import("torch._dynamo", compiled.install)
    after_import("torch.jit", compiled.install_script)
    after_import("torch.distributed", lambda module: patch_init_process_group(module, _on_rank))
    after_import("multiprocessing.process", lambda module: nudge.install(module.BaseProcess))
    after_import("subprocess", lambda module: nudge.install_popen(module.Popen, _recorded))
    after_import("torch", _start_capture)
    after_import("torch", tracing.trace_autograd_threads)
    after_import("ctypes", tracing.trace_ctypes_callbacks)


def _start_capture(module) -> None:  # noqa: ARG001
    """The parent test asked its children to capture their module calls: start once torch is
    here (`child_capture.py`)."""
    state = _state
    if state is None or state.pid != os.getpid() or state.capture is not None:
        return
    from fastci.runner.record import child_capture  # noqa: PLC0415

    if not os.environ.get(child_capture.ENV):
        return
    from pathlib import Path  # noqa: PLC0415

    state.capture = child_capture.start(Path(state.path(".blobs")), state.root, state.lines,
                                        _coverage, _coverage_paused)


def _coverage():
    """The Coverage measuring this process, or None."""
    state = _state
    if state is None or state.pid != os.getpid():
        return None
    if state.cov is not None:
        return state.cov
    return _startup_coverage()


def _startup_coverage():
    """The Coverage that coverage.py's start-up began in this process, or None. Never
    imports coverage: at exit a SIGTERM handler can interrupt an import, and its own import
    of the same module then met a half-initialised one, raised, and lost the evidence (a
    forkserver's pool worker, whose server starts without coverage)."""
    control = sys.modules.get("coverage.control")
    return getattr(getattr(control, "process_startup", None), "coverage", None)


def _recorded(pid: int) -> bool:
    state = _state
    return state is not None and started_in(state.folder, pid)


def _install_sigterm() -> None:
    """Multiprocessing pools end their workers with SIGTERM: write the evidence first."""
    try:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        pass  # not the main thread: a terminated child then leaves no evidence (fallback)


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001
    """Write the evidence (once), then end as SIGTERM would have: a handler that returned
    instead left a pool worker waiting on its queue's lock forever. Python runs this handler
    between any two bytecodes of the main thread, also inside a `finish` already under way
    (exit began as the pool sent SIGTERM; another thread took the signal `sigterm_held`
    blocks): that finish writes the evidence, and then ends the process."""
    state = _state
    if state is not None and state.pid == os.getpid() and state.saved and not state.written:
        state.terminated = True
        return
    try:
        finish("sigterm")
    finally:
        _end_by_sigterm()


def _end_by_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


class sigterm_held:
    """SIGTERM waits while a fork child sets its recording up (a pool terminating a worker
    that is still starting), then reaches the handler that writes the evidence."""

    def __enter__(self):
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        except (AttributeError, OSError, ValueError):
            pass
        return self

    def __exit__(self, *exc) -> None:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        except (AttributeError, OSError, ValueError):
            pass


def _exit(code: int) -> None:
    try:
        finish("_exit")
    finally:
        _real_exit(code)


def _after_fork() -> None:
    """A fork of a recorded child is a child of its own: fresh recorders, fresh evidence."""
    state = _state
    if state is None:
        return
    from coverage.control import Coverage  # noqa: PLC0415

    config = os.environ.get(CONFIG)
    if state.capture is not None:  # the parent process's captures: not this fork's
        state.capture.end_test()
    if state.lines is not None:  # what the parent process ran: not this fork's
        state.lines.forget()
    inherited = state.cov or Coverage.current()
    with sigterm_held():
        if inherited is not None:
            inherited._auto_save = False
            try:
                inherited.stop()
            except Exception:
                pass
        if config:
            record(state.tag, state.folder, state.root, config)
        else:
            begin(state.tag, state.folder, state.root, None, own_lines(state.root))


# The audited events `_note` reads. Every other one (torch's import alone raises some 30,000:
# attribute reads of code objects, `id()`, `exec`, `compile`) returns at the first test.
_NOTED = frozenset({"open", "os.listdir", "os.scandir", "subprocess.Popen",
                    "os.posix_spawn", "os.spawn",
                    "cpython.run_command", "cpython.run_file", "cpython.run_module",
                    "cpython.run_stdin", "cpython.run_startup", "cpython.run_interactivehook"})


def _audit(event: str, args: tuple) -> None:
    """Runs on every audited event of the child: no imports, and it never raises."""
    if event not in _NOTED:
        return
    state = _state
    if state is None or state.pid != os.getpid() or state.saved:
        return
    try:
        _note(state, event, args)
    except Exception:
        pass


def _note(state: _State, event: str, args: tuple) -> None:
    if event.startswith("cpython.run_"):  # the main program starts: start-up is over
        state.main_started = True
        cov = _startup_coverage()
        if cov is not None:  # only `finish` saves: coverage's own atexit save could race
            cov._auto_save = False  # a pool's SIGTERM and leave a half-written data file
            if state.lines is not None and cov._started:
                cov.stop()  # ours started first and saw all it did: one recorder is enough
        _watch_tracer(state)
        return
    if event in ("subprocess.Popen", "os.posix_spawn", "os.spawn"):
        if tracing._describe_spawn(event, args):
            state.spawned += 1
        return
    seen = tracing.file_event(event, args)
    if seen is not None:
        _probed(*seen)


def _probed(kind: str, path: str) -> None:
    """A file opened, asked about (`tracing.probe_files`) or listed: noted as the recorder
    notes it (`tracing.evidence_of`)."""
    state = _state
    if state is None or state.pid != os.getpid():
        return
    found = tracing.evidence_of(kind, path, state.root)
    if found is not None:
        which, full = found
        getattr(state, which).add(full)


def _on_compiled_entry(kind: str, origin: str) -> None:  # noqa: ARG001
    state = _state
    if state is not None and state.pid == os.getpid() and \
            (not origin or origin.startswith(state.root)):
        state.compiled = True


def _on_compile(starting: bool) -> None:  # noqa: ARG001
    """A child records one context: what runs while compiling is already its evidence."""


def _install_kernel_hook(module) -> None:  # noqa: ARG001
    def on_launch(filename: str, qualname: str) -> None:
        state = _state
        if state is not None and filename.startswith(state.root):
            state.kernels.add((filename, qualname))

    tracing.KernelHook(on_launch, _untraced).install()


def _untraced():
    """No line tracing inside a Triton launch, as in the parent: the launch is the kernel's
    evidence, and under TRITON_INTERPRET=1 tracing the interpreter made a child's launches
    several times slower."""
    state = _state
    recorder = state.lines if state is not None and state.pid == os.getpid() else None
    return _lines_paused(recorder) if recorder is not None else _coverage_paused()


@contextlib.contextmanager
def _lines_paused(recorder):
    recorder.pause()
    try:
        yield
    finally:
        recorder.resume()


@contextlib.contextmanager
def _coverage_paused():
    collector = getattr(_coverage(), "_collector", None)
    if collector is None:
        yield
        return
    collector.pause()
    try:
        yield
    finally:
        collector.resume()


def _on_rank(info: dict) -> None:
    if _state is not None:
        _state.ranks.append(info)


def patch_init_process_group(module, on_rank) -> None:
    """Note the backend, world size and rank of every process group a process joins."""
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "__fastci__", False):
        return

    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            on_rank({"backend": str(module.get_backend()),
                     "world_size": int(module.get_world_size()),
                     "rank": int(module.get_rank())})
        except Exception:
            pass
        return result

    init_process_group.__fastci__ = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    module.init_process_group = init_process_group


# -- run a callback once a module is imported ---------------------------------------------
class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.callbacks: dict[str, list] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.callbacks:
            return None
        spec = tracing.spec_from_others(self, name, path, target)
        if spec is None:
            return None
        loader = spec.loader
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec
        # The callbacks are taken when the module runs, not when it is found: a lookup alone
        # (`importlib.util.find_spec("triton")`, which torch's CUDA builds make as they start)
        # must leave them for the import that follows.

        def exec_module(module):
            original(module)
            for callback in self.callbacks.pop(name, ()):
                try:
                    callback(module)
                except Exception:
                    pass

        loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]  # on purpose: runs the callbacks after the module's own code
        return spec


_finder = _AfterImport()


def after_import(name: str, callback) -> None:
    """Call `callback(module)` once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        try:
            callback(module)
        except Exception:
            pass
        return
    _finder.callbacks.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
