"""The real path of a source file, cheaply: the recorders ask for every file Python runs.

`os.path.realpath` makes one lstat call per component of the path, and a recorder resolves
every distinct file name it meets (some 2,000 files over torch's import, ten components each:
0.3 s of a child's CPU on tinyllm). A file's directory is resolved once here; the file itself
then costs one lstat, to find a file that is itself a link.
"""

from __future__ import annotations

import os

_directories: dict[str, str] = {}  # absolute directory -> its real path


def real_file(path: str) -> str:
    """`os.path.realpath(path)`, for a file name (absolute, or from the working directory)."""
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    if "/./" in path or "/../" in path or "//" in path or os.path.islink(path):
        return os.path.realpath(path)  # realpath's own rules: `..` after a link, the link
    head, tail = os.path.split(path)
    real = _directories.get(head)
    if real is None:
        real = _directories[head] = os.path.realpath(head)
    return os.path.join(real, tail)
