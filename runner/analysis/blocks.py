"""Python source -> blocks with fingerprints of their normalised source.

A block is a function, a class body or a module body, named by qualname (`<module>`,
`Class`, `Class.method`, `func.<locals>.inner`). Its fingerprint hashes the AST with
docstrings, comments and formatting gone, and with nested functions and classes reduced to
stubs (their own blocks carry their bodies), so editing one method changes one block.

Module and class bodies also keep their statements one by one, with the names each
statement defines and reads: a changed body can then be resolved to the names whose values
changed (`EPS = 1e-6`, a dataclass field default) instead of selecting everything that
imports the module.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Union

MODULE = "<module>"


@dataclass(frozen=True)
class Statement:
    """One statement of a module or class body."""

    digest: str
    defines: tuple[str, ...]
    reads: tuple[str, ...]
    kind: str  # "import" | "def" | "assign": its effect is the names it binds; "other": unknown


@dataclass(frozen=True)
class Block:
    qualname: str
    kind: str  # "module" | "class" | "function"
    start: int  # first line, decorators included
    end: int
    fingerprint: str
    reads: tuple[str, ...] = ()  # identifiers the block reads (names and attributes)
    statements: tuple[Statement, ...] = ()  # body statements (module and class blocks)
    is_jit: bool = False  # decorated with triton.jit (or a jit-like decorator)
    calls: tuple[str, ...] = ()  # plain names called (to find the jit functions a kernel calls)
    body_start: int = 0  # first line of the body: lines before it run in the parent scope
    header: str = ""  # digest of decorators, signature or bases: what the parent evaluates
    decorators: str = ""  # digest of the decorators alone: calls made as the parent runs
    doc: str = ""  # digest of the docstring: `__doc__`, which fingerprints leave out
    inherits: bool = False  # a class with bases: a method added to it may override one
    registers: bool = False  # a decorator FastCI does not know may keep it (a registry)


PARSER_VERSION = 7
"""What `parse_blocks` computes for a source: stores keep inventories by blob, so bump it
whenever the same source parses to other blocks or lines, and older ones are parsed again.
2: a function whose body is a docstring alone owns its first line (a call is reported there).
3: a block's decorators have a digest of their own.
4: so has its docstring, and `obj.__doc__` is read as ".__doc__" (DOC_ATTRIBUTE).
5: so is a call of a helper that reads a docstring for its caller (DOC_READERS).
6: a block knows whether a decorator may have registered it (`registers`).
7: a class statement reads its bases and keywords; more decorators count as wrappers."""


@dataclass(frozen=True)
class FileBlocks:
    """The blocks of one file, or the reason it has none."""

    blocks: tuple[Block, ...] = ()
    error: str | None = None  # a syntax error: the file no longer parses
    imports: tuple[str, ...] = ()  # absolute module names this file imports (best effort)
    line_owner: dict[int, str] = field(default_factory=dict, compare=False, hash=False)

    def by_qualname(self) -> dict[str, Block]:
        return {b.qualname: b for b in self.blocks}

    def owner_of(self, line: int) -> str:
        """The innermost block that owns a line (the module body by default)."""
        return self.line_owner.get(line, MODULE)


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_PLAIN = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Import, ast.ImportFrom, ast.Pass)
_Def = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef]  # what `_DEFS` narrows to


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _doc_digest(node) -> str:
    doc = ast.get_docstring(node, clean=False)
    return _digest(doc) if doc is not None else ""


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _stub(node: _Def) -> ast.stmt:
    """A nested def or class as its parent sees it: the name only.

    The decorators, signature and bases belong to the child's own fingerprint; a changed
    default argument is therefore a change of the function, which is what the tests that
    call it executed.
    """
    # `type_params` is a field from Python 3.12 on; mypy checks against 3.10's ast.
    if isinstance(node, ast.ClassDef):
        return ast.ClassDef(  # type: ignore[call-arg]
            name=node.name, bases=[], keywords=[], body=[ast.Pass()], decorator_list=[],
            type_params=[])
    return ast.FunctionDef(  # type: ignore[call-arg]
        name=node.name, args=ast.arguments(
            posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
            defaults=[]), body=[ast.Pass()], decorator_list=[], returns=None, type_comment=None,
        type_params=[])


class _StubDefs(ast.NodeTransformer):
    """Defs nested in compound statements (`if triton is not None: @jit def k(...)`) are
    blocks of their own too: their parent sees their names only."""

    def _stubbed(self, node: _Def) -> ast.stmt:
        return _stub(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _stubbed


def _without_defs(stmt: ast.stmt) -> ast.stmt:
    if isinstance(stmt, _DEFS):
        return _stub(stmt)
    if not any(isinstance(n, _DEFS) for n in ast.walk(stmt)):
        return stmt
    return _StubDefs().visit(copy.deepcopy(stmt))


def _normalised_body(body: list[ast.stmt]) -> list[ast.stmt]:
    return [_without_defs(s) for s in _strip_docstring(body)]


def normalised_statement(stmt: ast.stmt) -> ast.stmt:
    """A statement as its block's fingerprint sees it: nested defs and classes as stubs."""
    return _without_defs(stmt)


def _dump(nodes: Sequence[ast.AST] | ast.AST) -> str:
    if isinstance(nodes, ast.AST):
        return ast.dump(nodes, annotate_fields=False, include_attributes=False)
    return "\n".join(ast.dump(n, annotate_fields=False, include_attributes=False)
                     for n in nodes)


def _header(node: _Def) -> list[ast.AST]:
    """What a def or class statement evaluates besides its body."""
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords]
    parts: list[ast.AST] = [*node.decorator_list, node.args]
    if node.returns is not None:
        parts.append(node.returns)
    return parts


DOC_ATTRIBUTE = ".__doc__"  # what a block reads for `obj.__doc__`
# Helpers that read `obj.__doc__` inside the standard library, for their caller:
# `inspect.getdoc(fn)`, `help(fn)`, `pydoc.render_doc(fn)`.
DOC_READERS = frozenset({"getdoc", "help", "render_doc"})


class _Reads(ast.NodeVisitor):
    """Identifiers read by a subtree, not descending into nested defs' bodies."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.stored: set[str] = set()
        self.declared_global: set[str] = set()
        self.attributes: set[str] = set()
        self.calls: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.stored.add(node.id)
        else:
            self.names.add(node.id)

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        self.declared_global.update(node.names)

    visit_Nonlocal = visit_Global

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not isinstance(node.ctx, ast.Store):
            # `fn.__doc__` reads any object's docstring, a bare `__doc__` its own module's
            name = DOC_ATTRIBUTE if node.attr == "__doc__" else node.attr
            self.names.add(name)
            self.attributes.add(name)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        called = node.func.id if isinstance(node.func, ast.Name) else \
            node.func.attr if isinstance(node.func, ast.Attribute) else None
        if called is not None:
            self.calls.add(called)
            if called in DOC_READERS:
                self.names.add(DOC_ATTRIBUTE)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.names.add(alias.name)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.names.update(alias.name.split("."))

    def _nested(self, node: _Def) -> None:
        for part in _header(node):
            self.visit(part)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _nested


def _reads(nodes: Sequence[ast.AST], params: ast.arguments | None = None
           ) -> tuple[set[str], set[str]]:
    """(names read, names called). With `params`, the nodes are a function body: its
    locals (parameters and names it assigns) shadow module names and are not reads."""
    visitor = _Reads()
    for node in nodes:
        visitor.visit(node)
    names = visitor.names
    if params is not None:
        local = set(visitor.stored)
        local.update(a.arg for a in [*params.posonlyargs, *params.args, *params.kwonlyargs])
        local.update(a.arg for a in (params.vararg, params.kwarg) if a is not None)
        local -= visitor.declared_global
        names = names - (local - visitor.attributes)
    return names, visitor.calls


def _defines(stmt: ast.stmt) -> set[str]:
    names: set[str] = set()
    if isinstance(stmt, _DEFS):
        names.add(stmt.name)
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
        for alias in stmt.names:
            names.add((alias.asname or alias.name).split(".")[0])
    else:
        targets: list[ast.AST] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            targets = [stmt.target]
        else:
            targets = [n for n in ast.walk(stmt)
                       if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))
                       and isinstance(getattr(n, "ctx", None), ast.Store)]
        for target in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
    return names


def _statement(stmt: ast.stmt) -> Statement:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        # Aligned, unsorted: the i-th name read is bound as the i-th name defined, so a
        # changed `EPS` propagates through `from .norms import EPS as E` to `E` alone.
        return Statement(
            digest=_digest(_dump(stmt)),
            defines=tuple((a.asname or a.name).split(".")[0] for a in stmt.names),
            reads=tuple(a.name for a in stmt.names), kind="import")
    if isinstance(stmt, _DEFS):
        digest = _digest(_dump(_stub(stmt)))
        # A class statement reads its bases and keywords (a metaclass): a subclass holds
        # what a changed base holds (a dataclass field's default, a mixin's new method).
        reads: set[str] = _reads([ast.Expr(value=node) for node in (
            *stmt.bases, *(k.value for k in stmt.keywords))])[0] \
            if isinstance(stmt, ast.ClassDef) else set()
    else:
        normal = _without_defs(stmt)
        digest = _digest(_dump(normal))
        reads, _ = _reads([normal])
    if isinstance(stmt, _DEFS):
        kind = "def"
    elif isinstance(stmt, _PLAIN):
        kind = "assign"
    else:
        kind = "other"
    return Statement(digest=digest, defines=tuple(sorted(_defines(stmt))),
                     reads=tuple(sorted(reads)), kind=kind)


def is_jit(node: ast.AST) -> bool:
    """Decorated with triton.jit, autotune or heuristics (a kernel or jit function)."""
    for deco in getattr(node, "decorator_list", []):
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("jit", "autotune", "heuristics"):
            return True
    return False


# Decorators that return the class or function they were given and keep no reference to
# it: the definition's name is the only way to reach what they decorate.
TRANSPARENT_DECORATORS = frozenset({
    "dataclass", "total_ordering", "unique", "verify", "final", "runtime_checkable",
    "dataclass_transform", "override", "staticmethod", "classmethod", "property",
    "cached_property", "abstractmethod", "wraps", "contextmanager", "asynccontextmanager",
    "singledispatchmethod", "no_type_check", "overload",
    # wrappers that keep the function nowhere a name does not reach
    "no_grad", "inference_mode", "enable_grad", "lru_cache", "cache", "jit", "autotune",
    "heuristics", "compile", "custom_fwd", "custom_bwd",
})


def registers(node: ast.AST) -> bool:
    """Whether a decorator other than the transparent ones may keep the definition where
    code reaches it without its name (`@register("level")` filling a registry): a class
    reached that way runs none of its lines when its body holds values only (an Enum)."""
    for deco in getattr(node, "decorator_list", []):
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name not in TRANSPARENT_DECORATORS:
            return True
    return False


def _end(node: _Def) -> int:
    return node.end_lineno or node.lineno


def first_line(stmt: ast.stmt) -> int:
    """A statement's first line, its decorators included: where the tracer reports a def."""
    return min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])


class _Collector:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.owner: dict[int, str] = {}

    def module(self, tree: ast.Module, nlines: int) -> None:
        body = _normalised_body(tree.body)
        reads, calls = _reads(body)
        self.blocks.append(Block(
            qualname=MODULE, kind="module", start=1, end=max(nlines, 1),
            fingerprint=_digest(_dump(body)), reads=tuple(sorted(reads)),
            statements=tuple(_statement(s) for s in _strip_docstring(tree.body)),
            calls=tuple(sorted(calls)), doc=_doc_digest(tree)))
        self._children(tree.body, prefix="")

    def _children(self, body: list[ast.stmt], prefix: str) -> None:
        for qualname, node in defs_in(body, prefix):  # parents first: the innermost wins
            self._def(node, qualname)

    def _def(self, node: _Def, qualname: str) -> None:
        start = first_line(node)
        end = _end(node)
        body = _normalised_body(node.body)
        header = _header(node)
        head_reads, head_calls = _reads(header)
        params = None if isinstance(node, ast.ClassDef) else node.args
        body_reads, body_calls = _reads(body, params)
        if isinstance(node, ast.ClassDef):
            kind = "class"
            fingerprint = _digest(_dump(header) + "\n|" + _dump(body))
            statements = tuple(_statement(s) for s in _strip_docstring(node.body))
        else:
            kind = "function"
            fingerprint = _digest(type(node).__name__ + _dump(header) + "\n|" + _dump(body))
            statements = ()
        # The decorators and the def/class line run in the parent scope, when the body
        # runs they are not reported again: they belong to the parent. Except for a
        # function whose body is a docstring alone (a hook for subclasses to override):
        # a call of it runs no line of its body, and is reported on its first line.
        body_start = node.body[0].lineno if node.body else end
        if kind == "function" and not _strip_docstring(node.body):
            body_start = start
        for line in range(body_start, end + 1):
            self.owner[line] = qualname
        self.blocks.append(Block(
            qualname=qualname, kind=kind, start=start, end=end, fingerprint=fingerprint,
            reads=tuple(sorted(head_reads | body_reads)), statements=statements,
            is_jit=is_jit(node), calls=tuple(sorted(head_calls | body_calls)),
            body_start=body_start, header=_digest(_dump(header)),
            decorators=_digest(_dump(node.decorator_list)) if node.decorator_list else "",
            doc=_doc_digest(node),
            inherits=isinstance(node, ast.ClassDef) and bool(node.bases or node.keywords),
            registers=registers(node)))


def defs_in(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, _Def]]:
    """(qualname, node) of every def and class in a body, parents before children, as
    blocks are named: defs nested in if/try/with/for at one level belong to that scope."""
    for stmt in body:
        if isinstance(stmt, _DEFS):
            qualname = f"{prefix}{stmt.name}"
            yield qualname, stmt
            inner = f"{qualname}." if isinstance(stmt, ast.ClassDef) else f"{qualname}.<locals>."
            yield from defs_in(stmt.body, inner)
            continue
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.stmt):
                yield from defs_in([child], prefix)
            elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                yield from defs_in(child.body, prefix)


class ModuleStatements:
    """A module's top-level statements, parsed once: which one spans a line (a module body
    with hundreds of import-time calls was parsed once per calling line)."""

    def __init__(self, source: str | bytes) -> None:
        try:
            body = _strip_docstring(ast.parse(source).body)
        except (SyntaxError, ValueError):
            body = []
        self._spans = [(first_line(stmt), stmt.end_lineno or stmt.lineno, stmt)
                       for stmt in body]

    def at(self, line: int) -> tuple[int, Statement] | None:
        """The statement that spans `line` (decorators included): its first line and what
        it binds, or None (no such statement, or the source does not parse)."""
        for first, last, stmt in self._spans:
            if first <= line <= last:
                return first, _statement(stmt)
        return None


def _imports(tree: ast.Module, module_name: str | None, is_package: bool) -> tuple[str, ...]:
    found: set[str] = set()
    package = module_name if is_package else (module_name or "").rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = (package or "").split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([p for p in parts if p] + ([node.module] if node.module else []))
            if base:
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
    return tuple(sorted(found))


def parse_blocks(source: str | bytes, module_name: str | None = None,
                 is_package: bool = False) -> FileBlocks:
    """Split one file's source into blocks; a syntax error is reported, not raised."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        where = f" at line {line}" if line else ""
        return FileBlocks(error=f"does not parse{where}: {getattr(exc, 'msg', exc)}")
    text = source.decode(errors="replace") if isinstance(source, bytes) else source
    collector = _Collector()
    collector.module(tree, text.count("\n") + 1)
    return FileBlocks(blocks=tuple(collector.blocks), line_owner=collector.owner,
                      imports=_imports(tree, module_name, is_package))


def module_name_for(path: str) -> tuple[str | None, bool]:
    """`pkg/sub/mod.py` -> ("pkg.sub.mod", False); `pkg/__init__.py` -> ("pkg", True).

    Best effort, from the path alone: source roots such as `src/` are stripped by the
    import-graph resolver, which tries every suffix of the dotted name.
    """
    if not path.endswith(".py"):
        return None, False
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]) or None, True
    return ".".join(parts), False
