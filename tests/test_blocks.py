"""Block extraction and fingerprints: what counts as a change, and what does not."""

from __future__ import annotations

import textwrap

import pytest

from fastci.runner.analysis.blocks import MODULE, parse_blocks

SOURCE = '''
"""Module docstring."""
import math
from .norms import EPS as E

SCALE = E * 2


@decorate(1)
class Layer(Base):
    """A layer."""
    width: int = 4

    def forward(self, x, eps=E):
        # a comment
        def inner(y):
            return y + 1
        return inner(x) * self.width + eps

    @staticmethod
    def helper():
        return math.pi


def top(a):
    if a:
        return SCALE
    return 0
'''


def fingerprints(source: str) -> dict[str, str]:
    return {b.qualname: b.fingerprint for b in parse_blocks(textwrap.dedent(source)).blocks}


def test_blocks_and_qualnames():
    blocks = parse_blocks(SOURCE).by_qualname()
    assert set(blocks) == {MODULE, "Layer", "Layer.forward", "Layer.forward.<locals>.inner",
                           "Layer.helper", "top"}
    assert blocks["Layer"].kind == "class" and blocks["top"].kind == "function"


@pytest.mark.parametrize("edit", [
    ('"""A layer."""', '"""A layer, documented at length."""'),
    ("# a comment", "# another comment entirely"),
    ("        return inner(x) * self.width + eps", "        return inner(x)*self.width+eps"),
    ('"""Module docstring."""', '"""Changed module docstring."""'),
    ("def top(a):\n", "def top(a):  # trailing comment\n"),
])
def test_comment_docstring_and_whitespace_do_not_change_fingerprints(edit):
    old, new = edit
    assert old in SOURCE
    assert fingerprints(SOURCE) == fingerprints(SOURCE.replace(old, new))


def test_a_method_change_changes_only_that_method():
    before = fingerprints(SOURCE)
    after = fingerprints(SOURCE.replace("return y + 1", "return y + 2"))
    changed = {q for q in before if before[q] != after[q]}
    assert changed == {"Layer.forward.<locals>.inner"}


def test_default_argument_and_decorator_belong_to_the_function():
    before = fingerprints(SOURCE)
    changed_default = fingerprints(SOURCE.replace("eps=E", "eps=0.1"))
    assert before["Layer.forward"] != changed_default["Layer.forward"]
    after = fingerprints(SOURCE.replace("@staticmethod\n    def helper",
                                        "@classmethod\n    def helper"))
    assert {q for q in before if before[q] != after[q]} == {"Layer.helper"}


def test_class_header_change_changes_the_class_block():
    after = fingerprints(SOURCE.replace("class Layer(Base)", "class Layer(Other)"))
    assert after["Layer"] != fingerprints(SOURCE)["Layer"]


def test_statements_record_defined_and_read_names():
    module = parse_blocks(SOURCE).by_qualname()[MODULE]
    kinds = {s.defines: s.kind for s in module.statements}
    assert kinds[("math",)] == "import"
    assert kinds[("E",)] == "import"
    assert kinds[("SCALE",)] == "assign"
    assert kinds[("Layer",)] == "def"
    scale = next(s for s in module.statements if s.defines == ("SCALE",))
    assert scale.reads == ("E",)
    alias = next(s for s in module.statements if s.defines == ("E",))
    assert alias.reads == ("EPS",)


def test_function_reads_exclude_its_locals_but_keep_attributes():
    blocks = parse_blocks(SOURCE).by_qualname()
    forward = blocks["Layer.forward"]
    assert "E" in forward.reads  # the default
    assert "width" in forward.reads  # self.width
    assert "x" not in forward.reads and "eps" not in forward.reads
    assert "SCALE" in blocks["top"].reads


def test_line_owner_is_the_innermost_block_and_headers_belong_to_the_parent():
    fb = parse_blocks(SOURCE)
    lines = SOURCE.splitlines()

    def line_of(text):
        return next(i + 1 for i, line in enumerate(lines) if text in line)

    assert fb.owner_of(line_of("return y + 1")) == "Layer.forward.<locals>.inner"
    assert fb.owner_of(line_of("width: int = 4")) == "Layer"
    assert fb.owner_of(line_of("def forward")) == "Layer"  # runs when the class body runs
    assert fb.owner_of(line_of("class Layer")) == MODULE
    assert fb.owner_of(line_of("SCALE = E")) == MODULE


def test_syntax_error_is_reported_not_raised():
    fb = parse_blocks("def broken(:\n    pass\n")
    assert fb.blocks == () and "does not parse" in fb.error and "line 1" in fb.error


def test_jit_functions_and_their_calls_are_marked():
    fb = parse_blocks(textwrap.dedent('''
        import triton

        @triton.jit
        def helper(x):
            return x

        @triton.jit
        def kernel(ptr):
            helper(ptr)
    ''')).by_qualname()
    assert fb["kernel"].is_jit and fb["helper"].is_jit
    assert "helper" in fb["kernel"].calls


def test_imports_resolve_relative_names():
    fb = parse_blocks("from .norms import EPS\nimport torch.nn\nfrom . import sub\n",
                      "pkg.model", False)
    assert {"pkg.norms", "pkg.norms.EPS", "torch.nn", "pkg", "pkg.sub"} <= set(fb.imports)


def test_defs_inside_module_level_if_are_blocks_and_do_not_change_the_statement():
    source = textwrap.dedent('''
        try:
            import triton
        except ImportError:
            triton = None

        if triton is not None:
            @triton.jit
            def kernel(x):
                return x * 2
    ''')
    before = parse_blocks(source).by_qualname()
    after = parse_blocks(source.replace("x * 2", "x * 3")).by_qualname()
    assert before["kernel"].fingerprint != after["kernel"].fingerprint
    assert before[MODULE].fingerprint == after[MODULE].fingerprint
    assert before[MODULE].statements == after[MODULE].statements
