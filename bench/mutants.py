"""Reproducible source mutants of a Python package: the bugs training code really gets.

Each operator finds candidate nodes in a file's AST; a mutant replaces one node's source
segment with the mutated node's `ast.unparse`, leaving every other byte as it was. Benign
edits (comments, docstrings, an equivalent rewrite) are generated too: a selector must not
select the world for them, and no test may fail.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str  # relative to the subject root
    line: int
    operator: str
    benign: bool
    before: str
    after: str  # the whole file after the mutation

    def apply(self, root: Path) -> None:
        (root / self.path).write_text(self.after)


def _segment_replace(source: str, node: ast.AST, text: str) -> str:
    lines = source.splitlines(keepends=True)
    start = (sum(len(line) for line in lines[: node.lineno - 1])
             + _col(lines[node.lineno - 1], node.col_offset))
    end = (sum(len(line) for line in lines[: node.end_lineno - 1])
           + _col(lines[node.end_lineno - 1], node.end_col_offset))
    return source[:start] + text + source[end:]


def _col(line: str, byte_offset: int) -> int:
    return len(line.encode()[:byte_offset].decode(errors="ignore"))


FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq}
DTYPES = {"float32": "float16", "float16": "float32", "bfloat16": "float32", "float64": "float32"}


def _parents(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    parent = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parent[child] = node
    return parent


def _is_docstring(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _docstring_nodes(tree: ast.Module) -> set[ast.AST]:
    """The docstrings' string constants: the constant operator leaves them alone."""
    docstring_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            if node.body and _is_docstring(node.body[0]):
                docstring_nodes.add(node.body[0].value)
    return docstring_nodes


MEMOIZERS = ("lru_cache", "cache", "cached_property")


def _memoized_bodies(tree: ast.Module) -> set[ast.AST]:
    """The nodes inside the bodies of functions wrapped by functools.lru_cache, cache or
    cached_property: a test that only hits the cache never runs them."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                _decorator_name(d) in MEMOIZERS for d in node.decorator_list):
            for stmt in node.body:
                inside.update(ast.walk(stmt))
    return inside


def _decorator_name(deco: ast.expr) -> str:
    target = deco.func if isinstance(deco, ast.Call) else deco
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _candidates(tree: ast.Module):
    """(operator, node, mutated replacement node or source text). A mutation inside a
    memoized function's body is offered under its own operator and as "memoized body"."""
    parent = _parents(tree)
    docstring_nodes = _docstring_nodes(tree)
    memoized = _memoized_bodies(tree)
    for node in ast.walk(tree):
        for operator, target, new in _node_candidates(node, parent, docstring_nodes):
            yield operator, target, new
            if target in memoized:
                yield "memoized body", target, new


def _swapped_arguments(node: ast.Call):
    new = copy.deepcopy(node)
    new.args = [new.args[1], new.args[0]]
    if ast.dump(new.args[0]) != ast.dump(new.args[1]):
        yield "swapped arguments", node, new


def _changed_constant(node: ast.Constant, parent: dict[ast.AST, ast.AST]):
    if isinstance(node.value, float):
        value = node.value * 10 if node.value != 0 else 1e-3
    else:
        value = node.value + 1
    kind = "changed default" if isinstance(parent.get(node), ast.arguments) else "changed constant"
    yield kind, node, ast.Constant(value)


def _node_candidates(node: ast.AST, parent: dict[ast.AST, ast.AST], docstring_nodes: set[ast.AST]):
    """The mutations of one node: at most one operator applies to a node."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIP:
        new = copy.deepcopy(node)
        new.ops = [FLIP[type(node.ops[0])]()]
        yield "comparison flip", node, new
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        new = copy.deepcopy(node)
        new.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        yield "+ for -", node, new
    elif isinstance(node, ast.Slice) and node.upper is not None and hasattr(node, "lineno"):
        new = copy.deepcopy(node)
        new.upper = ast.BinOp(left=new.upper, op=ast.Sub(), right=ast.Constant(1))
        yield "off-by-one slice", node, new
    elif isinstance(node, ast.Call) and len(node.args) == 2 and not node.keywords \
            and not any(isinstance(a, ast.Starred) for a in node.args):
        yield from _swapped_arguments(node)
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float) \
            and not isinstance(node.value, bool) and node not in docstring_nodes:
        yield from _changed_constant(node, parent)
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        yield "dropped call", node, ast.Pass()
    elif isinstance(node, ast.Attribute) and node.attr in DTYPES and \
            isinstance(node.value, ast.Name) and node.value.id == "torch":
        new = copy.deepcopy(node)
        new.attr = DTYPES[node.attr]
        yield "changed dtype", node, new
    elif isinstance(node, ast.If):
        new = ast.UnaryOp(op=ast.Not(), operand=copy.deepcopy(node.test))
        yield "negated condition", node.test, new


def _benign(source: str, tree: ast.Module, rng: random.Random):
    functions = [n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not functions:
        return []
    out = []
    f = rng.choice(functions)
    lines = source.splitlines(keepends=True)
    body_line = f.body[0].lineno - 1
    indent = lines[body_line][: len(lines[body_line]) - len(lines[body_line].lstrip())]
    comment = f"{indent}# reviewed: keep this behaviour\n"
    out.append(("benign: comment", f.body[0].lineno,
                "".join(lines[:body_line] + [comment] + lines[body_line:])))
    g = rng.choice(functions)
    doc = g.body[0]
    if _is_docstring(doc):
        new_doc = repr(doc.value.value + " (Documented.)")
        out.append(("benign: docstring", doc.lineno, _segment_replace(source, doc.value, new_doc)))
    return out


def generate(root: Path, package: str, count: int, benign: int, seed: int = 0) -> list[Mutant]:
    rng = random.Random(seed)
    files = sorted(p for p in (root / package).rglob("*.py") if p.name != "__init__.py")
    pool = []
    benign_pool = []
    for path in files:
        source = path.read_text()
        tree = ast.parse(source)
        rel = path.relative_to(root).as_posix()
        for operator, node, new in _candidates(tree):
            if not hasattr(node, "end_lineno"):
                continue
            text = ast.unparse(new)
            after = _segment_replace(source, node, text)
            if after == source:
                continue
            try:
                ast.parse(after)
            except SyntaxError:
                continue
            pool.append((rel, node.lineno, operator, source, after))
        for operator, line, after in _benign(source, tree, rng):
            benign_pool.append((rel, line, operator, source, after))
    # Spread over operators: round-robin through shuffled per-operator lists.
    by_operator: dict[str, list] = {}
    for item in pool:
        by_operator.setdefault(item[2], []).append(item)
    for items in by_operator.values():
        rng.shuffle(items)
    chosen = []
    operators = sorted(by_operator)
    while len(chosen) < count and any(by_operator.values()):
        for op in operators:
            if by_operator[op] and len(chosen) < count:
                chosen.append(by_operator[op].pop())
    rng.shuffle(benign_pool)
    chosen += benign_pool[:benign]
    mutants = []
    for rel, line, operator, before, after in chosen:
        digest = hashlib.sha1(f"{rel}:{line}:{operator}:{after}".encode()).hexdigest()[:10]
        mutants.append(Mutant(id=f"{rel.rsplit('/', 1)[-1][:-3]}-{line}-{digest}", path=rel,
                              line=line, operator=operator,
                              benign=operator.startswith("benign"), before=before, after=after))
    return mutants
