"""The sys.monitoring recorder (Python 3.12+) records the same evidence as coverage.py's.

Each suite here is recorded twice in one repository, once with `FASTCI_RECORDER=coverage` and
once with `FASTCI_RECORDER=sysmon`, and every piece of evidence is compared: blocks, lines,
import-time work, fixtures' shares, files, kernels, children, module-call contexts. A line
the new recorder missed would be a test wrongly skipped later, so equality is the bar.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import LIBRARY, Project

if sys.version_info < (3, 12):
    pytest.skip(f"sys.monitoring recorder tests: need Python 3.12+, this is "
                f"{sys.version_info.major}.{sys.version_info.minor}", allow_module_level=True)

from fastci.runner.record.lines import SysmonLines, choose, monitoring  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Shapes a per-line, once-per-context recorder could get wrong: a generator made in one
# context and resumed in others, threads, recursion, exceptions, a branch only a later loop
# iteration takes, the same function in two tests, a forked child, a Python subprocess.
SHAPES = {
    **LIBRARY,
    "calc/shapes.py": '''
        import threading

        TABLE = {n: n * n for n in range(3)}


        def counter(n):
            for i in range(n):
                if i == 2:
                    yield -i
                else:
                    yield i


        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)


        def risky(x):
            try:
                if x < 0:
                    raise ValueError(x)
                return x
            except ValueError:
                return 0
            finally:
                TABLE.get(x)


        def loop(n):
            out = 0
            for i in range(n):
                if i > 3:
                    out += 2
                else:
                    out += 1
            return out


        def in_thread(x):
            box = []
            t = threading.Thread(target=lambda: box.append(fact(x)))
            t.start()
            t.join()
            return box[0]


        class Shape:
            sides = len(TABLE)

            def area(self):
                return [s * 2 for s in range(self.sides)]


        def square(x):
            return x * x
    ''',
    "tests/test_shapes.py": '''
        import multiprocessing
        import os
        import subprocess
        import sys

        import pytest

        from calc import shapes

        GEN = shapes.counter(5)


        @pytest.fixture(scope="module")
        def made():
            return shapes.Shape()


        def test_generator_resumed_here():
            assert next(GEN) == 0


        def test_generator_resumed_again():
            assert next(GEN) == 1
            assert next(GEN) == -2


        def test_recursion_and_loop():
            assert shapes.fact(4) == 24
            assert shapes.loop(6) == 8


        def test_loop_again():
            assert shapes.loop(2) == 2


        def test_exceptions():
            assert shapes.risky(-1) == 0
            assert shapes.risky(2) == 2


        def test_thread():
            assert shapes.in_thread(3) == 6


        def test_module_fixture(made):
            assert made.area() == [0, 2, 4]


        def test_module_fixture_again(made):
            assert len(made.area()) == 3


        def test_forked_child():
            ctx = multiprocessing.get_context("fork")
            p = ctx.Process(target=shapes.square, args=(3,))
            p.start()
            p.join()
            assert p.exitcode == 0


        def test_python_child():
            code = "from calc import shapes; assert shapes.fact(3) == 6"
            subprocess.run([sys.executable, "-c", code], check=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    ''',
}

_NOISE = {"duration", "peak_memory"}


def record(project: Project, recorder: str, out: Path, *args: str) -> dict:
    env = {**os.environ, "FASTCI_RECORDER": recorder, "PYTHONPATH": str(project.root)}
    env.pop("FASTCI_STORE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fastci-record",
         f"--fastci-out={out}", f"--rootdir={project.root}", *args],
        cwd=project.root, text=True, capture_output=True, env=env, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"with {recorder} (" in proc.stdout, proc.stdout[-2000:]
    return json.loads(out.read_text())


def evidence(data: dict) -> dict:
    """What a recording says about the code, without timings and the capture blobs' bytes
    (pickles and fingerprints come from torch, not from the line recorder)."""
    tests = {}
    for test in data["tests"]:
        test = {k: v for k, v in test.items() if k not in _NOISE}
        modules = test.get("modules")
        if modules:
            modules = {**modules, "captures": [
                {k: v for k, v in c.items() if k in ("index", "module", "lines", "why")}
                for c in modules["captures"]]}
            test["modules"] = modules
        tests[test["test_id"]] = test
    return {"tests": tests, "import_time": data["import_time"],
            "session_files": data["session_files"], "order": data["order"],
            "collected": data.get("collected")}


def assert_same(old: dict, new: dict) -> None:
    a, b = evidence(old), evidence(new)
    assert set(a["tests"]) == set(b["tests"])
    for test_id in a["tests"]:
        for key, value in a["tests"][test_id].items():
            assert b["tests"][test_id].get(key) == value, (test_id, key)
    assert a == b


def test_both_recorders_give_the_same_evidence(tmp_path):
    project = Project(tmp_path / "repo")
    project.write(SHAPES)
    project.write({"data/width.txt": "width = 7\n"})
    project.commit("shapes")
    old = record(project, "coverage", tmp_path / "coverage.json")
    new = record(project, "sysmon", tmp_path / "sysmon.json")
    assert_same(old, new)
    tests = evidence(new)["tests"]
    # The evidence is not empty: each test of the same function has its lines.
    loop = tests["tests/test_shapes.py::test_loop_again"]["lines"]["calc/shapes.py"]
    again = tests["tests/test_shapes.py::test_recursion_and_loop"]["lines"]["calc/shapes.py"]
    assert set(loop) < set(again)
    assert "calc/shapes.py" in tests["tests/test_shapes.py::test_thread"]["lines"]
    assert "calc/shapes.py" in tests["tests/test_shapes.py::test_forked_child"]["child_blocks"]


def test_both_recorders_give_the_same_evidence_with_module_captures(tmp_path):
    pytest.importorskip("torch")
    from test_prune import NET

    project = Project(tmp_path / "repo")
    project.write(NET)
    project.commit("net")
    old = record(project, "coverage", tmp_path / "coverage.json")
    new = record(project, "sysmon", tmp_path / "sysmon.json")
    assert_same(old, new)
    assert any(t.get("modules") and t["modules"]["captures"] for t in new["tests"])


@pytest.mark.slow
def test_both_recorders_give_the_same_evidence_on_tinyllm(tmp_path):
    """examples/tinyllm: Triton kernels in the interpreter, training loops, captures."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    repo = tmp_path / "tinyllm"
    shutil.copytree(ROOT / "examples" / "tinyllm", repo, ignore=shutil.ignore_patterns(
        "__pycache__", ".fastci", ".pytest_cache", "changes"))
    project = Project.at(repo)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "s"]):
        project.git(*args)
    old = record(project, "coverage", tmp_path / "coverage.json")
    new = record(project, "sysmon", tmp_path / "sysmon.json")
    assert_same(old, new)


# -- the recorder itself ---------------------------------------------------------------------

def _sample(n):
    total = 0
    for i in range(n):
        total += i
    return total


def _noted(scenario) -> dict[str, set[int]]:
    """Run `scenario(lines)` under a SysmonLines of its own: context -> the lines of this
    file it noted there."""
    lines = SysmonLines(str(ROOT))
    lines.start()
    try:
        scenario(lines)
    finally:
        lines.stop()
    here = str(Path(__file__).resolve())
    return {context: set(files.get(here, ())) for context, files in lines.lines().items()}


def test_each_context_sees_every_line_it_ran(tmp_path):
    def scenario(lines):
        lines.switch("a")
        _sample(3)
        lines.switch("b")
        _sample(3)
        lines.switch("c")
        lines.pause()
        _sample(3)  # paused: not this context's
        lines.resume()
        lines.switch("d")
        threading.Thread(target=_sample, args=(2,)).start()
        _sample(1)

    data = _noted(scenario)
    first = _sample.__code__.co_firstlineno
    body = {first + 1, first + 2, first + 3, first + 4}
    assert body <= data["a"]
    assert body <= data["b"]
    assert not (data.get("c", set()) & body)
    assert body <= data["d"]


def _branches(flag):
    if flag:
        taken = "one"
    else:
        taken = "other"
    return taken


def test_going_back_to_a_context_sees_what_ran_elsewhere_since(tmp_path):
    """A context re-entered (a test after a repeated module call's `|in`) keeps the events of
    code whose disabled lines it has all noted; the lines another context disabled since,
    and lines never run before, still reach it."""
    def scenario(lines):
        lines.switch("a")
        _branches(0)
        lines.switch("b")
        _branches(1)  # disables the "one" lines, which "a" never noted
        lines.switch("a")
        _branches(1)
        lines.switch("b")
        _branches(0)
        lines.switch("a")
        lines.pause()
        _branches(1)  # disabled while paused: noted nowhere
        lines.resume()
        lines.switch("c")
        _branches(1)

    data = _noted(scenario)
    first = _branches.__code__.co_firstlineno
    one, other = {first + 1, first + 2, first + 5}, {first + 1, first + 4, first + 5}
    assert data["a"] & (one | other) == one | other
    assert data["b"] & (one | other) == one | other
    assert data["c"] & (one | other) == one


def _paused_generator():
    yield 1
    resumed = 2  # runs after a late start
    yield resumed


def test_a_late_start_sees_the_rest_of_frames_already_running(tmp_path):
    """A child starts splitting its lines once it imports torch, in the middle of its
    program: the rest of the frames on every thread's stack, and of generators resumed
    later, must still be noted (their code objects never fire PY_START again)."""
    generator = _paused_generator()
    next(generator)
    go, done = threading.Event(), threading.Event()

    def waiting():
        go.wait()
        done.set()  # runs after a late start, in a frame started before it

    thread = threading.Thread(target=waiting)
    thread.start()
    lines = SysmonLines(str(ROOT))
    lines.start(late=True)
    try:
        lines.switch("late")
        after_start = 1
        next(generator)
        go.set()
        thread.join()
    finally:
        lines.stop()
    noted = lines.lines()["late"][str(Path(__file__).resolve())]
    here = test_a_late_start_sees_the_rest_of_frames_already_running.__code__.co_firstlineno
    source = Path(__file__).read_text().splitlines()

    def line_of(text: str, after: int = 0) -> int:
        return next(n for n, line in enumerate(source, 1) if n > after and text in line)

    assert line_of("after_start = 1", here) in noted
    assert line_of("resumed = 2  #") in noted
    assert line_of("done.set()  #", here) in noted
    assert after_start


def test_stop_frees_the_tool_id():
    lines = SysmonLines(str(ROOT))
    lines.start()
    tool = lines.tool
    assert monitoring.get_tool(tool) == "fastci"
    lines.stop()
    assert monitoring.get_tool(tool) is None
    assert choose("auto")[0] == "sysmon"


def test_without_a_free_tool_id_coverage_records(monkeypatch):
    monkeypatch.setattr("fastci.runner.record.lines._free_tool_id", lambda: None)
    assert choose("auto") == ("coverage", "no free sys.monitoring tool id")
    assert choose("sysmon")[0] == "coverage"


def test_a_recorder_whose_tool_ids_are_taken_does_not_start():
    taken = [t for t in (4, 3) if monitoring.get_tool(t) is None]
    for tool in taken:
        monitoring.use_tool_id(tool, "someone else")
    try:
        assert choose("sysmon") == ("coverage", "no free sys.monitoring tool id")
        with pytest.raises(RuntimeError, match="no free"):
            SysmonLines(str(ROOT)).start()
    finally:
        for tool in taken:
            monitoring.free_tool_id(tool)
