"""Where a recording's time goes, part by part: timers behind `FASTCI_RECORD_PROFILE`.

`FASTCI_RECORD_PROFILE=FILE pytest --fastci-record` wraps the recorder's parts in timers for
that session and writes, at exit, each part's seconds and calls to FILE as JSON. The
seconds are the main thread's CPU time (a shared machine's waits do not count), exclusive:
a part's time excludes the parts it calls, and the test code a wrapper runs. Unset, the
plugin never imports this module: a recording pays nothing for it. `bench/recording_profile.py`
runs it and prints the table.

What no timer can see is the line recorder itself (coverage.py's tracer or sys.monitoring's
callbacks fire inside the test's own code): it is what the recording's overhead leaves
once the timed parts are taken away. The timers cost about a microsecond a call, so parts
called very often (reads by string) read a little high; the calls are reported beside them.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any, Callable

ENV = "FASTCI_RECORD_PROFILE"
TEST_CODE = "(test code)"  # what a wrapper runs of the test itself: never a part's cost

# (part, attribute of the recorder holding the methods ("": the recorder), their names);
# an absent one is skipped, so a renamed method loses its row, never the recording.
_RECORDER_PARTS = (
    ("contexts (switches)", "", ("switch",)),
    ("file events (kernel)", "file_events", ("drain", "take_overflow")),
    ("children", "children", ("enter", "collect", "on_spawn")),
    ("memo and module scan", "", ("scan_modules",)),
    ("memo and module scan", "memo", ("begin", "end", "scan")),
    ("audit hook (open, spawn, list)", "", ("_on_file",)),
    ("kernel launches", "", ("_on_launch",)),
    ("end of session: evidence", "", ("finish",)),
)
_CAPTURE_PARTS = (
    ("capture: bookkeeping", ("_call", "_session_environment", "_is_repo")),
    ("capture: torch.save", ("_save",)),
    ("capture: module state", ("_module_state",)),
)
_STORE_WRITES = ("save_inventories", "save_test_names", "save_captures", "save_snapshot",
                 "add_history")


class Parts:
    """Exclusive seconds and calls per part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._inner: list[float] = []  # time spent in nested timed calls, per open call
        self._absorbing: list[str] = []  # parts that take their nested calls' time too
        self.started = time.thread_time()

    def timed(self, part: str, fn: Callable, absorb: bool = False) -> Callable:
        """`fn`, its time counted to `part` (to an enclosing absorbing part, if any),
        less what nested timed calls count; with `absorb`, nested calls count to `part`."""
        inner, absorbing = self._inner, self._absorbing
        seconds, calls, clock = self.seconds, self.calls, time.thread_time

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            absorbed = bool(absorbing)
            owner = absorbing[-1] if absorbed else part
            pushed = absorb and not absorbed
            if pushed:
                absorbing.append(part)
            start = clock()
            inner.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                nested = inner.pop()
                if pushed:
                    absorbing.pop()
                seconds[owner] += elapsed - nested
                if not absorbed:
                    calls[part] += 1
                if inner:
                    inner[-1] += elapsed

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]  # functions take attributes
        return wrapper

    def to_json(self) -> dict:
        return {"session_cpu_seconds": time.thread_time() - self.started,
                "parts": {name: {"seconds": round(self.seconds[name], 4),
                                 "calls": self.calls[name]} for name in sorted(self.seconds)}}


def _wrap_methods(parts: Parts, part: str, owner: object, names: tuple[str, ...]) -> None:
    for name in names:
        method = getattr(owner, name, None)
        if callable(method):
            setattr(owner, name, parts.timed(part, method))


def instrument(recorder) -> Parts:
    """Time the parts of a started recorder, and write them at exit to $FASTCI_RECORD_PROFILE."""
    from fastci.runner.record import capture, tracing  # noqa: PLC0415 (profiling only)

    parts = Parts()
    for part, where, names in _RECORDER_PARTS:
        owner = getattr(recorder, where, None) if where else recorder
        if owner is not None:
            _wrap_methods(parts, part, owner, names)
    tracing.start(recorder._on_file)  # the audit hook's sink: now the timed one
    hook = getattr(recorder, "_kernel_hook", None)
    if hook is not None:  # installed at collection, after this: it takes the timed one
        hook.on_launch = recorder._on_launch
    # A read by string classifies its call site one frame up: one more, past the timer.
    tracing._getframe = lambda depth=0: sys._getframe(depth + 2)
    tracing.RecordingModule.__getattribute__ = parts.timed(  # type: ignore[method-assign]
        "reads by string (module attributes)", tracing.RecordingModule.__getattribute__)
    recording_property = tracing.functools.cached_property
    if recording_property is not getattr(tracing, "_original_cached_property", None):
        recording_property.__get__ = parts.timed(  # type: ignore[method-assign]
            "cached_property reads", recording_property.__get__)
    capture._signature = parts.timed("capture: signatures", capture._signature)
    capture._arguments_signature = parts.timed("capture: signatures",
                                               capture._arguments_signature)
    # Never `capture._tracing`: torch.compile traces it inside every module call, and a
    # timer there (time.thread_time) is a graph break, so fullgraph=True tests failed.
    finish = recorder.finish

    def finish_session(store_in_use):
        # Imported only here, where the plugin has imported them (the store) or is about
        # to (carry-forward): a module imported earlier than in a plain session could move
        # what its import reads into another context.
        from fastci.runner import store  # noqa: PLC0415

        for backend in (store.SqliteEvidenceStore, store.RedisEvidenceStore):
            _wrap_methods(parts, "end of session: store writes", backend, _STORE_WRITES)
        recording = finish(store_in_use)
        from fastci.runner.execution import carry  # noqa: PLC0415 (hooks are stopped now)

        carry.store_recording = parts.timed("end of session: store writes",
                                            carry.store_recording)
        return recording

    recorder.finish = finish_session
    install = recorder.install_module_capture

    def install_module_capture(budget: int) -> None:
        install(budget)
        if recorder.capture is not None and not hasattr(recorder.capture, "_profiled"):
            recorder.capture._profiled = True
            for part, names in _CAPTURE_PARTS:
                _wrap_methods(parts, part, recorder.capture, names)
            # The contexts a captured call runs in, their switches included.
            recorder.switch_derived = parts.timed("capture: context switches",
                                                  recorder.switch_derived, absorb=True)
            _exclude_module_calls(parts, recorder.capture)

    recorder.install_module_capture = install_module_capture
    out = os.environ[ENV]
    atexit.register(lambda: _write(parts, out))
    return parts


def _exclude_module_calls(parts: Parts, module_capture) -> None:
    """The module's own forward, which the capture wrapper runs, is test code. The first
    captured call imports the fingerprints (torch, and so Triton), as capture itself does
    then: earlier, Triton would read TRITON_INTERPRET before the suite's conftest set it,
    and what the import reads would be another context's."""
    call = module_capture._call
    fingerprinted: list[bool] = []

    def _call(original, module, args, kwargs):
        if not fingerprinted:
            from fastci.runner.prune import fingerprints  # noqa: PLC0415

            fingerprints.fingerprints = parts.timed("capture: fingerprints",
                                                    fingerprints.fingerprints)
            fingerprinted.append(True)
        return call(parts.timed(TEST_CODE, original), module, args, kwargs)

    module_capture._call = _call


def _write(parts: Parts, path: str) -> None:
    data = parts.to_json()
    data["parts"].pop(TEST_CODE, None)
    data["python"] = sys.version.split()[0]
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
