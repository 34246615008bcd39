"""Checking what a runner sent back before the trusted side uses any of it.

A shard's recording is written by the code under test, so it is data from an adversary: the
selection side takes from it only what it can check, and rebuilds the rest from git objects.
The tree is the head commit's (from git, never the recording's), test ids must be ones the
plan sent, paths must be in the head tree, sizes and counts are bounded, blocks and kernel
hashes are recomputed from the trusted side's own inventories of the head's blobs, file
hashes are the head tree's. Module captures (pickles written by code under test) come back
as bytes checked against their sha256 digest and stored content-addressed; the trusted side
never unpickles them: pruning replays them on a runner, in its sandbox. The capture budget
is the trusted base's (the shard request's, passed to the plugin over the head's own
configuration): a test whose kept captures add up to more than it is proof the runner
ignored it, and the result is rejected. Anything malformed raises `InvalidResult` with the
reason; nothing of it is stored.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import re
from collections.abc import Container, Mapping
from typing import Any

from fastci.runner.analysis.environment import Environment
from fastci.runner.analysis.inventory import kernel_hashes
from fastci.runner.errors import FastCIError
from fastci.runner.evidence import TestRecord
from fastci.runner.record.recorder import Recording

OUTCOMES = ("passed", "failed", "skipped", "error")
MAX_TESTS = 200_000
MAX_TEXT = 4000
MAX_ID = 2000
MAX_ITEMS = 100_000  # paths, lines per path, files, markers... per test
MAX_LINE = 10_000_000
DIMENSION = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
DIGEST = re.compile(r"[0-9a-f]{64}\Z")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
MAX_CAPTURES = 1000  # module captures per test
MAX_CAPTURE_B64 = 512 * 2**20
SHA = re.compile(r"[0-9a-f]{40}\Z")
ENV_FIELDS = tuple(f.name for f in dataclasses.fields(Environment))
ENV_REQUIRED = {f.name for f in dataclasses.fields(Environment)
                if f.default is dataclasses.MISSING}
ENV_NUMBERS = {"gpus"}  # counts; every other field is text or absent


class InvalidResult(FastCIError):
    """A runner's result that fails validation: reported, never stored."""


def _fail(why: str):
    raise InvalidResult(why[:300])


def _text(value, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        _fail(f"{what} is not a string of at most {limit} characters")
    return value


def _list(value, what: str, limit: int = MAX_ITEMS) -> list:
    if not isinstance(value, list) or len(value) > limit:
        _fail(f"{what} is not a list of at most {limit} items")
    return value


def _dict(value, what: str, limit: int = MAX_ITEMS) -> dict:
    if not isinstance(value, dict) or len(value) > limit:
        _fail(f"{what} is not a mapping of at most {limit} entries")
    return value


def _optional_number(value, what: str) -> float | None:
    return None if value is None else _number(value, what)


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        _fail(f"{what} is not a non-negative number")
    return float(value)


def _relative(value, what: str) -> str:
    path = _text(value, what, 1000)
    if path.startswith(("/", "-")) or ".." in path.split("/") or "\0" in path:
        _fail(f"{what} {path[:80]!r} is not a repository-relative path")
    return path


def check_sha(value) -> str:
    if not isinstance(value, str) or not SHA.match(value):
        _fail(f"{str(value)[:60]!r} is not a 40-hex commit id")
    return value


def recording(data, *, head_tree: Mapping[str, str], inventories: Mapping,
              planned: set[str] | None, capture_budget_mb: float | None = None
              ) -> tuple[Recording, dict, list[str]]:
    """(the recording, its failures, the ids collected), checked against the head tree and
    the plan (`planned` None: a full run, any test of a file in the head tree) and the
    trusted capture budget (None: none was sent)."""
    data = _dict(data, "the recording", 64)
    budget = None if capture_budget_mb is None else \
        int(_number(capture_budget_mb, "the capture budget") * 2**20)
    tests: dict[str, TestRecord] = {}
    for raw in _list(data.get("tests"), "tests", MAX_TESTS):
        record = _test(raw, head_tree, inventories, planned, budget)
        if record.test_id in tests:
            _fail(f"test {record.test_id[:200]!r} is reported twice")
        tests[record.test_id] = record
    failures = {}
    for test_id, failure in _dict(data.get("failures", {}), "failures").items():
        if test_id not in tests:
            _fail(f"a failure of {str(test_id)[:200]!r}, which did not run")
        failures[test_id] = _failure(failure, head_tree)
    collected = [_test_id(t, head_tree, None) for t in
                 _list(data.get("collected", list(tests)), "collected", MAX_TESTS)]
    order = [t for t in _list(data.get("order", []), "order", MAX_TESTS) if t in tests]
    env = _dict(data.get("environment"), "environment", 16)
    if set(env) - set(ENV_FIELDS):
        _fail("the environment has unknown fields")
    environment = Environment(**{k: _env_value(k, env.get(k)) for k in ENV_FIELDS
                                 if k in env or k in ENV_REQUIRED})
    import_time: dict[str, dict[str, list[str]]] = {}
    for path, qualnames in _dict(data.get("import_time", {}), "import_time").items():
        fb = inventories.get(path) if path in head_tree else None
        if fb is None:
            continue
        known = fb.by_qualname()
        for qualname, origins in _dict(qualnames, "import_time entries").items():
            if qualname in known:
                import_time.setdefault(path, {})[qualname] = sorted(
                    _text(o, "an import origin", MAX_ID) for o in _list(origins, "origins"))
    session_files = _files(data.get("session_files", {}), head_tree)
    rec = Recording(tree=dict(head_tree), environment=environment, tests=tests,
                    import_time=import_time, session_files=session_files,
                    first_failure_at=_optional_number(data.get("first_failure_at"),
                                                      "first_failure_at"),
                    started_at=_number(data.get("started_at", 0.0), "started_at"),
                    finished_at=_number(data.get("finished_at", 0.0), "finished_at"),
                    order=order)
    return rec, failures, collected


def _test_id(value, head_tree: Mapping[str, str], planned: set[str] | None) -> str:
    test_id = _text(value, "a test id", MAX_ID)
    if planned is not None:
        if test_id not in planned:
            _fail(f"test {test_id[:200]!r} was not in the plan")
    elif _relative(test_id.split("::", 1)[0], "a test's file") not in head_tree:
        _fail(f"test {test_id[:200]!r} is not in a file of the head commit")
    return test_id


def _captured_bytes(modules, test_id: str) -> int:
    """The bytes of module captures a test says it kept (its `modules`, or None)."""
    if modules is None:
        return 0
    captures = _list(_dict(modules, f"the module captures of {test_id[:200]!r}", 16)
                     .get("captures", []), f"the module captures of {test_id[:200]!r}")
    total = 0
    for capture in captures:
        capture = _dict(capture, "a module capture", 16)
        if capture.get("digest") is not None:  # kept; the others were not (budget, pickling)
            total += int(_number(capture.get("size", 0), "a module capture's size"))
    return total


def _test(raw, head_tree, inventories, planned, budget: int | None = None) -> TestRecord:
    raw = _dict(raw, "a test", 64)
    test_id = _test_id(raw.get("test_id"), head_tree, planned)
    captured = _captured_bytes(raw.get("modules"), test_id)
    if budget is not None and captured > budget:
        _fail(f"test {test_id[:200]!r} kept {captured} bytes of module captures, over the "
              f"base's capture budget of {budget} bytes")
    outcome = raw.get("outcome")
    if outcome not in OUTCOMES:
        _fail(f"test {test_id[:200]!r} has outcome {str(outcome)[:40]!r}")
    lines = {p: tuple(ls) for p, ls in _line_map(raw.get("lines") or {}, head_tree,
                                                  "covered").items()}
    blocks: dict[str, set[str]] = {}
    for path, numbers in lines.items():
        fb = inventories.get(path)
        if fb is not None:
            blocks[path] = {fb.owner_of(n) for n in numbers}
    launched = set()
    credited: dict[str, set[str]] = {}  # blocks without lines: every other one is its lines
    for key in _dict(raw.get("kernels") or {}, "kernels"):
        path, _, qualname = _text(key, "a kernel", MAX_ID).partition("::")
        fb = inventories.get(path) if path in head_tree else None
        if fb is not None and qualname in fb.by_qualname():
            launched.add(key)
            blocks.setdefault(path, set()).add(qualname)
            credited.setdefault(path, set()).add(qualname)
    # Blocks it reached without their lines (cache hits) or that ran in a child: both only
    # ever add to what selects the test, and say its lines cannot tell a path through them.
    reached = _block_map(raw.get("credited"), head_tree, inventories, "credited")
    in_children = _block_map(raw.get("child_blocks"), head_tree, inventories, "child")
    for path, qualnames in [*reached.items(), *in_children.items()]:
        blocks.setdefault(path, set()).update(qualnames)
        credited.setdefault(path, set()).update(qualnames)
    markers = tuple(_text(m, "a marker", 200) for m in _list(raw.get("markers", []), "markers"))
    dimension = raw.get("dimension", "correctness")
    if not isinstance(dimension, str) or not DIMENSION.match(dimension):
        _fail(f"test {test_id[:200]!r} has dimension {str(dimension)[:40]!r}")
    peak = raw.get("peak_memory", 0)
    if isinstance(peak, bool) or not isinstance(peak, int) or peak < 0:
        _fail(f"test {test_id[:200]!r} has peak memory {str(peak)[:40]!r}")
    if not isinstance(raw.get("cuda", False), bool):
        _fail(f"test {test_id[:200]!r}: cuda is not true or false")
    return TestRecord(
        test_id=test_id, outcome=outcome, duration=_number(raw.get("duration"), "a duration"),
        blocks={p: tuple(sorted(q)) for p, q in blocks.items()},
        files=_files(raw.get("files") or {}, head_tree),
        dirs=tuple(sorted({_relative(d, "a listed directory")
                           for d in _list(raw.get("dirs", []), "dirs")})),
        spawns=tuple(sorted({_text(s, "a spawn", MAX_ID)
                             for s in _list(raw.get("spawns", []), "spawns")})),
        kernels=kernel_hashes(inventories, launched), markers=markers, dimension=dimension,
        peak_memory=peak, cuda=raw.get("cuda", False), lines=lines,
        modules=_modules(raw.get("modules"), head_tree, test_id),
        credited={p: tuple(sorted(q)) for p, q in sorted(credited.items())},
        child_blocks={p: tuple(sorted(q)) for p, q in sorted(in_children.items())})


def _block_map(raw, head_tree, inventories, what: str) -> dict[str, set[str]]:
    """{path: qualnames} naming blocks of the head's inventories (others are dropped)."""
    out: dict[str, set[str]] = {}
    for path, qualnames in _dict(raw or {}, f"{what} blocks").items():
        fb = inventories.get(path) if path in head_tree else None
        if fb is None:
            continue
        known = fb.by_qualname()
        found = {q for q in _list(qualnames, f"{what} blocks of a file")
                 if isinstance(q, str) and q in known}
        if found:
            out[path] = found
    return out


def _line_map(raw, tree: Container[str], what: str) -> dict[str, list[int]]:
    """{path: line numbers} with every path in `tree`, numbers sorted and unique (0, which
    coverage reports for entering an empty module, is dropped)."""
    out = {}
    for path, numbers in _dict(raw, f"{what} lines").items():
        if _relative(path, f"a {what} path") not in tree:
            _fail(f"{what} path {path[:200]!r} is not in the tree")
        numbers = _list(numbers, f"{what} lines of {path[:100]}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_LINE
                   for n in numbers):
            _fail(f"{what} lines of {path[:100]!r} are not line numbers")
        out[path] = sorted(set(numbers) - {0})
    return out


def _modules(raw, head_tree: Mapping[str, str], test_id: str) -> dict | None:
    """A test's module captures (what pruning reads): which calls it kept, by digest, with
    what each returned and which lines ran inside and outside them. Checked like the rest:
    paths in the head tree, digests of 64 hex, environment names (FastCI's own dropped)."""
    if raw is None:
        return None
    what = f"the module captures of {test_id[:200]!r}"
    raw = _dict(raw, what, 16)
    captures = []
    for capture in _list(raw.get("captures", []), what, MAX_CAPTURES):
        capture = _dict(capture, "a module capture", 16)
        digest = capture.get("digest")
        if digest is not None and not (isinstance(digest, str) and DIGEST.match(digest)):
            _fail(f"a capture digest of {test_id[:200]!r} is not 64 hex")
        env = {}
        for name, value in _dict(capture.get("env") or {}, "a capture's environment",
                                 64).items():
            if not isinstance(name, str) or not ENV_NAME.match(name):
                _fail(f"a capture of {test_id[:200]!r} sets {str(name)[:60]!r}")
            if not name.startswith("FASTCI_"):  # the recorder's own hand-over: never replayed
                env[name] = _text(value, "an environment value", 1000)
        why = capture.get("why")
        captures.append({
            "index": int(_number(capture.get("index", 0), "a capture's index")),
            "module": _text(capture.get("module"), "a captured module", 300),
            "digest": digest, "size": int(_number(capture.get("size", 0), "a capture's size")),
            "why": None if why is None else _text(why, "why a call was not kept", 500),
            "out": {_text(k, "a fingerprint path", MAX_ID): _json_leaf(v) for k, v in
                    _dict(capture.get("out") or {}, "recorded fingerprints",
                          MAX_FINGERPRINTS).items()},
            "env": env, "lines": _line_map(capture.get("lines") or {}, head_tree, "captured")})
    out = {"captures": captures,
           "outside": _line_map(raw.get("outside") or {}, head_tree, "uncaptured"),
           "inside": _line_map(raw.get("inside") or {}, head_tree, "captured"),
           "sys_path": [_relative(p, "a sys.path entry")
                        for p in _list(raw.get("sys_path", []), "sys_path", 64)]}
    if raw.get("uncaptured") is not None:  # why it captured nothing: pruning keeps the test
        out["uncaptured"] = _text(raw["uncaptured"], "why a test was not captured", 500)
    if raw.get("stopped") is not None:  # why later calls were not: they keep it too
        out["stopped"] = _text(raw["stopped"], "why capture stopped", 500)
    return out


def captures(result, recording: Recording, budget_mb: float | None) -> dict[str, bytes]:
    """The capture bytes a shard sent back, each verified against its sha256 digest, sent
    only for digests the validated recording's tests kept, and within the base's budget per
    test: {digest: bytes}. A digest whose bytes did not come (over what a shard returns) is
    simply absent: pruning then finds it missing and keeps its tests."""
    sent = _dict(result.get("captures") or {}, "the captures", MAX_ITEMS)
    kept: dict[str, int] = {}
    for test in recording.tests.values():
        for capture in (test.modules or {}).get("captures", ()):
            if capture["digest"] is not None:
                kept[capture["digest"]] = capture["size"]
    out: dict[str, bytes] = {}
    for digest, encoded in sent.items():
        if digest not in kept:
            _fail(f"capture {str(digest)[:70]!r} belongs to no test's evidence")
        try:
            data = base64.b64decode(_text(encoded, "a capture", MAX_CAPTURE_B64),
                                    validate=True)
        except ValueError:
            _fail(f"capture {digest[:12]} is not base64")
        if hashlib.sha256(data).hexdigest() != digest or len(data) != kept[digest]:
            _fail(f"capture {digest[:12]} does not match its digest and size")
        out[digest] = data
    if budget_mb is not None:
        budget = int(budget_mb * 2**20)
        for test in recording.tests.values():
            got = sum(len(out.get(c["digest"], b"")) for c in
                      (test.modules or {}).get("captures", ()) if c["digest"])
            if got > budget:
                _fail(f"test {test.test_id[:200]!r} sent {got} bytes of captures, over "
                      f"the base's budget of {budget} bytes")
    return out


def _files(raw, head_tree: Mapping[str, str]) -> dict[str, str]:
    """Files a test opened: those of the head tree, with the head tree's blob ids."""
    return {p: head_tree[p] for p in _dict(raw, "files") if isinstance(p, str) and p in head_tree}


def _failure(raw, head_tree: Mapping[str, str]) -> dict:
    raw = _dict(raw, "a failure", 16)
    path, line = raw.get("path"), raw.get("line")
    if not (isinstance(path, str) and path in head_tree and isinstance(line, int)
            and not isinstance(line, bool) and 0 <= line < MAX_LINE):
        path, line = None, None
    message = raw.get("message")
    return {"path": path, "line": line,
            "message": message[-2000:] if isinstance(message, str) else None,
            "when": raw.get("when") if raw.get("when") in ("setup", "call", "teardown")
            else None, "at": _optional_number(raw.get("at"), "a failure's time")}


def shard(result, *, head_tree: Mapping[str, str], inventories: Mapping,
          planned: set[str] | None, sha: str, capture_budget_mb: float | None = None
          ) -> tuple[Recording | None, dict, list[str], set[str], dict]:
    """A shard's whole result: (recording or None, failures, collected, flaky ids, first
    failures of the flaky ones); `capture_budget_mb` is the one the request carried."""
    result = _dict(result, "the shard's result", 32)
    if result.get("sha") != sha:
        _fail(f"the shard ran {str(result.get('sha'))[:60]!r}, not {sha}")
    if result.get("recording") is None:
        return None, {}, [], set(), {}
    rec, failures, collected = recording(result["recording"], head_tree=head_tree,
                                         inventories=inventories, planned=planned,
                                         capture_budget_mb=capture_budget_mb)
    flaky = {t for t in _list(result.get("flaky", []), "flaky") if t in rec.tests}
    firsts = {t: _failure(f, head_tree)
              for t, f in _dict(result.get("flaky_failures", {}), "flaky failures").items()
              if t in flaky and isinstance(f, dict)}
    return rec, failures, collected, flaky, firsts


def _env_value(name: str, value: Any) -> Any:
    """One field of the recorded environment: a short text, or a count for `gpus`."""
    if value is None:
        return None
    if name in ENV_NUMBERS:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 16:
            _fail(f"environment.{name} is not a count")
        return value
    return _text(value, f"environment.{name}", 200)


MAX_FINGERPRINTS = 10_000  # per replayed call
MAX_FIELDS = 64  # per fingerprint (hash, dtype, shape, summaries...)


def replay_output(raw, *, captures: set[str], overrides: set[str], tree: Container[str]
                  ) -> dict:
    """A runner's output of one replay process: results only for the captures it was sent,
    override answers only for the classes it was asked about, line numbers only of files in
    the tree it replayed, fingerprints as bounded JSON data (they are only compared)."""
    raw = _dict(raw, "a replay's output", 8)
    results = {}
    for digest, result in _dict(raw.get("captures", {}), "replayed captures").items():
        if digest not in captures:
            _fail(f"a result for {str(digest)[:80]!r}, which was not sent")
        results[digest] = _replay_result(result, tree)
    answers = {}
    for key, found in _dict(raw.get("overrides", {}), "override answers").items():
        if key not in overrides:
            _fail(f"an answer for {str(key)[:120]!r}, which was not asked")
        found = _dict(found, "an override answer", 4)
        error = found.get("error")
        answers[key] = {
            "overriding": [_text(n, "a method name", 200)
                           for n in _list(found.get("overriding", []), "overriding")],
            "error": None if error is None else _text(error, "an override error")}
    return {"captures": results, "overrides": answers}


def _replay_result(raw, tree: Container[str]) -> dict:
    raw = _dict(raw, "a replay result", 16)
    if raw.get("error") is not None:
        return {"error": _text(raw["error"], "a replay error"), "fingerprints": {}}
    prints = {}
    for path, leaf in _dict(raw.get("fingerprints", {}), "fingerprints",
                            MAX_FINGERPRINTS).items():
        prints[_text(path, "a fingerprint path", MAX_ID)] = _json_leaf(leaf)
    out: dict = {"fingerprints": prints, "error": None,
                 "seconds": _number(raw.get("seconds", 0.0), "replay seconds"),
                 "load_seconds": _number(raw.get("load_seconds", 0.0), "load seconds")}
    if "close" in raw:
        out["close"] = {_text(k, "a compared tensor", MAX_ID): _text(v, "a comparison", 500)
                        for k, v in _dict(raw["close"], "comparisons").items()}
    if "lines" in raw:
        out["lines"] = _line_map(raw["lines"], tree, "replayed")
    if "read" in raw:  # data files of the tree the call read: they join pruned evidence
        read = [_relative(p, "a file a replay read") for p in _list(raw["read"], "files read")]
        outside = [p for p in read if p not in tree]
        if outside:
            _fail(f"a replay read {outside[0][:200]!r}, which is not in the tree")
        out["read"] = sorted(set(read))
    if raw.get("unwatched") is not None:
        out["unwatched"] = _text(raw["unwatched"], "why a replay's reads went unseen", 500)
    return out


def _json_leaf(value) -> dict:
    """One fingerprint: a flat mapping of short texts, numbers, nulls and lists of numbers."""
    value = _dict(value, "a fingerprint", MAX_FIELDS)
    for key, item in value.items():
        _text(key, "a fingerprint field", 100)
        if isinstance(item, str):
            _text(item, "a fingerprint value", 500)
        elif isinstance(item, list):
            if len(item) > 64 or not all(isinstance(n, (int, float)) and
                                         not isinstance(n, bool) for n in item):
                _fail("a fingerprint list is not a short list of numbers")
        elif item is not None and (isinstance(item, bool) or
                                   not isinstance(item, (int, float))):
            _fail("a fingerprint value is not a text, a number or null")
    return value
