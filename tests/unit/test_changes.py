"""Change analysis on inline sources: which files, blocks and names a change changed.

`diff_trees` compares {path: blob} trees; `analyse` turns the Python files among them into
changed blocks (by AST fingerprint: comments, docstrings and whitespace change nothing) and
resolves changed module and class bodies to the names whose values changed.
"""

from __future__ import annotations

import pytest
from selection_world import changes_between, dedented, edit, inventories

from fastci.runner.analysis.blocks import DOC_ATTRIBUTE, MODULE, parse_blocks
from fastci.runner.analysis.changes import (
    FileChange,
    blocks_reading,
    diff_trees,
    is_native,
    is_pytest_config,
)

LIB = dedented({
    "pkg/__init__.py": "",
    "pkg/norms.py": '''
        """Norms."""
        import math

        EPS = 1e-6
        SCALE = EPS * 2


        def rms(xs):
            """Root mean square."""
            # add EPS so an all-zero input has a norm
            return math.sqrt(sum(x * x for x in xs) / len(xs) + EPS)


        def l1(xs):
            return sum(abs(x) for x in xs)
    ''',
    "pkg/layer.py": '''
        from dataclasses import dataclass

        from pkg.norms import EPS as E


        @dataclass
        class Config:
            width: int = 4


        class Layer(Base):
            scale = 2.0

            def forward(self, x):
                return x * self.scale + E

            def extra(self):
                return 1


        def offset():
            return E
    ''',
})


def blocks(new, old=LIB):
    return dict(changes_between(old, new).blocks)


# -- diff_trees ------------------------------------------------------------------------------

def test_diff_trees_names_each_kind_of_file_change():
    old = {"a.py": "1", "b.py": "2", "c.py": "3", "d.txt": "4"}
    new = {"a.py": "1", "b.py": "2b", "e.py": "5", "d2.txt": "4"}
    assert diff_trees(old, new, {"d.txt": "d2.txt"}) == (
        FileChange("b.py", "modified"),
        FileChange("c.py", "removed"),
        FileChange("d2.txt", "renamed", "d.txt"),
        FileChange("e.py", "added"),
    )


def test_diff_trees_ignores_a_rename_that_git_reported_for_paths_still_present():
    old = {"a.py": "1"}
    new = {"a.py": "1", "b.py": "1"}
    assert diff_trees(old, new, {"a.py": "b.py"}) == (FileChange("b.py", "added"),)


def test_change_set_paths_include_both_sides_of_a_rename():
    changes = changes_between({"x/a.py": "A = 1\n"}, {"x/b.py": "A = 1\n"}, {"x/a.py": "x/b.py"})
    assert changes.paths == ["x/a.py", "x/b.py"]
    assert changes.file_status()["x/a.py"].status == "renamed"
    assert changes.unresolved == {"x/a.py": "renamed to x/b.py"}
    assert changes.blocks == {("x/a.py", MODULE): "removed", ("x/b.py", MODULE): "added"}


# -- blocks: what changes and what does not -------------------------------------------------

def test_a_function_body_change_changes_that_function_only():
    new = edit(LIB, "pkg/norms.py", "abs(x) for x", "abs(x) ** 1 for x")
    changes = changes_between(LIB, new)
    assert changes.blocks == {("pkg/norms.py", "l1"): "modified"}
    assert changes.names == frozenset() and changes.unresolved == {}


@pytest.mark.parametrize("old, new", [
    ('"""Root mean square."""', '"""Root mean square of a list."""'),
    ("# add EPS so an all-zero input has a norm", "# EPS keeps zero inputs finite"),
    ('"""Norms."""', '"""Norms of lists."""'),
    ("return sum(abs(x) for x in xs)", "return sum(abs(x)   for x in xs)"),
    ("def l1(xs):\n", "def l1(xs):  # taxicab\n"),
], ids=["function-docstring", "comment", "module-docstring", "whitespace", "trailing-comment"])
def test_comment_docstring_and_whitespace_edits_change_no_block(old, new):
    changes = changes_between(LIB, edit(LIB, "pkg/norms.py", old, new))
    assert changes.files == (FileChange("pkg/norms.py", "modified"),)
    assert changes.blocks == {}
    assert changes.unresolved == {} and changes.unparseable == {}
    # A docstring is a value only for the code that reads it: `fn.__doc__` anywhere, a bare
    # `__doc__` in its own module.
    docstring = '"""' in old
    module = old == '"""Norms."""'
    assert changes.names == (frozenset({DOC_ATTRIBUTE}) if docstring else frozenset())
    assert changes.local_names == ({"pkg/norms.py": frozenset({"__doc__"})} if module else {})


def test_an_added_function_is_an_added_block_and_a_new_module_name():
    new = edit(LIB, "pkg/norms.py", "def l1(xs):",
               "def linf(xs):\n    return max(xs)\n\n\ndef l1(xs):")
    changes = changes_between(LIB, new)
    assert changes.blocks == {("pkg/norms.py", "linf"): "added",
                              ("pkg/norms.py", MODULE): "modified"}
    assert changes.names == {"linf"}


def test_a_removed_function_is_a_removed_block():
    new = edit(LIB, "pkg/norms.py", "\n\ndef l1(xs):\n    return sum(abs(x) for x in xs)\n", "\n")
    changes = changes_between(LIB, new)
    assert changes.blocks == {("pkg/norms.py", "l1"): "removed",
                              ("pkg/norms.py", MODULE): "modified"}
    assert changes.names == {"l1"}


def test_a_changed_default_argument_is_a_change_of_the_function():
    new = edit(LIB, "pkg/norms.py", "def l1(xs):", "def l1(xs, p=1):")
    assert blocks(new) == {("pkg/norms.py", "l1"): "modified"}


# -- module and class bodies: which names changed -------------------------------------------

def test_a_module_constant_change_names_it_and_what_is_computed_from_it():
    new = edit(LIB, "pkg/norms.py", "EPS = 1e-6", "EPS = 1e-5")
    changes = changes_between(LIB, new)
    assert changes.blocks == {("pkg/norms.py", MODULE): "modified"}
    # SCALE = EPS * 2 changed value too; `from pkg.norms import EPS as E` rebinds E.
    assert {"EPS", "SCALE", "E"} <= changes.names
    assert changes.unresolved == {}


def test_blocks_reading_a_changed_constant_include_importers_under_another_name():
    new = edit(LIB, "pkg/norms.py", "EPS = 1e-6", "EPS = 1e-5")
    changes = changes_between(LIB, new)
    hits = blocks_reading(changes, inventories(new))
    assert hits[("pkg/norms.py", "rms")] == {"EPS"}
    assert hits[("pkg/layer.py", "Layer.forward")] == {"E"}
    assert hits[("pkg/layer.py", "offset")] == {"E"}
    assert ("pkg/norms.py", "l1") not in hits
    assert not any(q == MODULE for _, q in hits)


def test_a_class_attribute_change_names_the_attribute_and_the_class():
    changes = changes_between(LIB, edit(LIB, "pkg/layer.py", "scale = 2.0", "scale = 3.0"))
    assert changes.blocks == {("pkg/layer.py", "Layer"): "modified"}
    assert {"scale", "Layer"} <= changes.names


def test_a_dataclass_field_default_change_names_the_field_and_the_class():
    changes = changes_between(LIB, edit(LIB, "pkg/layer.py", "width: int = 4", "width: int = 8"))
    assert changes.blocks == {("pkg/layer.py", "Config"): "modified"}
    assert {"width", "Config"} <= changes.names


def test_a_dataclass_change_stays_resolved_to_its_names():
    # @dataclass keeps no reference to the class: its name is the only way to it.
    changes = changes_between(LIB, edit(LIB, "pkg/layer.py", "width: int = 4", "width: int = 8"))
    assert changes.unresolved == {}


@pytest.mark.parametrize("decorator", ["@register(\"config\")", "@REGISTRY.register_module()"])
def test_a_class_a_decorator_may_have_registered_changes_its_whole_module(decorator):
    # A registry reaches it without its name: its importers are its readers.
    old = edit(LIB, "pkg/layer.py", "@dataclass\n", f"{decorator}\n@dataclass\n")
    changes = changes_between(old, edit(old, "pkg/layer.py", "width: int = 4", "width: int = 8"))
    assert changes.unresolved == {"pkg/layer.py": "class Config changed, and a decorator may "
                                                  "have registered it (it runs as the module "
                                                  "is imported)"}


def test_a_method_added_to_a_class_with_bases_is_recorded_for_the_pruning_check():
    new = edit(LIB, "pkg/layer.py", "    def extra(self):",
               "    def reset(self):\n        return 0\n\n    def extra(self):")
    changes = changes_between(LIB, new)
    assert changes.blocks[("pkg/layer.py", "Layer.reset")] == "added"
    assert changes.added_methods == {("pkg/layer.py", "Layer"): frozenset({"reset"})}


def test_a_changed_import_rebinds_its_names_in_that_file_only():
    new = edit(LIB, "pkg/layer.py", "from pkg.norms import EPS as E",
               "from pkg.norms import SCALE as E")
    changes = changes_between(LIB, new)
    assert changes.local_names == {"pkg/layer.py": frozenset({"E"})}
    assert "E" not in changes.names


def test_a_module_statement_that_is_not_a_definition_is_unresolved():
    new = edit(LIB, "pkg/norms.py", "SCALE = EPS * 2",
               "SCALE = EPS * 2\nif SCALE > 1:\n    SCALE = 1")
    changes = changes_between(LIB, new)
    assert changes.unresolved == {
        "pkg/norms.py": "a module body statement that is not a plain definition changed"}


def test_a_new_python_file_is_unresolved_as_new():
    changes = changes_between(LIB, {**LIB, "pkg/extra.py": "def f():\n    return 1\n"})
    assert changes.unresolved == {"pkg/extra.py": "new file"}
    assert changes.blocks == {("pkg/extra.py", MODULE): "added", ("pkg/extra.py", "f"): "added"}


def test_a_removed_python_file_removes_its_blocks():
    changes = changes_between(LIB, {p: t for p, t in LIB.items() if p != "pkg/norms.py"})
    assert changes.unresolved == {"pkg/norms.py": "removed"}
    assert {q for (p, q), s in changes.blocks.items() if s == "removed"} == {
        MODULE, "rms", "l1"}


def test_a_file_that_no_longer_parses_is_reported_with_its_line():
    new = edit(LIB, "pkg/norms.py", "def l1(xs):", "def l1(xs:")
    changes = changes_between(LIB, new)
    line = new["pkg/norms.py"].splitlines().index("def l1(xs:") + 1
    assert set(changes.unparseable) == {"pkg/norms.py"}
    assert changes.unparseable["pkg/norms.py"].startswith(f"does not parse at line {line}")
    assert changes.blocks == {}


def test_non_python_files_are_file_changes_without_blocks():
    changes = changes_between({**LIB, "cfg.yaml": "a: 1\n"}, {**LIB, "cfg.yaml": "a: 2\n"})
    assert changes.files == (FileChange("cfg.yaml", "modified"),)
    assert changes.blocks == {} and not changes.empty


# -- parse_blocks on the pieces analyse relies on --------------------------------------------

def test_parse_blocks_reports_a_syntax_error_instead_of_raising():
    fb = parse_blocks("def f(:\n    pass\n")
    assert fb.blocks == () and fb.error.startswith("does not parse at line 1")


def test_parse_blocks_statements_say_what_a_body_defines_and_reads():
    module = parse_blocks(LIB["pkg/norms.py"]).by_qualname()[MODULE]
    by_defines = {s.defines: s for s in module.statements}
    assert by_defines[("SCALE",)].reads == ("EPS",) and by_defines[("SCALE",)].kind == "assign"
    assert by_defines[("math",)].kind == "import"
    assert by_defines[("rms",)].kind == "def"


def test_parse_blocks_line_owner_is_the_innermost_block():
    fb = parse_blocks(LIB["pkg/layer.py"], "pkg.layer")
    source = LIB["pkg/layer.py"].splitlines()
    forward_body = source.index("        return x * self.scale + E") + 1
    assert fb.owner_of(forward_body) == "Layer.forward"
    assert fb.owner_of(source.index("    scale = 2.0") + 1) == "Layer"
    assert fb.owner_of(1) == MODULE
    assert "pkg.norms" in fb.imports


@pytest.mark.parametrize("path, native, pytest_config", [
    ("csrc/kernel.cu", True, False), ("setup.py", True, False), ("pkg/ext.pyx", True, False),
    ("pytest.ini", False, True), ("sub/pytest.ini", False, True), ("tox.ini", False, True),
    ("pkg/mod.py", False, False), ("docs/setup.cfg", False, False),
])
def test_native_and_pytest_configuration_paths(path, native, pytest_config):
    assert is_native(path) is native
    assert is_pytest_config(path) is pytest_config
