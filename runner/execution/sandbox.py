"""Running the repository's code (its tests, its git checkout) as a sandbox user.

A runner worker never runs code under test as itself. With `FASTCI_SANDBOX_USER` set, each
command starts through util-linux's `setpriv --reuid --regid --clear-groups --no-new-privs`
(all capabilities dropped): another uid cannot read the worker's files (mode 0600/0700), its
`/proc/<pid>/environ` or its memory. With `FASTCI_SANDBOX_HIDE` (directories, `:`-separated)
the command also gets its own mount and PID namespaces (`unshare --mount --pid --fork
--mount-proc`, which needs CAP_SYS_ADMIN): each hidden directory is covered by an empty tmpfs
(the interpreter and FastCI are bound back read-only where they live inside one), and /proc
shows only the sandbox's own processes. Without a sandbox user (a developer's laptop, the
local CLI) commands run as the caller, as before.

Whatever the mechanism, the environment is built from an allowlist (`environment`), never
by filtering the worker's: no Redis URL, store, queue prefix, token or key reaches it.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Variables a test process may inherit from the worker; everything else is dropped.
PASSED = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "CUDA_VISIBLE_DEVICES",
          "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "TRITON_INTERPRET", "OMP_NUM_THREADS",
          "MKL_NUM_THREADS")
PASSED_PREFIXES = ("LC_",)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def environment(home: Path, environ: dict | None = None, extra: tuple[str, ...] = ()
                ) -> dict[str, str]:
    """The environment of a sandboxed command: allowlisted names only, plus what FastCI
    sets itself (HOME and TMPDIR: the job's folder, no user site, no git config)."""
    env = dict(os.environ if environ is None else environ)
    out = {k: v for k, v in env.items()
           if (k in PASSED or k.startswith(PASSED_PREFIXES) or k in extra)
           and not k.startswith("FASTCI_")}
    out.setdefault("PATH", DEFAULT_PATH)
    out.update(HOME=str(home), TMPDIR=str(home), PYTHONNOUSERSITE="1",
               GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    return out


@dataclass(frozen=True)
class Sandbox:
    user: str | None = None
    hide: tuple[str, ...] = ()
    extra_env: tuple[str, ...] = ()
    """Names the deployment adds to the allowlist (FASTCI_SANDBOX_ENV, comma-separated)."""

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Sandbox":
        env = os.environ if environ is None else environ
        hide = tuple(p for p in env.get("FASTCI_SANDBOX_HIDE", "").split(os.pathsep) if p)
        extra = tuple(n.strip() for n in env.get("FASTCI_SANDBOX_ENV", "").split(",")
                      if n.strip())
        return cls(env.get("FASTCI_SANDBOX_USER") or None, hide, extra)

    @property
    def ids(self) -> tuple[int, int] | None:
        return None if self.user is None else _ids(self.user)

    def give(self, path: Path) -> None:
        """Make a folder the sandbox's to write in (owned by it where we may chown)."""
        if self.user is None:
            return
        uid, gid = _ids(self.user)
        try:
            os.chown(path, uid, gid)
        except PermissionError:
            os.chmod(path, 0o777)

    def command(self, argv: list[str], stage: Path | None = None) -> list[str]:
        """`argv` as the sandbox runs it. `stage`: an empty folder of the job's, where the
        read-only mounts are prepared (needed when directories are hidden)."""
        if self.user is None:
            return list(argv)
        uid, gid = _ids(self.user)
        drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        if not self.hide:
            return [*drop, *argv]
        hidden = [os.path.realpath(h) for h in self.hide]
        wanted = {k for k in _needed() if any(_under(k, h) for h in hidden)}
        keep = sorted(k for k in wanted if not any(k != o and _under(k, o) for o in wanted))
        if stage is None:
            raise ValueError("hiding directories needs a staging folder")
        q = shlex.quote
        lines = ["set -e"]
        for i, path in enumerate(keep):
            target = q(f"{stage}/{i}")
            lines += [f"mkdir -p {target}", f"mount --rbind {q(path)} {target}"]
        for path in hidden:
            lines.append(f"mount -t tmpfs -o mode=0755,size=1m fastci-hidden {q(path)}")
        for i, path in enumerate(keep):
            lines += [f"mkdir -p {q(path)}", f"mount --rbind {q(f'{stage}/{i}')} {q(path)}",
                      f"mount -o remount,bind,ro {q(path)}", f"umount -l {q(f'{stage}/{i}')}"]
        lines.append('exec "$@"')
        return ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
                "--mount-proc", "--kill-child", "--", "sh", "-c", "\n".join(lines), "sh",
                *drop, *argv]

    def run(self, argv: list[str], cwd: Path, home: Path, timeout: float | None = None,
            setenv: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run `argv` in the sandbox with the allowlisted environment (plus `setenv`, values
        the trusted side chose, never the worker's own); output captured."""
        stage = home.parent / "stage"
        if self.hide:
            stage.mkdir(exist_ok=True)
        env = environment(home, extra=self.extra_env)
        env.update({k: v for k, v in (setenv or {}).items() if not k.startswith("FASTCI_")})
        return subprocess.run(self.command(argv, stage), cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, env=env)


def _needed() -> set[str]:
    """What a sandboxed Python needs to see: the interpreter's installation, the virtual
    environment, and where FastCI itself is imported from."""
    import fastci  # noqa: PLC0415

    paths = {sys.base_prefix, sys.prefix, os.path.dirname(sys.executable),
             str(Path(fastci.__file__).resolve().parent.parent),
             os.path.realpath(sys.executable)}
    return {os.path.realpath(p) if os.path.isdir(p) else os.path.dirname(os.path.realpath(p))
            for p in paths}


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid
