"""Block inventories of a whole tree, cached in the store by blob sha.

A file's blocks depend only on its contents, so each blob is parsed once, ever. Also the
tree-wide facts built on inventories: the static import graph (which test files reach which
module), and the hash of each Triton kernel with every jit function it calls.
"""

from __future__ import annotations

import ast
import hashlib
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Mapping

from fastci.runner.analysis.blocks import (
    MODULE,
    Block,
    FileBlocks,
    module_name_for,
    parse_blocks,
)
from fastci.runner.analysis.discover import NAMES_VERSION, names_in
from fastci.runner.git import Repo

if TYPE_CHECKING:
    from fastci.runner.store import EvidenceStore


def is_python(path: str) -> bool:
    return path.endswith(".py")


def load(repo: Repo, rev: str, tree: Mapping[str, str], store: EvidenceStore, paths=None
         ) -> dict[str, FileBlocks]:
    """{path: FileBlocks} for the Python files of a tree (or the `paths` given)."""
    wanted = [p for p in (paths if paths is not None else tree) if is_python(p) and p in tree]
    cached = store.load_inventories(tree[p] for p in wanted)
    missing = [p for p in wanted if tree[p] not in cached]
    if missing:
        sources = repo.read_many(rev, missing)
        fresh = {}
        for path in missing:
            name, is_package = module_name_for(path)
            fresh[tree[path]] = parse_blocks(sources.get(path, b""), name, is_package)
        store.save_inventories(fresh)
        cached.update(fresh)
    return {p: cached[tree[p]] for p in wanted}


class Inventories(Mapping[str, FileBlocks]):
    """The Python files of a tree, parsed (or read from the cache) only when asked for.

    Most changes need a handful of files; a changed module constant needs all of them. A
    mapping that loads lazily keeps the first case fast without a second code path.
    """

    def __init__(self, repo: Repo, rev: str, tree: Mapping[str, str],
                 store: EvidenceStore) -> None:
        self._repo, self._rev, self._tree, self._store = repo, rev, tree, store
        self._paths = [p for p in tree if is_python(p)]
        self._loaded: dict[str, FileBlocks] = {}
        self._complete = False

    def using(self, store: EvidenceStore) -> "Inventories":
        """The same inventories (what is loaded stays loaded) over another open store: a
        plan's store may be closed by the time its results are stored."""
        other = Inventories(self._repo, self._rev, self._tree, store)
        other._loaded, other._complete = dict(self._loaded), self._complete
        return other

    def load(self, paths) -> dict[str, FileBlocks]:
        missing = [p for p in paths if p not in self._loaded and p in self._tree]
        if missing:
            self._loaded.update(load(self._repo, self._rev, self._tree, self._store, missing))
        return {p: self._loaded[p] for p in paths if p in self._loaded}

    def _all(self) -> dict[str, FileBlocks]:
        if not self._complete:
            self.load(self._paths)
            self._complete = True
        return self._loaded

    def __getitem__(self, path: str) -> FileBlocks:
        if path not in self._loaded:
            if not is_python(path) or path not in self._tree:
                raise KeyError(path)
            self.load([path])
        return self._loaded[path]

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and path in self._tree and is_python(path)

    def __iter__(self):
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def items(self):
        return self._all().items()

    def test_names(self, paths: list[str]) -> dict[str, list[str]]:
        """The test functions in each of `paths` (`discover.names_in`), from the store's
        cache by blob where it has them; only a test file never seen before is loaded."""
        keys = {p: f"{self._tree[p]}:{NAMES_VERSION}" for p in paths if p in self}
        found = self._store.load_test_names(keys.values())
        fresh = {key: names_in(self[path]) for path, key in keys.items() if key not in found}
        if fresh:
            self._store.save_test_names(fresh)
        return {path: found[key] if key in found else fresh[key] for path, key in keys.items()}

    def source(self, path: str) -> bytes | None:
        """A file's contents in this tree (doctest items compare their docstrings)."""
        if path not in self._tree:
            return None
        return self._repo.read_many(self._rev, [path]).get(path)

    def values(self):
        return self._all().values()


def _module_index(paths: list[str]) -> dict[str, set[str]]:
    """Dotted names -> paths, under every suffix of the path (so `src/pkg/mod.py` answers
    to `pkg.mod` whatever the source root is)."""
    index: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        name, _ = module_name_for(path)
        if not name:
            continue
        parts = name.split(".")
        for i in range(len(parts)):
            index[".".join(parts[i:])].add(path)
    return index


class ImportGraph:
    """Static, conservative: an import that resolves to several files counts for all."""

    def __init__(self, inventories: Mapping[str, FileBlocks]) -> None:
        index = _module_index(list(inventories))
        self.importers: dict[str, set[str]] = defaultdict(set)
        for path, fb in inventories.items():
            for imported in fb.imports:
                parts = imported.split(".")
                for n in range(len(parts), 0, -1):
                    targets = index.get(".".join(parts[:n]))
                    if targets:
                        for target in targets:
                            self.importers[target].add(path)
                            # importing pkg.mod runs pkg/__init__.py too
                        for k in range(1, n):
                            for init in index.get(".".join(parts[:k]), ()):
                                self.importers[init].add(path)
                        break

    def reached_from(self, path: str) -> set[str]:
        """Every file that imports `path`, directly or through other files."""
        seen, queue = {path}, deque([path])
        while queue:
            for importer in self.importers.get(queue.popleft(), ()):
                if importer not in seen:
                    seen.add(importer)
                    queue.append(importer)
        return seen


def kernel_hashes(inventories: Mapping[str, FileBlocks], kernels: set[str]) -> dict[str, str]:
    """"path::qualname" -> hash of the kernel and every jit function it calls (by name,
    transitively, among the jit functions of the tree), and of the module-level values they
    read: a global such as `SCALE = 2.0` is baked into the compiled kernel (constexpr or
    not), and the configs and heuristics in its decorators are read the same way. A kernel
    no longer found hashes to "missing"."""
    jit_by_name: dict[str, list[tuple[str, Block]]] = defaultdict(list)
    for path, fb in inventories.items():
        for block in fb.blocks:
            if block.is_jit:
                jit_by_name[block.qualname.rsplit(".", 1)[-1]].append((path, block))
    index = _module_index(list(inventories))
    out = {}
    for key in kernels:
        path, _, qualname = key.partition("::")
        home = inventories.get(path)
        kernel = home.by_qualname().get(qualname) if home else None
        if kernel is None:
            out[key] = "missing"
            continue
        seen: dict[str, str] = {}
        queue = deque([(path, kernel)])
        while queue:
            p, b = queue.popleft()
            ident = f"{p}::{b.qualname}"
            if ident in seen:
                continue
            seen[ident] = b.fingerprint
            for name in b.calls:
                queue.extend(jit_by_name.get(name, ()))
            seen.update(_globals_read(p, b, inventories, index))
        digest = hashlib.blake2b(digest_size=12)
        for ident in sorted(seen):
            digest.update(f"{ident}={seen[ident]};".encode())
        out[key] = digest.hexdigest()
    return out


def _globals_read(path: str, block: Block, inventories: Mapping[str, FileBlocks],
                  index: dict[str, set[str]]) -> dict[str, str]:
    """"path::=name" -> digest of each module-level statement that binds a name the block
    reads, resolved the way Triton resolves a kernel's globals: in the kernel's module, then
    through `from x import NAME` and `import x as m` (`m.NAME`) into repository modules, and
    on through the names those statements read (`SCALE = BASE * 2`) and the module-level
    functions they call (`configs=get_configs()`)."""
    out: dict[str, str] = {}
    attributes = set(block.reads)
    queue = deque((path, name) for name in block.reads)
    done: set[tuple[str, str]] = set()
    while queue:
        p, name = queue.popleft()
        if (p, name) in done:
            continue
        done.add((p, name))
        fb = inventories.get(p)
        if fb is None or fb.error:
            continue
        blocks = fb.by_qualname()
        body = blocks.get(MODULE)
        for statement in (body.statements if body else ()):
            if name not in statement.defines:
                continue
            if statement.kind == "def":
                target = blocks.get(name)
                if target is None or target.is_jit:
                    continue  # a jit function is hashed as a callee, by its calls
                out[f"{p}::={name}"] = target.fingerprint
                queue.extend((p, n) for n in target.reads)
                continue
            out[f"{p}::={name}"] = statement.digest
            if statement.kind == "import":
                for source, bound in zip(statement.reads, statement.defines):
                    if bound != name:
                        continue
                    for module, imported in _import_targets(fb, source, index):
                        if imported is None:  # `import pkg.mod as m`: m.NAME reads
                            queue.extend((module, a) for a in attributes)
                        else:
                            queue.append((module, imported))
            else:
                queue.extend((p, n) for n in statement.reads)
    return out


def _import_targets(fb: FileBlocks, source: str, index: dict[str, set[str]]
                    ) -> list[tuple[str, str | None]]:
    """Where an imported name comes from, among the repository's modules: (path, name) for
    `from pkg.mod import name`, (path, None) for a module imported whole."""
    out: list[tuple[str, str | None]] = []
    for imported in fb.imports:
        if imported == source or imported.endswith("." + source):
            for path in index.get(imported, ()):  # the name is a module itself
                out.append((path, None))
            base = imported[: -len(source) - 1] if imported != source else ""
            for path in index.get(base, ()) if base else ():
                out.append((path, source))
    return out


def doctest_digest(source: str | bytes, obj: str) -> str | None:
    """A digest of the docstring a doctest item runs: of the module ("") or of the class or
    function at qualname `obj`. None when it cannot be isolated (`__test__` entries, an
    object not defined by a plain def or class): the caller then watches the whole file."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    node: _Scope = tree
    for part in obj.split(".") if obj else ():
        child = _child_def(node, part)
        if child is None:
            return None
        node = child
    text = ast.get_docstring(node, clean=False)
    return hashlib.blake2b((text if text is not None else "\0none").encode(),
                           digest_size=12).hexdigest()


_Scope = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef  # has a docstring


def _child_def(node: ast.AST, name: str
               ) -> ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The first def or class called `name` in `node`'s own scope (inside if/try too)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if child.name == name:
                return child
        elif isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)) and \
                not isinstance(child, ast.Lambda):
            found = _child_def(child, name)
            if found is not None:
                return found
    return None
