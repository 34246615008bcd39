"""Warm replays: a process that has imported torch once, and forks one child per replay.

    python -m fastci.runner.prune.zygote SOCKET

A replay process spends most of its life importing torch (seconds) before it replays a call
(milliseconds). The zygote imports torch, coverage and FastCI's replay code, none of the
repository's. Replays import more of torch lazily (`use_deterministic_algorithms` alone pulls
in dynamo and sympy, over 800 modules, about a second): each child reports the installed and
standard-library modules it imported, and the zygote imports them itself between requests, so
the next children start with them. Nothing of the repository is ever learned: a module is
learned only when its file lies in a site-packages folder or the standard library (an
editable install's files lie in the repository), so every child still imports the tree it
replays. It serves on a Unix socket in a folder only its user can open (mode 0700;
each peer's uid is checked as well, since a request makes it run code as that user). For
each request it forks: the child clears and sets its environment, changes to the tree, sends
its output to a file and runs `replay.main`, exactly what a cold `python -m
fastci.runner.prune.replay` runs; the zygote answers with the child's exit status. It exits
after IDLE seconds without a request, and it is keyed by the interpreter, FastCI's code and
the environment it was started with, so a change to any of them starts a fresh one.

Only the developer's machine uses it (`LocalReplayer`): runners replay in the sandbox, cold.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

IDLE = 600.0  # seconds a zygote waits for work before it exits
START_TIMEOUT = 60.0
MAX_REQUEST = 1 << 20
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
RACE_LOST = 3  # a zygote's exit status when another one already serves its path
MAX_LEARNED = 5000  # module names one child may report
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def socket_path(environ: dict[str, str]) -> Path:
    """Where the zygote for this interpreter, FastCI's replay code and environment listens."""
    from fastci.runner.prune import replay as code  # noqa: PLC0415

    sources = sorted(Path(code.__file__).resolve().parent.glob("*.py"))
    stamp = [(p.name, p.stat().st_mtime_ns) for p in sources]
    key = hashlib.sha256(json.dumps([sys.executable, str(sources[0].parent), stamp,
                                     sorted(environ.items())]).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / \
        f"fastci-zygote-{os.getuid()}"
    return folder / f"{key}.sock"


# -- the client -------------------------------------------------------------------------
def replay(socket_file: Path, environ: dict[str, str], request_file: Path, cwd: Path,
           env: dict[str, str], log: Path, timeout: float,
           within: float | None = None) -> int | None:
    """Run one replay in a child of the zygote: its exit status, or None when no zygote
    could serve it (the caller then starts a cold process). `within`: the seconds the
    caller may wait for it all (a zygote still starting goes on starting, for the next)."""
    wait = START_TIMEOUT if within is None else max(0.0, min(within, START_TIMEOUT))
    conn = _connect(socket_file) or _start(socket_file, environ, wait)
    if conn is None:
        return None
    with conn:
        conn.settimeout(timeout if within is None else max(0.1, min(timeout, within)))
        try:
            _send(conn, {"request": str(request_file), "cwd": str(cwd), "env": env,
                         "log": str(log), "timeout": int(timeout)})
            answer = _receive(conn)
        except (OSError, ValueError):
            return None
    status = answer.get("status") if isinstance(answer, dict) else None
    return status if isinstance(status, int) else None


def prestart(environ: dict[str, str]) -> None:
    """Start the zygote for `environ`, unless one serves, and return at once, before it
    serves (a recording that ends starts the one its next selection will use)."""
    path = socket_path(environ)
    conn = _connect(path) or _start(path, environ, wait=0.0)
    if conn is not None:
        conn.close()


def warmed(socket_file: Path) -> list[str] | None:
    """The modules the zygote at `socket_file` learned from its children since it started
    (and imported, where they import), or None when none serves there."""
    conn = _connect(socket_file)
    if conn is None:
        return None
    with conn:
        conn.settimeout(10.0)
        try:
            _send(conn, {"warmed": True})
            answer = _receive(conn)
        except (OSError, ValueError):
            return None
    names = answer.get("warmed") if isinstance(answer, dict) else None
    return names if isinstance(names, list) else None


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        return conn
    except OSError:
        conn.close()
        return None


def _start(path: Path, environ: dict[str, str], wait: float = START_TIMEOUT
           ) -> socket.socket | None:
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # not a folder only this user can open: no zygote, cold replays
    if len(str(path)) > MAX_SOCKET_PATH:
        return None  # a Unix socket's path has a hard limit
    proc = subprocess.Popen([sys.executable, "-m", "fastci.runner.prune.zygote", str(path)],
                            env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, cwd=folder)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and proc.poll() in (None, RACE_LOST):
        conn = _connect(path)
        if conn is not None:
            return conn
        time.sleep(0.05)
    return _connect(path)  # another client's zygote may have won the race


def _send(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)


def _receive(conn: socket.socket) -> dict:
    header = _exactly(conn, 4)
    (size,) = struct.unpack("!I", header)
    if size > MAX_REQUEST:
        raise ValueError("message too large")
    return json.loads(_exactly(conn, size))


def _exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(left)
        if not chunk:
            raise OSError("connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- the server -------------------------------------------------------------------------
def serve(path: Path) -> None:
    """Accept requests until IDLE seconds pass without one. Forks happen on this (the main)
    thread; a thread per child waits for it and answers."""
    idle = float(os.environ.get("FASTCI_ZYGOTE_IDLE", IDLE))
    lock = open(path.with_suffix(".lock"), "w")  # held while this zygote lives
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(RACE_LOST)  # another zygote serves (or is starting to serve) this path
    import coverage  # noqa: F401, PLC0415 - imported once, here, for every child
    import torch  # noqa: F401, PLC0415

    from fastci.runner.prune import fingerprints, replay  # noqa: F401, PLC0415
    from fastci.runner.record import lines  # noqa: F401, PLC0415 (the replays' recorder)

    learned: queue.Queue[list[str]] = queue.Queue()
    warm: set[str] = set()
    known = path.with_suffix(".learned")  # what the zygotes before this one learned
    learned.put(_read_learned(known))
    _import_learned(learned, warm)

    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    path.with_suffix(".pid").write_text(str(os.getpid()))
    server.listen(16)
    server.settimeout(1.0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so `finally` removes the socket
    running: dict[int, float] = {}
    last = time.monotonic()
    try:
        while running or time.monotonic() - last < idle:
            if _import_learned(learned, warm):  # here, between forks, on the main thread
                _write_learned(known, warm)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            last = time.monotonic()
            if _peer_uid(conn) != os.getuid():
                conn.close()
                continue
            try:
                conn.settimeout(10.0)
                message = _receive(conn)
                if message.get("warmed"):
                    _import_learned(learned, warm)
                    with conn:
                        _send(conn, {"warmed": sorted(warm)})
                    continue
                pid, reports = _fork(message)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                conn.close()
                continue
            running[pid] = last
            threading.Thread(target=_answer, args=(conn, pid, reports, running, learned),
                             daemon=True).start()
    finally:
        server.close()
        path.unlink(missing_ok=True)
        path.with_suffix(".pid").unlink(missing_ok=True)


def stop(path: Path) -> bool:
    """Stop the zygote listening at `path`, if one is; True if one was."""
    try:
        pid = int(path.with_suffix(".pid").read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return False
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[1]


def _answer(conn: socket.socket, pid: int, reports: int, running: dict,
            learned: queue.Queue) -> None:
    """Wait for a child, pass on the modules it reports, and answer with its status. The
    report is read before the wait: a child blocked on a full pipe would never exit."""
    with conn:
        with os.fdopen(reports, "rb") as pipe:
            report = pipe.read(MAX_REQUEST + 1)
        _, status = os.waitpid(pid, 0)
        running.pop(pid, None)
        names = _parse_report(report)
        if names:
            learned.put(names)
        try:
            _send(conn, {"status": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass


def _fork(message: dict) -> tuple[int, int]:
    """Start the child for one request: its pid, and the pipe it reports its imports on."""
    request, cwd, env, log = (str(message["request"]), str(message["cwd"]),
                              dict(message["env"]), str(message["log"]))
    timeout = int(message.get("timeout", 600))
    reader, writer = os.pipe()
    pid = os.fork()
    if pid:
        os.close(writer)
        return pid, reader
    os.close(reader)
    code = 70  # the child: the replay, as a cold process would run it
    before = set(sys.modules)
    try:
        signal.alarm(max(1, timeout))  # nobody may be waiting for it: it ends itself
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
        os.chdir(cwd)
        from fastci.runner.prune import replay  # noqa: PLC0415

        code = replay.main([request])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the status says it failed, the log says why
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        code = 1
    finally:
        _report_imports(writer, before)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# -- learning what replays import ---------------------------------------------------------
def _report_imports(fd: int, before: set[str]) -> None:
    """In a child: write the installed modules the replay imported, one name a line."""
    try:
        names = [name for name, module in list(sys.modules.items())
                 if name not in before and _installed(name, module)][:MAX_LEARNED]
        data = "\n".join(names).encode()[:MAX_REQUEST]
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(data)
    except BaseException:  # noqa: BLE001 - a report is an optimisation, never a failure
        pass


def _installed(name: str, module) -> bool:
    """Importable the same way in every tree: a built-in, or a file in a site-packages
    folder or the standard library. An editable install's modules are the repository's
    own (their files lie in its tree) and are never learned."""
    if not _MODULE_NAME.fullmatch(name) or name.startswith("__"):
        return False
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return name in sys.builtin_module_names
    real = Path(os.path.realpath(path))
    return bool({"site-packages", "dist-packages"} & set(real.parts)) or any(
        real.is_relative_to(lib) for lib in _STDLIB)


_STDLIB = tuple({Path(os.path.realpath(sysconfig.get_paths()[k])) for k in ("stdlib",
                                                                           "platstdlib")})


def _parse_report(data: bytes) -> list[str]:
    if len(data) > MAX_REQUEST:
        return []
    names = data.decode(errors="replace").splitlines()[:MAX_LEARNED]
    return [n for n in names if _MODULE_NAME.fullmatch(n)]


def _read_learned(path: Path) -> list[str]:
    """The modules an earlier zygote of this key learned: a fresh one (after its idle exit,
    or started ahead of the first selection) imports them before it serves."""
    try:
        return _parse_report(path.read_bytes()[:MAX_REQUEST + 1])
    except OSError:
        return []


def _write_learned(path: Path, warm: set[str]) -> None:
    tmp = path.with_suffix(f".learned.{os.getpid()}")
    try:
        tmp.write_text("\n".join(sorted(warm)[:MAX_LEARNED]))
        os.replace(tmp, path)
    except OSError:
        pass  # an optimisation, never a failure


def _import_learned(learned: queue.Queue, warm: set[str]) -> bool:
    """Import, in the zygote, what its children reported, parents first. A module that
    fails to import is remembered too, and never tried again. True when it learned any."""
    grew = False
    while True:
        try:
            names = learned.get_nowait()
        except queue.Empty:
            return grew
        for name in sorted(set(names) - warm, key=lambda n: (n.count("."), n)):
            warm.add(name)
            grew = True
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - the children import it themselves
                continue


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
