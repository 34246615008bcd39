"""The pytest plugin: records evidence (`--fastci-record`) and runs a selection in risk order
(`--fastci-plan`). Inert, and cheap to import, unless one of its options is given.

Under pytest-xdist (`-n 2`) the tests run in worker processes: each worker records its own
tests (every worker loads this plugin with the same options) and writes its recording as
JSON into a scratch folder the controller names in the worker's `workerinput`; the
controller runs no test, so it stops its own recorder before the workers start (they must
not inherit its hooks), then merges the workers' recordings into one (`merge_recordings`)
and stores it, or writes it to `--fastci-out`, as a serial session would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fastci.runner.record.recorder import Recorder

_recorder_key = pytest.StashKey["Recorder"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fastci", "FastCI runtime-evidence test selection")
    group.addoption("--fastci-record", action="store_true", default=False,
                    help="record per-test runtime evidence into the FastCI store")
    group.addoption("--fastci-store", metavar="PATH", default=None,
                    help="evidence store (default: .fastci/evidence.db in the repository)")
    group.addoption("--fastci-plan", metavar="FILE", default=None,
                    help="run only the tests a FastCI plan selects, in its order")
    group.addoption("--fastci-out", metavar="FILE", default=None,
                    help="write what was recorded to FILE (JSON) instead of the store")
    group.addoption("--fastci-capture-budget-mb", metavar="MB", default=None, type=_megabytes,
                    help="bytes of module captures kept per test, over [tool.fastci] "
                         "capture_budget_mb: the App passes its trusted base's here, so the "
                         "tree under test cannot raise its own")
    group.addoption("--fastci-uncaptured", metavar="FILE", default=None,
                    help="tests to record without capture for pruning, and the others' "
                         "capture allowance (JSON: {\"below\": seconds, \"tests\": [ids], "
                         "\"allowance\": {id: seconds}}): the App's, from its store's "
                         "durations; else the store recorded into says, by [tool.fastci] "
                         "capture_min_seconds and capture_share")


def _megabytes(text: str) -> float:
    import argparse  # noqa: PLC0415 (start-up: only when the option is given)
    import math  # noqa: PLC0415

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of megabytes: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"not zero or more megabytes: {text!r}")
    return value


def _worker_id(node) -> str:
    """The id pytest-xdist gives a worker ("gw0"), from a report's or a controller's node."""
    workerinput = getattr(node, "workerinput", None) or {}
    return str(workerinput.get("workerid") or getattr(getattr(node, "gateway", None), "id", "?"))


def capture_budget(option: float | None, configured: float) -> int:
    """Bytes of captures kept per test: the command line's budget (the App's trusted base)
    wins over the configuration of the tree under test."""
    return int((configured if option is None else option) * 2**20)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Start measuring before conftest files are imported, so their lines count too."""
    ns = early_config.known_args_namespace
    if not getattr(ns, "fastci_record", False):
        if getattr(ns, "fastci_plan", None):
            from fastci.runner.git import GitError, Repo  # noqa: PLC0415 (start-up)

            with contextlib.suppress(GitError):  # a plan needs no repository
                _check_rootdir(early_config, Repo.find(early_config.invocation_params.dir).root)
        return
    # Imported here: pytest loads the plugin in every run, and only a recording pays for these.
    from fastci.runner.config import ConfigError, load  # noqa: PLC0415 (start-up)
    from fastci.runner.git import GitError, Repo  # noqa: PLC0415 (start-up)
    from fastci.runner.record.recorder import Recorder  # noqa: PLC0415 (start-up)

    try:
        repo = Repo.find(early_config.invocation_params.dir)
    except GitError as exc:
        raise pytest.UsageError(f"fastci: cannot record: {exc}") from None
    _check_rootdir(early_config, repo.root)
    try:
        which = load(repo.root).recorder
    except ConfigError as exc:
        raise pytest.UsageError(f"fastci: {exc}") from None
    recorder = Recorder(repo, which)
    recorder.start()
    if os.environ.get("FASTCI_RECORD_PROFILE"):  # where the time goes, part by part
        from fastci.runner.record import profile  # noqa: PLC0415 (start-up: profiling only)

        profile.instrument(recorder)
    early_config.stash[_recorder_key] = recorder


_VALUED = ("--fastci-store", "--fastci-plan", "--fastci-out", "--fastci-capture-budget-mb",
           "--fastci-uncaptured")


def _check_rootdir(early_config: pytest.Config, root) -> None:
    """pytest finds its rootdir and configuration file before it loads plugins, so the value
    of `--fastci-out /tmp/run.json`, given apart, counts as a test path there once the file
    exists (a second run): the rootdir becomes /tmp, and the repository's configuration
    (`pythonpath`, `testpaths`, markers) is silently lost, which shows later as a conftest
    that cannot import the package. Said plainly instead, where it happened: a rootdir
    above the repository's root."""
    given = [a for a in early_config.invocation_params.args if a in _VALUED]
    rootpath = Path(early_config.rootpath).resolve()
    if given and rootpath in Path(root).resolve().parents:
        raise pytest.UsageError(
            f"fastci: give {given[0]}=VALUE with '=': given apart, pytest takes the value for "
            f"a test path while it looks for its configuration, and found rootdir {rootpath} "
            f"above the repository ({root})")


def pytest_configure(config: pytest.Config) -> None:
    recorder = config.stash.get(_recorder_key, None)
    plan = config.getoption("fastci_plan")
    if recorder is None and not plan:
        return
    config.pluginmanager.register(_Session(config, recorder, plan), "fastci-session")


def pytest_report_header(config: pytest.Config) -> str:
    recorder = config.stash.get(_recorder_key, None)
    plan = config.getoption("fastci_plan")
    if recorder is None and not plan:
        return "fastci: off (pass --fastci-record to record evidence, or use `fastci run`)"
    parts = []
    if recorder is not None:
        parts.append(f"recording evidence in {recorder.repo.root} with "
                     f"{recorder.line_recorder} ({recorder.line_recorder_why})")
    if plan:
        parts.append(f"running the plan in {plan}")
    return "fastci: " + "; ".join(parts)


class _Session:
    """The active part: registered only when recording or running a plan."""

    def __init__(self, config: pytest.Config, recorder: Recorder | None, plan: str | None
                 ) -> None:
        from fastci.runner.config import ConfigError, load  # noqa: PLC0415 (start-up: when active)

        self.config = config
        self.recorder = recorder
        self.plan = json.loads(Path(plan).read_text()) if plan else None
        self.failures: dict[str, dict] = {}
        self.collected: list[str] = []
        self._outcome: dict[str, str] = {}
        self._duration: dict[str, float] = {}
        root = recorder.repo.root if recorder else Path(config.rootpath)
        # Test ids are relative to the repository root, whatever rootdir pytest chose.
        rel = os.path.relpath(config.rootpath, root)
        self._prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        self._root = Path(root)
        try:
            self.settings = load(root)
        except ConfigError as exc:
            raise pytest.UsageError(f"fastci: {exc}") from None
        self.capture_budget = capture_budget(config.getoption("fastci_capture_budget_mb"),
                                             self.settings.capture_budget_mb)
        self.workers_dir: str | None = None  # an xdist controller's: where workers write
        self._ran_by: dict[str, str] = {}  # an xdist controller's: test id -> worker id
        self._worker_errors: dict[str, str] = {}  # worker id -> why it recorded nothing
        workerinput = getattr(config, "workerinput", None)  # an xdist worker's
        self.write_to: str | None = None
        if recorder is not None and workerinput and workerinput.get("fastci_workers_dir"):
            self.write_to = os.path.join(workerinput["fastci_workers_dir"],
                                         f"{workerinput.get('workerid', 'gw')}.json")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self) -> None:
        """An xdist controller (its "dsession" is registered by now, whatever order the
        plugins' configure hooks ran in, and its workers start after this hook): it runs no
        test, so it records nothing and names the folder its workers write to."""
        if self.recorder is not None and self.config.pluginmanager.has_plugin("dsession"):
            self.recorder.abandon()
            self.workers_dir = tempfile.mkdtemp(prefix="fastci-xdist-")

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """pytest-xdist, in the controller, before a worker starts: where it writes."""
        if self.workers_dir is not None:
            node.workerinput["fastci_workers_dir"] = self.workers_dir

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist, in the controller: why a worker that is gone wrote no recording."""
        if self.workers_dir is None:
            return
        output = getattr(node, "workeroutput", None) or {}
        why = output.get("fastci_error") or (f"it went down: {error}" if error else None)
        if why:
            self._worker_errors[_worker_id(node)] = str(why)[:500]

    def pytest_collection_finish(self) -> None:
        # Hook Triton launches only if the code under test imported Triton while being
        # collected: importing it ourselves would cost every session half a second.
        if self.recorder is not None:
            self.recorder.scan_modules()  # reads by string, memoized functions
        if self.recorder is not None and "triton" in sys.modules:
            self.recorder.install_kernel_hook()
        # Likewise torch: module calls are captured for pruning only in suites that use it.
        if self.recorder is not None and "torch" in sys.modules and self.settings.prune != "off":
            self.recorder.install_module_capture(self.capture_budget)
            capture = self.recorder.capture
            assert capture is not None
            capture.uncaptured, capture.allowance = self._capture_limits()
            capture.children = self.settings.capture_children == "on"

    def _capture_limits(self) -> tuple[dict[str, str], dict[str, float]]:
        """The collected tests recorded without capture, each with why (their last run took
        under capture_min_seconds), and the seconds of capture each other test with a known
        duration may spend (capture_share of it): the App's file, or this store's
        durations. A test with no duration on record is captured without limit."""
        given = self.config.getoption("fastci_uncaptured")
        if given:
            try:
                data = json.loads(Path(given).read_text())
                below, tests = float(data["below"]), [str(t) for t in data["tests"]]
                allowance = {str(t): float(s) for t, s in data.get("allowance", {}).items()}
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                raise pytest.UsageError(f"fastci: --fastci-uncaptured {given}: {exc}") from None
        else:
            below, share = self.settings.capture_min_seconds, self.settings.capture_share
            durations = self._last_durations()
            tests = [t for t, took in durations.items() if took < below]
            allowance = {t: share * took for t, took in durations.items()
                         if share and took >= below}
        why = (f"its last run took under {below:g} s (capture_min_seconds), so pruning it "
               "would save less than capturing its calls costs")
        collected = set(self.collected)
        return ({t: why for t in tests if t in collected},
                {t: s for t, s in allowance.items() if t in collected})

    def _last_durations(self) -> dict[str, float]:
        """The store's latest duration of each test; none where there is no store yet."""
        from fastci.runner.store import StoreError, open_store, resolve_store  # noqa: PLC0415

        if not (self.settings.capture_min_seconds or self.settings.capture_share):
            return {}
        assert self.recorder is not None
        location = resolve_store(self.config.getoption("fastci_store"), self.settings.store,
                                 self.recorder.repo.root)
        try:
            with open_store(location, create=False) as store:
                return store.durations()
        except StoreError:
            return {}  # the first recording: every test is captured

    def test_id(self, nodeid: str) -> str:
        return self._prefix + nodeid if self._prefix else nodeid

    # -- collection: contexts per test module, then the plan's selection and order -----------
    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        if self.recorder is None or not isinstance(collector, pytest.File):
            return (yield)
        rel = Path(str(collector.path)).resolve().relative_to(self.recorder.repo.root.resolve())
        self.recorder.begin_collect(rel.as_posix())
        try:
            return (yield)
        finally:
            self.recorder.end_collect()

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]
                                      ) -> None:
        self.collected = [self.test_id(item.nodeid) for item in items]
        if not self.plan:
            return
        from fastci.runner.selection.plan import apply_plan  # noqa: PLC0415 (start-up: plans only)

        keep, drop = apply_plan(self.plan, self.collected)
        by_id = {self.test_id(item.nodeid): item for item in items}
        phase = self.plan.get("dimensions")
        if phase:  # one phase of a run: the blocking dimensions, or all the others
            names = set(phase["names"])

            def wanted(test_id: str) -> bool:
                markers = [m.name for m in by_id[test_id].iter_markers()]
                return (self.settings.dimension_of(markers) in names) != phase["exclude"]

            drop += [t for t in keep if not wanted(t)]
            keep = [t for t in keep if wanted(t)]
        if drop:
            config.hook.pytest_deselected(items=[by_id[i] for i in drop])
        items[:] = [by_id[i] for i in keep]

    # -- fixtures broader than a test get their own context -----------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef):
        if self.recorder is None or fixturedef.scope == "function":
            return (yield)
        context = _fixture_context(fixturedef)
        self.recorder.push(context)
        capture = self.recorder.capture
        try:
            if capture is None or os.environ.get("FASTCI_CAPTURE_FUNCTIONS") == "0":
                return (yield)
            # Its calls are captured for the tests that use it (`capture.begin_shared`),
            # through the names its own file binds, as a function-scoped fixture's are.
            func: Any = getattr(fixturedef, "func", None)
            namespace = getattr(func, "__globals__", None)
            filename = getattr(getattr(func, "__code__", None), "co_filename", None)
            if not (isinstance(filename, str) and os.path.realpath(filename).startswith(
                    os.path.realpath(str(self._root)) + os.sep)):
                namespace = None  # a plugin's or a library's fixture: none of the tree's code
            capture.begin_shared(context)
            try:
                with capture.bindings.wrapped(namespace, filename):
                    return (yield)
            finally:
                capture.end_shared()
        finally:
            self.recorder.pop()

    # -- per test ---------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item):
        if self.recorder is not None:
            if not isinstance(item, pytest.Function):
                self.recorder.set_item_code(self.test_id(item.nodeid),
                                            *_item_code(item, self.recorder.repo.root))
            self.recorder.begin_test(self.test_id(item.nodeid), _shared_contexts(item))
        try:
            with self._bound(item):
                return (yield)
        finally:
            if self.recorder is not None:
                markers = tuple(dict.fromkeys(m.name for m in item.iter_markers()))
                self.recorder.end_test(
                    self.test_id(item.nodeid), self._outcome.get(item.nodeid, "passed"),
                    self._duration.get(item.nodeid, 0.0), markers,
                    self.settings.dimension_of(markers))

    def _bound(self, item) -> contextlib.AbstractContextManager:
        """While the test runs (setup, call and teardown), the repository functions that its
        file and its function-scoped fixtures' files call are bound to capturing wrappers
        (`bindings.py`), so their calls can be replayed for pruning: a model or a config
        built by a fixture is a call like one in the test's body."""
        stack = contextlib.ExitStack()
        capture = self.recorder.capture if self.recorder is not None else None
        if capture is None or not isinstance(item, pytest.Function) \
                or self.test_id(item.nodeid) in capture.uncaptured \
                or os.environ.get("FASTCI_CAPTURE_FUNCTIONS") == "0":
            return stack
        for namespace, filename in _binding_namespaces(item, str(self._root)):
            stack.enter_context(capture.bindings.wrapped(namespace, filename))
        return stack

    def pytest_runtest_logreport(self, report) -> None:
        nodeid = report.nodeid
        if self.workers_dir is not None and getattr(report, "node", None) is not None:
            self._ran_by[self.test_id(nodeid)] = _worker_id(report.node)
        self._duration[nodeid] = self._duration.get(nodeid, 0.0) + report.duration
        current = self._outcome.get(nodeid, "passed")
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
            if current not in ("failed", "error"):
                self._outcome[nodeid] = outcome
                self.failures[self.test_id(nodeid)] = _failure(report, self._root)
        elif report.skipped and report.when in ("setup", "call") and current == "passed":
            self._outcome[nodeid] = "passed" if hasattr(report, "wasxfail") else "skipped"

    def pytest_sessionfinish(self) -> None:
        if self.recorder is None:
            return
        from fastci.runner.record.recorder import recording_to_json  # noqa: PLC0415 (start-up)
        from fastci.runner.store import (  # noqa: PLC0415 (start-up)
            StoreError,
            open_store,
            resolve_store,
        )

        out = self.config.getoption("fastci_out")
        # --fastci-store as given; else [tool.fastci] store, relative to the repository.
        store_path = resolve_store(self.config.getoption("fastci_store"), self.settings.store,
                                   self.recorder.repo.root)
        try:
            with open_store(store_path) as store:
                if self.workers_dir is not None:
                    recording, failures, collected = self._merge_workers()
                else:
                    recording = self.recorder.finish(store)
                    failures, collected = self.failures, self.collected
                from fastci.runner.selection.scope import (  # noqa: PLC0415 (start-up)
                    from_pytest,
                )

                recording.scope = from_pytest(self.config, self.recorder.repo.root).to_json()
                if self.write_to is not None:  # an xdist worker: the controller stores
                    data = recording_to_json(recording, failures)
                    data["collected"] = collected
                    partial = Path(self.write_to + ".partial")
                    partial.write_text(json.dumps(data))
                    partial.replace(self.write_to)  # whole, or not there at all
                elif out:
                    data = recording_to_json(recording, failures)
                    data["collected"] = collected
                    Path(out).write_text(json.dumps(data))
                else:
                    from fastci.runner.execution.carry import (  # noqa: PLC0415 (start-up)
                        store_recording,
                    )

                    summary = store_recording(store, self.recorder.repo, recording)
                    self._summary = summary
            if self.write_to is None:
                _prewarm(self.recorder.capture)
        except StoreError as exc:
            self._tell_controller(exc)
            raise pytest.UsageError(f"fastci: {exc}") from None
        except BaseException as exc:
            self._tell_controller(exc)
            raise

    def _tell_controller(self, exc: BaseException) -> None:
        """An xdist worker that could not write its recording says why to the controller,
        which then refuses to store a recording without its tests."""
        output = getattr(self.config, "workeroutput", None)
        if self.write_to is not None and output is not None:
            output["fastci_error"] = f"{type(exc).__name__}: {exc}"[:500]

    def _merge_workers(self):
        """The workers' recordings as one, with their failures and what they collected."""
        from fastci.runner.record.recorder import (  # noqa: PLC0415 (start-up)
            merge_recordings,
            recording_from_json,
        )

        assert self.workers_dir is not None
        recordings, failures, collected = [], {}, []
        try:
            for name in sorted(os.listdir(self.workers_dir)):
                if not name.endswith(".json"):
                    continue  # a worker that died while writing (its `.partial`)
                data = json.loads(Path(self.workers_dir, name).read_text())
                recording, worker_failures = recording_from_json(data)
                recordings.append(recording)
                failures.update(worker_failures)
                collected += data.get("collected", [])
        finally:
            shutil.rmtree(self.workers_dir, ignore_errors=True)
        if not recordings:
            raise pytest.UsageError("fastci: no pytest-xdist worker recorded anything (did "
                                    "every worker crash?); nothing was recorded")
        merged = merge_recordings(recordings)
        self._check_every_worker_delivered(merged)
        return merged, failures, list(dict.fromkeys(collected))

    def _check_every_worker_delivered(self, merged) -> None:
        """Every test a worker reported must be in the merged recording: a worker whose
        recording is missing would otherwise lose its tests' evidence without a word."""
        missing: dict[str, list[str]] = {}
        for test_id, worker in self._ran_by.items():
            if test_id not in merged.tests:
                missing.setdefault(worker, []).append(test_id)
        if not missing:
            return
        parts = []
        for worker, tests in sorted(missing.items()):
            why = self._worker_errors.get(worker, "its recording file is missing or lacks them")
            parts.append(f"{worker} ran {len(tests)} test(s) with no recording "
                         f"(e.g. {tests[0]}): {why}")
        raise pytest.UsageError("fastci: a pytest-xdist worker's recording is incomplete; "
                                "nothing was stored: " + "; ".join(parts))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        summary = getattr(self, "_summary", None)
        if summary:
            terminalreporter.write_line(f"fastci: {summary}")


def _fixture_context(fixturedef) -> str:
    return f"fixture:{fixturedef.scope}:{fixturedef.baseid}::{fixturedef.argname}"


def _binding_namespaces(item, root: str) -> list[tuple[dict, str]]:
    """(namespace, file) of the test function and of each function-scoped fixture it uses
    that is defined in a test file or a conftest.py of the repository (a plugin's or a
    library's fixture is no code of the test's), each once."""
    from fastci.runner.analysis.discover import is_test_code  # noqa: PLC0415

    found: dict[int, tuple[dict, str]] = {}
    namespace = getattr(getattr(item, "obj", None), "__globals__", None)
    if isinstance(namespace, dict):
        found[id(namespace)] = (namespace, str(item.path))
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    prefix = os.path.realpath(root) + os.sep
    for name in item.fixturenames:
        for fixturedef in defs.get(name, ()):
            func: Any = getattr(fixturedef, "func", None)
            namespace = getattr(func, "__globals__", None)
            if fixturedef.scope != "function" or not isinstance(namespace, dict) \
                    or id(namespace) in found:
                continue
            filename = os.path.realpath(func.__code__.co_filename)
            rel = filename[len(prefix):] if filename.startswith(prefix) else None
            if rel and is_test_code(rel):
                found[id(namespace)] = (namespace, filename)
    return list(found.values())


def _shared_contexts(item) -> list[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    contexts = []
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope != "function":
            contexts.append(_fixture_context(defs[-1]))
    return contexts


def _item_code(item, root: Path) -> tuple[str, str, str]:
    """(kind, path, object) of an item whose code is not a Python function: a doctest's is
    its docstring (object: its qualname in the module, "" for the module's own), any other
    kind's is its file."""
    try:
        path = Path(str(item.path)).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        path = str(item.path)
    dtest = getattr(item, "dtest", None)
    if type(item).__name__ == "DoctestItem" and dtest is not None:
        module = str(dtest.globs.get("__name__", "")) if path.endswith(".py") else ""
        name = dtest.name
        obj = name[len(module) + 1:] if module and name.startswith(module + ".") else \
            ("" if name == module else name)
        return "doctest", path, obj
    return type(item).__name__, path, ""


def _failure(report, root: Path) -> dict:
    """Where and why a test failed, for annotations: the crash point, repo-relative."""
    crash = getattr(report.longrepr, "reprcrash", None)
    where = {"path": None, "line": None, "message": str(report.longrepr)[-2000:],
             "when": report.when, "at": time.time()}
    if crash is not None:
        path = crash.path
        try:
            path = Path(crash.path).resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass  # outside the repository (a library frame): keep it as pytest said
        where.update(path=path, line=crash.lineno, message=crash.message[:2000])
    return where


PREWARM = "FASTCI_PREWARM"  # set by the CLI for its recordings (`Engine`)


def _prewarm(capture) -> None:
    """A recording the CLI ran on the developer's machine starts, as it ends, the replay
    zygotes its next selection will use (`prune/zygote.py`), one per session environment
    its captures hold (at most two), so the first selection after it does not wait for
    torch's import. The zygote's key is the selecting process's environment: this session's
    as it began, less what the CLI set for it (and what pytest sets, which no replay has).
    A guess that misses costs an idle zygote (it exits after FASTCI_ZYGOTE_IDLE seconds),
    never a replay."""
    if os.environ.get(PREWARM) != "1" or capture is None \
            or os.environ.get("FASTCI_WARM_REPLAYS", "1") == "0":
        return
    sessions = {json.dumps(sorted((k, v) for k, v in c.env.items()
                                  if not k.startswith("FASTCI_")))
                for calls in capture.captures.values() for c in calls}
    if not sessions:
        return
    try:
        from fastci.runner.prune import zygote  # noqa: PLC0415 (only a recording's end)
        from fastci.runner.prune.replayers import replay_environment  # noqa: PLC0415

        base = {k: v for k, v in capture._environ.items() if k != PREWARM}
        for session in sorted(sessions)[:2]:
            zygote.prestart(replay_environment(dict(json.loads(session)), base))
    except Exception:  # noqa: BLE001 - an optimisation: the selection starts its own
        pass
