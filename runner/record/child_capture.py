"""Capture for pruning inside a child process of a recorded test (a torchrun rank, a training
command the test runs as a user would).

The parent test's capture request travels in `FASTCI_CHILD_CAPTURE` (the budget, the test's
capture allowance, and digests of the session's environment). Once the child imports torch,
its module calls are captured as the parent's are (`capture.ModuleCapture`), into blobs in
the child's evidence folder. Which lines ran inside which captured call comes from the
child's line recorder switching context around each captured call, as the parent's recorder
does: FastCI's own sys.monitoring recorder on Python 3.12+, coverage's dynamic contexts on
its C tracer before. The parent then merges each capture into its
test's evidence like one of its own (`recorder._merge_children`), so a change that ran only
inside captured calls of a child can be pruned by replaying them.

The replay runs in a plain process, without the launcher's rendezvous: the variables a
launcher sets per process (RANK, MASTER_PORT, ...) go into the saved call and are set around
it, not into the replay process's environment, so every rank's calls replay in one process
pair. A call that needs its process group fails to replay, and keeps its test.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from fastci.runner.record.paths import real_file

ENV = "FASTCI_CHILD_CAPTURE"
TEST = "child"  # the child's one "test": every context of a capturing child starts with it

# Set by launchers per process: the process group's rendezvous, never import-time settings
# of the code (torchrun, torch.distributed.launch, mpirun's and SLURM's ranks).
LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "NCCL_ASYNC_ERROR_HANDLING", "OMPI_COMM_WORLD_", "SLURM_PROCID", "SLURM_LOCALID",
            "OMP_NUM_THREADS")
# The hand-over itself, and what names the recorded tree's folder: a replay sets its own
# import path for the tree it replays.
_NOT_ENVIRONMENT = ("PYTHONPATH", "PWD", "OLDPWD", "COVERAGE_", "FASTCI_", "_")


def request(budget: int, allowance: float | None, base: dict[str, str]) -> str:
    """The parent's request to its children, for one test (`base`: `digests` of the
    session's environment as it started)."""
    return json.dumps({"budget": budget, "allowance": allowance, "base": base})


def digests(environ: dict[str, str]) -> dict[str, str]:
    """Only digests of the session's values travel to the children (a secret among them is
    not copied into another variable)."""
    return {k: _digest(v) for k, v in environ.items()}


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]


class ChildRecorder:
    """What `ModuleCapture` needs of a recorder, over the child's line recorder: FastCI's own
    `lines.SysmonLines` (Python 3.12+, the child's recorder since it started; lines before the
    first capture stay in its "" context, outside every capture), or else coverage's C tracer
    with one dynamic context per captured call. Coverage's sys.monitoring core keeps no
    contexts: a child measured by it does not capture."""

    def __init__(self, root: str, lines, coverage, untraced) -> None:
        self.root = os.path.realpath(root)
        self.context = TEST
        self.environ: dict[str, str] = {}
        self.repository_modules: list = []
        self.lines: Any = lines  # the child's SysmonLines, or None (coverage's contexts)
        self._coverage = coverage  # () -> the Coverage measuring this process, or None
        self._untraced = untraced  # coverage paused
        self._count = -1
        self._seen: set[str] = set()  # module names scan_modules has looked at

    def can_split(self) -> bool:
        """Can the lines be split by context here?"""
        if self.lines is not None:
            return True
        collector = getattr(self._coverage(), "_collector", None)
        return collector is not None and collector.tracer_name() != "SysMonitor"

    def switch_derived(self, test: str, context: str) -> None:  # noqa: ARG002 (one test)
        if self.lines is not None:
            self.lines.switch(context)
        else:
            cov = self._coverage()
            if cov is not None:
                cov.switch_context(context)
        self.context = context

    @contextlib.contextmanager
    def untraced(self):
        """No line noted inside (a Triton launch, a capture's own work)."""
        lines = self.lines
        if lines is None:
            with self._untraced():
                yield
            return
        lines.pause()
        try:
            yield
        finally:
            lines.resume()

    def scan_modules(self) -> None:
        """The repository's modules imported so far, but the program itself (`__main__`, and
        aliases of it such as multiprocessing's `__mp_main__`): a replay process has its own.
        Each module is looked at once (a scan comes before every capture)."""
        if len(sys.modules) == self._count:
            return
        self._count = len(sys.modules)
        prefix = self.root + os.sep
        seen = self._seen
        for name, module in list(sys.modules.items()):
            if name in seen:
                continue
            seen.add(name)
            path = getattr(module, "__file__", None) if module is not None else None
            if name != "__main__" and getattr(module, "__name__", None) == name \
                    and isinstance(path, str) and os.path.isabs(path) \
                    and "site-packages" not in path \
                    and real_file(path).startswith(prefix):
                self.repository_modules.append((name, module))


def start(folder: Path, root: str, lines, coverage, untraced):
    """Capture this process's module calls, as its parent test asked (None: it did not, or
    the lines cannot be split by call here)."""
    try:
        spec = json.loads(os.environ.get(ENV) or "null")
    except ValueError:
        return None
    if not isinstance(spec, dict):
        return None
    from fastci.runner.record.capture import ModuleCapture  # noqa: PLC0415 (imports little)

    recorder = ChildRecorder(root, lines, coverage, untraced)
    if not recorder.can_split():
        return None
    base = spec.get("base") or {}
    changed = {k: v for k, v in os.environ.items()
               if base.get(k) != _digest(v) and not k.startswith(_NOT_ENVIRONMENT)}
    per_process = {k: v for k, v in changed.items() if k.startswith(LAUNCHER)}
    # What the replay process needs set (`capture._session_environment`: the variables that
    # differ from this baseline): the session's changes, without the launcher's.
    group = {k for k in changed if k not in per_process}
    recorder.environ = {k: v for k, v in os.environ.items() if k not in group}
    folder.mkdir(parents=True, exist_ok=True)
    capture = ModuleCapture(recorder, int(spec.get("budget") or 0) or 64 * 2**20, spill=folder)
    capture.call_environ = {k: v for k, v in per_process.items()
                            if not any(w in k.upper() for w in ("TOKEN", "SECRET", "PASSWORD",
                                                                "KEY"))}
    if spec.get("allowance") is not None:
        capture.allowance[TEST] = float(spec["allowance"])
    capture.install()
    capture.begin_test(TEST)
    recorder.switch_derived(TEST, TEST)
    if os.environ.get("FASTCI_CAPTURE_FUNCTIONS") != "0":
        _bind_main_program(capture)
    return capture


PROFILE_EVENTS = 500_000  # a program that never calls a function of its own: stop looking


def _bind_main_program(capture) -> None:
    """The program's own calls of repository functions, classes and methods (`Trainer(cfg)`,
    `load_config(path)`, `trainer.evaluate()`) are captured as a test file's are
    (`bindings.py`), through its namespace and its classes. That namespace is complete when
    the program first calls a function of its own (`main()`, at the end of the file), so a
    profile hook waits for that call, binds, and removes itself; torch is imported by then,
    which is when this runs. Names bound later are not wrapped: their calls run outside any
    capture, and keep their test."""
    main = sys.modules.get("__main__")
    filename = getattr(main, "__file__", None)
    if not isinstance(filename, str):
        return
    real = os.path.realpath(filename)
    if not real.startswith(capture.root + os.sep):
        return  # a launcher or a library's program (torchrun's agent): nothing of the tree
    names, seen = {filename, real}, [0]

    def profile(frame, event, arg) -> None:  # noqa: ARG001
        seen[0] += 1
        if event == "call" and frame.f_code.co_filename in names \
                and frame.f_code.co_name != "<module>":
            sys.setprofile(None)
            capture.bindings.bind(frame.f_globals, real, callers=(filename,))
        elif seen[0] > PROFILE_EVENTS:
            sys.setprofile(None)

    sys.setprofile(profile)


def report(capture, by_context: dict[str, dict[str, set[int]]]) -> dict:
    """The capture section of the child's evidence: each call with the lines it ran, the
    lines repeats of captured calls ran, and the lines outside any (absolute paths under the
    root, by context: `child._lines_by_context`)."""
    from fastci.runner.record.capture import CAPTURED, INSIDE  # noqa: PLC0415

    captures, taken = [], set()
    for item in capture.captures.get(TEST, ()):
        context = f"{TEST}{CAPTURED}{item.index}"
        taken.add(context)
        captures.append({**item.to_json(), "lines": _plain(by_context.get(context, {}))})
    taken.add(TEST + INSIDE)
    outside: dict[str, set[int]] = defaultdict(set)
    for context, files in by_context.items():
        if context not in taken:
            for filename, ls in files.items():
                outside[filename] |= ls
    return {"captures": captures, "inside": _plain(by_context.get(TEST + INSIDE, {})),
            "outside": _plain(outside), "blobs": {d: str(p) for d, p in capture.blobs.items()},
            "sys_path": capture.sys_path, "stopped": capture.stopped.get(TEST)}


def _plain(files) -> dict[str, list[int]]:
    return {f: sorted(ls) for f, ls in files.items()}
