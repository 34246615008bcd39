"""Child processes record for the test that started them, and native readers are seen.

Every way a test can start a child that runs the repository's code has a test here, on a
real repository recorded through the real CLI. Each project gives every test its own function,
run only in that test's child, so that a change selects exactly one test: a child that escapes
notice leaves its test unselected, and an unsound merge (credit to the wrong test, or to every
test) selects a test whose processes never ran the change.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest

from fastci.runner.record.children import Children

WORK = '''
def in_python_c(x):
    return x + 1


def in_python_m(x):
    return x + 2


def in_pytest_child(x):
    return x + 3


def in_spawn_pool(x):
    return x * 2


def in_forkserver(x):
    return x * 3


def in_fork_pool(x):
    return x * 4


def in_terminated_subprocess(x):
    return x * 5


def in_terminated_process(x):
    return x * 6


def nobody(x):
    return x - 1
'''

PROCESSES = {
    "pyproject.toml": "[project]\nname = 'sp'\nversion = '0'\n",
    "sp/__init__.py": "",
    "sp/work.py": WORK,
    "sp/tool.py": '''
        import sys

        from sp.work import in_python_m

        if __name__ == "__main__":
            print(in_python_m(int(sys.argv[1])))
    ''',
    "inner/inner_check.py": '''
        from sp.work import in_pytest_child


        def test_inner():
            assert in_pytest_child(1) == 4
    ''',
    "tests/test_processes.py": '''
        import multiprocessing
        import subprocess
        import sys
        import time

        from sp import work


        def run(*args):
            return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                                  check=True).stdout.strip()


        def test_python_c():
            assert run("-c", "from sp.work import in_python_c; print(in_python_c(1))") == "2"


        def test_python_m():
            assert run("-m", "sp.tool", "1") == "3"


        def test_pytest_child():
            assert "1 passed" in run("-m", "pytest", "-q", "-p", "no:cacheprovider",
                                     "inner/inner_check.py")


        def test_spawn_pool():
            with multiprocessing.get_context("spawn").Pool(2) as pool:
                assert pool.map(work.in_spawn_pool, [1, 2]) == [2, 4]


        def test_forkserver():
            ctx = multiprocessing.get_context("forkserver")
            with ctx.Pool(1) as pool:
                assert pool.map(work.in_forkserver, [1]) == [3]


        def test_fork_pool():
            with multiprocessing.get_context("fork").Pool(2) as pool:
                assert pool.map(work.in_fork_pool, [1, 2]) == [4, 8]


        # Fixtures end servers with terminate() and a wait without timeout: each child writes
        # its evidence as SIGTERM ends it, and one that got SIGTERM just before it blocked
        # (in time.sleep) is signalled again, never waited on forever (record/nudge.py).
        SERVE = "from sp.work import in_terminated_subprocess as f; f(1); " \\
                "print('up', flush=True); import time; time.sleep(60)"


        def serve(ready):
            work.in_terminated_process(1)
            ready.set()
            time.sleep(60)


        def test_terminated_subprocess():
            for _ in range(6):
                proc = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE)
                assert proc.stdout.readline() == b"up\\n"
                proc.terminate()
                proc.wait()
                proc.stdout.close()


        def test_terminated_process():
            ctx = multiprocessing.get_context("fork")
            for _ in range(6):
                ready = ctx.Event()
                proc = ctx.Process(target=serve, args=(ready,))
                proc.start()
                assert ready.wait(30)
                proc.terminate()
                proc.join()


        def test_no_child():
            assert work.nobody(1) == 0
    ''',
}

WAYS = {  # the function each test's child, and only its child, runs
    "in_python_c": "test_python_c",
    "in_python_m": "test_python_m",
    "in_pytest_child": "test_pytest_child",
    "in_spawn_pool": "test_spawn_pool",
    "in_forkserver": "test_forkserver",
    "in_fork_pool": "test_fork_pool",
    "in_terminated_subprocess": "test_terminated_subprocess",
    "in_terminated_process": "test_terminated_process",
    "nobody": "test_no_child",
}


def _change(project, function: str, path: str = "sp/work.py") -> dict[str, list[str]]:
    """Negate what `function` returns; the selected tests, with their reasons."""
    project.edit(path, f"def {function}(x):\n    return x", f"def {function}(x):\n    return -x")
    return {t["id"]: t["reasons"] for t in project.select()["tests"]
            if t["decision"] == "selected"}


def test_every_way_of_starting_a_python_child_records_for_its_test(project):
    project.write(PROCESSES)
    project.commit()
    project.record()
    for function, test in WAYS.items():
        chosen = _change(project, function)
        assert set(chosen) == {f"tests/test_processes.py::{test}"}, (function, chosen)
        project.git("checkout", "sp/work.py")
    explained = project.fastci("explain", "tests/test_processes.py::test_spawn_pool").stdout
    assert "sp/work.py: <module>, in_spawn_pool" in explained
    assert "ran in child processes (never pruned)" in explained


CRASHES = {
    "pyproject.toml": "[project]\nname = 'cr'\nversion = '0'\n",
    "cr/__init__.py": "",
    "cr/work.py": '''
        import os
        import signal


        def dies():
            os.kill(os.getpid(), signal.SIGKILL)


        def lingers():
            import time
            time.sleep(8)


        def fine():
            return 1
    ''',
    "tests/test_crash.py": '''
        import multiprocessing
        import subprocess
        import sys

        from cr import work


        def test_child_killed():
            p = multiprocessing.get_context("spawn").Process(target=work.dies)
            p.start()
            p.join()
            assert p.exitcode == -9


        def test_child_outlives_test():
            subprocess.Popen([sys.executable, "-c", "from cr.work import lingers; lingers()"])


        def test_child_fine():
            p = multiprocessing.get_context("spawn").Process(target=work.fine)
            p.start()
            p.join()
    ''',
    "data/unrelated.json": "{}\\n",
}


def test_a_child_without_evidence_keeps_select_on_any_change_and_says_why(project):
    project.write(CRASHES)
    project.commit()
    project.record()
    project.edit("cr/work.py", "return 1", "return 2")  # only test_child_fine's child ran it
    result = project.select()
    chosen = {t["id"]: t["reasons"] for t in result["tests"] if t["decision"] == "selected"}
    assert set(chosen) == {"tests/test_crash.py::test_child_fine",
                           "tests/test_crash.py::test_child_killed",
                           "tests/test_crash.py::test_child_outlives_test"}
    killed = " ".join(chosen["tests/test_crash.py::test_child_killed"])
    assert "could not merge" in killed and "wrote no evidence (it crashed or was killed)" in killed
    lingering = " ".join(chosen["tests/test_crash.py::test_child_outlives_test"])
    assert "was still running when its test ended" in lingering
    assert "executed changed code: cr/work.py::fine" in \
        " ".join(chosen["tests/test_crash.py::test_child_fine"])
    explained = project.fastci("explain", "tests/test_crash.py::test_child_killed").stdout
    assert "child evidence not merged (select on any change)" in explained
    # No half-merged evidence: the killed child's own lines (dies) are not in the evidence.
    assert "dies" not in explained.split("evidence:", 1)[1]


INTERRUPTED = {
    "pyproject.toml": "[project]\nname = 'ix'\nversion = '0'\n",
    "ix/__init__.py": "",
    "ix/work.py": '''
        def by_forkserver(x):
            return x + 1


        def by_spawn(x):
            return x + 2
    ''',
    # A pool's SIGTERM can land while its worker is already exiting, between any two
    # bytecodes of the main thread. The child arms it at the first audited event after its
    # exit began (an import, a file opened): a thread that sleeps takes the signal where the
    # evidence writer blocks it, and the main thread runs the handler all the same.
    "ix/sabotage.py": '''
        import atexit
        import os
        import signal
        import sys
        import threading
        import time

        from ix import work

        _armed = []


        def _audit(event, args):
            if _armed == [True]:
                _armed.append("sent")
                os.kill(os.getpid(), signal.SIGTERM)


        def _arm():
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
            sys.addaudithook(_audit)


        def forkserver_child():
            work.by_forkserver(1)
            _arm()
            real_exit = os._exit

            def exiting(code):
                _armed.append(True)
                real_exit(code)

            os._exit = exiting  # the forkserver's child ends with os._exit


        def spawn_child():
            work.by_spawn(1)
            _arm()
            atexit.register(_armed.append, True)  # runs before the recording's exit handler
    ''',
    "tests/test_interrupted.py": '''
        import multiprocessing

        from ix import sabotage


        def test_forkserver_exit():
            p = multiprocessing.get_context("forkserver").Process(
                target=sabotage.forkserver_child)
            p.start()
            p.join()


        def test_spawn_exit():
            p = multiprocessing.get_context("spawn").Process(target=sabotage.spawn_child)
            p.start()
            p.join()
    ''',
}


def test_a_sigterm_that_lands_while_a_child_exits_keeps_its_evidence(project):
    """A forkserver pool's worker got its SIGTERM as it began to exit: the handler's own
    import of a module the interrupted exit was importing failed, and the worker died with
    no evidence (its test then selected on any change, two CI runs in four); a SIGTERM that
    reached the handler while the evidence was written ended the process half-way."""
    project.write(INTERRUPTED)
    project.commit()
    project.record()
    for function, test, line in (("by_forkserver", "test_forkserver_exit", 2),
                                 ("by_spawn", "test_spawn_exit", 6)):
        chosen = _change(project, function, "ix/work.py")
        assert chosen == {f"tests/test_interrupted.py::{test}": [
            f"executed changed code: ix/work.py::{function} (modified: line {line} changed)"]}
        project.git("checkout", "ix/work.py")

def test_partial_or_missing_evidence_files_merge_nothing(tmp_path):
    """The parent's reading of a context's folder, on files as children leave them."""
    children = Children(str(tmp_path), [], lambda: None)
    children.start()
    try:
        folder = tmp_path / "t"
        from fastci.runner.record import child  # noqa: PLC0415

        where = child.tag_folder(children.folder, "tests/t.py::test_a")
        os.makedirs(where)
        dead = 2 ** 22 + 1  # above pid_max: no such process
        good = {"format": 1, "pid": dead, "ppid": os.getpid(), "tag": "tests/t.py::test_a",
                "argv": ["python"], "lines": {str(folder / "m.py"): [1]}, "files": [],
                "kernels": [], "ranks": [], "spawned": 0}
        for name, report in ((f"{dead}-a", good), (f"{dead}-b", "{\"format\": 1, \"li")):
            marker = {"pid": dead, "ppid": os.getpid(), "argv": ["python"],
                      "tag": "tests/t.py::test_a"}
            with open(os.path.join(where, f"{name}.start"), "w") as fh:
                json.dump(marker, fh)
            with open(os.path.join(where, f"{name}.json"), "w") as fh:
                fh.write(report if isinstance(report, str) else json.dumps(report))
        children.collect("tests/t.py::test_a")
        assert "tests/t.py::test_a" not in children.evidence  # one bad file: nothing merged
        assert children.unmerged(["tests/t.py::test_a"]) == [
            f"child pid {dead} (python) wrote unreadable evidence"]
    finally:
        children.stop()


NATIVE = {
    "pyproject.toml": "[project]\nname = 'nat'\nversion = '0'\n",
    "nat/__init__.py": "",
    "nat/read.py": '''
        import ctypes
        import ctypes.util
        import os

        _libc = ctypes.CDLL(ctypes.util.find_library("c"))
        _libc.fopen.restype = ctypes.c_void_p
        _libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        _libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                ctypes.c_void_p]
        _libc.fclose.argtypes = [ctypes.c_void_p]


        def read_native(path):
            """Through the C library: no Python audit event is raised."""
            fh = _libc.fopen(os.fsencode(path), b"rb")
            buf = ctypes.create_string_buffer(64)
            n = _libc.fread(buf, 1, 64, fh)
            _libc.fclose(fh)
            return buf.raw[:n].decode()
    ''',
    "assets/vocab.txt": "a b c\n",
    "assets/other.txt": "x y\n",
    "tests/test_native.py": '''
        from nat.read import read_native


        def test_vocab():
            assert read_native("assets/vocab.txt").split() == ["a", "b", "c"]


        def test_other():
            assert read_native("assets/other.txt").split() == ["x", "y"]
    ''',
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_a_file_read_through_the_c_library_selects_its_reader(project):
    project.write(NATIVE)
    project.commit()
    project.record()
    project.write({"assets/vocab.txt": "a b d\n"})
    assert project.selected() == {"tests/test_native.py::test_vocab"}
    explained = project.fastci("explain", "tests/test_native.py::test_vocab").stdout
    assert "read 1 data files: assets/vocab.txt" in explained
    assert "kernel's file events" in explained


LOADER = {
    "pyproject.toml": "[project]\nname = 'dl'\nversion = '0'\n",
    "dl/__init__.py": "",
    "dl/data.py": '''
        import torch
        from torch.utils.data import Dataset


        def keep(x):
            """A filter only the DataLoader's workers run."""
            return x % 2 == 0


        def scale(x):
            """Only the test process runs this."""
            return x * 1.0


        class Numbers(Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return torch.tensor(float(i)) if keep(i) else torch.tensor(-1.0)
    ''',
    "tests/test_loader.py": '''
        import torch
        from torch.utils.data import DataLoader

        from dl.data import Numbers, keep, scale


        def test_dataloader_workers():
            batches = list(DataLoader(Numbers(), batch_size=4, num_workers=2))
            assert torch.cat(batches).tolist() == [0, -1, 2, -1, 4, -1, 6, -1]


        def test_in_process():
            assert scale(2) == 2.0
    ''',
}


def test_dataloader_workers_record_for_their_test(project):
    project.write(LOADER)
    project.commit()
    project.record()
    project.edit("dl/data.py", "return x % 2 == 0", "return x % 2 == 1")
    assert project.selected() == {"tests/test_loader.py::test_dataloader_workers"}
    project.git("checkout", "dl/data.py")
    project.edit("dl/data.py", "return x * 1.0", "return x * 2.0")
    assert project.selected() == {"tests/test_loader.py::test_in_process"}


DIST = {
    "pyproject.toml": "[project]\nname = 'dp'\nversion = '0'\n",
    "dp/__init__.py": "",
    "dp/dist.py": '''
        import os

        import torch
        import torch.distributed as dist


        def on_rank0(x):
            return x + 1


        def on_every_rank(x):
            return x * 2


        def worker(rank, world):
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" +
                                    os.environ["DP_PORT"], rank=rank, world_size=world)
            t = torch.tensor([float(on_every_rank(rank))])
            dist.all_reduce(t)
            dist.destroy_process_group()
    ''',
    "dp/in_mp_spawn.py": '''
        def only_in_mp_spawn(x):
            return x - 3
    ''',
    "scripts/train.py": '''
        import torch
        import torch.distributed as dist

        from dp.dist import on_every_rank, on_rank0

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        t = torch.tensor([float(on_every_rank(rank))])
        dist.all_reduce(t)
        if rank == 0:
            assert on_rank0(t.item()) == 3.0
        dist.destroy_process_group()
    ''',
    "tests/test_torch_children.py": '''
        import os
        import socket
        import subprocess
        import sys

        import torch.multiprocessing as mp


        def free_port():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return str(s.getsockname()[1])


        def _ranked(rank, world):
            from dp.dist import worker
            from dp.in_mp_spawn import only_in_mp_spawn
            only_in_mp_spawn(rank)
            worker(rank, world)


        def test_mp_spawn():
            os.environ["DP_PORT"] = free_port()
            mp.spawn(_ranked, args=(2,), nprocs=2, join=True)


        def test_torchrun():
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                            "--master_port", free_port(), "scripts/train.py"],
                           check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    ''',
}


@pytest.mark.slow
def test_mp_spawn_and_torchrun_record_for_their_tests_with_their_ranks(project):
    project.write(DIST)
    project.commit()
    project.record()
    tests = "tests/test_torch_children.py::"
    project.edit("dp/in_mp_spawn.py", "return x - 3", "return x - 4")
    assert project.selected() == {tests + "test_mp_spawn"}
    project.git("checkout", "dp/in_mp_spawn.py")
    project.edit("dp/dist.py", "return x + 1", "return x + 2")  # only torchrun's rank 0
    assert project.selected() == {tests + "test_torchrun"}
    project.git("checkout", "dp/dist.py")
    project.edit("scripts/train.py", "rank = dist.get_rank()", "rank = int(dist.get_rank())")
    assert project.selected() == {tests + "test_torchrun"}
    project.git("checkout", "scripts/train.py")
    for test in ("test_mp_spawn", "test_torchrun"):
        explained = project.fastci("explain", tests + test).stdout
        assert "process groups: gloo:2" in explained, explained



KERNEL = {
    "pyproject.toml": "[project]\nname = 'kern'\nversion = '0'\n",
    "kern/__init__.py": "",
    "kern/ops.py": '''
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def _scale(x):
            return x * 2


        @triton.jit
        def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, _scale(tl.load(x_ptr + offs, mask=mask)), mask=mask)


        def double(x):
            out = torch.empty_like(x)
            double_kernel[(1,)](x, out, x.numel(), BLOCK=16)
            return out
    ''',
    "tests/test_kern.py": '''
        import os
        import subprocess
        import sys


        def test_kernel_in_a_child():
            code = ("import torch; from kern.ops import double; "
                    "print(double(torch.ones(4)).tolist())")
            out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                 text=True, env={**os.environ, "TRITON_INTERPRET": "1"}).stdout
            assert out.strip() == "[2.0, 2.0, 2.0, 2.0]"


        def test_no_kernel():
            assert sys.version_info >= (3,)
    ''',
}


def test_a_triton_kernel_a_child_launches_is_evidence_of_its_test(project):
    """Children launch kernels untraced, as the parent does (the interpreter's Python is not
    traced): the launch itself is the evidence, and it covers the jit functions it calls."""
    pytest.importorskip("triton")
    project.write(KERNEL)
    project.commit()
    project.record()
    test = "tests/test_kern.py::test_kernel_in_a_child"
    explained = project.fastci("explain", test).stdout
    assert "launched kernels: kern/ops.py::double_kernel" in explained, explained
    project.edit("kern/ops.py", "return x * 2", "return x * 3")  # a jit function it calls
    chosen = {t["id"]: t["reasons"] for t in project.select()["tests"]
              if t["decision"] == "selected"}
    assert set(chosen) == {test}
    assert chosen[test][0].startswith("launched a Triton kernel"), chosen[test]


IMPORTS = {
    "pyproject.toml": "[project]\nname = 'im'\nversion = '0'\n",
    "im/__init__.py": "",
    "im/consts.py": '''
        SCALE = 2
        UNUSED = 3


        def scaled(x):
            return x * SCALE
    ''',
    "tests/test_imports.py": '''
        import subprocess
        import sys

        from im.consts import scaled


        def test_in_a_child():
            code = "from im.consts import scaled; assert scaled(2) == 4"
            subprocess.run([sys.executable, "-c", code], check=True)


        def test_in_process():
            assert scaled(2) == 4
    ''',
}


def _imports_project(project):
    project.write(IMPORTS)
    project.commit()
    project.record()


def test_a_module_value_a_child_reads_selects_its_test(project):
    _imports_project(project)
    project.edit("im/consts.py", "SCALE = 2", "SCALE = 5")
    assert project.selected() == {"tests/test_imports.py::test_in_a_child",
                                  "tests/test_imports.py::test_in_process"}


def test_a_module_value_no_process_reads_selects_nobody(project):
    """A child imports the module inside its test, so its evidence holds the module body as
    run; a change resolved to names nobody reads selects nobody, as it does for the test
    process, which imported the module at collection."""
    _imports_project(project)
    project.edit("im/consts.py", "UNUSED = 3", "UNUSED = 4")
    assert project.selected() == set()


def test_a_module_level_side_effect_only_a_child_ran_selects_its_test(project):
    """The other side of the rule above: a module-level statement that is not a plain
    definition is not resolved to names, so a test whose child ran that module's body (and
    no test that did not) is selected."""
    project.write({
        "pyproject.toml": "[project]\nname = 'se'\nversion = '0'\n",
        "se/__init__.py": "",
        "se/plugin.py": """
            REGISTRY = []
            REGISTRY.append("a")
        """,
        "tests/test_side.py": """
            import subprocess
            import sys


            def test_in_a_child():
                code = "import se.plugin as p; assert p.REGISTRY == ['a']"
                subprocess.run([sys.executable, "-c", code], check=True)


            def test_elsewhere():
                assert True
        """,
    })
    project.commit()
    project.record()
    project.edit("se/plugin.py", 'REGISTRY.append("a")', 'REGISTRY.append("b")')
    assert project.selected() == {"tests/test_side.py::test_in_a_child"}


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring needs Python 3.12+")
def test_a_child_on_sys_monitoring_records_with_one_recorder(project):
    """On 3.12+ a child records with FastCI's own sys.monitoring tool alone, from before its
    main program to its end, and so does a fork of it: coverage.py, which only starts the
    child, has stopped by then. Two tools cost each child a second callback on every new
    code object, and coverage's pause restarted every tool's disabled events."""
    project.write({
        "pyproject.toml": "[project]\nname = 'one'\nversion = '0'\n",
        "one/__init__.py": "",
        "one/tools.py": """
            import os
            import sys


            def tools():
                return sorted(name for i in range(6)
                              if (name := sys.monitoring.get_tool(i)) is not None)


            def report(path):
                with open(path, "w") as fh:
                    fh.write(",".join(tools()))
                pid = os.fork()
                if pid == 0:
                    with open(path + ".fork", "w") as fh:
                        fh.write(",".join(tools()))
                    os._exit(0)
                os.waitpid(pid, 0)
        """,
        "tests/test_tools.py": """
            import subprocess
            import sys


            def test_tools(tmp_path):
                out = tmp_path / "tools"
                code = f"from one.tools import report; report({str(out)!r})"
                subprocess.run([sys.executable, "-c", code], check=True)
                print("TOOLS", out.read_text(), (tmp_path / "tools.fork").read_text())
        """,
    })
    project.commit()
    recorded = project.record("-s")
    assert "TOOLS fastci fastci" in recorded.stdout, recorded.stdout[-2000:]
    # A line only the fork ran: its evidence reached the test.
    project.edit("one/tools.py", 'path + ".fork"', 'path + ".fork" + ""')
    assert project.selected() == {"tests/test_tools.py::test_tools"}


def _selection(tests, changes, tree=None):
    from fastci.runner.analysis.environment import current  # noqa: PLC0415
    from fastci.runner.analysis.inventory import ImportGraph  # noqa: PLC0415
    from fastci.runner.evidence import Snapshot  # noqa: PLC0415
    from fastci.runner.selection.rules import SelectionInput, select  # noqa: PLC0415

    env = current()
    tree = tree or {"m.py": "1", "tests/t.py": "2", "assets/vocab.txt": "3", "README.md": "4"}
    snap = Snapshot(commit="base", environment=env, tree=tree,
                    tests={t.test_id: t for t in tests})
    head = {**tree, **{c.path: "changed" for c in changes.files}}
    return select(SelectionInput(head="head", head_tree=head, environment=env, snapshot=snap,
                                 changes=changes, head_inventories={},
                                 import_graph=ImportGraph({}), static_tests=[],
                                 head_kernels={}))


def test_a_changed_block_that_ran_in_a_child_is_never_offered_for_pruning():
    """Pruning replays the module calls captured in the test's own process; the same change
    may have behaved otherwise in a child, whose calls nobody captured."""
    from fastci.runner.analysis.changes import ChangeSet, FileChange  # noqa: PLC0415
    from fastci.runner.evidence import TestRecord  # noqa: PLC0415

    here = TestRecord("tests/t.py::test_here", "passed", 1.0, blocks={"m.py": ("f",)},
                      file_events=True)
    there = TestRecord("tests/t.py::test_there", "passed", 1.0, blocks={"m.py": ("f",)},
                       child_blocks={"m.py": ("f",)}, file_events=True)
    sel = _selection([here, there], ChangeSet(files=(FileChange("m.py", "modified"),),
                                              blocks={("m.py", "f"): "modified"}))
    assert sel.decision(here.test_id).prunable == (("m.py", "f"),)
    assert sel.decision(there.test_id).selected and sel.decision(there.test_id).prunable == ()


def test_without_kernel_file_events_a_changed_data_file_selects_the_test_unless_ignored():
    from fastci.runner.analysis.changes import ChangeSet, FileChange  # noqa: PLC0415
    from fastci.runner.evidence import TestRecord  # noqa: PLC0415

    watched = TestRecord("tests/t.py::test_watched", "passed", 1.0, blocks={"m.py": ("f",)},
                         file_events=True)
    unwatched = TestRecord("tests/t.py::test_unwatched", "passed", 1.0,
                           blocks={"m.py": ("f",)})
    data = _selection([watched, unwatched],
                      ChangeSet(files=(FileChange("assets/vocab.txt", "modified"),)))
    assert [d.test_id for d in data.selected] == [unwatched.test_id]
    assert "without the kernel's file events" in data.decision(unwatched.test_id).reasons[0]
    docs = _selection([watched, unwatched],
                      ChangeSet(files=(FileChange("README.md", "modified"),)))
    assert list(docs.selected) == []


def test_the_environment_digest_covers_what_decides_the_ranks():
    from dataclasses import replace  # noqa: PLC0415

    from fastci.runner.analysis.environment import Environment  # noqa: PLC0415

    cpu = Environment(python="3.11.7", torch="2.5", triton=None, cuda=None, gpu=None,
                      platform="Linux-x86_64")
    # Evidence recorded before GPU counts were known keeps the digest it was stored under.
    before = {k: v for k, v in cpu.__dict__.items() if k not in ("lock_hash", "gpus", "nccl")}
    assert cpu.digest == hashlib.sha256(json.dumps(before, sort_keys=True).encode()
                                        ).hexdigest()[:16]
    eight = replace(cpu, gpu="NVIDIA H200", gpus=8, nccl="2.21.5")
    assert len({eight.digest, replace(eight, gpus=4).digest,
                replace(eight, nccl="2.26.2").digest, cpu.digest}) == 4

