"""Which lines of the repository ran, per context: the two line recorders.

- `CoverageLines`: coverage.py's C tracer with one dynamic context per test context. It
  receives an event for every line of every traced frame (and a call event for every Python
  function, the repository's or not). Python 3.10 and 3.11.
- `SysmonLines` (Python 3.12+, PEP 669's sys.monitoring): LINE events are switched on for the
  repository's code objects only (a PY_START event sees each code object once, and is then
  disabled for it), and each line's event is disabled after its first hit in a context.
  Switching context re-arms the LINE events of every code object that had one disabled (its
  local events set again), so each line is seen once per context, never missed: the
  evidence is the same as coverage's. `sys.monitoring.restart_events()` would re-arm them
  too, but also every PY_START disabled for code outside the repository: each test then
  paid a callback for every torch function it ran (139,210 PY_START callbacks over einops'
  suite, 29,607 with the local re-arm).

`choose()` picks one: `[tool.fastci] recorder` or `FASTCI_RECORDER` ("auto", "sysmon",
"coverage"); "auto" is sysmon on 3.12+ and coverage before. Where sys.monitoring cannot be
used (an older Python, no free tool id) the recorder is coverage, and the reason is kept.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import defaultdict
from typing import Any, Protocol

from fastci.runner.record.paths import real_file

# Tool ids PEP 669 leaves to no convention (0 debugger, 1 coverage, 2 profiler, 5 optimizer):
# coverage.py in our own children (sys.monitoring core) keeps its id 1.
_TOOL_IDS = (4, 3)
_OMIT = ("/site-packages/", "/.venv/", "/.fastci/", "/.git/")

monitoring: Any = getattr(sys, "monitoring", None)


class LineRecorder(Protocol):
    name: str

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def forget(self) -> None: ...
    def switch(self, context: str) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def lost(self) -> str | None: ...
    def retrace(self) -> None: ...
    def lines(self) -> dict[str, dict[str, set[int]]]:
        """context -> absolute file name -> lines that ran (files under the root)."""
        ...


def choose(setting: str) -> tuple[str, str]:
    """(the recorder to use, why): `setting` is "auto", "sysmon" or "coverage"."""
    if setting == "coverage":
        return "coverage", "forced by the recorder setting"
    if monitoring is None:
        why = "sys.monitoring needs Python 3.12+"
        return "coverage", (f"recorder 'sysmon' asked for, but {why}" if setting == "sysmon"
                            else why)
    if _free_tool_id() is None:
        return "coverage", "no free sys.monitoring tool id"
    return "sysmon", "Python 3.12+" if setting == "auto" else "forced by the recorder setting"


def make(name: str, root: str, omit: list[str]) -> LineRecorder:
    return SysmonLines(root) if name == "sysmon" else CoverageLines(root, omit)


def _free_tool_id() -> int | None:
    if monitoring is None:
        return None
    for tool in _TOOL_IDS:
        if monitoring.get_tool(tool) is None:
            return tool
    return None


def current_tracer() -> Any:
    """This thread's tracer as coverage.py installed it: its C tracer, or the object whose
    bound method the Python tracer is."""
    trace: Any = sys.gettrace()
    return getattr(trace, "__self__", trace)


def tracer_gone(tracer: Any) -> str | None:
    """How this thread lost `tracer` (a test's own `sys.settrace`), or None: it has it."""
    now = current_tracer()
    if now is tracer:
        return None
    return "sys.settrace replaced the line tracer" if now is not None else \
        "sys.settrace(None) removed the line tracer"


class CoverageLines:
    """coverage.py's C tracer, one dynamic context per test context."""

    name = "coverage"

    def __init__(self, root: str, omit: list[str]) -> None:
        self.root = root
        self.omit = omit
        self._cov: Any = None
        self._paused = threading.local()  # per thread: how deep in pause(), whose tracer
        self._main: Any = None  # the tracer of the thread that started the recording

    def start(self) -> None:
        import coverage  # noqa: PLC0415 (only a recording session pays for it)

        self._cov = coverage.Coverage(data_file=None, source=[self.root], branch=False,
                                      config_file=False, omit=self.omit, messages=False)
        self._cov.start()
        self._main = current_tracer()

    def lost(self) -> str | None:
        """How this (the recording's) thread lost its tracer, or None: a test's own
        `sys.settrace` (a profiler, a debugger, `sys.settrace(None)` in a `finally`) takes
        coverage's place, and the lines that run after it go unrecorded. Threads started
        outside `threading` never get one (`tracing.py` notes those)."""
        if self._cov is None or self._main is None or self._paused.__dict__.get("depth", 0):
            return None
        return tracer_gone(self._main)

    def retrace(self) -> None:
        """Put the tracer back for what runs next."""
        if self._main is not None:
            self._main.start()

    def stop(self) -> None:
        if self._cov is not None:
            try:
                self._cov.stop()
            except Exception:  # a forked child's coverage may already be gone
                pass

    def forget(self) -> None:
        """In a forked child: stop, and drop what the parent measured."""
        self.stop()
        self._cov = None

    def switch(self, context: str) -> None:
        if self._cov is not None:
            self._cov.switch_context(context)

    def pause(self) -> None:
        """Stop this thread's tracer only. coverage's own `Collector.pause` stops every
        thread's, and its `resume` starts them all on the calling thread, where the last
        one wins: once a test had started a thread, the test's own frame went on under
        another thread's tracer and the lines it ran after a captured call were lost."""
        paused = self._paused
        paused.depth = getattr(paused, "depth", 0) + 1
        if paused.depth > 1:
            return  # nested: the outer pause stopped it (CTracer stops at its next event)
        collector = getattr(self._cov, "_collector", None)
        trace: Any = sys.gettrace()
        trace = getattr(trace, "__self__", trace)  # the Python tracer hands out a method
        mine = None if collector is None else next(
            (t for t in collector.tracers if t is trace), None)
        paused.tracer = mine
        if mine is not None:
            mine.stop()

    def resume(self) -> None:
        paused = self._paused
        paused.depth -= 1
        if paused.depth == 0 and paused.tracer is not None:
            paused.tracer.start()
            paused.tracer = None

    def lines(self) -> dict[str, dict[str, set[int]]]:
        out: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        if self._cov is None:
            return out
        data = self._cov.get_data()
        for filename in data.measured_files():
            for line, contexts in data.contexts_by_lineno(filename).items():
                for context in contexts:
                    out[context][filename].add(line)
        return out


class SysmonLines:
    """sys.monitoring: each line of the repository seen once per context.

    Soundness: an event is only ever disabled after its line was noted in the running
    context, and every switch of context (and the end of a pause) re-arms all of them, so no
    line that runs in a context can go unnoted there.
    """

    name = "sysmon"

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self._prefix = self.root.rstrip(os.sep) + os.sep
        self.tool: int | None = None
        self._data: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        self._current: dict[str, set[int]] = self._data[""]
        self._files: dict[str, str | None] = {}  # co_filename -> file under the root, or None
        self._armed: list = []  # code objects with LINE events on (turned off at stop)
        # ... that had LINE events disabled since they were armed, with those events' lines
        self._spent: dict[Any, set[int]] = {}
        self._paused: dict[int, int] = {}  # thread id -> how deep in pause() it is
        self._missed = False  # an event was disabled while paused: re-arm at resume
        self.switches = 0

    def start(self, late: bool = False) -> None:
        """`late`: the process has run for a while (a child that starts recording once it
        imports torch). The repository's frames already running in any thread are armed
        now, and a generator resumed later is armed at its first resume, as a new call is at
        its start: none of their lines can go unnoted."""
        tool = _free_tool_id()
        if tool is None:
            raise RuntimeError("no free sys.monitoring tool id")
        monitoring.use_tool_id(tool, "fastci")
        self.tool = tool
        events = monitoring.events
        starts = events.PY_START | (events.PY_RESUME if late else 0)
        monitoring.register_callback(tool, events.PY_START, self._py_start)
        if late:
            monitoring.register_callback(tool, events.PY_RESUME, self._py_start)
        monitoring.register_callback(tool, events.LINE, self._line)
        monitoring.set_events(tool, starts)
        if late:
            for top in sys._current_frames().values():
                frame: Any = top
                while frame is not None:
                    self._py_start(frame.f_code, 0)
                    frame = frame.f_back

    def stop(self) -> None:
        tool = self.tool
        if tool is None:
            return
        self.tool = None
        events = monitoring.events
        monitoring.set_events(tool, 0)
        for code in self._armed:
            try:
                monitoring.set_local_events(tool, code, 0)
            except Exception:  # noqa: BLE001 - nothing to turn off
                pass
        self._armed.clear()
        monitoring.register_callback(tool, events.PY_START, None)
        monitoring.register_callback(tool, events.PY_RESUME, None)
        monitoring.register_callback(tool, events.LINE, None)
        monitoring.free_tool_id(tool)

    def forget(self) -> None:
        """In a forked child: stop, and drop what the parent measured."""
        self.stop()
        self._data.clear()

    def switch(self, context: str) -> None:
        self._current = self._data[context]
        self.switches += 1
        self._rearm()

    def pause(self) -> None:
        """Only the calling thread's lines go unnoted: another thread's run on."""
        me = threading.get_ident()
        self._paused[me] = self._paused.get(me, 0) + 1

    def resume(self) -> None:
        me = threading.get_ident()
        depth = self._paused.pop(me) - 1
        if depth:
            self._paused[me] = depth
        elif self._missed:
            self._missed = False
            self._rearm()

    def _rearm(self) -> None:
        """Every line event disabled since the last re-arm whose line the running context
        has not noted fires again (its code object's local events set anew: that resets
        every event its lines disabled). A code object whose disabled lines the context
        has all noted stays as it is: a line it has not run since it was armed was never
        disabled, and fires. So a test that goes in and out of a repeated module call (a
        training loop's steps: its context, then the call's `|in`, then its own again) no
        longer sees every line of each step once more."""
        tool, spent = self.tool, self._spent
        if tool is None or not spent:
            return
        line = monitoring.events.LINE
        noted = self._current
        kept = {}
        for code, lines in spent.items():
            have = noted.get(code.co_filename)
            if have is not None and lines <= have:
                kept[code] = lines
                continue
            monitoring.set_local_events(tool, code, 0)
            monitoring.set_local_events(tool, code, line)
        self._spent = kept

    def lost(self) -> str | None:
        """sys.monitoring sees every thread, and `sys.settrace` does not touch it."""
        return None

    def retrace(self) -> None:
        pass

    def lines(self) -> dict[str, dict[str, set[int]]]:
        out: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        for context, by_name in self._data.items():
            for co_filename, ls in by_name.items():
                filename = self._files.get(co_filename)
                if filename is not None and ls:
                    out[context][filename] |= ls
        return out

    # -- the callbacks (hot: keep them short) -------------------------------------------------
    def _py_start(self, code, offset):  # noqa: ARG002 (sys.monitoring's signature)
        co_filename = code.co_filename
        filename = self._files.get(co_filename, False)
        if filename is False:
            filename = self._files[co_filename] = self._measured(co_filename)
        if filename is not None and self.tool is not None:
            try:
                if not monitoring.get_local_events(self.tool, code):
                    monitoring.set_local_events(self.tool, code, monitoring.events.LINE)
                    self._armed.append(code)
            except ValueError:  # not a code object sys.monitoring can instrument
                pass
        return monitoring.DISABLE

    def _line(self, code, line):
        if self._paused and threading.get_ident() in self._paused:
            self._missed = True
        else:
            self._current[code.co_filename].add(line)
        spent = self._spent.get(code)
        if spent is None:
            self._spent[code] = {line}
        else:
            spent.add(line)
        return monitoring.DISABLE

    def _measured(self, co_filename: str) -> str | None:
        """The file a code object comes from, when it is the repository's (as coverage.py's
        source and omit settings decide it), else None."""
        if not co_filename or co_filename.startswith("<"):
            return None  # exec'd strings, doctests, frozen modules: no file to map to
        real = real_file(co_filename)
        if not real.startswith(self._prefix):
            return None
        rel = real[len(self._prefix) - 1:]
        if any(part in rel for part in _OMIT):
            return None
        return real
