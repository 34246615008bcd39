"""Which repository files were read, whoever read them: the kernel's file-access events.

Python's audit hook sees `open()` in this process only. Native readers (numpy, ctypes and the
C library, sentencepiece, tokenizers, safetensors) and child processes raise no audit event,
but the kernel sees every open and read: on Linux, inotify watches on the repository's folders
report them, whichever process and whichever language did the reading. The events name no
process, so the recorder credits them to the test running when they are drained (at every
context switch and at each test's teardown): more, never less.

inotify is reached through ctypes and the C library: no dependency. Only folders holding a
non-Python file of the tree are watched, since only those files can be data evidence.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys

IN_ACCESS = 0x00000001
IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_CLOSE_NOWRITE = 0x00000010
IN_OPEN = 0x00000020
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
WATCHED = IN_OPEN | IN_ACCESS | IN_CLOSE_NOWRITE | IN_CLOSE_WRITE | IN_MODIFY
_HEADER = struct.Struct("iIII")
_READ = IN_ACCESS | IN_CLOSE_NOWRITE


class FileEvents:
    """inotify watches on the folders that hold the tree's non-Python files."""

    def __init__(self, root: str, files: list[str]) -> None:
        self.root = root
        self.files = set(files)  # repository-relative paths that can be evidence
        self.fd = -1
        self.folders: dict[int, str] = {}  # watch descriptor -> folder, relative
        self.unavailable: str | None = None
        self.overflowed = False  # events were lost since the last drain

    def start(self) -> bool:
        """Watch; False (and `unavailable` says why) where the kernel offers no events."""
        if not sys.platform.startswith("linux"):
            self.unavailable = f"no inotify on {sys.platform}"
            return False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError) as exc:
            self.unavailable = f"inotify not reachable through the C library ({exc})"
            return False
        add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = init(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self.unavailable = f"inotify_init1 failed: {os.strerror(ctypes.get_errno())}"
            return False
        self.fd = fd
        for folder in sorted({os.path.dirname(p) for p in self.files}):
            wd = add(fd, os.fsencode(os.path.join(self.root, folder)), WATCHED)
            if wd < 0:
                errno = ctypes.get_errno()
                if errno == 2:  # the folder went away since the tree was read
                    continue
                self.close()
                self.unavailable = (f"inotify_add_watch on {folder or '.'}/ failed: "
                                    f"{os.strerror(errno)}")
                return False
            self.folders[wd] = folder
        return True

    def drain(self) -> set[str]:
        """The tree's files read since the last drain (repository-relative)."""
        if self.fd < 0:
            return set()
        seen: dict[str, int] = {}
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                self.overflowed = True
                break
            if not data:
                break
            offset = 0
            while offset + _HEADER.size <= len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset:offset + length].split(b"\0", 1)[0]
                offset += length
                if mask & IN_Q_OVERFLOW:
                    self.overflowed = True
                    continue
                if mask & (IN_ISDIR | IN_IGNORED) or not name or wd not in self.folders:
                    continue
                folder = self.folders[wd]
                rel = os.fsdecode(name) if not folder else f"{folder}/{os.fsdecode(name)}"
                if rel in self.files:
                    seen[rel] = seen.get(rel, 0) | mask
        # Opened and only written (IN_CLOSE_WRITE or IN_MODIFY, no read) is no input.
        return {rel for rel, mask in seen.items()
                if mask & _READ or not mask & (IN_CLOSE_WRITE | IN_MODIFY)}

    def take_overflow(self) -> bool:
        lost, self.overflowed = self.overflowed, False
        return lost

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
