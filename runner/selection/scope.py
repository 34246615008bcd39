"""The recorded suite's scope: which tests the pytest arguments of a recording asked for.

`fastci record -- tests/unit -k "not slow"` records the tests those arguments collect, and
the snapshot remembers the arguments. Selection then decides within that scope: a test
function found at the head (statically, without collecting) that the arguments would not
have collected was never in the suite being gated, so it is listed as outside the recorded
suite, neither selected nor counted as new. Everything in doubt stays inside (selected as
new, when it has no evidence): only what the arguments certainly exclude is outside.

- test paths (`tests/unit`, `tests/test_x.py::test_y`) and `--ignore`/`--ignore-glob`/
  `--deselect`: exact, by the test's path and node id;
- `-k`: evaluated on the test's names (file, class, function) with pytest's own expression
  parser; an identifier that no name matches might still match a marker or keyword known
  only at collection, so the test is outside only if the expression is false whatever those
  identifiers are;
- `-m`: markers are known only at collection, so `-m` never puts a test outside here;
  `fastci run` passes the recorded arguments to pytest, which applies it.

An empty scope (older snapshots, `--all-tests`) is the whole repository.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

MAX_UNKNOWN = 8  # -k identifiers beyond this many unknowns: undecided, so inside


@dataclass(frozen=True)
class Scope:
    paths: tuple[str, ...] = ()  # repo-relative paths or node ids; "" is the whole repository
    ignore: tuple[str, ...] = ()  # repo-relative paths
    ignore_glob: tuple[str, ...] = ()  # patterns, as given
    deselect: tuple[str, ...] = ()  # node-id prefixes
    keyword: str = ""
    markexpr: str = ""

    @property
    def whole(self) -> bool:
        return self.paths in ((), ("",)) and not (self.ignore or self.ignore_glob or
                                                  self.deselect or self.keyword or
                                                  self.markexpr)

    def to_json(self) -> dict:
        if self.whole:
            return {}
        out: dict = {"paths": list(self.paths)}
        for name in ("ignore", "ignore_glob", "deselect"):
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        if self.keyword:
            out["keyword"] = self.keyword
        if self.markexpr:
            out["markexpr"] = self.markexpr
        return out

    @classmethod
    def from_json(cls, data: Mapping | None) -> "Scope":
        data = data or {}
        return cls(paths=tuple(data.get("paths", ())), ignore=tuple(data.get("ignore", ())),
                   ignore_glob=tuple(data.get("ignore_glob", ())),
                   deselect=tuple(data.get("deselect", ())),
                   keyword=str(data.get("keyword", "")), markexpr=str(data.get("markexpr", "")))

    def pytest_args(self) -> list[str]:
        """Arguments that make pytest collect this scope again (from the repository root)."""
        if self.whole:
            return []
        args = [p or "." for p in self.paths]
        args += [f"--ignore={p}" for p in self.ignore]
        args += [f"--ignore-glob={p}" for p in self.ignore_glob]
        args += [f"--deselect={p}" for p in self.deselect]
        if self.keyword:
            args += ["-k", self.keyword]
        if self.markexpr:
            args += ["-m", self.markexpr]
        return args

    def describe(self) -> str:
        return shlex.join(self.pytest_args()) or "the whole repository"

    def contains(self, test_id: str) -> bool:
        """False only when the recorded arguments certainly would not collect `test_id`."""
        if self.whole:
            return True
        path = test_id.split("::", 1)[0]
        if self.paths and not any(_under(test_id, p) for p in self.paths):
            return False
        if any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.ignore):
            return False
        if any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(os.path.basename(path), g)
               for g in self.ignore_glob):
            return False
        if any(test_id.startswith(d) for d in self.deselect):
            return False
        if self.keyword and _keyword_excludes(self.keyword, test_id):
            return False
        return True


def _under(test_id: str, scope_path: str) -> bool:
    """Whether `scope_path` (a directory, a file or a node id) contains `test_id`."""
    if scope_path in ("", "."):
        return True
    if "::" in scope_path:  # a node id: itself, its parametrizations, its methods
        return test_id == scope_path or test_id.startswith((scope_path + "::",
                                                            scope_path + "["))
    path = test_id.split("::", 1)[0]
    return path == scope_path or path.startswith(scope_path.rstrip("/") + "/")


def _names(test_id: str) -> list[str]:
    """The names pytest's -k matches for an item, as far as they are known statically: the
    function (with its parameters), each class, the module's file name, and the folders."""
    path, _, rest = test_id.partition("::")
    return [*rest.split("::"), *path.split("/")]


_IDENT = re.compile(r"(?:\\.|[^\s()\\])+")  # as pytest's -k scanner reads an identifier


def _keyword_excludes(expression: str, test_id: str) -> bool:
    try:
        from _pytest.mark.expression import Expression  # noqa: PLC0415 (only with -k)

        compiled = Expression.compile(expression)
    except Exception:  # noqa: BLE001 - an expression pytest refuses: decide nothing
        return False
    names = [n.lower() for n in _names(test_id)]
    identifiers = {w for w in _IDENT.findall(expression) if w not in ("and", "or", "not")}
    unknown = sorted(i for i in identifiers if not any(i.lower() in n for n in names))
    if len(unknown) > MAX_UNKNOWN:
        return False
    for values in itertools.product((False, True), repeat=len(unknown)):
        assumed = dict(zip(unknown, values))

        def matcher(ident: str, /, **_kwargs: str | int | bool | None) -> bool:
            if ident in assumed:
                return assumed[ident]
            return any(ident.lower() in n for n in names)

        try:
            if compiled.evaluate(matcher):
                return False
        except Exception:  # noqa: BLE001 - undecidable here: keep the test inside
            return False
    return True


def from_pytest(config, root: Path) -> Scope:
    """The scope of a pytest session, from its parsed arguments (`config.args` holds the
    test paths pytest used: those given, else `testpaths`, else the invocation folder)."""
    invocation = Path(config.invocation_params.dir)
    root = Path(root).resolve()

    def relative(arg: str) -> str | None:
        path, sep, rest = arg.partition("::")
        full = (invocation / path).resolve()
        try:
            rel = full.relative_to(root).as_posix()
        except ValueError:
            return None  # outside the repository
        rel = "" if rel == "." else rel
        return rel + sep + rest if sep else rel

    paths = []
    for arg in config.args:
        rel = relative(str(arg))
        if rel is None:
            return Scope()  # tests from outside the repository: no scope we can judge
        paths.append(rel)
    if "" in paths:
        paths = [""]
    option = config.option
    ignore = [r for r in (relative(str(p)) for p in (getattr(option, "ignore", None) or []))
              if r]
    deselect = [r for r in (relative(str(p)) for p in (getattr(option, "deselect", None)
                                                       or [])) if r]
    return Scope(paths=tuple(sorted(set(paths))), ignore=tuple(ignore),
                 ignore_glob=tuple(getattr(option, "ignore_glob", None) or []),
                 deselect=tuple(deselect), keyword=getattr(option, "keyword", "") or "",
                 markexpr=getattr(option, "markexpr", "") or "")
