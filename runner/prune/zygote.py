"""Warm replays: a process that has imported torch once, and forks one child per replay.

    python -m fastci.runner.prune.zygote SOCKET

A replay process spends most of its life importing torch (seconds) before it replays a call
(milliseconds). The zygote imports torch, coverage and FastCI's replay code, none of the
repository's, then serves on a Unix socket in a folder only its user can open (mode 0700;
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
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

IDLE = 600.0  # seconds a zygote waits for work before it exits
START_TIMEOUT = 60.0
MAX_REQUEST = 1 << 20
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
RACE_LOST = 3  # a zygote's exit status when another one already serves its path


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
           env: dict[str, str], log: Path, timeout: float) -> int | None:
    """Run one replay in a child of the zygote: its exit status, or None when no zygote
    could serve it (the caller then starts a cold process)."""
    conn = _connect(socket_file) or _start(socket_file, environ)
    if conn is None:
        return None
    with conn:
        conn.settimeout(timeout)
        try:
            _send(conn, {"request": str(request_file), "cwd": str(cwd), "env": env,
                         "log": str(log), "timeout": int(timeout)})
            answer = _receive(conn)
        except (OSError, ValueError):
            return None
    status = answer.get("status") if isinstance(answer, dict) else None
    return status if isinstance(status, int) else None


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        return conn
    except OSError:
        conn.close()
        return None


def _start(path: Path, environ: dict[str, str]) -> socket.socket | None:
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
    deadline = time.monotonic() + START_TIMEOUT
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
                pid = _fork(_receive(conn))
            except (OSError, ValueError, KeyError, TypeError):
                conn.close()
                continue
            running[pid] = last
            threading.Thread(target=_answer, args=(conn, pid, running), daemon=True).start()
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


def _answer(conn: socket.socket, pid: int, running: dict) -> None:
    with conn:
        _, status = os.waitpid(pid, 0)
        running.pop(pid, None)
        try:
            _send(conn, {"status": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass


def _fork(message: dict) -> int:
    """Start the child for one request; its pid."""
    request, cwd, env, log = (str(message["request"]), str(message["cwd"]),
                              dict(message["env"]), str(message["log"]))
    timeout = int(message.get("timeout", 600))
    pid = os.fork()
    if pid:
        return pid
    code = 70  # the child: the replay, as a cold process would run it
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
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
