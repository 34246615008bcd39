"""The recording parent's side of child processes: hand the recording down, merge it back.

While a session records, every Python child a test starts records for that test (see
`child.py`): the request travels through the environment (coverage.py's
`COVERAGE_PROCESS_CONFIG`, plus the test's context and a folder), through multiprocessing's
preparation data (spawn, forkserver) and through a fork handler (fork, DataLoader workers).

At a test's teardown the parent reads what its children wrote. It merges a context's child
evidence only when every child that started wrote complete evidence and every Python child
the audit hook saw start reported in; otherwise it merges none of it and keeps the reasons, so
the test keeps the select-on-any-change rule and `fastci explain` says why. Half-merged
evidence is never stored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from fastci.runner.record import child, child_capture, nudge

GRACE_SECONDS = 2.0  # how long teardown waits for a child that is still writing its evidence

_active: "Children | None" = None
_fork_handler_installed = False


@dataclass
class ChildEvidence:
    """What the children of one test context recorded, merged (paths absolute)."""

    lines: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    files: set[str] = field(default_factory=set)
    absent: set[str] = field(default_factory=set)  # paths looked for and not found
    folders: set[str] = field(default_factory=set)  # folders asked about and found
    listed: set[str] = field(default_factory=set)  # folders listed
    kernels: set[tuple[str, str]] = field(default_factory=set)
    ranks: list[dict] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)  # "pid: argv" of each child merged
    compiled: bool = False  # a child entered torch.compile'd code (compiled.py)
    reads: set[tuple[str, str]] = field(default_factory=set)  # (module file, name) by string
    credited: set[tuple[str, str]] = field(default_factory=set)  # (file, qualname) cache hits
    captured: list[dict] = field(default_factory=list)
    """Per child that captured its module calls (`child_capture.report`, blobs moved out of
    the children's folder): its lines are there, split by call, and not in `lines`."""


class Children:
    """Hands the recording down to children and collects what they wrote, per context."""

    def __init__(self, root: str, omit: list[str], detach: Callable[[], None]) -> None:
        self.root = root
        self.omit = omit
        self.detach = detach  # stops the parent's own hooks in a forked child
        self.folder = ""
        self.config = ""
        self.tag = ""
        self.spawned: Counter[str] = Counter()  # context -> Python children the audit saw
        self.evidence: dict[str, ChildEvidence] = {}
        self.failures: dict[str, list[str]] = {}
        self.ranks: dict[str, list[dict]] = defaultdict(list)  # in-process process groups
        self.blobs = ""  # where the children's captures wait for the recording's end
        self._environ: dict[str, str | None] = {}
        self._patched: list[tuple[object, str, object]] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        global _active
        from coverage.config import CoverageConfig  # noqa: PLC0415

        self.folder = tempfile.mkdtemp(prefix="fastci-children-")
        config = CoverageConfig()
        config.from_args(
            data_file=os.path.join(self.folder, "coverage", ".coverage"), source=[self.root],
            omit=self.omit, parallel=True, branch=False,
            plugins=["fastci.runner.record.child"],
            disable_warnings=["no-data-collected", "module-not-measured",
                              "module-not-imported", "module-not-python", "include-ignored",
                              "couldnt-parse", "no-ctracer"])
        if sys.version_info >= (3, 12):  # sys.monitoring: each line seen once
            config.core = "sysmon"
        self.config = config.serialize()
        for key, value in ((child.CONFIG, self.config), (child.ENV_DIR, self.folder),
                           (child.ENV_ROOT, self.root), (child.ENV_TAG, self.tag)):
            self._environ[key] = os.environ.get(key)
            os.environ[key] = value
        self._environ[child_capture.ENV] = os.environ.pop(child_capture.ENV, None)
        self._patch_multiprocessing()
        self._patched.extend(nudge.install_popen(
            subprocess.Popen, lambda pid: child.started_in(self.folder, pid)))
        _install_fork_handler()
        child.after_import("torch.distributed", self._patch_ranks)
        _active = self

    def stop(self) -> None:
        """Collect what every context's children wrote, and hand nothing more down."""
        global _active
        _active = None
        for key, value in self._environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()
        if not self.folder:
            return
        for tag in list(self.spawned):  # contexts other than tests: fixtures, collection
            if tag not in self.evidence and tag not in self.failures:
                self._collect_folder(child.tag_folder(self.folder, tag), wait=0.0, tag=tag)
        if os.path.isdir(self.folder):
            for entry in sorted(os.listdir(self.folder)):
                path = os.path.join(self.folder, entry)
                if entry != "coverage" and os.path.isdir(path) and entry not in self._done:
                    self._collect_folder(path, wait=0.0)
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def _done(self) -> set[str]:
        return {os.path.basename(child.tag_folder(self.folder, t))
                for t in (*self.evidence, *self.failures)}

    def enter(self, tag: str) -> None:
        """Children started from now on record for `tag` (a test id or a shared context)."""
        if tag != self.tag:
            self.tag = tag
            if _active is self:
                os.environ[child.ENV_TAG] = tag

    def capture_for(self, request: str | None) -> None:
        """Children started from now on capture their module calls (`child_capture.py`) as
        `request` says, or none. Their coverage stays on the core it has: on sys.monitoring
        the child splits its lines by call with a recorder of its own
        (`child_capture.ChildRecorder`)."""
        if _active is not self:
            return
        if request is None:
            os.environ.pop(child_capture.ENV, None)
            return
        os.environ[child_capture.ENV] = request

    def on_spawn(self) -> None:
        """The audit hook saw this process start a child able to run the repository's code."""
        self.spawned[self.tag] += 1

    # -- teardown ----------------------------------------------------------------------------
    def collect(self, tag: str) -> None:
        """Read what the children of `tag` wrote (at the test's teardown)."""
        path = child.tag_folder(self.folder, tag)
        if os.path.isdir(path) or self.spawned.get(tag):
            self._collect_folder(path, wait=GRACE_SECONDS, tag=tag)

    def _collect_folder(self, path: str, wait: float, tag: str | None = None) -> None:
        """Merge the evidence the children in `path` wrote, all of it or none: any child that
        did not report keeps its test on select-on-any-change, with the reason."""
        starts = self._wait_for_children(path, wait, tag)
        markers = {n: _read(os.path.join(path, n + ".start")) or {} for n in starts}
        if tag is None:
            tag = next((m.get("tag") for m in markers.values() if m.get("tag")), None)
        if tag is None:
            return
        reports, reasons = _read_reports(path, markers)
        reasons += self._unreported(tag, markers, reports)
        if reasons:
            self.failures[tag] = reasons
            return
        merged = ChildEvidence()
        for report in reports:
            captured = report.get("capture")
            if isinstance(captured, dict):
                merged.captured.append(self._keep_blobs(captured))
            else:
                for filename, ls in report["lines"].items():
                    merged.lines[filename].update(ls)
            merged.files.update(report.get("files", ()))
            merged.absent.update(report.get("absent", ()))
            merged.folders.update(report.get("folders", ()))
            merged.listed.update(report.get("listed", ()))
            merged.kernels.update(tuple(k) for k in report.get("kernels", ()))
            merged.reads.update(tuple(r) for r in report.get("reads", ()))
            merged.credited.update(tuple(c) for c in report.get("credited", ()))
            merged.ranks.extend(report.get("ranks", ()))
            merged.processes.append(_who(str(report["pid"]), report))
            merged.compiled = merged.compiled or bool(report.get("compiled"))
        if reports:
            self.evidence[tag] = merged

    def _keep_blobs(self, captured: dict) -> dict:
        """Move a child's saved calls out of the children's folder (emptied at `stop`)."""
        if not self.blobs:
            self.blobs = tempfile.mkdtemp(prefix="fastci-child-captures-")
        kept = {}
        for digest, path in (captured.get("blobs") or {}).items():
            target = os.path.join(self.blobs, os.path.basename(str(digest)))
            try:
                shutil.move(path, target)
            except OSError:
                continue  # the call is then missing from the store: its test stays selected
            kept[digest] = target
        return {**captured, "blobs": kept}

    def _wait_for_children(self, path: str, wait: float, tag: str | None) -> list[str]:
        """The children that started in `path`, once those still starting or still writing
        have had a moment (at most `wait` seconds)."""
        deadline = time.monotonic() + wait
        while True:
            starts = _names(path, ".start")
            missing = [n for n in starts if not os.path.exists(os.path.join(path, n + ".json"))]
            alive = [n for n in missing if _alive(int(n.split("-", 1)[0]))]
            unseen = tag is not None and self.spawned.get(tag, 0) > sum(
                (_read(os.path.join(path, n + ".start")) or {}).get("ppid") == os.getpid()
                for n in starts)
            if not (alive or unseen) or time.monotonic() >= deadline:
                return starts
            time.sleep(0.02)

    def _unreported(self, tag: str, markers: dict[str, dict], reports: list[dict]) -> list[str]:
        """Every Python child a process saw itself start must have reported in."""
        started_by: Counter[int] = Counter(m.get("ppid", -1) for m in markers.values())
        expected = [(os.getpid(), self.spawned.get(tag, 0), "the test")]
        expected += [(r["pid"], r.get("spawned", 0), _who(f"{r['pid']}", r)) for r in reports]
        out = []
        for pid, count, who in expected:
            if started_by.get(pid, 0) < count:
                absent = count - started_by.get(pid, 0)
                out.append(f"{absent} Python child process{'es' if absent > 1 else ''} "
                           f"started by {who} did not report (not started through this "
                           "Python with FastCI's environment)")
        return out

    # -- results -----------------------------------------------------------------------------
    def unmerged(self, contexts) -> list[str]:
        """Why the children of these contexts are not in the evidence (empty: they all are)."""
        out: list[str] = []
        for context in contexts:
            out.extend(self.failures.get(context, ()))
            if context not in self.failures and context not in self.evidence \
                    and self.spawned.get(context):
                out.append(f"{self.spawned[context]} Python child process(es) started by the "
                           "test left no evidence")
        return out

    def ranks_of(self, contexts) -> tuple[str, ...]:
        """The process groups these contexts joined, as "backend:world_size" (gloo:2)."""
        groups = set()
        for context in contexts:
            found = list(self.ranks.get(context, ()))
            if context in self.evidence:
                found += self.evidence[context].ranks
            groups |= {f"{r['backend']}:{r['world_size']}" for r in found}
        return tuple(sorted(groups))

    # -- hooks -------------------------------------------------------------------------------
    def _patch_ranks(self, module) -> None:
        child.patch_init_process_group(module, lambda info: self.ranks[self.tag].append(info))

    def _patch_multiprocessing(self) -> None:
        """spawn and forkserver children carry a Stowaway; the forkserver and the resource
        tracker, helper processes shared by every later test that run none of the
        repository's code, start without the recording request; a terminated child is
        signalled again while it is joined (nudge.py)."""
        import multiprocessing.forkserver as forkserver  # noqa: PLC0415
        import multiprocessing.process  # noqa: PLC0415
        import multiprocessing.resource_tracker as resource_tracker  # noqa: PLC0415
        import multiprocessing.spawn as spawn  # noqa: PLC0415

        original = spawn.get_preparation_data

        def get_preparation_data(name):
            data = original(name)
            data["fastci"] = child.Stowaway(self.tag, self.folder, self.root, self.config)
            return data

        spawn.get_preparation_data = get_preparation_data
        self._patched.append((spawn, "get_preparation_data", original))
        self._patched.extend(nudge.install(multiprocessing.process.BaseProcess))
        for helper in (forkserver.ForkServer, resource_tracker.ResourceTracker):
            ensure = helper.ensure_running
            helper.ensure_running = _without_request(ensure)  # type: ignore[method-assign]
            self._patched.append((helper, "ensure_running", ensure))


def _without_request(ensure_running):
    def start_helper(server):
        saved = {k: os.environ.pop(k) for k in child.ENV_KEYS if k in os.environ}
        try:
            return ensure_running(server)
        finally:
            os.environ.update(saved)

    return start_helper


def _install_fork_handler() -> None:
    global _fork_handler_installed
    if not _fork_handler_installed:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_installed = True


def _after_fork_in_child() -> None:
    """A fork of the recording process (multiprocessing fork, a DataLoader worker): stop the
    parent's recording here and record this child for the running test instead."""
    global _active
    watch = _active
    if watch is None:
        return
    _active = None
    with child.sigterm_held():
        try:
            watch.detach()
            child.record(watch.tag, watch.folder, watch.root, watch.config)
        except Exception:
            pass  # no marker written: the audit hook's fork count makes the parent fall back


def _names(path: str, suffix: str) -> list[str]:
    try:
        return sorted(n[:-len(suffix)] for n in os.listdir(path) if n.endswith(suffix))
    except OSError:
        return []


def _read(path: str) -> dict | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended: only its parent has not collected it yet
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def _who(name: str, info: dict) -> str:
    argv = " ".join(str(a) for a in info.get("argv", ()))[:120]
    return f"child pid {name.split('-', 1)[0]} ({argv})" if argv else \
        f"child pid {name.split('-', 1)[0]}"


def _read_reports(path: str, markers: dict[str, dict]) -> tuple[list[dict], list[str]]:
    """The children's evidence files, and why any child has none that can be merged."""
    reports, reasons = [], []
    for name, marker in markers.items():
        who = _who(name, marker)
        report = _read(os.path.join(path, name + ".json"))
        if report is None:
            if os.path.exists(os.path.join(path, name + ".json")):
                reasons.append(f"{who} wrote unreadable evidence")
            elif _alive(int(name.split("-", 1)[0])):
                reasons.append(f"{who} was still running when its test ended")
            else:
                reasons.append(f"{who} wrote no evidence (it crashed or was killed)")
        elif report.get("format") != child.FORMAT or report.get("lines") is None:
            reasons.append(f"{who} recorded no lines ({report.get('error') or 'unknown'})")
        else:
            reports.append(report)
    return reports, reasons
