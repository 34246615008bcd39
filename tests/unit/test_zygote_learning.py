"""What a warm zygote learns from its children: the installed and standard-library modules
they imported, never a module of the repository (an editable install's files lie in its
tree). End to end, with real replays: tests/test_prune.py's warm test."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

from fastci.runner.prune import zygote


def _module(name: str, file: str | None) -> types.ModuleType:
    module = types.ModuleType(name)
    if file is not None:
        module.__file__ = file
    return module


def test_installed_and_standard_modules_are_learned():
    import json.decoder  # noqa: F401, PLC0415

    assert zygote._installed("json.decoder", sys.modules["json.decoder"])
    torch_like = _module("pkg.sub", "/venv/lib/python3.11/site-packages/pkg/sub.py")
    assert zygote._installed("pkg.sub", torch_like)
    assert zygote._installed("sys", sys)  # a built-in


def test_repository_and_unplaced_modules_are_never_learned(tmp_path):
    # An editable install: the package's file is in the developer's tree.
    (tmp_path / "tinyllm").mkdir()
    (tmp_path / "tinyllm" / "attention.py").write_text("")
    editable = _module("tinyllm.attention", str(tmp_path / "tinyllm" / "attention.py"))
    assert not zygote._installed("tinyllm.attention", editable)
    assert not zygote._installed("spaces", _module("spaces", None))  # a namespace package
    assert not zygote._installed("__main__", sys.modules["__main__"])
    assert not zygote._installed("os; rm", os)  # a name that is no module name


def test_a_child_reports_what_it_imported_and_the_zygote_imports_it(tmp_path):
    before = set(sys.modules) - {"xml.dom.minidom"}
    sys.modules.pop("xml.dom.minidom", None)
    import xml.dom.minidom  # noqa: F401, PLC0415 - imported "by the replay"

    reader, writer = os.pipe()
    zygote._report_imports(writer, before)
    with os.fdopen(reader, "rb") as pipe:
        names = zygote._parse_report(pipe.read())
    assert "xml.dom.minidom" in names
    assert all(zygote._installed(n, sys.modules[n]) for n in names)

    import queue  # noqa: PLC0415

    learned: queue.Queue = queue.Queue()
    learned.put(["xml.dom.minidom", "no_such_module_anywhere", "json"])
    warm: set[str] = set()
    sys.modules.pop("xml.dom.minidom")
    zygote._import_learned(learned, warm)
    assert "xml.dom.minidom" in sys.modules  # imported here, for the next children
    assert warm == {"xml.dom.minidom", "no_such_module_anywhere", "json"}  # none retried


def test_a_report_too_large_or_malformed_teaches_nothing():
    assert zygote._parse_report(b"x" * (zygote.MAX_REQUEST + 1)) == []
    assert zygote._parse_report(b"json\n../../etc\nos.path\n\xff\xfe") == ["json", "os.path"]
    assert json.loads(json.dumps(zygote._parse_report(b""))) == []


def test_no_zygote_no_answer(tmp_path):
    assert zygote.warmed(Path(tmp_path) / "nobody.sock") is None


def test_what_a_zygote_learned_is_kept_for_the_next_one(tmp_path):
    """A zygote that exits after its idle time, or one started ahead of the first
    selection, imports what the ones before it learned before it serves."""
    known = tmp_path / "key.learned"
    assert zygote._read_learned(known) == []  # the first zygote of its key
    zygote._write_learned(known, {"json", "xml.dom.minidom"})
    assert zygote._read_learned(known) == ["json", "xml.dom.minidom"]
    known.write_bytes(b"json\n../../etc/passwd\nos; rm -rf\nos.path")  # written by someone else
    assert zygote._read_learned(known) == ["json", "os.path"]
    assert not list(tmp_path.glob("*.learned.*"))  # written whole, renamed into place
