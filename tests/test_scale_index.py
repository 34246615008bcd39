"""Selection from the snapshot's index decides exactly what evaluating every test decides.

The index (`evidence_index.py`) lets selection decode only the tests a change reaches and
skip all others from the index alone. That is sound only if the index names everything the
rules read of a test. Checked three ways, all through a real git repository and the real
store (both backends where it matters):

- a generated snapshot with every kind of evidence, each kind carried alone by a test of
  its own, and a change for each rule: the indexed selection equals the full evaluation in
  every decision, reason and rank (`FASTCI_CHECK_INDEX`, set for the whole suite in
  conftest.py, makes `Engine.plan` compare them), and the test the change is about is
  selected (so no case passes by selecting nothing);
- the same with one kind of key dropped from the index at a time: the comparison must
  fail, which shows that each kind is needed and that the check would see it missing;
- tinyllm recorded once, under each of its example changes (slow).

And: the rules read no field of a test that the index does not answer for.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import Project

from fastci.runner import evidence_index
from fastci.runner.analysis import discover, inventory
from fastci.runner.analysis.environment import current, is_manifest, lock_hash
from fastci.runner.engine import Engine
from fastci.runner.evidence import Snapshot, TestRecord
from fastci.runner.evidence_index import (
    INDEXED_FIELDS,
    KINDS,
    IndexedTests,
    TestIndex,
)
from fastci.runner.git import Repo
from fastci.runner.selection import crosscheck
from fastci.runner.selection.crosscheck import IndexMismatch
from fastci.runner.selection.rules import select
from fastci.runner.store import SqliteEvidenceStore

ROOT = Path(__file__).resolve().parents[1]


def _blob(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


CORE = _src('''
    """Core."""
    CONST = 1


    def f(x):
        return x - 1


    def g(x):
        return x * CONST


    def documented(x):
        """
        >>> documented(1)
        2
        """
        return x + 1


    class Model:
        bias = 0.5

        def forward(self, x):
            return x + self.bias
''')

SOURCES = {
    "requirements.txt": "numpy\n",
    "conftest.py": "ROOT = 1\n",
    "pkg/__init__.py": "",
    "pkg/core.py": CORE,
    "pkg/names.py": _src('''
        VALUE = 3


        def reader():
            return globals()["VALUE"]
    '''),
    "pkg/registry.py": _src('''
        ITEMS = []


        def register(name):
            ITEMS.append(name)


        register("a")
    '''),
    "pkg/broken.py": "def h():\n    return 1\n",
    "pkg/boot.py": "def build():\n    return [1, 2]\n\n\nTABLE = build()\n",
    "pkg/kern.py": _src('''
        import triton

        SCALE = 2.0


        @triton.jit
        def kernel(x):
            return x * SCALE
    '''),
    "data/a.txt": "a\n",
    "data/b.txt": "b\n",
    "data/dir/x.txt": "x\n",
    "tests/items.yaml": "- item: 1\n",
    "tests/conftest.py": "LEVEL = 1\n",
    "tests/sub/conftest.py": "SUB = 1\n",
    "tests/test_reg.py": "import pkg.registry\n\n\ndef test_reg():\n    pass\n",
    "tests/test_broken.py": "from pkg import broken\n\n\ndef test_broken():\n    pass\n",
    "tests/test_boot.py": "import pkg.boot\n\n\ndef test_boot():\n    pass\n",
    "tests/test_own.py": "def test_own():\n    assert 1 + 1 == 2\n",
    "tests/test_bad.py": "def test_bad():\n    pass\n",
    "tests/test_gone.py": "def test_gone():\n    pass\n",
    "tests/sub/test_sub.py": "def test_sub():\n    pass\n",
}
SPREAD = 10  # modules pkg/mod<i>.py the generated tests spread over
for _i in range(SPREAD):
    SOURCES[f"pkg/mod{_i}.py"] = "".join(f"def h{j}(x):\n    return x + {j}\n\n\n"
                                         for j in range(6))
MANY = {f"tests/test_many{k}.py": [f"test_m{k}_{n}" for n in range(30)] for k in range(6)}
DEDICATED = ["test_block", "test_name", "test_file", "test_stale", "test_dir", "test_kernel",
             "test_dynamic", "test_dynamic_all", "test_yaml", "test_spawn", "test_no_events",
             "test_failed", "test_child", "test_namespace", "test_ran_broken",
             "test_reads_registry"]
SOURCES["tests/test_core.py"] = "".join(f"def {name}():\n    pass\n\n\n" for name in DEDICATED)
for _path, _names in MANY.items():
    SOURCES[_path] = "".join(f"def {name}():\n    pass\n\n\n" for name in _names)

KERNEL = "pkg/kern.py::kernel"
DOCTEST = "pkg/core.py::pkg.core.documented"


def _dedicated(kernel_hash: str) -> dict[str, dict]:
    """One test per kind of evidence, carrying that kind alone (no blocks elsewhere)."""
    core = "tests/test_core.py::"
    return {
        core + "test_block": {"blocks": {"pkg/core.py": ("f",)}},
        core + "test_name": {"blocks": {"pkg/core.py": ("g",)}},
        core + "test_file": {"files": {"data/a.txt": _blob("a\n")}},
        core + "test_stale": {"files": {"data/b.txt": "0" * 40}},  # always differs
        core + "test_dir": {"dirs": ("data/dir",)},
        core + "test_kernel": {"kernels": {KERNEL: kernel_hash}},
        core + "test_dynamic": {"dynamic": {"pkg/names.py": ("VALUE",)}},
        core + "test_dynamic_all": {"dynamic": {"pkg/core.py": ("*",)}},
        core + "test_yaml": {"code": {"kind": "yaml", "path": "tests/items.yaml",
                                      "sha": _blob(SOURCES["tests/items.yaml"])}},
        core + "test_spawn": {"spawns": ("python -c",)},
        core + "test_no_events": {"file_events": False},
        core + "test_failed": {"outcome": "failed"},
        core + "test_child": {"blocks": {"pkg/core.py": ("Model.forward",)},
                              "child_blocks": {"pkg/core.py": ("Model.forward",)}},
        core + "test_namespace": {"blocks": {"pkg/names.py": ("reader",)}},
        # Ran code in a module, or read it by string, that its test file does not import.
        core + "test_ran_broken": {"blocks": {"pkg/broken.py": ("h",)}},
        core + "test_reads_registry": {"dynamic": {"pkg/registry.py": ("ITEMS",)}},
        DOCTEST: {"code": {"kind": "doctest", "path": "pkg/core.py", "object": "documented",
                           "digest": inventory.doctest_digest(CORE, "documented"),
                           "sha": _blob(CORE)}},
        "tests/test_reg.py::test_reg": {},
        "tests/test_broken.py::test_broken": {},
        "tests/test_boot.py::test_boot": {},
        "tests/test_own.py::test_own": {},
        "tests/test_bad.py::test_bad": {},
        "tests/test_gone.py::test_gone": {},
        "tests/sub/test_sub.py::test_sub": {},
    }


def _generated(rng: random.Random, kernel_hash: str) -> dict[str, dict]:
    """Tests whose evidence mixes every kind at random, so that keys are shared."""
    out = {}
    for path, names in MANY.items():
        for name in names:
            blocks = {f"pkg/mod{m}.py": tuple(sorted({f"h{rng.randrange(6)}" for _ in range(2)}))
                      for m in rng.sample(range(SPREAD), 2)}
            fields: dict = {"blocks": blocks, "outcome": "passed" if rng.random() > 0.05
                            else "error", "file_events": rng.random() > 0.1,
                            "duration": rng.choice([0.01, 0.2, 1.5, 3.0])}
            if rng.random() < 0.3:
                blocks["pkg/core.py"] = tuple(rng.sample(["f", "g", "documented"], 1))
            if rng.random() < 0.2:
                fields["files"] = {rng.choice(["data/a.txt", "data/b.txt"]):
                                   _blob(rng.choice(["a\n", "b\n"]))}
            if rng.random() < 0.1:
                fields["dirs"] = ("data/dir",)
            if rng.random() < 0.1:
                fields["kernels"] = {KERNEL: kernel_hash}
            if rng.random() < 0.05:
                fields["dynamic"] = {"pkg/names.py": ("VALUE", "OTHER")}
            if rng.random() < 0.05:
                fields["spawns"] = ("torchrun",)
            if rng.random() < 0.1:
                fields["dimension"] = "convergence"
            out[f"{path}::{name}"] = fields
    return out


class World:
    """A real repository at one commit and a snapshot of generated evidence in the store."""

    def __init__(self, root: Path, environment=None) -> None:
        self.project = Project(root)
        self.project.write(SOURCES)
        (root / ".gitignore").write_text(".fastci/\n")
        self.commit = self.project.commit("world")
        repo = Repo.find(root)
        self.tree = repo.tree(self.commit)
        self.engine = Engine(root)
        self.store_path = self.engine.store_path
        with self.engine.open_store() as store:
            invs = inventory.load(repo, self.commit, self.tree, store)
            kernel_hash = inventory.kernel_hashes(invs, {KERNEL})[KERNEL]
            specs = {**_generated(random.Random(7), kernel_hash), **_dedicated(kernel_hash)}
            self.tests = {t: TestRecord(test_id=t, **{"outcome": "passed", "duration": 0.1,
                                                      "file_events": True, **fields})
                          for t, fields in specs.items()}
            manifests = {p: repo.read(self.commit, p) for p in self.tree if is_manifest(p)}
            env = environment or current(lock_hash(manifests))
            store.save_snapshot(Snapshot(
                commit=self.commit, environment=env, tree=self.tree, tests=self.tests,
                import_time={"pkg/boot.py": {"build": ["tests/test_boot.py"]}},
                session_files={}))

    def plan(self, files: dict[str, str | None]):
        """Engine.plan on the working tree with `files` written (None: deleted), then the
        tree restored."""
        root = self.project.root
        try:
            for path, text in files.items():
                target = root / path
                if text is None:
                    target.unlink()
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
            with SqliteEvidenceStore(self.store_path) as store:
                return self.engine.plan(store=store)
        finally:
            self.project.git("checkout", "-q", "--", ".")
            self.project.git("clean", "-fdq")


def _edit(path: str, old: str, new: str) -> dict[str, str]:
    assert old in SOURCES[path], (path, old)
    return {path: SOURCES[path].replace(old, new, 1)}


# change -> (files written, the tests it must select)
CHANGES = {
    "a function body": (_edit("pkg/core.py", "return x - 1", "return x - 2"),
                        {"tests/test_core.py::test_block", "tests/test_core.py::test_spawn"}),
    "a constant read by name": (_edit("pkg/core.py", "CONST = 1", "CONST = 2"),
                                {"tests/test_core.py::test_name",
                                 "tests/test_core.py::test_dynamic_all"}),
    "a method of a class run in a child": (
        _edit("pkg/core.py", "return x + self.bias", "return x - self.bias"),
        {"tests/test_core.py::test_child"}),
    "a data file": ({"data/a.txt": "A\n"}, {"tests/test_core.py::test_file",
                                            "tests/test_core.py::test_no_events"}),
    "a file added in a listed directory": ({"data/dir/y.txt": "y\n"},
                                           {"tests/test_core.py::test_dir"}),
    "a kernel": (_edit("pkg/kern.py", "return x * SCALE", "return x * SCALE * 2"),
                 {"tests/test_core.py::test_kernel"}),
    "a value the kernel reads": (_edit("pkg/kern.py", "SCALE = 2.0", "SCALE = 3.0"),
                                 {"tests/test_core.py::test_kernel"}),
    "a value read by string": (_edit("pkg/names.py", "VALUE = 3", "VALUE = 4"),
                               {"tests/test_core.py::test_dynamic",
                                "tests/test_core.py::test_namespace"}),
    "a yaml item's file": ({"tests/items.yaml": "- item: 2\n"},
                           {"tests/test_core.py::test_yaml"}),
    "a doctest": (_edit("pkg/core.py", ">>> documented(1)\n    2",
                        ">>> documented(2)\n    3"), {DOCTEST}),
    "a module-level call (unresolved)": (_edit("pkg/registry.py", 'register("a")',
                                               'register("b")'),
                                         {"tests/test_reg.py::test_reg",
                                          "tests/test_core.py::test_reads_registry"}),
    "a module that no longer parses": ({"pkg/broken.py": "def h(:\n"},
                                       {"tests/test_broken.py::test_broken",
                                        "tests/test_core.py::test_ran_broken"}),
    "a test file that no longer parses": ({"tests/test_bad.py": "def test_bad(:\n"},
                                          {"tests/test_bad.py::test_bad"}),
    "import-time work": (_edit("pkg/boot.py", "return [1, 2]", "return [1, 3]"),
                         {"tests/test_boot.py::test_boot"}),
    "a conftest.py below the root": (_edit("tests/sub/conftest.py", "SUB = 1", "SUB = 2"),
                                     {"tests/sub/test_sub.py::test_sub"}),
    "the test's own code": (_edit("tests/test_own.py", "1 + 1 == 2", "2 + 2 == 4"),
                            {"tests/test_own.py::test_own"}),
    "a spread module": (_edit("pkg/mod3.py", "return x + 2", "return x + 20"), set()),
    "a comment only": (_edit("pkg/mod4.py", "def h1(x):", "def h1(x):  # note"),
                       {"tests/test_core.py::test_failed"}),
    "a new test and a removed test file": ({"tests/test_new.py": "def test_new():\n    pass\n",
                                            "tests/test_gone.py": None},
                                           {"tests/test_new.py::test_new"}),
    "the root conftest.py (everything)": ({"conftest.py": "ROOT = 2\n"},
                                          {"tests/test_many0.py::test_m0_0"}),
    "a dependency manifest (everything)": ({"requirements.txt": "numpy\ntorch\n"},
                                           {"tests/test_many1.py::test_m1_3"}),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(tmp_path_factory.mktemp("index-world") / "repo")


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_indexed_selection_equals_the_full_one(world, change, monkeypatch):
    monkeypatch.setenv(crosscheck.ENV, "1")  # Engine.plan compares the two (IndexMismatch)
    files, must = CHANGES[change]
    planned = world.plan(files)
    assert planned.snapshot is not None and planned.snapshot.index is not None
    selected = {d.test_id for d in planned.selection.selected}
    assert must <= selected, f"{change}: {sorted(must - selected)} not selected"
    assert planned.selection.select_all_reason or \
        len(selected) < len(planned.selection.decisions)


def test_only_the_tests_a_change_reaches_are_decoded(world, monkeypatch):
    monkeypatch.delenv(crosscheck.ENV, raising=False)  # the comparison would decode them all
    planned = world.plan(CHANGES["a spread module"][0])
    tests = planned.snapshot.tests
    assert isinstance(tests, IndexedTests)
    reached = sum(1 for d in planned.selection.decisions if d.selected or not d.new)
    assert 0 < tests.decoded < reached / 2, (tests.decoded, reached)
    skipped = [d for d in planned.selection.skipped if "mod3" not in str(d.reasons)]
    assert skipped and all(r.startswith("nothing it executed or read changed (")
                           for d in skipped for r in d.reasons)


def test_evidence_from_another_environment_selects_all_from_the_index(tmp_path, monkeypatch):
    monkeypatch.setenv(crosscheck.ENV, "1")
    elsewhere = replace(current(), python="0.0.0-elsewhere")
    other = World(tmp_path / "repo", environment=elsewhere)
    planned = other.plan({})
    assert planned.selection.select_all_reason and "another environment" in \
        planned.selection.select_all_reason
    assert len(planned.selection.selected) == len(planned.selection.decisions)


# What each kind of key is needed for: the change its dedicated test alone carries.
NEEDED = {
    evidence_index.BLOCKS: "a module that no longer parses",
    evidence_index.EXECUTED: "a function body",
    evidence_index.FILES: "a data file",
    evidence_index.DIRS: "a file added in a listed directory",
    evidence_index.KERNELS: "a kernel",
    evidence_index.DYNAMIC: "a value read by string",
    evidence_index.CODE: "a yaml item's file",
    evidence_index.SPAWNS: "a function body",
    evidence_index.NO_FILE_EVENTS: "a data file",
}


def test_every_kind_of_key_has_a_change_that_needs_it():
    assert set(NEEDED) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_an_index_without_one_kind_of_key_is_caught(tmp_path, monkeypatch, kind):
    """An unsound index (one kind of key left out): the comparison must see it."""
    keys = evidence_index._keys
    monkeypatch.setattr(evidence_index, "_keys",
                        lambda test: ((k, p) for k, p in keys(test) if k != kind))
    broken = World(tmp_path / "repo")  # its snapshot is saved with the unsound index
    monkeypatch.setenv(crosscheck.ENV, "1")
    with pytest.raises(IndexMismatch, match="differs from the full evaluation"):
        broken.plan(CHANGES[NEEDED[kind]][0])


class _Watched:
    """A test record that notes which of its fields are read."""

    def __init__(self, record: TestRecord, seen: set[str]) -> None:
        self._record, self._seen = record, seen

    def __getattr__(self, name: str):
        self._seen.add(name)
        return getattr(self._record, name)


def test_the_rules_read_only_what_the_index_names(world, monkeypatch):
    """Every field of a test the rules read, under every change above, is one the index
    answers for: a rule that starts reading another one fails here, until the index keys
    it (evidence_index._keys) and INDEXED_FIELDS names it."""
    monkeypatch.delenv(crosscheck.ENV, raising=False)
    seen: set[str] = set()
    for files, _ in CHANGES.values():
        planned = world.plan(files)
        snap = planned.snapshot
        watched = {t: _Watched(snap.tests[t], seen) for t in snap.tests}
        inputs = replace(planned.inputs, snapshot=replace(snap, tests=watched))
        with SqliteEvidenceStore(world.store_path) as store:
            inputs = replace(inputs, head_inventories=inputs.head_inventories.using(store))
            select(inputs, use_index=False)
    assert seen <= INDEXED_FIELDS, f"read but not indexed: {sorted(seen - INDEXED_FIELDS)}"
    assert {"blocks", "files", "dirs", "kernels", "dynamic", "code", "spawns", "file_events",
            "child_blocks"} <= seen  # the watch itself works


def test_the_index_packs_and_unpacks_to_itself(world):
    index = TestIndex.build(world.tests)
    again = TestIndex.unpack(index.pack())
    assert again == index and again.position["tests/test_core.py::test_kernel"] >= 0
    assert again.kernels() == {KERNEL: {world.tests["tests/test_core.py::test_kernel"]
                                        .kernels[KERNEL]}}


@pytest.mark.parametrize("damage", ["garbage", "version", "position", "lengths",
                                    "blocks text", "order"])
def test_a_damaged_index_is_not_used(world, damage):
    """A damaged or foreign index reads as none (every test evaluated), never as a wrong one."""
    import json
    import zlib

    body = json.loads(zlib.decompress(TestIndex.build(world.tests).pack()))
    if damage == "version":
        body["v"] = 99
    elif damage == "position":
        body["p"]["b"][0][-1] = [len(body["tests"])]
    elif damage == "lengths":
        body["t"] = body["t"][:-1]
    elif damage == "blocks text":
        body["e"]["pkg/core.py"] = 7
    elif damage == "order":  # selection finds a test file's tests by bisecting the ids
        body["tests"][0], body["tests"][1] = body["tests"][1], body["tests"][0]
    data = b"not an index" if damage == "garbage" else zlib.compress(json.dumps(body).encode())
    assert TestIndex.unpack(data) is None


# -- tinyllm, recorded once ------------------------------------------------------------------

@pytest.mark.slow
def test_tinyllm_selects_alike_from_the_index_under_each_example_change(tmp_path, monkeypatch):
    """examples/tinyllm recorded for real; each of its example changes selected with the
    index and by evaluating every test (Engine.plan compares them)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    repo = tmp_path / "tinyllm"
    shutil.copytree(ROOT / "examples" / "tinyllm", repo, ignore=shutil.ignore_patterns(
        "__pycache__", ".fastci", ".pytest_cache"))
    project = Project.at(repo)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "s"]):
        project.git(*args)
    project.record()
    monkeypatch.setenv(crosscheck.ENV, "1")
    engine = Engine(repo)
    patches = sorted((repo / "changes").glob("*.patch"))
    assert len(patches) >= 10
    reached = []
    for patch in patches:
        project.git("apply", str(patch))
        try:
            planned = engine.plan()
        finally:
            project.git("checkout", "-q", "--", ".")
            project.git("clean", "-fdq", "-e", ".fastci")
        assert planned.snapshot is not None and planned.snapshot.index is not None
        reached.append(len(planned.selection.selected))
    assert len(planned.selection.decisions) > 300  # the whole suite was recorded
    assert any(reached) and min(reached) < len(planned.selection.decisions)


def test_a_snapshot_stored_without_its_index_selects_the_same_by_the_full_path(
        tmp_path, monkeypatch):
    monkeypatch.delenv(crosscheck.ENV, raising=False)
    world = World(tmp_path / "repo")
    files, must = CHANGES["a data file"]
    with_index = world.plan(files)
    with SqliteEvidenceStore(world.store_path) as store:
        store._db.execute("UPDATE snapshots SET test_index = NULL")
    without = world.plan(files)
    assert without.snapshot.index is None and with_index.snapshot.index is not None
    assert crosscheck.differences(with_index.selection, without.selection) == []
    assert must <= {d.test_id for d in without.selection.selected}



class _Counting:
    """A store that counts the inventories it is asked for."""

    def __init__(self, store) -> None:
        self._store, self.inventories = store, 0

    def load_inventories(self, blobs):
        blobs = list(blobs)
        self.inventories += len(blobs)
        return self._store.load_inventories(blobs)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_discovery_reads_cached_test_names_not_inventories(world, tmp_path):
    """Test functions depend only on a test file's blob: found once, then read by blob."""
    repo = Repo.find(world.project.root)
    key = f"{world.tree['tests/test_core.py']}:{discover.NAMES_VERSION}"
    with SqliteEvidenceStore(tmp_path / "fresh.db") as store:
        expected = discover.test_functions(inventory.load(repo, world.commit, world.tree,
                                                          store))
        first, again = _Counting(store), _Counting(store)
        for counting in (first, again):
            found = inventory.Inventories(repo, world.commit, world.tree, counting)
            assert discover.test_functions(found) == expected
        assert store.load_test_names([key]) == {key: DEDICATED}
    assert first.inventories > 0 and again.inventories == 0
    assert "tests/test_core.py::test_kernel" in expected


def test_a_path_whose_blocks_do_not_read_answers_with_every_test_that_ran_it(world):
    """The blocks of one path are decoded when a change asks for them: unreadable, they
    answer with every test that executed the path (more tests, never fewer)."""
    import json
    import zlib

    body = json.loads(zlib.decompress(TestIndex.build(world.tests).pack()))
    body["e"]["pkg/core.py"] = "{not json"
    index = TestIndex.unpack(zlib.compress(json.dumps(body).encode()))
    ran = index.keys(evidence_index.BLOCKS)[("pkg/core.py",)]
    assert index.keys(evidence_index.EXECUTED)[("pkg/core.py", "f")] == ran
    names = index.keys(evidence_index.EXECUTED)[("pkg/names.py", "reader")]
    assert [index.tests[i] for i in names] == ["tests/test_core.py::test_namespace"]


def test_the_index_names_the_tests_that_executed_a_file(world):
    index = TestIndex.build(world.tests)
    found = index.executing(["pkg/names.py", "pkg/nothing.py"])
    assert found == sorted(t for t, r in world.tests.items() if "pkg/names.py" in r.blocks)
    assert "tests/test_core.py::test_namespace" in found and index.executing([]) == []
