"""Change analysis: what differs between the tree evidence was recorded on and the head.

Pure: it compares two {path: blob} trees and the block inventories of the files that
differ. Python files change by block (AST fingerprints, so a comment-only edit changes
nothing); module and class bodies are resolved to the names whose values changed, and
what cannot be resolved is said so, for the selection to widen.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping

from fastci.runner.analysis.blocks import DOC_ATTRIBUTE, MODULE, Block, FileBlocks
from fastci.runner.analysis.statements import FunctionChange, function_changes

# Files that change what every test runs under.
# pytest 9 reads pytest.toml and .pytest.toml ([pytest] table) and .pytest.ini too.
PYTEST_CONFIG = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
                 "setup.cfg", "pyproject.toml")
ALWAYS_EVERYTHING_NAMES = ("sitecustomize.py", "usercustomize.py")
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh", ".pyx",
                   ".pxd", ".pxi", ".so", ".pyd", ".pth", ".cmake")
NATIVE_NAMES = ("CMakeLists.txt", "Makefile", "build.ninja", "setup.py", "MANIFEST.in")


@dataclass(frozen=True)
class FileChange:
    path: str  # the path at the head (the old path for a removal)
    status: str  # added | removed | modified | renamed
    old_path: str | None = None


@dataclass(frozen=True)
class ChangeSet:
    files: tuple[FileChange, ...] = ()
    blocks: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(path, qualname) -> added | removed | modified; paths as the evidence knows them."""
    unparseable: Mapping[str, str] = field(default_factory=dict)  # head path -> error
    names: frozenset[str] = frozenset()
    """Module-level and class-level names whose values changed (global: conservative)."""
    local_names: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Names rebound by a changed import statement: they matter inside that file only."""
    unresolved: Mapping[str, str] = field(default_factory=dict)
    """path -> why its module-level change could not be resolved to names."""
    added_methods: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    """(path, class) -> methods added to a class with bases, when that is all that made the
    class change broad: harmless unless one overrides an inherited attribute (a pruning
    replay checks that under the new code) or other code looks the name up."""
    names_by_path: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """path -> the module-level names whose values changed in that module, a class's own
    name standing for any change in its body: what a test that reads the module by string
    (getattr, import_module) can see."""
    functions: Mapping[tuple[str, str], FunctionChange] = field(default_factory=dict)
    """(path, qualname) -> how a modified function changed statement by statement, where
    both its sources were at hand (`statements.py`)."""
    broad_classes: frozenset[tuple[str, str]] = frozenset()
    """(path, class) whose change reaches every user of the class (its header, an attribute
    or field, a special method), beyond gaining plain methods: the tests that ran one of its
    methods use it, even when they reached it without its name (a registry's `make("block")`)."""

    @property
    def paths(self) -> list[str]:
        out = []
        for change in self.files:
            out.append(change.path)
            if change.old_path:
                out.append(change.old_path)
        return sorted(set(out))

    def file_status(self) -> dict[str, FileChange]:
        out = {}
        for change in self.files:
            out[change.path] = change
            if change.old_path:
                out[change.old_path] = change
        return out

    @property
    def empty(self) -> bool:
        return not self.files


def diff_trees(old: Mapping[str, str], new: Mapping[str, str], renames: Mapping[str, str]
               ) -> tuple[FileChange, ...]:
    renamed_to = {o: n for o, n in renames.items() if o in old and n in new and o not in new}
    renamed_from = {n: o for o, n in renamed_to.items()}
    changes = []
    for path in sorted(set(old) | set(new)):
        if path in renamed_to:
            continue
        if path in renamed_from:
            changes.append(FileChange(path, "renamed", renamed_from[path]))
        elif path not in old:
            changes.append(FileChange(path, "added"))
        elif path not in new:
            changes.append(FileChange(path, "removed"))
        elif old[path] != new[path]:
            changes.append(FileChange(path, "modified"))
    return tuple(changes)


def _statement_changes(old: Block | None, new: Block | None):
    old_counts = Counter(s.digest for s in (old.statements if old else ()))
    new_counts = Counter(s.digest for s in (new.statements if new else ()))
    gone = old_counts - new_counts
    came = new_counts - old_counts
    changed = [s for s in (old.statements if old else ()) if gone[s.digest]]
    changed += [s for s in (new.statements if new else ()) if came[s.digest]]
    return changed


Sources = Mapping[str, tuple["bytes | str | None", "bytes | str | None"]]


def analyse(files: tuple[FileChange, ...], old_inv: Mapping[str, FileBlocks],
            new_inv: Mapping[str, FileBlocks], head_inventories: Mapping[str, FileBlocks],
            sources: Sources | None = None) -> ChangeSet:
    """Blocks, names and unresolved bodies of a set of file changes.

    `old_inv` and `new_inv` hold the changed Python files at the evidence's tree and at the
    head; `head_inventories` every Python file at the head, for propagating changed names
    through module-level statements that read them (`B = EPS * 2`). `sources`: path ->
    (old source, new source) of modified Python files, for comparing modified functions
    statement by statement (a file without both keeps whole functions).
    """
    found = _Found()
    for change in files:
        found.add(change, old_inv, new_inv)
    functions = _function_changes(found.blocks, old_inv, sources or {})
    # A name computed from a changed name changed too, in any module (B = EPS * 2).
    _propagate(found.names, found.local, found.unresolved, head_inventories, found.by_path)
    return ChangeSet(files=files, blocks=found.blocks, unparseable=found.unparseable,
                     names=frozenset(found.names),
                     local_names={p: frozenset(n) for p, n in found.local.items()},
                     unresolved=found.unresolved, added_methods=found.added_methods,
                     names_by_path={p: frozenset(n) for p, n in found.by_path.items() if n},
                     functions=functions, broad_classes=frozenset(found.broad_classes))


def _function_changes(blocks: Mapping[tuple[str, str], str], old_inv: Mapping[str, FileBlocks],
                      sources: Sources) -> dict[tuple[str, str], FunctionChange]:
    wanted: dict[str, list[str]] = {}
    for (path, qualname), status in blocks.items():
        fb = old_inv.get(path)
        block = fb.by_qualname().get(qualname) if fb is not None else None
        if status == "modified" and block is not None and block.kind == "function":
            wanted.setdefault(path, []).append(qualname)
    out = {}
    for path, qualnames in sorted(wanted.items()):
        old_source, new_source = sources.get(path, (None, None))
        if old_source is None or new_source is None:
            continue
        for qualname, change in function_changes(old_source, new_source, qualnames).items():
            out[(path, qualname)] = change
    return out


def with_names(changes: ChangeSet, by_path: Mapping[str, set[str]],
               unresolved: Mapping[str, str], inventories: Mapping[str, FileBlocks]
               ) -> ChangeSet:
    """The change set with more module-level names whose values changed (`by_path`: path ->
    names bound there, e.g. by a statement whose import-time call ran changed code) and more
    unresolved modules, propagated as changed names are (`B = DEFAULT * 2`)."""
    if not any(by_path.values()) and not unresolved:
        return changes
    names = set(changes.names)
    fresh_by_path = {p: set(n) for p, n in changes.names_by_path.items()}
    for path, bound in by_path.items():
        names.update(bound)
        fresh_by_path.setdefault(path, set()).update(bound)
    local = {p: set(n) for p, n in changes.local_names.items()}
    fresh_unresolved = dict(changes.unresolved)
    for path, why in unresolved.items():
        fresh_unresolved.setdefault(path, why)
    _propagate(names, local, fresh_unresolved, inventories, fresh_by_path)
    return replace(changes, names=frozenset(names), unresolved=fresh_unresolved,
                   names_by_path={p: frozenset(n) for p, n in fresh_by_path.items() if n})


@dataclass
class _Found:
    """What `analyse` has found so far, filled one file change at a time: a file that went
    away, a file that is new, or a file whose blocks are compared one by one."""

    blocks: dict[tuple[str, str], str] = field(default_factory=dict)
    unparseable: dict[str, str] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    local: dict[str, set[str]] = field(default_factory=dict)
    unresolved: dict[str, str] = field(default_factory=dict)
    added_methods: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    by_path: dict[str, set[str]] = field(default_factory=dict)
    broad_classes: set[tuple[str, str]] = field(default_factory=set)
    subclass_hooks: bool | None = None  # does a repository class define __init_subclass__?

    def add(self, change: FileChange, old_inv: Mapping[str, FileBlocks],
            new_inv: Mapping[str, FileBlocks]) -> None:
        """One file change. Where a file is at the head it is at `change.path`."""
        new_path = change.path if change.status != "removed" else None
        old_path = change.old_path or (change.path if change.status != "added" else None)
        if not ((old_path or "").endswith(".py") or (new_path or "").endswith(".py")):
            return
        old_fb = old_inv.get(old_path) if old_path else None
        new_fb = new_inv.get(new_path) if new_path else None
        if new_fb is not None and new_fb.error:
            self.unparseable[change.path] = new_fb.error
            new_fb = None
        if change.status in ("removed", "renamed") or (old_fb is not None and old_fb.error):
            self._old_file_gone(change, old_fb)
            if new_fb is None:
                return
        if change.status == "added" or change.status == "renamed" or old_fb is None:
            if new_fb is not None:
                self._new_file(change, new_fb)
            return
        if new_fb is None:  # no longer parses: the selection treats it on its own rule
            return
        if self.subclass_hooks is None:
            self.subclass_hooks = any(
                b.qualname.endswith(".__init_subclass__")
                for inv in (old_inv, new_inv) for fb in inv.values() for b in fb.blocks)
        self._compare(change.path, old_fb, new_fb)

    def _old_file_gone(self, change: FileChange, old_fb: FileBlocks | None) -> None:
        """Everything that ran from the old file is gone from where it was (a removal, a
        rename, or an old file that did not parse)."""
        old_path = change.old_path or change.path
        for block in (old_fb.blocks if old_fb and not old_fb.error else ()):
            self.blocks[(old_path, block.qualname)] = "removed"
        if change.status == "renamed":
            self.unresolved[old_path] = f"renamed to {change.path}"
        elif change.status == "removed":
            self.unresolved[old_path] = "removed"

    def _new_file(self, change: FileChange, new_fb: FileBlocks) -> None:
        """Every block of a file with nothing to compare against is new; a new file's module
        body is a change no name resolves (a rename's was there before)."""
        for block in new_fb.blocks:
            self.blocks[(change.path, block.qualname)] = "added"
        if change.status != "renamed":
            self.unresolved.setdefault(change.path, "new file")

    def _compare(self, path: str, old_fb: FileBlocks, new_fb: FileBlocks) -> None:
        """Blocks whose fingerprints differ; a changed module or class body is taken on to
        the names it changed."""
        old_blocks, new_blocks = old_fb.by_qualname(), new_fb.by_qualname()
        for qualname in sorted(set(old_blocks) | set(new_blocks)):
            before, after = old_blocks.get(qualname), new_blocks.get(qualname)
            if before is not None and after is not None and before.doc != after.doc:
                # A docstring is a value code reads (argparse's description=__doc__, a
                # registry's help from fn.__doc__): the blocks that read it are its readers.
                if qualname == MODULE:  # a bare `__doc__` in the file, or its module's
                    self.local.setdefault(path, set()).add("__doc__")
                    self.by_path.setdefault(path, set()).add("__doc__")
                self.names.add(DOC_ATTRIBUTE)  # `obj.__doc__`, a module's too
            if before is not None and after is not None and before.fingerprint == after.fingerprint:
                continue
            status = "added" if before is None else "removed" if after is None else "modified"
            self.blocks[(path, qualname)] = status
            kind = after.kind if after is not None else old_blocks[qualname].kind
            if kind != "function":
                self._body_changed(path, qualname, kind, before, after)
            elif before is not None and after is not None:
                self._header_changed(path, qualname, before, after)
            elif any(b is not None and b.registers for b in (before, after)) \
                    and not _nested(qualname, old_blocks, new_blocks):
                # `@register("sgd")` on a new function may take an existing key; removed,
                # it no longer fills it: the registry reaches it by no name.
                self.unresolved.setdefault(path, f"{qualname} was {status}, with a decorator "
                                                 "that may register it (it runs as the "
                                                 "module is imported)")

    def _header_changed(self, path: str, qualname: str, before: Block, after: Block) -> None:
        """What a def statement evaluates in its parent changed. Its decorators run as the
        module is imported (`@register("adam")` fills a registry), which no name resolves;
        a module-level function's signature is a value that code reads without calling the
        function (`inspect.signature`, a CLI built from the defaults): its readers."""
        if before.decorators != after.decorators:
            self.unresolved.setdefault(path, f"the decorators of {qualname} changed (they run "
                                             "as the module is imported)")
        elif before.header != after.header and "." not in qualname:
            self.names.add(qualname)
            self.by_path.setdefault(path, set()).add(qualname)

    def _body_changed(self, path: str, qualname: str, kind: str, before: Block | None,
                      after: Block | None) -> None:
        """A module or class body changed: the names whose values changed, for the module
        and for every reader, or why they cannot be told."""
        short = qualname.rsplit(".", 1)[-1]
        changed_statements = _statement_changes(before, after)
        in_module = self.by_path.setdefault(path, set())
        if kind == "class":
            in_module.add(qualname.split(".", 1)[0])
        elif kind == "module":
            in_module.update(d for s in changed_statements for d in s.defines)
        if kind == "class" and before is not None and after is not None \
                and not after.inherits and any(st.kind == "def" for st in changed_statements):
            # A method added to (or removed from) a class without bases overrides nothing in
            # it, but the class may be a mixin ahead of another base (`class TinyLM(SizeMixin,
            # nn.Module)` gaining `train`): its subclasses, through its name, are changed.
            self.names.add(short)
        if kind == "class" and _class_change_is_broad(before, after, changed_statements):
            if (before is None or after is None) and self.subclass_hooks \
                    and any(b is not None and b.inherits for b in (before, after)):
                # A base's __init_subclass__ may register it under a key another class held
                # (a registry of models by `arch`), or drop it from one.
                self.unresolved.setdefault(path, f"class {short} was "
                                                 f"{'added' if before is None else 'removed'}, "
                                                 "and a base's __init_subclass__ may "
                                                 "register it")
            if any(b is not None and b.registers for b in (before, after)):
                # A registry its decorator filled reaches it without its name, and an
                # Enum or a class of constants runs no line a test could be credited with.
                self.unresolved.setdefault(path, f"class {short} changed, and a decorator "
                                                 "may have registered it (it runs as the "
                                                 "module is imported)")
            self.names.add(short)  # whoever names the class may see different behaviour
            added = _only_added_methods(before, after, changed_statements)
            if added:
                self.added_methods[(path, qualname)] = added
            else:  # ... and whoever ran its methods: it may have reached it by a registry
                self.broad_classes.add((path, qualname))
        for statement in changed_statements:
            if statement.kind == "other":
                self.unresolved[path] = (
                    f"a {'module' if kind == 'module' else 'class ' + short} body "
                    "statement that is not a plain definition changed")
            elif statement.kind == "import" and kind == "module":
                self.local.setdefault(path, set()).update(statement.defines)
            else:
                self.names.update(statement.defines)


def _nested(qualname: str, *inventories: Mapping[str, Block]) -> bool:
    """A def inside a function: its decorators run when the function runs (the function's
    own change), not as the module is imported."""
    parent = qualname.rpartition(".")[0]
    while parent:
        for blocks in inventories:
            if parent in blocks:
                return blocks[parent].kind == "function"
        parent = parent.rpartition(".")[0]
    return False


def _class_change_is_broad(before: Block | None, after: Block | None, changed) -> bool:
    """Whether a changed class must select every user of the class, not only the readers
    of the names it changed: its header (bases, decorators such as @dataclass) changed, a
    field or attribute changed, or a method was added to or removed from a class with bases
    or a special method (it may override or stop overriding an inherited one)."""
    if before is None or after is None or before.header != after.header:
        return True
    for statement in changed:
        if statement.kind != "def":
            return True
        name = statement.defines[0]
        if after.inherits or (name.startswith("__") and name.endswith("__")):
            return True
    return False


def _only_added_methods(before: Block | None, after: Block | None, changed
                        ) -> frozenset[str] | None:
    """The names, when a class with bases changed only by gaining plain methods."""
    if before is None or after is None or before.header != after.header or not after.inherits:
        return None
    old_defs = {d for s in before.statements for d in s.defines}
    added = set()
    for statement in changed:
        if statement.kind != "def" or statement not in after.statements:
            return None  # removed or re-signed, or not a method
        name = statement.defines[0]
        if name in old_defs or name.startswith("__"):
            return None
        added.add(name)
    return frozenset(added) or None


def _propagate(names: set[str], local: dict[str, set[str]], unresolved: dict[str, str],
               inventories: Mapping[str, FileBlocks],
               by_path: dict[str, set[str]] | None = None) -> None:
    if not names and not local:
        return
    bodies = [(path, block) for path, fb in inventories.items()
              for block in fb.blocks if block.kind in ("module", "class")]
    grew = True
    while grew:
        grew = False
        for path, block in bodies:
            visible = names | local.get(path, set())
            for statement in block.statements:
                # (a def statement reads nothing; a class statement, its bases: a subclass
                # of a changed class is a changed name too)
                if not visible.intersection(statement.reads):
                    continue
                if statement.kind == "other":
                    if path not in unresolved:
                        unresolved[path] = ("a module-level statement reads changed name(s) "
                                            + ", ".join(sorted(visible & set(statement.reads))))
                    continue
                if statement.kind == "import":
                    bound = {d for r, d in zip(statement.reads, statement.defines)
                             if r in visible}
                else:
                    bound = set(statement.defines)
                if by_path is not None and bound:
                    in_module = by_path.setdefault(path, set())
                    in_module.update(bound if block.kind == "module"
                                     else {block.qualname.split(".", 1)[0]})
                fresh = bound - names
                if fresh:
                    names.update(fresh)
                    grew = True


def blocks_reading(changes: ChangeSet, inventories: Mapping[str, FileBlocks]
                   ) -> dict[tuple[str, str], frozenset[str]]:
    """(path, qualname) of every block that reads a changed name -> the names it reads."""
    if not changes.names and not changes.local_names:
        return {}
    out: dict[tuple[str, str], frozenset[str]] = {}
    for path, fb in inventories.items():
        visible = changes.names | changes.local_names.get(path, frozenset())
        for block in fb.blocks:
            if block.kind == "module":
                continue  # module bodies ran at import; their effect is in `names` already
            hit = visible.intersection(block.reads)
            if hit:
                out[(path, block.qualname)] = hit
    for path, cls in sorted(changes.broad_classes):  # its methods use the class itself
        found = inventories.get(path)
        short = frozenset({cls.rsplit(".", 1)[-1]})
        for block in found.blocks if found is not None else ():
            if block.qualname.startswith(cls + ".") and block.kind == "function":
                out[(path, block.qualname)] = out.get((path, block.qualname), frozenset()) | short
    return out


def is_native(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name in NATIVE_NAMES or name.endswith(NATIVE_SUFFIXES) or name in ALWAYS_EVERYTHING_NAMES


def is_pytest_config(path: str) -> bool:
    return path in PYTEST_CONFIG or path.rsplit("/", 1)[-1] in (
        "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml")


__all__ = ["ChangeSet", "FileChange", "FunctionChange", "Sources", "analyse", "blocks_reading",
           "diff_trees", "is_native", "is_pytest_config", "with_names", "MODULE"]
