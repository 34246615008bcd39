"""The selection rules (`fastci.runner.selection.rules.select`) on changes to an inline
repository, with no git, store or pytest in between.

Each safety rule of DESIGN.md "Selection, in order" gets the change that must select; each
rule that lets a test be skipped also gets the nearby change that must not be skipped,
because a selector that skips the test a change breaks is the one failure FastCI must not
have. Reasons are checked as the words a developer reads in `fastci explain`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from selection_world import ENV, dedented, edit, inventories, run_select, selection_input, sha

from fastci.runner.analysis.inventory import kernel_hashes
from fastci.runner.evidence import SESSION, TestRecord
from fastci.runner.selection.report import Selection
from fastci.runner.selection.rules import History, select

OLD = dedented({
    "requirements.txt": "numpy\n",
    "README.md": "calc\n",
    "calc/__init__.py": "",
    "calc/norms.py": '''
        """Norms."""
        EPS = 1e-6


        def rms(xs):
            """Root mean square."""
            return (sum(x * x for x in xs) / len(xs) + EPS) ** 0.5


        def l1(xs):
            return sum(abs(x) for x in xs)
    ''',
    "calc/model.py": '''
        from calc.norms import rms


        def build_offsets():
            return [1, 2, 3]


        OFFSETS = build_offsets()


        class Model:
            bias = 0.5

            def __init__(self, width):
                self.width = width

            def forward(self, xs):
                n = rms(xs)
                return [x / n + self.bias for x in xs]

            def offsets(self):
                return OFFSETS
    ''',
    "calc/config.py": '''
        from dataclasses import dataclass


        @dataclass
        class Config:
            width: int = 4


        def load(path):
            with open(path) as fh:
                key, value = fh.read().split("=")
            return Config(**{key.strip(): int(value)})
    ''',
    "kern/__init__.py": "",
    "kern/ops.py": '''
        import triton


        @triton.jit
        def combine(a, b):
            return a + b


        @triton.jit
        def add_kernel(x, y, out):
            out = combine(x, y)
    ''',
    "configs/small.cfg": "width = 8\n",
    "configs/other.cfg": "width = 2\n",
    "tests/conftest.py": '''
        import pytest


        @pytest.fixture
        def width():
            return 4
    ''',
    "tests/test_norms.py": '''
        from calc.norms import l1, rms


        def test_rms():
            assert abs(rms([3.0, 4.0]) - 12.5 ** 0.5) < 1e-3


        def test_l1():
            assert l1([-1, 2]) == 3
    ''',
    "tests/test_model.py": '''
        from calc.config import load
        from calc.model import Model


        def test_forward(width):
            assert len(Model(width).forward([1.0, 2.0])) == 2


        def test_offsets(width):
            assert Model(width).offsets() == [1, 2, 3]


        def test_config_file():
            assert load("configs/small.cfg").width == 8
    ''',
    "tests/test_kernels.py": '''
        from kern.ops import add_kernel


        def test_add():
            add_kernel[(1,)](1, 2, 3)
    ''',
    "tests/sub/conftest.py": '''
        LIMIT = 3
    ''',
    "tests/sub/test_deep.py": '''
        from calc.norms import l1


        def test_deep():
            assert l1([1, 2]) == 3
    ''',
})

ADD_KERNEL = "kern/ops.py::add_kernel"


def evidence() -> dict[str, TestRecord]:
    """What recording OLD produced: per test, the blocks its own run executed (module bodies
    ran at import, outside every test), the data files it read, the kernels it launched."""
    kernel_hash = kernel_hashes(inventories(OLD), {ADD_KERNEL})[ADD_KERNEL]
    records = [
        TestRecord("tests/test_norms.py::test_rms", "passed", 0.1,
                   {"tests/test_norms.py": ("test_rms",), "calc/norms.py": ("rms",)}),
        TestRecord("tests/test_norms.py::test_l1", "passed", 0.1,
                   {"tests/test_norms.py": ("test_l1",), "calc/norms.py": ("l1",)}),
        TestRecord("tests/test_model.py::test_forward", "passed", 0.2,
                   {"tests/test_model.py": ("test_forward",), "tests/conftest.py": ("width",),
                    "calc/model.py": ("Model.__init__", "Model.forward"),
                    "calc/norms.py": ("rms",)}),
        TestRecord("tests/test_model.py::test_offsets", "passed", 0.2,
                   {"tests/test_model.py": ("test_offsets",), "tests/conftest.py": ("width",),
                    "calc/model.py": ("Model.__init__", "Model.offsets")}),
        TestRecord("tests/test_model.py::test_config_file", "passed", 0.3,
                   {"tests/test_model.py": ("test_config_file",), "calc/config.py": ("load",)},
                   files={"configs/small.cfg": sha(OLD["configs/small.cfg"])}),
        TestRecord("tests/test_kernels.py::test_add", "passed", 2.0,
                   {"tests/test_kernels.py": ("test_add",), "kern/ops.py": ("add_kernel",)},
                   kernels={ADD_KERNEL: kernel_hash}),
        TestRecord("tests/sub/test_deep.py::test_deep", "passed", 0.1,
                   {"tests/sub/test_deep.py": ("test_deep",), "calc/norms.py": ("l1",)}),
    ]
    # Recorded on Linux with the kernel's file events on: every reader's opens were seen.
    return {r.test_id: replace(r, file_events=True) for r in records}


ALL = set(evidence())


def selected(selection: Selection) -> set[str]:
    return {d.test_id for d in selection.selected}


def reasons(selection: Selection, test_id: str) -> tuple[str, ...]:
    decision = selection.decision(test_id)
    assert decision is not None, f"{test_id} is not in the selection"
    return decision.reasons


def assert_readable(selection: Selection) -> None:
    """Every decision says why, in words: no empty reason, no Python reprs leaking."""
    for decision in selection.decisions:
        assert decision.reasons, f"{decision.test_id} has no reason"
        for reason in decision.reasons:
            assert reason.strip() and reason == reason.strip()
            for leak in ("frozenset", "{", "[(", "None", "<function", "\\n"):
                assert leak not in reason, f"{decision.test_id}: {reason!r}"


def select_after(new: dict[str, str], tests=None, **kwargs) -> Selection:
    selection = run_select(OLD, new, evidence() if tests is None else tests, **kwargs)
    assert_readable(selection)
    return selection


# -- nothing changed, and the trace diff ------------------------------------------------------

def test_no_change_skips_every_test_and_says_what_it_checked():
    selection = select_after(OLD)
    assert selected(selection) == set()
    assert selection.mode == "trace-diff" and selection.select_all_reason is None
    assert reasons(selection, "tests/test_norms.py::test_rms") == (
        "nothing it executed or read changed (2 blocks in 2 files)",)
    assert reasons(selection, "tests/test_model.py::test_config_file") == (
        "nothing it executed or read changed (2 blocks in 2 files; 1 data file)",)
    assert reasons(selection, "tests/test_kernels.py::test_add") == (
        "nothing it executed or read changed (2 blocks in 2 files; 1 kernel)",)


def test_changed_block_in_evidence_selects_and_unrelated_tests_skip():
    new = edit(OLD, "calc/norms.py", "/ len(xs) + EPS", "/ max(len(xs), 1) + EPS")
    selection = select_after(new)
    assert selected(selection) == {"tests/test_norms.py::test_rms",
                                   "tests/test_model.py::test_forward"}
    assert reasons(selection, "tests/test_norms.py::test_rms") == (
        "executed changed code: calc/norms.py::rms (modified: line 7 changed)",)
    assert reasons(selection, "tests/test_norms.py::test_l1")[0].startswith(
        "nothing it executed or read changed")
    assert selection.changed_files == ("calc/norms.py",)


@pytest.mark.parametrize("old, new", [
    ('"""Root mean square."""', '"""Root mean square, guarded by EPS."""'),
    ("def l1(xs):\n", "def l1(xs):  # the taxicab norm\n"),
    ("return sum(abs(x) for x in xs)", "return sum( abs(x)  for x in xs )"),
    ('"""Norms."""', '"""Norms of vectors."""'),
], ids=["docstring", "comment", "whitespace", "module-docstring"])
def test_comment_docstring_and_whitespace_edits_select_nothing(old, new):
    selection = select_after(edit(OLD, "calc/norms.py", old, new))
    assert selected(selection) == set()
    assert selection.changed_files == ("calc/norms.py",)


def test_a_removed_function_selects_the_tests_that_executed_it():
    new = edit(OLD, "calc/norms.py", "def l1(xs):\n    return sum(abs(x) for x in xs)\n", "")
    selection = select_after(new)
    assert selected(selection) == {"tests/test_norms.py::test_l1",
                                   "tests/sub/test_deep.py::test_deep"}
    assert "executed changed code: calc/norms.py::l1 (removed)" in reasons(
        selection, "tests/sub/test_deep.py::test_deep")


def test_reasons_list_three_examples_and_count_the_rest():
    tests = {"tests/test_norms.py::test_rms": TestRecord(
        "tests/test_norms.py::test_rms", "passed", 0.1,
        {"tests/test_norms.py": ("test_rms",), "calc/norms.py": ("rms", "l1"),
         "calc/model.py": ("Model.__init__", "Model.forward", "Model.offsets")})}
    new = edit(OLD, "calc/norms.py", "+ EPS) ** 0.5", "+ EPS) ** 0.25")
    new = edit(new, "calc/norms.py", "abs(x) for", "abs(x) * 1 for")
    new = edit(new, "calc/model.py", "self.width = width", "self.width = int(width)")
    new = edit(new, "calc/model.py", "return OFFSETS", "return list(OFFSETS)")
    (reason,) = reasons(select_after(new, tests), "tests/test_norms.py::test_rms")
    assert reason.startswith("executed changed code: ")
    assert reason.endswith(" and 1 more")
    # One-statement functions: every call runs the changed statement, whatever the lines.
    assert reason.count(" changed)") == 3


# -- safety rules that select one test -----------------------------------------------------

def test_a_new_test_is_selected_and_its_neighbours_are_not():
    new = edit(OLD, "tests/test_norms.py", "def test_l1():",
               "def test_rms_of_one():\n    assert rms([2.0]) > 1.9\n\n\ndef test_l1():")
    selection = select_after(new)
    assert selected(selection) == {"tests/test_norms.py::test_rms_of_one"}
    decision = selection.decision("tests/test_norms.py::test_rms_of_one")
    assert decision.new and decision.reasons == ("new test: no evidence yet",)


def test_a_test_whose_own_code_changed_is_selected():
    new = edit(OLD, "tests/test_norms.py", "assert l1([-1, 2]) == 3", "assert l1([-1, 2, 0]) == 3")
    selection = select_after(new)
    assert selected(selection) == {"tests/test_norms.py::test_l1"}
    assert reasons(selection, "tests/test_norms.py::test_l1")[0] == (
        "the test's own code changed (tests/test_norms.py::test_l1)")


@pytest.mark.parametrize(("outcome", "verb"), [("failed", "failed"), ("error", "errored")])
def test_a_test_that_failed_last_time_is_selected_even_with_no_change(outcome, verb):
    tests = evidence()
    rid = "tests/test_norms.py::test_l1"
    tests[rid] = replace(tests[rid], outcome=outcome)
    selection = select_after(OLD, tests)
    assert selected(selection) == {rid}
    assert reasons(selection, rid) == (f"it {verb} in the last run",)


def test_a_test_that_passed_or_skipped_last_time_is_not_selected_for_it():
    tests = evidence()
    rid = "tests/test_norms.py::test_l1"
    tests[rid] = replace(tests[rid], outcome="skipped")
    assert selected(select_after(OLD, tests)) == set()


def test_a_skipped_test_is_selected_by_any_change():
    """It ran nothing, so its evidence cannot say its skip condition did not change."""
    tests = evidence()
    rid = "tests/test_norms.py::test_l1"
    tests[rid] = replace(tests[rid], outcome="skipped")
    selection = select_after({**OLD, "configs/small.cfg": "width = 16\n"}, tests)
    assert rid in selected(selection)
    assert reasons(selection, rid)[0].startswith("it was skipped in the last run")


def test_a_changed_data_file_selects_the_tests_that_read_it():
    new = {**OLD, "configs/small.cfg": "width = 16\n"}
    selection = select_after(new)
    assert selected(selection) == {"tests/test_model.py::test_config_file"}
    assert reasons(selection, "tests/test_model.py::test_config_file") == (
        "read a changed file: configs/small.cfg (changed)",)


def test_a_removed_data_file_selects_the_tests_that_read_it():
    new = {p: t for p, t in OLD.items() if p != "configs/small.cfg"}
    selection = select_after(new)
    assert reasons(selection, "tests/test_model.py::test_config_file") == (
        "read a changed file: configs/small.cfg (removed)",)


def test_a_data_file_no_test_read_selects_nothing():
    assert selected(select_after({**OLD, "configs/other.cfg": "width = 3\n"})) == set()
    assert selected(select_after({**OLD, "README.md": "calc, a library\n"})) == set()


def test_an_untracked_data_file_is_compared_by_its_content():
    """A test that read a file git does not track: its content hash stands in for the tree."""
    tests = evidence()
    rid = "tests/test_norms.py::test_l1"
    tests[rid] = replace(tests[rid], files={"data/cache.bin": sha("v1")})
    same = replace(selection_input(OLD, OLD, tests), untracked_shas={"data/cache.bin": sha("v1")})
    assert rid not in selected(select(same))
    other = replace(same, untracked_shas={"data/cache.bin": sha("v2")})
    assert reasons(select(other), rid) == ("read a changed file: data/cache.bin (changed)",)


def test_a_kernel_whose_jit_callee_changed_selects_the_tests_that_launched_it():
    """On a GPU a kernel's body never runs as Python lines: the launch is the evidence, and
    its hash covers every jit function it calls."""
    new = edit(OLD, "kern/ops.py", "return a + b", "return a - b")
    selection = select_after(new)
    assert selected(selection) == {"tests/test_kernels.py::test_add"}
    (why,) = reasons(selection, "tests/test_kernels.py::test_add")
    assert why.startswith("launched a Triton kernel whose source")
    assert why.endswith(": kern/ops.py::add_kernel")


def test_a_module_constant_a_kernel_reads_selects_the_tests_that_launched_it():
    """A global read by a jit function is baked into the compiled kernel."""
    old = edit(OLD, "kern/ops.py", "import triton\n", "import triton\n\nSCALE = 2\n")
    old = edit(old, "kern/ops.py", "out = combine(x, y)", "out = combine(x, y) * SCALE")
    new = edit(old, "kern/ops.py", "SCALE = 2", "SCALE = 3")
    kernel_hash = kernel_hashes(inventories(old), {ADD_KERNEL})[ADD_KERNEL]
    tests = evidence()
    tests["tests/test_kernels.py::test_add"] = replace(
        tests["tests/test_kernels.py::test_add"], kernels={ADD_KERNEL: kernel_hash})
    selection = run_select(old, new, tests)
    assert_readable(selection)
    assert selected(selection) == {"tests/test_kernels.py::test_add"}


def test_a_change_beside_a_kernel_does_not_select_its_tests():
    new = edit(OLD, "kern/ops.py", "@triton.jit\ndef combine",
               "def host_helper():\n    return 1\n\n\n@triton.jit\ndef combine")
    assert "tests/test_kernels.py::test_add" not in selected(select_after(new))


def test_a_listed_directory_that_gained_a_file_selects_the_test():
    tests = evidence()
    rid = "tests/test_norms.py::test_l1"
    tests[rid] = replace(tests[rid], dirs=("configs",))
    selection = select_after({**OLD, "configs/large.cfg": "width = 64\n"}, tests)
    assert selected(selection) == {rid}
    assert reasons(selection, rid) == (
        "listed configs/, where files were added or removed (configs/large.cfg)",)
    # A file changed in place is not a change to the listing.
    assert rid not in selected(select_after({**OLD, "configs/other.cfg": "x = 1\n"}, tests))


def test_a_test_that_spawns_python_children_is_selected_on_any_code_change():
    tests = evidence()
    rid = "tests/sub/test_deep.py::test_deep"
    tests[rid] = replace(tests[rid], spawns=("python -m torch.distributed.run",))
    assert rid not in selected(select_after(OLD, tests))
    selection = select_after(edit(OLD, "calc/model.py", "[1, 2, 3]", "[1, 2, 4]"), tests)
    assert rid in selected(selection)
    assert reasons(selection, rid) == (
        "it starts child processes whose evidence FastCI could not merge (python -m "
        "torch.distributed.run), and code or data changed",)


def test_a_test_whose_compiled_code_was_unseen_is_selected_on_any_code_change():
    tests = evidence()
    rid = "tests/sub/test_deep.py::test_deep"
    why = "torch.compile ran, and this torch does not say which code dynamo traced"
    tests[rid] = replace(tests[rid], spawns=(why,))
    assert rid not in selected(select_after(OLD, tests))
    selection = select_after(edit(OLD, "calc/model.py", "[1, 2, 3]", "[1, 2, 4]"), tests)
    assert rid in selected(selection)
    assert reasons(selection, rid) == (
        f"it ran torch.compile'd code FastCI could not see ({why}), and code or data changed",)


def test_evidence_without_kernel_file_events_is_selected_by_any_changed_data_file():
    # Without the kernel's file events (no inotify, or events lost), a native reader or a
    # child may have read a file unseen: a changed non-Python file selects the test, unless
    # the settings' ignore globs (documentation by default) match it.
    tests = evidence()
    rid = "tests/test_norms.py::test_l1"
    tests[rid] = replace(tests[rid], file_events=False)
    selection = select_after({**OLD, "configs/other.cfg": "width = 3\n"}, tests)
    assert selected(selection) == {rid}
    assert reasons(selection, rid)[0].startswith(
        "its file evidence was recorded without the kernel's file events")
    assert selected(select_after({**OLD, "docs/guide.md": "# guide\n"}, tests)) == set()


# -- module-level values: constants, class attributes, dataclass defaults -------------------

def test_a_changed_module_constant_selects_the_tests_whose_code_reads_it():
    selection = select_after(edit(OLD, "calc/norms.py", "EPS = 1e-6", "EPS = 1e-3"))
    assert selected(selection) == {"tests/test_norms.py::test_rms",
                                   "tests/test_model.py::test_forward"}
    assert reasons(selection, "tests/test_norms.py::test_rms") == (
        "executed code that reads a changed module or class value: "
        "calc/norms.py::rms reads EPS",)


def test_a_constant_imported_by_name_elsewhere_is_followed_through_the_import():
    """`from calc.norms import EPS` in another module: code there that reads the name is
    affected although no line of it changed."""
    old = edit(OLD, "calc/model.py", "from calc.norms import rms",
               "from calc.norms import EPS, rms")
    old = edit(old, "calc/model.py", "return OFFSETS", "return [o + EPS for o in OFFSETS]")
    new = edit(old, "calc/norms.py", "EPS = 1e-6", "EPS = 0.5")
    tests = evidence()
    selection = run_select(old, new, tests)
    assert "tests/test_model.py::test_offsets" in selected(selection)
    assert "calc/model.py::Model.offsets reads EPS" in reasons(
        selection, "tests/test_model.py::test_offsets")[0]
    assert "tests/test_norms.py::test_l1" not in selected(selection)


def test_a_changed_class_attribute_selects_the_users_of_the_class():
    selection = select_after(edit(OLD, "calc/model.py", "bias = 0.5", "bias = 0.25"))
    assert selected(selection) == {"tests/test_model.py::test_forward",
                                   "tests/test_model.py::test_offsets"}
    # A method of the changed class uses the class itself (it may come from a registry).
    assert "calc/model.py::Model.forward reads Model, bias" in reasons(
        selection, "tests/test_model.py::test_forward")[0]


def test_a_changed_dataclass_default_selects_the_code_that_builds_the_class():
    """A dataclass field default has no line in `__init__`: only the class body changed."""
    selection = select_after(edit(OLD, "calc/config.py", "width: int = 4", "width: int = 5"))
    assert selected(selection) == {"tests/test_model.py::test_config_file"}
    (why,) = reasons(selection, "tests/test_model.py::test_config_file")
    assert why.startswith("executed code that reads a changed module or class value: ")
    assert "calc/config.py::load reads Config" in why
    assert "tests/test_model.py::test_config_file reads width" in why


def test_a_module_statement_that_cannot_be_resolved_selects_every_importer():
    new = edit(OLD, "calc/model.py", "OFFSETS = build_offsets()",
               "OFFSETS = build_offsets()\nOFFSETS.reverse()")
    selection = select_after(new)
    why = "a module body statement that is not a plain definition changed"
    assert selected(selection) == {"tests/test_model.py::test_forward",
                                   "tests/test_model.py::test_offsets",
                                   "tests/test_model.py::test_config_file"}
    assert reasons(selection, "tests/test_model.py::test_forward") == (
        f"executed code in calc/model.py, which changed at module level ({why})",)
    assert reasons(selection, "tests/test_model.py::test_config_file") == (
        f"tests/test_model.py imports calc/model.py, which changed at module level ({why})",)


def test_a_function_run_at_import_time_selects_the_test_files_that_imported_it():
    """`OFFSETS = build_offsets()` runs while a test file is collected, outside every test:
    recording keeps it as import-time evidence of that file."""
    import_time = {"calc/model.py": {"build_offsets": ("tests/test_model.py",)}}
    new = edit(OLD, "calc/model.py", "return [1, 2, 3]", "return [3, 2, 1]")
    selection = select_after(new, import_time=import_time)
    assert selected(selection) == {"tests/test_model.py::test_forward",
                                   "tests/test_model.py::test_offsets",
                                   "tests/test_model.py::test_config_file"}
    assert reasons(selection, "tests/test_model.py::test_offsets") == (
        "calc/model.py::build_offsets runs at import time for tests/test_model.py and changed",)


def renamed_norms(importers: tuple[str, ...]) -> dict[str, str]:
    new = {("calc/vector_norms.py" if p == "calc/norms.py" else p): t for p, t in OLD.items()}
    for path in importers:
        new = edit(new, path, "from calc.norms import", "from calc.vector_norms import")
    return new


def test_a_renamed_module_selects_the_tests_that_ran_it():
    new = renamed_norms(("calc/model.py", "tests/test_norms.py", "tests/sub/test_deep.py"))
    selection = select_after(new, renames={"calc/norms.py": "calc/vector_norms.py"})
    assert selected(selection) == {
        "tests/test_norms.py::test_rms", "tests/test_norms.py::test_l1",
        "tests/test_model.py::test_forward", "tests/sub/test_deep.py::test_deep"}
    assert "executed code in calc/norms.py, which changed at module level (renamed to " \
        "calc/vector_norms.py)" in reasons(selection, "tests/test_norms.py::test_l1")


def test_a_renamed_module_selects_the_tests_of_a_file_still_importing_the_old_name():
    """calc/model.py still imports calc.norms: every test of a file importing it may now
    fail at import, whatever it executed."""
    new = renamed_norms(("tests/test_norms.py", "tests/sub/test_deep.py"))
    selection = select_after(new, renames={"calc/norms.py": "calc/vector_norms.py"})
    assert {"tests/test_model.py::test_offsets",
            "tests/test_model.py::test_config_file"} <= selected(selection)
    assert reasons(selection, "tests/test_model.py::test_offsets") == (
        "tests/test_model.py imports calc/norms.py, which changed at module level (renamed "
        "to calc/vector_norms.py)",)
    assert "tests/test_kernels.py::test_add" not in selected(selection)


# -- rules that select everything, or everything under a folder -----------------------------

@pytest.mark.parametrize("path, text, why", [
    ("requirements.txt", "numpy>=2\n", "dependency manifest requirements.txt modified"),
    ("poetry.lock", "[[package]]\n", "dependency manifest poetry.lock added"),
    ("pytest.ini", "[pytest]\naddopts = -x\n", "pytest configuration pytest.ini added"),
    ("csrc/rms.cu", "__global__ void k() {}\n",
     "csrc/rms.cu added: native code or a build input FastCI cannot map to the tests that "
     "load it"),
    ("conftest.py", "import os\n", "the root conftest.py added at module level"),
], ids=["requirements", "lock-file", "pytest-ini", "native", "root-conftest"])
def test_a_change_to_what_every_test_runs_under_selects_all(path, text, why):
    selection = select_after({**OLD, path: text})
    assert selected(selection) == ALL and selection.mode == "all"
    assert why in selection.select_all_reason
    assert why in reasons(selection, "tests/test_norms.py::test_l1")


def test_evidence_from_another_environment_selects_all():
    other = replace(ENV, python="3.12.1", torch="2.4.0")
    selection = select_after(OLD, evidence_environment=other)
    assert selected(selection) == ALL
    assert selection.select_all_reason == (
        "evidence was recorded under another environment (python 3.12.1, torch 2.4.0, "
        "triton 3.0.0, cuda -); this one is python 3.11.7, torch 2.3.0, triton 3.0.0, cuda -")


def test_another_dependency_lock_selects_all():
    selection = select_after(OLD, environment=replace(ENV, lock_hash="lock-2"))
    assert selected(selection) == ALL
    assert selection.select_all_reason == (
        "the dependency lock differs from the one the evidence was recorded with")


def test_a_data_file_read_at_import_time_selects_all_when_it_changes():
    session_files = {"configs/other.cfg": sha(OLD["configs/other.cfg"])}
    assert selected(select_after(OLD, session_files=session_files)) == set()
    selection = select_after({**OLD, "configs/other.cfg": "width = 3\n"},
                             session_files=session_files)
    assert selected(selection) == ALL
    assert selection.select_all_reason == (
        "configs/other.cfg was read at import time, outside any test, and changed")


def test_a_function_run_at_session_start_selects_all_when_it_changes():
    import_time = {"calc/model.py": {"build_offsets": (SESSION,)}}
    selection = select_after(edit(OLD, "calc/model.py", "[1, 2, 3]", "[1, 2]"),
                             import_time=import_time)
    assert selected(selection) == ALL
    assert selection.select_all_reason == (
        "calc/model.py::build_offsets ran at session start (conftest or plugin import) and "
        "changed")


def test_a_conftest_module_body_change_selects_everything_under_it():
    selection = select_after(edit(OLD, "tests/sub/conftest.py", "LIMIT = 3", "LIMIT = 4"))
    assert selected(selection) == {"tests/sub/test_deep.py::test_deep"}
    assert reasons(selection, "tests/sub/test_deep.py::test_deep") == (
        "tests/sub/conftest.py changed at module level",)


def test_a_conftest_fixture_change_selects_only_the_tests_that_used_the_fixture():
    selection = select_after(edit(OLD, "tests/conftest.py", "return 4", "return 5"))
    assert selected(selection) == {"tests/test_model.py::test_forward",
                                   "tests/test_model.py::test_offsets"}
    assert reasons(selection, "tests/test_model.py::test_forward") == (
        "executed changed code: tests/conftest.py::width (modified: line 6 changed)",)


def test_a_comment_in_a_conftest_selects_nothing():
    new = edit(OLD, "tests/sub/conftest.py", "LIMIT = 3", "LIMIT = 3  # tests per shard")
    assert selected(select_after(new)) == set()


# -- files that no longer parse, removed test files, no evidence -----------------------------

def test_a_file_that_no_longer_parses_selects_its_dependants_and_says_where():
    new = edit(OLD, "calc/model.py", "def offsets(self):", "def offsets(self)")
    line = new["calc/model.py"].splitlines().index("    def offsets(self)") + 1
    selection = select_after(new)
    assert selected(selection) == {"tests/test_model.py::test_forward",
                                   "tests/test_model.py::test_offsets",
                                   "tests/test_model.py::test_config_file"}
    (why,) = reasons(selection, "tests/test_model.py::test_config_file")
    assert why.startswith(f"calc/model.py does not parse at line {line}: ")
    assert why.endswith(", and this test depends on it")


def test_a_test_file_that_no_longer_parses_selects_its_tests():
    new = edit(OLD, "tests/test_norms.py", "def test_l1():", "def test_l1(:")
    selection = select_after(new)
    assert selected(selection) == {"tests/test_norms.py::test_rms",
                                   "tests/test_norms.py::test_l1"}


def test_tests_in_a_removed_test_file_are_left_out_with_a_note():
    new = {p: t for p, t in OLD.items() if p != "tests/test_norms.py"}
    selection = select_after(new)
    assert selection.decision("tests/test_norms.py::test_rms") is None
    assert selection.notes == ("2 tests in removed test files left out",)
    assert selected(selection) == set()


def test_without_evidence_every_test_found_at_the_head_is_selected():
    selection = run_select(OLD, OLD, None, no_evidence_reason="no evidence for the head")
    assert selected(selection) == ALL
    assert selection.mode == "all" and selection.base is None
    assert selection.select_all_reason == "no evidence for the head"
    assert all(d.reasons == ("no evidence for the head",) for d in selection.decisions)


# -- order ---------------------------------------------------------------------------------

def test_selected_tests_are_ranked_and_skipped_tests_are_not():
    new = edit(OLD, "calc/norms.py", "EPS = 1e-6", "EPS = 1e-3")
    selection = select_after(new)
    assert sorted(d.rank for d in selection.selected) == [1, 2]
    assert all(d.rank is None for d in selection.skipped)


def test_a_test_with_recent_failures_runs_before_one_without():
    history = History(outcomes={"tests/test_norms.py::test_l1": ("failed", "passed")})
    tests = evidence()
    new = edit(OLD, "calc/norms.py", "EPS = 1e-6", "EPS = 1e-3")
    new = edit(new, "calc/norms.py", "abs(x) for", "abs(x) * 1 for")
    selection = select_after(new, tests, history=history)
    order = [d.test_id for d in selection.selected]
    assert order[0] == "tests/test_norms.py::test_l1"
    assert selection.decision("tests/test_norms.py::test_l1").risk > \
        selection.decision("tests/test_norms.py::test_rms").risk
