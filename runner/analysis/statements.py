"""Inside a changed function: the lines a test must have run to be affected, or why the whole
function counts.

A test that ran a changed function along a path on which no statement changed, and that did
not pass an insertion point, ran statement for statement what the new code runs on the same
path: its outcome through this function cannot have changed. So a function's old and new
bodies are compared statement by statement (compound statements by header, then block by
block), and each difference becomes a hunk: the old tree's lines whose execution means the
test met it. The line recorders report, for every statement that starts executing, at least
one line of its span (Python 3.10 to 3.13 alike: `try:`, `pass`, `...`, constant tests and
every `except`/`case` tried; only `global`/`nonlocal` and docstrings are silent), so "ran a
line of the hunk" is exact on fresh evidence.

Some changes alter the function as a whole, and then every test that executed it is
affected (`FunctionChange.whole` says why): the signature, defaults or decorators; a name
that became local or stopped being one; `global`/`nonlocal`; a generator or coroutine (its
frame, and so its locals, may be resumed by another test); a closure over its locals (a
lambda, nested def or generator expression another test may call later); a write that
outlives the call (an attribute or item store, a mutating method, `setattr`): a later call
by another test may read back what a changed statement wrote; a def defined twice under one
name; a Triton kernel (its body runs untraced).
"""

from __future__ import annotations

import ast
import difflib
import re
import symtable
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Union

from fastci.runner.analysis.blocks import defs_in, first_line, is_jit, normalised_statement

_Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_TRY = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)
# Calls that make a new object: writing into it is local to the call.
FRESH_CALLS = frozenset({
    "list", "dict", "set", "tuple", "frozenset", "bytearray", "OrderedDict", "defaultdict",
    "deque", "Counter", "SimpleNamespace", "deepcopy", "copy", "clone", "sorted", "zeros",
    "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like", "tensor",
    "arange", "randn", "rand", "randint", "linspace", "eye", "new_zeros", "new_ones",
    "new_empty", "new_full"})
# Method names that change their receiver (a list, dict, set, file, queue, registry).
MUTATORS = frozenset({
    "append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault",
    "add", "discard", "sort", "reverse", "write", "writelines", "put", "put_nowait", "send",
    "appendleft", "extendleft", "rotate", "fill", "resize", "cache_clear", "seed",
    "manual_seed", "use_deterministic_algorithms", "__setitem__", "__delitem__",
    "__setattr__", "__delattr__", "basicConfig", "simplefilter", "filterwarnings",
    "resetwarnings", "setrecursionlimit"})
# The standard library's camelCase setters on shared objects (`logger.setLevel`,
# `addHandler`, `addFilter`, `setFormatter`, `removeHandler`).
_CAMEL_SETTER = re.compile(r"(set|add|remove)[A-Z]")
# Builtins that write by name, or run code that may.
WRITES_BY_NAME = frozenset({"setattr", "delattr", "globals", "vars", "exec", "eval"})
# Methods whose `self` is the object being built: writing into it is the call's result.
CONSTRUCTORS = frozenset({"__init__", "__post_init__"})
# Calls that exhaust a generator expression passed to them before the function goes on.
CONSUMERS = frozenset({"sum", "any", "all", "min", "max", "list", "tuple", "set", "frozenset",
                       "sorted", "dict", "join", "next", "extend", "update", "extendleft",
                       "writelines", "fromkeys", "Counter", "deque", "cat", "stack"})
# Lazy wrappers that are harmless as the iterable of a for loop (which exhausts or drops them).
LAZY = frozenset({"enumerate", "zip", "map", "filter", "reversed", "iter"})
# Calls that call a `key=` lambda during the call only.
KEYED = frozenset({"sorted", "sort", "min", "max", "nlargest", "nsmallest"})


@dataclass(frozen=True)
class Hunk:
    """One difference: a test that ran one of `lines` (the old tree's) met it."""

    lines: frozenset[int]
    what: str  # "line 12 changed", "a statement inserted at line 14", ... (head lines)


@dataclass(frozen=True)
class FunctionChange:
    """How one modified function changed, statement by statement."""

    span: tuple[int, int]  # the old function body's first and last line
    hunks: tuple[Hunk, ...] = ()
    whole: str | None = None
    """Why every test that executed the function is affected (None: the hunks decide)."""
    writes: str | None = None
    """A write in the old or the new version that outlives the call, if any."""
    everyone: bool = False
    """A hunk holds the first statement every call runs: whoever ran the function met it
    (no need to look at any test's lines)."""

    def hit(self, lines: Iterable[int]) -> str | None:
        """What the first hunk a test ran is, or None when it ran none."""
        ran = set(lines)
        for hunk in self.hunks:
            if not hunk.lines.isdisjoint(ran):
                return hunk.what
        return None

    def ran(self, lines: Iterable[int]) -> bool:
        """Whether any of `lines` is in the old function's body."""
        first, last = self.span
        return any(first <= n <= last for n in lines)


def function_changes(old_source: str | bytes, new_source: str | bytes,
                     qualnames: Iterable[str]) -> dict[str, FunctionChange]:
    """Each modified function's change. A source that does not parse gives nothing (the
    caller falls back to whole functions)."""
    try:
        old_tree, new_tree = ast.parse(old_source), ast.parse(new_source)
    except (SyntaxError, ValueError, RecursionError):
        return {}
    old_scopes, new_scopes = _scopes(old_source), _scopes(new_source)
    old_defs, new_defs = _defs(old_tree), _defs(new_tree)
    out = {}
    for qualname in qualnames:
        olds, news = old_defs.get(qualname, []), new_defs.get(qualname, [])
        if not olds or not news or not isinstance(olds[0], _FUNCTIONS) \
                or not isinstance(news[0], _FUNCTIONS):
            continue
        old, new = olds[0], news[0]
        span = (_body_start(old), old.end_lineno or old.lineno)
        if len(olds) > 1 or len(news) > 1:
            out[qualname] = FunctionChange(span, whole="it is defined more than once under "
                                                       "this name")
            continue
        old_scope = _scope_of(old_scopes, qualname, old.lineno)
        new_scope = _scope_of(new_scopes, qualname, new.lineno)
        writes = first_write(old, old_scope, _imported(old_scopes)) or \
            first_write(new, new_scope, _imported(new_scopes))
        whole = _whole(old, new, old_scope, new_scope) or (
            f"it writes state that outlives the call ({writes})" if writes else None)
        if whole is None:
            body = _body(old)
            hunks = _diff(body, _body(new), frozenset(range(span[0], span[1] + 1)))
            if not hunks:
                whole = "the change is not in a statement of its own"
            first = _own_lines(body[0]) if body else frozenset()
            everyone = any(first <= h.lines for h in hunks) if first else True
            out[qualname] = FunctionChange(span, tuple(hunks), whole, writes, everyone)
        else:
            out[qualname] = FunctionChange(span, (), whole, writes)
    return out


def writes_in(source: str | bytes, qualname: str) -> str | None:
    """The first write in a function that outlives the call ("line 12: ..."), "" when it has
    none, None when the function cannot be found or analysed."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    nodes = _defs(tree).get(qualname, [])
    if len(nodes) != 1 or not isinstance(nodes[0], _FUNCTIONS):
        return None
    table = _scopes(source)
    return first_write(nodes[0], _scope_of(table, qualname, nodes[0].lineno),
                       _imported(table)) or ""


def _defs(tree: ast.Module) -> dict[str, list[ast.AST]]:
    out: dict[str, list[ast.AST]] = {}
    for qualname, node in defs_in(tree.body):
        out.setdefault(qualname, []).append(node)
    return out


def _body(node: _Function) -> list[ast.stmt]:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]  # a docstring runs nothing
    return body


def _body_start(node: _Function) -> int:
    return node.body[0].lineno if node.body else node.lineno


# -- the function as a whole ------------------------------------------------------------------
def _whole(old: _Function, new: _Function, old_scope, new_scope) -> str | None:
    if type(old) is not type(new) or _dump(_header(old)) != _dump(_header(new)):
        return "its signature, defaults or decorators changed"
    if is_jit(old) or is_jit(new):
        return "it is a Triton kernel or jit function (its body runs untraced)"
    for node in (old, new):
        if isinstance(node, ast.AsyncFunctionDef) or _own(node, (ast.Yield, ast.YieldFrom,
                                                                 ast.Await)):
            return ("it is a generator or coroutine: its frame, locals included, may be "
                    "resumed by another test")
        declared = _own(node, (ast.Global, ast.Nonlocal))
        if declared:
            return f"it declares global or nonlocal names (line {getattr(declared, 'lineno', 0)})"
    if old_scope is None or new_scope is None:
        return "its scopes could not be analysed"
    # A name that became local (or stopped being one) changes what every statement reading
    # it reads, unchanged ones included; those read it in both versions.
    moved = (_locals(old_scope) ^ _locals(new_scope)) & _loads(old) & _loads(new)
    if moved:
        return f"a name it reads became local to it or stopped being one " \
               f"({', '.join(sorted(moved)[:3])})"
    for node, scope in ((old, old_scope), (new, new_scope)):
        closure = _closure(node, scope)
        if closure:
            return f"it creates a closure over its locals ({closure}), which may run later"
    return None


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _header(node: _Function) -> list[ast.AST]:
    parts: list[ast.AST] = [*node.decorator_list, node.args]
    if node.returns is not None:
        parts.append(node.returns)
    return parts


def _own_nodes(node: ast.AST, into_lambdas: bool = False) -> Iterator[ast.AST]:
    """The nodes of a function's own scope: not inside nested defs or classes (nor lambdas,
    unless `into_lambdas`: a lambda's body runs when it is called, maybe within the call)."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if isinstance(child, _NESTED) and not (into_lambdas and isinstance(child, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(child))


def _own(node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
    """The first node of `kinds` in the function's own scope (a yield in a lambda makes the
    lambda a generator, not the function)."""
    found = [n for n in _own_nodes(node) if isinstance(n, kinds)]
    return min(found, key=lambda n: getattr(n, "lineno", 0)) if found else None


def _scopes(source: str | bytes):
    try:
        text = source.decode() if isinstance(source, bytes) else source
        return symtable.symtable(text, "<fastci>", "exec")
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
        return None


def _scope_of(table, qualname: str, lineno: int):
    """The symbol table of the function `qualname` (defined at `lineno`), or None."""
    if table is None:
        return None
    parts = [p for p in qualname.split(".") if p != "<locals>"]
    current = table
    for i, name in enumerate(parts):
        matches = [c for c in current.get_children() if c.get_name() == name
                   and c.get_type() in ("function", "class")]
        if i == len(parts) - 1:
            matches = [c for c in matches if c.get_lineno() == lineno] or matches
        if len(matches) != 1:
            return None
        current = matches[0]
    return current if current.get_type() == "function" else None


def _locals(scope) -> frozenset[str]:
    return frozenset(s.get_name() for s in scope.get_symbols() if s.is_local())


def _closure(node: _Function, scope) -> str | None:
    """A nested scope that captures the function's locals and may run after it returns."""
    own = _locals(scope)
    done = _done_within(node)
    for child in _escaping(scope, done):
        captured = set(child.get_frees()) & own
        if captured:
            label = {"genexpr": "a generator expression", "lambda": "a lambda"}.get(
                child.get_name(), "a nested class" if child.get_type() == "class"
                else "a nested function")
            return f"{label} at line {child.get_lineno()} reads {', '.join(sorted(captured))}"
    return None


def _escaping(scope, done: dict[str, set[int]]) -> Iterator:
    for child in scope.get_children():
        name = child.get_name()
        if name in ("listcomp", "setcomp", "dictcomp") or child.get_lineno() in done.get(name, ()):
            yield from _escaping(child, done)  # done within the call; what they make may escape
        else:
            yield child


def _done_within(node: _Function) -> dict[str, set[int]]:
    """Lines whose generator expressions (and lambdas) all run out before the function goes
    on: passed to a consumer (sum, list, "".join, extend), iterated by a for loop, unpacked
    by an assignment; a lambda passed as `key=` to sorted, min or max."""
    done: dict[str, set[int]] = {"genexpr": set(), "lambda": set()}
    for child in _own_nodes(node):
        if isinstance(child, ast.Call):
            name = _called(child)
            for arg in child.args:
                if isinstance(arg, ast.GeneratorExp) and name in CONSUMERS:
                    done["genexpr"].add(id(arg))
            for keyword in child.keywords:
                if keyword.arg == "key" and isinstance(keyword.value, ast.Lambda) \
                        and name in KEYED:
                    done["lambda"].add(id(keyword.value))
        elif isinstance(child, (ast.For, ast.AsyncFor)):
            for gen in _iterated(child.iter):
                done["genexpr"].add(id(gen))
        elif isinstance(child, ast.Assign) and isinstance(child.value, ast.GeneratorExp) \
                and all(isinstance(t, (ast.Tuple, ast.List)) for t in child.targets):
            done["genexpr"].add(id(child.value))
    out: dict[str, set[int]] = {}
    for kind, cls in (("genexpr", ast.GeneratorExp), ("lambda", ast.Lambda)):
        nodes = [n for n in _own_nodes(node, into_lambdas=True) if isinstance(n, cls)]
        lines = {n.lineno for n in nodes if id(n) in done[kind]}
        out[kind] = lines - {n.lineno for n in nodes if id(n) not in done[kind]}
    return out


def _iterated(expr: ast.expr) -> list[ast.GeneratorExp]:
    """Generator expressions a for loop's iterable exhausts or drops with the loop."""
    if isinstance(expr, ast.GeneratorExp):
        return [expr]
    if isinstance(expr, ast.Call) and _called(expr) in LAZY | CONSUMERS:
        return [g for arg in expr.args for g in _iterated(arg)]
    return []


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else ""


# -- writes that outlive the call --------------------------------------------------------------
def _imported(table) -> frozenset[str]:
    """The module-level names a file binds by import (modules, mostly)."""
    if table is None:
        return frozenset()
    return frozenset(s.get_name() for s in table.get_symbols() if s.is_imported())


def first_write(node: _Function, scope, imported: frozenset[str] = frozenset()) -> str | None:
    """The first statement (by line) that writes state the call does not own: an attribute
    or item of anything but a container it made itself (or `self` in `__init__`), a
    mutating method on one, `setattr`/`globals()`/`exec`, `global`/`nonlocal`. An in-place
    function of an imported module (`nn.init.normal_(w)`) writes its first argument."""
    fresh = _fresh_locals(node, scope)
    builder = node.args.args[0].arg if node.name in CONSTRUCTORS and node.args.args else None
    found: list[tuple[int, str]] = []
    for child in _own_nodes(node, into_lambdas=True):
        line = getattr(child, "lineno", 0)
        if isinstance(child, (ast.Global, ast.Nonlocal)):
            found.append((line, f"line {line}: global or nonlocal"))
        elif isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets: list[ast.expr] = list(child.targets) \
                if isinstance(child, (ast.Assign, ast.Delete)) else [child.target]
            for target in _flat(targets):
                if isinstance(target, (ast.Attribute, ast.Subscript)) \
                        and not _owned(target, fresh, builder):
                    found.append((line, f"line {line}: stores into {ast.unparse(target)}"))
            # `items += [x]`, `seen |= keys` change a list, dict or set in place: the
            # caller's, when the name holds anything but what the call made.
            if isinstance(child, ast.AugAssign) and isinstance(child.target, ast.Name) \
                    and child.target.id not in fresh:
                found.append((line, f"line {line}: {child.target.id} "
                                    f"{_AUG[type(child.op)]}= may change it in place"))
        elif isinstance(child, ast.Call):
            what = _mutating_call(child, fresh, builder, imported)
            if what:
                found.append((line, f"line {line}: {what}"))
    return min(found)[1] if found else None


_AUG = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.MatMult: "@", ast.Div: "/",
        ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
        ast.BitXor: "^", ast.BitAnd: "&", ast.FloorDiv: "//"}


def _flat(targets: list[ast.expr]) -> Iterator[ast.expr]:
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            yield from _flat(list(target.elts))
        elif isinstance(target, ast.Starred):
            yield from _flat([target.value])
        else:
            yield target


def _root_name(node: ast.AST) -> str | None:
    """`a` of `a.b[c].d`; None when the chain does not start at a plain name."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _owned(target: ast.AST, fresh: set[str], builder: str | None) -> bool:
    """Whether writing into `target` changes only what the call made: an item or attribute of
    a container made in the call (`out[i]`, not `out.items[i]`, whose object may be shared),
    or anything under `self` in `__init__` (the object being built)."""
    depth = 0
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        target = target.value
        depth += 1
    if not isinstance(target, ast.Name):
        return False
    return (target.id == builder) or (target.id in fresh and depth <= 1)


def _mutating_call(call: ast.Call, fresh: set[str], builder: str | None,
                   imported: frozenset[str] = frozenset()) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id in WRITES_BY_NAME:
        if func.id in ("setattr", "delattr") and call.args \
                and _owned(ast.Attribute(value=call.args[0], attr="x"), fresh, builder):
            return None
        return f"calls {func.id}()"
    if isinstance(func, ast.Attribute):
        name = func.attr
        in_place = name.endswith("_") and not name.startswith("_")  # torch's in-place ops
        mutates = name in MUTATORS or name.startswith(("set_", "register")) or in_place \
            or _CAMEL_SETTER.match(name) is not None
        if in_place and name not in MUTATORS and _root_name(func) in imported and _root_name(func) \
                not in fresh:  # torch.nn.init.normal_(w): a function that writes w
            target = call.args[0] if call.args else None
            if target is not None and _owned(ast.Attribute(value=target, attr="x"), fresh,
                                             builder):
                return None
            return f"calls {ast.unparse(func)}()"
        if mutates and not _owned(func, fresh, builder):
            return f"calls {ast.unparse(func)}()"
    return None


def _fresh_locals(node: _Function, scope) -> set[str]:
    """Locals every binding of which is a plain `name = <new object>` ([], {}, dict(),
    torch.zeros(...)): writing into them is local to the call. Parameters never are."""
    params = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                              node.args.vararg, node.args.kwarg] if a is not None}
    stores: dict[str, int] = {}
    plain: dict[str, list[bool]] = {}
    nodes = list(_own_nodes(node, into_lambdas=True))
    # `x += y` keeps x what it was made as (a new list stays the call's own, a number a new
    # number): not a binding that makes it shared.
    in_place = {id(n.target) for n in nodes if isinstance(n, ast.AugAssign)}
    for child in nodes:
        if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)) \
                and id(child) not in in_place:
            stores[child.id] = stores.get(child.id, 0) + 1
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(child, ast.Assign):
            targets, value = child.targets, child.value
        elif isinstance(child, ast.AnnAssign) and child.value is not None:
            targets, value = [child.target], child.value
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                plain.setdefault(target.id, []).append(_fresh_value(value))
    own = _locals(scope) if scope is not None else set(plain)
    return {name for name, values in plain.items()
            if all(values) and len(values) == stores.get(name, 0) and name in own
            and name not in params}


def _fresh_value(value: ast.expr) -> bool:
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.SetComp,
                          ast.DictComp, ast.Constant, ast.JoinedStr)):
        return True
    if isinstance(value, ast.Tuple):
        return all(_fresh_value(e) for e in value.elts)
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else ""
        return name in FRESH_CALLS
    return False


# -- statement by statement ---------------------------------------------------------------
def _diff(old: list[ast.stmt], new: list[ast.stmt], entry: frozenset[int]) -> list[Hunk]:
    """The hunks between two blocks of statements; `entry`: the old lines whose execution
    means control may have reached the block's first position."""
    hunks: list[Hunk] = []
    matcher = difflib.SequenceMatcher(None, [_digest(s) for s in old], [_digest(s) for s in new],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1:
            for k, (before, after) in enumerate(zip(old[i1:i2], new[j1:j2])):
                if _same_header(before, after):
                    hunks += _inner(before, after, old, i1 + k, entry)
                else:
                    hunks.append(Hunk(_trigger(old, i1 + k, entry),
                                      f"line {after.lineno} changed"))
            continue
        for k in range(i1, i2):  # removed, or replaced: a test that reached it ran it
            what = f"the statement at line {old[k].lineno} (before the change) was removed" \
                if tag == "delete" else f"{_lines_text(new[j1:j2])} changed"
            hunks.append(Hunk(_trigger(old, k, entry), what))
        if tag == "insert":
            # A test passes the insertion point exactly when it then runs the statement that
            # follows it; at the end of a block, when it ran the one before (a superset: that
            # one may have returned); in an empty block, when it entered the block.
            near = _trigger(old, i2, entry) if i2 < len(old) else _reach(old, i1, entry)
            hunks.append(Hunk(near, f"a statement inserted at {_lines_text(new[j1:j2])}, "
                                    "beside one it ran"))
    return hunks


def _lines_text(stmts: list[ast.stmt]) -> str:
    first, last = stmts[0].lineno, stmts[-1].end_lineno or stmts[-1].lineno
    return f"line {first}" if first == last else f"lines {first}-{last}"


def _inner(before: ast.stmt, after: ast.stmt, block: list[ast.stmt], index: int,
           entry: frozenset[int]) -> list[Hunk]:
    """Two compound statements with the same header: compare their blocks one by one."""
    own = _own_lines(before)
    pairs: list[tuple[list[ast.stmt], list[ast.stmt], frozenset[int]]] = []
    clauses: list[Hunk] = []
    if isinstance(before, _TRY):
        assert isinstance(after, _TRY)
        pairs.append((before.body, after.body, own))
        for h_old, h_new in zip(before.handlers, after.handlers):
            clause = _lines(h_old.lineno, h_old.body[0].lineno - 1)
            if _dump([h_old.type or ast.Constant(None), ast.Constant(h_old.name)]) != \
                    _dump([h_new.type or ast.Constant(None), ast.Constant(h_new.name)]):
                # Tried (and its line reported) by every exception that got that far.
                clauses.append(Hunk(clause, f"the except clause at line {h_new.lineno} changed"))
            pairs.append((h_old.body, h_new.body, clause))
        body_lines = _span(before.body[0].lineno, before.body[-1].end_lineno)
        pairs.append((before.orelse, after.orelse, own | body_lines))
        pairs.append((before.finalbody, after.finalbody,
                      _span(before.lineno, before.end_lineno) | set(_reach(block, index, entry))))
    elif isinstance(before, ast.Match):
        assert isinstance(after, ast.Match)
        for c_old, c_new in zip(before.cases, after.cases):
            pairs.append((c_old.body, c_new.body,
                          _lines(c_old.pattern.lineno, c_old.body[0].lineno - 1)))
    else:
        for name in ("body", "orelse"):
            pairs.append((getattr(before, name, []), getattr(after, name, []), own))
    hunks = clauses
    for old_block, new_block, block_entry in pairs:
        hunks += _diff(old_block, new_block, frozenset(block_entry))
    if not hunks:  # they differ in something neither header nor blocks hold: the statement
        hunks.append(Hunk(_trigger(block, index, entry), f"line {after.lineno} changed"))
    return hunks


def _digest(stmt: ast.stmt) -> str:
    return _dump(normalised_statement(stmt))


def _dump(node: ast.AST | list[ast.AST]) -> str:
    if isinstance(node, list):
        return "\n".join(_dump(n) for n in node)
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _header_parts(stmt: ast.stmt) -> list[ast.AST] | None:
    """What a compound statement evaluates besides its blocks; None for a simple one."""
    if isinstance(stmt, (ast.If, ast.While)):
        return [stmt.test]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.target, stmt.iter]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return list(stmt.items)
    if isinstance(stmt, _TRY):  # its handlers' clauses are compared one by one (`_inner`)
        return [ast.Constant(len(stmt.handlers))]
    if isinstance(stmt, ast.Match):
        parts: list[ast.AST] = [stmt.subject, ast.Constant(len(stmt.cases))]
        for case in stmt.cases:
            parts += [case.pattern, case.guard or ast.Constant(None)]
        return parts
    return None


def _same_header(before: ast.stmt, after: ast.stmt) -> bool:
    if type(before) is not type(after):
        return False
    parts_before, parts_after = _header_parts(before), _header_parts(after)
    return parts_before is not None and parts_after is not None \
        and _dump(parts_before) == _dump(parts_after)


def _own_lines(stmt: ast.stmt) -> frozenset[int]:
    """The lines the tracer reports when the statement itself runs: all of a simple
    statement's, a compound statement's header (a def's decorators and signature)."""
    first = first_line(stmt)
    inner = _first_inner_line(stmt)
    last = (inner - 1) if inner is not None else (stmt.end_lineno or stmt.lineno)
    return _lines(first, max(last, stmt.lineno))


def _first_inner_line(stmt: ast.stmt) -> int | None:
    if isinstance(stmt, ast.Match):
        return stmt.cases[0].pattern.lineno if stmt.cases else None
    body = getattr(stmt, "body", None)
    if isinstance(body, list) and body:
        return body[0].lineno
    return None


def _trigger(block: list[ast.stmt], index: int, entry: frozenset[int]) -> frozenset[int]:
    """The lines that mean a test ran `block[index]`: its own, or where it cannot be seen
    (`global`, `nonlocal`), whatever comes before it."""
    stmt = block[index]
    if isinstance(stmt, (ast.Global, ast.Nonlocal)):
        return frozenset(_reach(block, index, entry))
    return _own_lines(stmt)


def _reach(block: list[ast.stmt], index: int, entry: frozenset[int]) -> frozenset[int]:
    """The lines whose execution means control may have reached position `index`."""
    if index == 0:
        return entry
    return _trigger(block, index - 1, entry)


def _lines(first: int, last: int) -> frozenset[int]:
    return frozenset(range(first, max(first, last) + 1))


def _span(first: int, last: int | None) -> frozenset[int]:
    return _lines(first, last or first)


__all__ = ["FunctionChange", "Hunk", "first_write", "function_changes", "writes_in"]
