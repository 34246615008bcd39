"""Replaying captured module calls in a fresh process, under one tree's code.

    python -m fastci.runner.prune.replay REQUEST.json

The request names the tree (`root`, put first on sys.path, so unpickling a module binds its
class and every function it calls to that tree's code), the captures (digest -> file) and
where to write the results. For each capture: restore torch's settings and RNG, call the
module, fingerprint what it returned, the state it left (parameters, buffers, tensor
attributes, in-place changes to its arguments, the RNG, the repository modules' globals; an
effect no fingerprint compares, a file written or a child started, makes the call
unreplayable), then back-propagate a fixed upstream
gradient and fingerprint the gradients of parameters and inputs. Anything that fails is
reported per capture, never raised: the caller keeps such tests selected.

With `trace`, the recording's line recorder (`record/lines.py`) notes the lines each
replay ran (under the new code these become part of a pruned test's evidence). With `watch`
(the tree's data files), the kernel's file events say which of them each replayed call read,
native readers included (`read`; they join a pruned test's evidence too), or `unwatched`
says why that could not be seen. With
`save_tensors` the tensors are kept for a later tolerance comparison (`compare_to`) by
`fastci.kernels.compare`. With `settle` (exact pruning) the process skips captures whose
tests stay selected whatever it finds (`settle.py`). With `budget` it replays for at most
that many seconds (`budget.py`).
"""

from __future__ import annotations

import inspect
import json
import os
import random
import sys
import time
import traceback
from contextlib import ExitStack, contextmanager
from typing import TypedDict

from fastci.runner.prune.budget import Deadline
from fastci.runner.prune.identity import held, holding, identity, tensor_attributes
from fastci.runner.prune.settle import SKIPPED, Settled
from fastci.runner.prune.state import Digester, differing, own_globals, own_objects

UPSTREAM_SEED = 20261129
FLUSH_MARGIN = 0.2  # seconds before a deadline past which the last launches are not written


class ReplayResult(TypedDict, total=False):
    """What the replay process reports for one capture (as JSON)."""

    fingerprints: dict
    error: str | None
    close: dict  # with `compare_to`: per tensor, within tolerance of the earlier replay?
    lines: dict[str, list[int]]  # with `trace`: the lines the call executed, per path
    read: list[str]  # with `watch`: the tree's data files the call read, natively too
    unwatched: str  # ... or why what it read could not be seen
    load_seconds: float
    seconds: float


def main(argv: list[str]) -> int:
    request = _resolved(json.loads(open(argv[0]).read()), os.path.dirname(os.path.abspath(argv[0])))
    root = os.path.realpath(request["root"])
    for rel in reversed(["."] + [p for p in request.get("sys_path", []) if p != "."]):
        sys.path.insert(0, os.path.normpath(os.path.join(root, rel)))
    os.chdir(root)
    if request["captures"]:
        _start_up()
        _watch_effects()
    recorder = None
    if request.get("trace"):
        # the recording's own line recorders: sys.monitoring on 3.12+, where tracing a
        # replay costs little, coverage.py's tracer before
        from fastci.runner.record.lines import choose, make  # noqa: PLC0415

        recorder = make(choose("auto")[0], root, [])
        recorder.start()
    memo = _launch_memo(request)
    reads = _Reads(root, request.get("watch"))
    try:
        results = _replay_all(request, root, recorder, memo, reads)
    finally:
        reads.close()
        if memo is not None:
            memo.uninstall()
            # what a cut-off call remembered, and the folder's trim: never past a local
            # selection's deadline, since they are only worth a later replay's time
            if _seconds_left(request) > FLUSH_MARGIN:
                memo.flush()
    overrides = {}
    for path, qualname, names in request.get("overrides", []):
        overrides[f"{path}::{qualname}"] = inherited(path, qualname, names)
    if recorder is not None:
        recorder.stop()
        ran = recorder.lines()
        for digest, result in results.items():
            by_path = {}
            for filename, lines in ran.get(digest, {}).items():
                rel = os.path.relpath(os.path.realpath(filename), root)
                if not rel.startswith(".."):
                    by_path[rel] = sorted(lines)
            result["lines"] = by_path
    launches = {"hits": memo.hits, "misses": memo.misses} if memo is not None else None
    with open(request["out"], "w") as f:
        json.dump({"captures": results, "overrides": overrides, "launches": launches}, f)
    return 0


def _seconds_left(request: dict) -> float:
    """Seconds to a local request's deadline (`until`); without one, no end."""
    until = request.get("until")
    if isinstance(until, (int, float)) and not isinstance(until, bool):
        return float(until) - time.monotonic()
    return float("inf")


def _launch_memo(request: dict):
    """With `launches` (a local request), kernel launches under Triton's interpreter are
    remembered there across replays (`launches.py`)."""
    folder = request.get("launches")
    if not folder or not request["captures"]:
        return None
    from fastci.runner.prune.launches import LaunchMemo  # noqa: PLC0415

    memo = LaunchMemo(folder)
    return memo if memo.install() else None


def _settled(request: dict) -> Settled | None:
    """With `settle` (exact pruning), which captures this process may skip."""
    plan = request.get("settle")
    if not plan:
        return None
    return Settled(plan["groups"], plan["settled"], plan.get("recorded"))


def _replay_all(request: dict, root: str, recorder, memo=None, reads=None
                ) -> dict[str, ReplayResult]:
    """Each capture's result, in the request's order: skipped where settled, cut off where
    the budget ran out. The launches `memo` remembered are written after each capture,
    between replayed calls (a write inside one is an effect); `reads` notes the data files
    each call read."""
    settled = _settled(request)
    deadline = Deadline(_budget(request))
    results: dict[str, ReplayResult] = {}
    for digest, path in request["captures"].items():
        if settled is not None and settled.skip(digest):
            results[digest] = {"fingerprints": {}, "error": SKIPPED, "seconds": 0.0,
                               "load_seconds": 0.0}
            continue
        if recorder is not None:
            recorder.switch(digest)
        if reads is not None:
            reads.begin()
        result = deadline.call(replay, path, root, request.get("save_tensors"),
                               request.get("compare_to"), digest)
        results[digest] = deadline.result() if result is None else result  # type: ignore[assignment]
        if reads is not None:
            reads.end(results[digest])
        if settled is not None:
            settled.replayed(digest, results[digest])
        if memo is not None:
            memo.flush(trim=False)
    return results


class _Reads:
    """Which of the tree's data files each replayed call read, seen in the kernel's file
    events (`record/fileaccess.py`), so native readers count as Python's `open` does.

    `said.files` compares the paths a call opened through Python under the two trees, so new
    code that opens another file differs and keeps its test. A native reader (the C library,
    a tokenizer's extension) raises no audit event: new code that reads a file that way
    computes what the old code did, and its test is pruned. Its carried evidence must then
    name the file, or a later change to it selects nothing. The events name no process: two
    replay processes on one tree credit each other's reads, which only adds evidence."""

    def __init__(self, root: str, watch: list[str] | None) -> None:
        from fastci.runner.record.fileaccess import FileEvents  # noqa: PLC0415

        self.wanted = watch is not None  # an older request asks nothing of this
        self.events: FileEvents | None = None
        self.unwatched: str | None = None
        if self.wanted:
            events = FileEvents(root, list(watch or ()))
            if events.start():
                self.events = events
            else:
                self.unwatched = events.unavailable or "no file events"

    def begin(self) -> None:
        if self.events is not None:
            self.events.drain()  # what ran before the call (imports, a flush) is not its
            self.events.take_overflow()

    def end(self, result: ReplayResult) -> None:
        if not self.wanted:
            return
        if self.events is None:
            result["unwatched"] = str(self.unwatched)
            return
        result["read"] = sorted(self.events.drain())
        if self.events.take_overflow():
            result["unwatched"] = "the kernel's file events overflowed during the call"

    def close(self) -> None:
        if self.events is not None:
            self.events.close()


def _start_up() -> None:
    """What every replay's first call would pay once, paid before the budget's clock starts:
    torch and the fingerprints (a zygote's fork has them already), and the deterministic
    switch a replay sets, whose first use imports dynamo and sympy (a second)."""
    import torch  # noqa: PLC0415

    from fastci.runner.prune import fingerprints  # noqa: F401, PLC0415

    torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled())


def _budget(request: dict) -> float | None:
    """The seconds this process may replay for (`budget.py`), counted from now; None: no
    limit. A local request's deadline (`until`, this machine's monotonic clock) bounds it."""
    seconds = request.get("budget")
    budget = None if seconds is None else max(0.0, float(seconds))
    left = _seconds_left(request)
    if left != float("inf"):
        budget = max(0.0, left) if budget is None else min(budget, max(0.0, left))
    return budget


def _resolved(request: dict, base: str) -> dict:
    """Paths in a request are relative to the request file's folder (a replay pack unpacked
    on a runner) unless absolute (the local CLI's temporary folder)."""
    def at(path):
        return path if path is None else os.path.join(base, path)

    settle = request.get("settle")
    if settle:
        settle = {**settle, "settled": at(settle["settled"])}
    return {**request, "root": at(request["root"]), "out": at(request["out"]),
            "settle": settle,
            "captures": {d: at(p) for d, p in request["captures"].items()},
            "save_tensors": at(request.get("save_tensors")),
            "compare_to": at(request.get("compare_to"))}


def inherited(path: str, qualname: str, names: list[str]) -> dict:
    """Which of a class's added methods exist on a base class (so they override it)."""
    import importlib  # noqa: PLC0415

    from fastci.runner.analysis.blocks import module_name_for  # noqa: PLC0415

    module_name, _ = module_name_for(path)
    if module_name is None:
        return {"overriding": [], "error": f"{path} is not an importable module"}
    try:
        target = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        overriding = sorted(n for n in names
                            if any(hasattr(base, n) for base in target.__mro__[1:]))
        return {"overriding": overriding, "error": None}
    except Exception as exc:  # noqa: BLE001 - the caller keeps the tests
        return {"overriding": [], "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def replay(path: str, root: str, save_dir: str | None, compare_dir: str | None,
           digest: str) -> ReplayResult:
    """`seconds`: the call, its backward and the fingerprints; `load_seconds`: unpickling,
    which imports the repository's modules the first time (start-up, not replay)."""
    started = time.perf_counter()
    timing = {"load": 0.0}
    try:
        fingerprints, tensors = _replay(path, root, timing)
        result: ReplayResult = {"fingerprints": fingerprints, "error": None}
        if save_dir:
            import torch  # noqa: PLC0415

            torch.save(tensors, os.path.join(save_dir, digest))
        if compare_dir:
            result["close"] = _compare(tensors, os.path.join(compare_dir, digest))
    except Exception as exc:  # noqa: BLE001 - reported, and the test stays selected
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        result = {"fingerprints": {}, "error": f"{type(exc).__name__}: {str(exc)[:300]} "
                                               f"(at {os.path.basename(frame.filename)}:"
                                               f"{frame.lineno})"}
    result["load_seconds"] = timing["load"]
    result["seconds"] = time.perf_counter() - started - timing["load"]
    return result


def _replay(path: str, root: str, timing: dict) -> tuple[dict, dict]:
    import torch  # noqa: PLC0415

    from fastci.runner.prune.fingerprints import (  # noqa: PLC0415
        fingerprints,
        set_checkout,
        tensor_leaf,
        tensors,
    )

    loading = time.perf_counter()
    saved = torch.load(path, weights_only=False, map_location=None)
    set_checkout(root, saved.get("root") or "")
    saved["state"] = _recorded_state(saved.get("state"))
    timing["load"] = time.perf_counter() - loading
    if "function" in saved or "method" in saved:
        return _replay_function(saved, root)
    module, args, kwargs = saved["module"], saved["args"], saved["kwargs"]
    _check_code(module, root)
    _check_state(saved.get("state"), root)
    _restore(saved)
    # (the module first: `self.past = x` where the old code kept a copy)
    before = held(args, kwargs, [("module", module), *_shared(saved.get("state"))])
    out, said = _call(saved, root, lambda: module(*args, **kwargs))
    after = held(args, kwargs, [("module", module), *_shared(saved.get("state"))])
    # The module whole after the call, past its state dict: what a forward leaves on it
    # (a count, a cache, `training`, a non-persistent buffer, a submodule it swapped), and
    # the arguments and the output whole (a set, an array, a generator's state), as a
    # function's are.
    prints = {**said, **fingerprints(out, "out"),
              "out.is": {"repr": identity(out, args, kwargs, type(module).forward, known=after)},
              **fingerprints(module.state_dict(), "state"),
              **fingerprints(tensor_attributes(module), "attr"),
              **fingerprints((args, kwargs), "args"),
              **_exact("out", out), **_exact("module", module), **_exact("args", (args, kwargs)),
              "args.is": {"repr": holding(args, kwargs, before, after=after)},
              **_globals_after(saved.get("state"), root),
              "rng": tensor_leaf(torch.get_rng_state()), **_other_rngs()}
    kept = {**tensors(out, "out"), **tensors(module.state_dict(), "state")}
    grads = _backward(out, args, kwargs, [("", module)])
    if grads:
        prints.update(fingerprints(grads, "grads"))
        kept.update(tensors(grads, "grads"))
    return prints, kept


def _call(saved: dict, root: str, call) -> tuple[object, dict]:
    """Run the captured call as the test had it (its variables, torch's modes), and what it
    said and looked at as fingerprints; an effect no fingerprint compares (a file written,
    a child started) makes it unreplayable."""
    _watch_effects()
    with _call_environment(saved), _effects() as seen, _observed() as observed, \
            _looked_at(root, saved.get("root")) as looked, _torch_modes(saved["settings"]), \
            _working_folder(saved.get("cwd")):
        environ, settings = dict(os.environ), _settings()
        out = call()
        process = _process_state(environ, (root, saved.get("root") or root), settings)
    if seen:
        raise RuntimeError(f"the call has an effect a replay cannot compare: {seen[0]}")
    return out, {**observed, **looked, **process}


def _process_state(environ: dict[str, str], roots: tuple[str, ...],
                   settings: dict[str, str] | None = None) -> dict:
    """What a call can set for the rest of the process, past its return value and the
    repository's globals: torch's global modes (`torch.set_default_dtype`, grad mode set
    without a `with`, matmul precision, deterministic algorithms, anomaly mode), the
    variables it set or removed (`environ`: before the call; the tree's root written as
    one), and the settings `_settings` reads that it changed (`settings`: before the call).
    Taken before the replay's own modes are undone."""
    import torch  # noqa: PLC0415

    from fastci.runner.prune.fingerprints import hash_leaf  # noqa: PLC0415

    modes = (torch.get_default_dtype(), torch.is_grad_enabled(),
             torch.is_inference_mode_enabled(), torch.get_float32_matmul_precision(),
             torch.are_deterministic_algorithms_enabled(), torch.is_anomaly_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    changed = sorted((k, v) for k, v in os.environ.items() if environ.get(k) != v)
    removed = sorted(k for k in environ if k not in os.environ)
    text = repr((changed, removed))
    for root in sorted({r for r in roots if r}, key=len, reverse=True):
        text = text.replace(root, "<root>")
    now = _settings()
    changed_settings = sorted((k, (settings or {}).get(k), now.get(k))
                              for k in now.keys() | (settings or {}).keys()
                              if (settings or {}).get(k) != now.get(k))
    return {"process.torch": hash_leaf(repr(modes)), "process.environ": hash_leaf(text),
            "process.settings": hash_leaf(repr(changed_settings))}


def _settings() -> dict[str, str]:
    """Settings a call can leave changed for the code after it, which the test then runs
    under: torch's default device and print options, numpy's error handling and print
    options, the warnings filters, and each logger's level, `disabled`, `propagate` and
    handlers (a logger with none of these set is left out: libraries make loggers lazily,
    in whichever call first imports them). Compared as what the call changed, so that what
    an earlier replay in the process left set counts once, there."""
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    import torch  # noqa: PLC0415

    out = {"torch.device": str(torch.get_default_device()),
           "torch.print": repr(sorted(vars(torch._tensor_str.PRINT_OPTS).items())),
           "warnings": repr(warnings.filters),
           "logging.disable": repr(logging.root.manager.disable)}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        out["numpy.err"] = repr(sorted(numpy.geterr().items()))
        out["numpy.print"] = repr(sorted(numpy.get_printoptions().items()))
    loggers = [("", logging.getLogger())] + sorted(
        (name, logger) for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger))
    for name, logger in loggers:
        handlers = [type(h).__qualname__ for h in logger.handlers
                    if not getattr(h, "_fastci_replay", False)]
        if logger.level or logger.disabled or not logger.propagate or handlers:
            out[f"logger.{name}"] = repr((logger.level, logger.disabled, logger.propagate,
                                          handlers))
    return out


def _backward(out, args, kwargs, modules: list) -> dict:
    """Back-propagate a fixed upstream gradient from the call's float outputs that require
    grad: the gradients of the arguments and of `modules`' parameters ((prefix, module))."""
    import torch  # noqa: PLC0415

    from fastci.runner.prune.fingerprints import tensors  # noqa: PLC0415

    outs = [t for t in tensors(out, "out").values()
            if t.requires_grad and t.is_floating_point()]
    if not outs:
        return {}
    generator = torch.Generator().manual_seed(UPSTREAM_SEED)
    upstream = [torch.randn(t.shape, generator=generator, dtype=torch.float32)
                .to(dtype=t.dtype, device=t.device) for t in outs]
    # The gradients this backward alone gives: a capture keeps the ones the test had
    # (`fingerprints.saving_grads`), and a change added to them can round away.
    for _prefix, module in modules:
        for p in module.parameters():
            p.grad = None
    for t in tensors((args, kwargs), "args").values():
        if t.is_leaf:
            t.grad = None
    torch.autograd.backward(outs, upstream)
    grads = {}
    for prefix, module in modules:
        grads.update({f"grad.{prefix}{n}": p.grad for n, p in module.named_parameters()
                      if p.grad is not None})
    grads.update({f"grad.{p}": t.grad for p, t in tensors((args, kwargs), "args").items()
                  if t.grad is not None})
    return grads


def _restore(saved: dict) -> None:
    """torch's settings and RNG as the test had them at the call."""
    import torch  # noqa: PLC0415

    settings = saved["settings"]
    torch.set_num_threads(settings["threads"])
    torch.set_default_dtype(getattr(torch, settings["default_dtype"].split(".")[-1]))
    torch.use_deterministic_algorithms(settings["deterministic"])
    torch.set_rng_state(saved["rng"])
    if saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    # Python's and NumPy's generators are not captured: each replay starts them from one
    # seed, so what `_other_rngs` finds after the call says how many draws it took.
    random.seed(UPSTREAM_SEED)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(UPSTREAM_SEED % 2**32)


@contextmanager
def _torch_modes(settings: dict):
    """Grad mode and autocast as the test had them at the call: a change only autocast tells
    apart (a cast, a region with autocast turned off) computes alike without it, and in the
    test it returns another dtype."""
    import torch  # noqa: PLC0415

    autocast = settings.get("autocast")
    if autocast is None:  # captured before autocast's state was, or torch could not say
        raise RuntimeError("the capture does not say whether autocast was on")
    with ExitStack() as modes:
        modes.enter_context(torch.set_grad_enabled(settings["grad"]))
        for device, dtype in autocast:
            modes.enter_context(torch.autocast(device, dtype=getattr(torch, dtype.split(".")[-1])))
        yield


@contextmanager
def _call_environment(saved: dict):
    """The variables the call saw that a replay process does not have of its own (a
    launcher's rank and rendezvous in a child, `child_capture.py`), set around the call."""
    environ = saved.get("environ") or {}
    before = {k: os.environ.get(k) for k in environ}
    os.environ.update(environ)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _observed():
    """What a call says besides what it returns, which a test can assert on: the warnings
    it raises (`pytest.warns`, `-W error`), the records it logs at any level (`caplog`)
    and what it prints (`capsys`). Filled in, as fingerprints, when the block ends."""
    import io  # noqa: PLC0415
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    class Records(logging.Handler):
        _fastci_replay = True  # not the call's (`_settings`)

        def __init__(self) -> None:
            super().__init__(level=1)
            self.seen: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            try:
                message = record.getMessage()
            except Exception as exc:  # noqa: BLE001 - a bad format string is a difference too
                message = f"<unformattable: {type(exc).__name__}>"
            self.seen.append(f"{record.name}:{record.levelno}:{message}")

    out: dict[str, dict] = {}
    root, records = logging.getLogger(), Records()
    level, disabled = root.level, logging.root.manager.disable
    stdout, stderr = io.StringIO(), io.StringIO()
    real = sys.stdout, sys.stderr
    root.addHandler(records)
    root.setLevel(1)
    logging.disable(logging.NOTSET)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sys.stdout, sys.stderr = stdout, stderr
            try:
                yield out
            finally:
                sys.stdout, sys.stderr = real
    finally:
        root.removeHandler(records)
        root.setLevel(level)
        logging.disable(disabled)

    from fastci.runner.prune.fingerprints import hash_leaf  # noqa: PLC0415 (imports torch)

    out["said.warnings"] = hash_leaf("\n".join(f"{w.category.__qualname__}: {w.message}"
                                                for w in caught))
    out["said.logs"] = hash_leaf("\n".join(records.seen))
    out["said.stdout"] = hash_leaf(stdout.getvalue())
    out["said.stderr"] = hash_leaf(stderr.getvalue())


@contextmanager
def _working_folder(recorded: str | None):
    """A replay runs in the tree's root. Where the test ran the call in another folder
    (`monkeypatch.chdir(tmp_path)`), a call that reads the working folder (`os.getcwd`,
    and what calls it: `os.path.abspath` and `relpath` of a relative path, `Path.cwd`,
    `Path.resolve`) would compute there what it did not in the test, whichever code reads
    it: such a call cannot be replayed."""
    if recorded in (None, "."):
        yield
        return
    reads: list[str] = []
    real = os.getcwd, os.getcwdb

    def reading(fn):
        def read():
            reads.append(fn.__name__)
            return fn()
        return read

    os.getcwd, os.getcwdb = reading(real[0]), reading(real[1])
    try:
        yield
    finally:
        os.getcwd, os.getcwdb = real
    if reads:
        raise RuntimeError(f"the call read the working folder ({reads[0]}), which the test "
                           f"had at {recorded}, not the tree's root where a replay runs")


@contextmanager
def _looked_at(root: str, recorded_root: str | None = None):
    """The files and folders the call opened, listed or asked about (`os.stat` and what
    calls it: `os.path.exists`, `Path.is_file`), as one fingerprint, `said.files`. A replay
    runs in the tree's root, not in the test's folder, with none of the files the test made:
    new code that looks for one finds nothing, and would compute what the old code did. So
    the new code's replay must look at the very paths the old code's did (the tree's root
    and the recording's, which a captured argument may name, written as one; the
    interpreter's own files, compiler and launch caches left out)."""
    seen: set[str] = set()
    ignored = _ignored_folders()
    roots = tuple(sorted({r.rstrip(os.sep) for r in (root, recorded_root or root)
                          if r and r.strip(os.sep)}, key=len, reverse=True))

    def note(kind: str, path) -> None:
        if isinstance(path, int):
            return  # a file descriptor: opened earlier, where it was noted
        try:
            text = os.fsdecode(path)
        except TypeError:
            return
        if text.endswith(_CODE_SUFFIXES) or "__pycache__" in text or _is_cache(text):
            return
        if os.path.isabs(text):
            mine = next((r for r in roots if text == r or text.startswith(r + os.sep)), None)
            if mine is not None:
                text = "<root>" + text[len(mine):]
            elif text.startswith(ignored) or any(
                    f.startswith(text.rstrip(os.sep) + os.sep)
                    for f in (*ignored, *(r + os.sep for r in roots))):
                return  # theirs, or a folder above them (`os.path.realpath` walks those)
        seen.add(f"{kind} {text}")

    def audit(event: str, args: tuple) -> None:
        kind = _LOOKS.get(event)
        if kind is not None and args:
            note(kind, args[0])

    def asking(name: str, real):
        def ask(path, *rest, **options):
            note(name, path)
            return real(path, *rest, **options)
        return ask

    patched = {name: getattr(os, name) for name in ("stat", "lstat", "access")}
    _look_sinks.append(audit)
    for name, real in patched.items():
        setattr(os, name, asking(name, real))
    out: dict[str, dict] = {}
    try:
        yield out
    finally:
        for name, real in patched.items():
            setattr(os, name, real)
        _look_sinks.remove(audit)
    from fastci.runner.prune.fingerprints import hash_leaf  # noqa: PLC0415 (imports torch)

    out["said.files"] = hash_leaf("\n".join(sorted(seen)))


_LOOKS = {"open": "open", "os.listdir": "list", "os.scandir": "list", "glob.glob": "glob",
          "os.chdir": "chdir"}
_CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")
_look_sinks: list = []


def _ignored_folders() -> tuple[str, ...]:
    """Where what a call opens is the interpreter's, a library's or a cache's, the same in
    both replays: left out of `said.files`."""
    import site  # noqa: PLC0415
    import sysconfig  # noqa: PLC0415

    from fastci.runner.prune.launches import default_folder  # noqa: PLC0415

    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, "/proc", "/sys", "/dev",
               *sysconfig.get_paths().values(), *site.getsitepackages()}
    launches = default_folder()
    if launches is not None:
        folders.add(str(launches))
    return tuple(sorted(os.path.abspath(f).rstrip(os.sep) + os.sep for f in folders if f))


def _other_rngs() -> dict:
    """Python's and NumPy's global generators after a call: a change that draws once more
    from them returns the same value yet moves every later draw of the test."""
    from fastci.runner.prune.fingerprints import hash_leaf  # noqa: PLC0415 (imports torch)

    out = {"pyrng": hash_leaf(repr(random.getstate()))}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state = numpy.random.get_state()
        out["nprng"] = hash_leaf(repr((state[0], state[2:])).encode() + state[1].tobytes())
    return out


def _replay_function(saved: dict, root: str) -> tuple[dict, dict]:
    """A captured call of a plain function (`capture.call_function`): the function is the
    one this tree's module binds under the recorded name. Besides what a module call's
    replay compares, the whole return value and arguments are compared exactly
    (`exact_digest`), and so are the repository modules' globals after the call (a global
    the function assigned is state the test goes on with). Effects no fingerprint can
    compare (a file written, a child started, a connection made) make the call unreplayable."""
    import torch  # noqa: PLC0415

    from fastci.runner.prune.fingerprints import (  # noqa: PLC0415
        bounded_fingerprints,
        fingerprints,
        tensor_leaf,
        tensors,
    )

    fn = saved["function"] if "function" in saved else _method(saved["method"])
    args, kwargs = saved["args"], saved["kwargs"]
    _check_function(fn, root)
    _check_state(saved.get("state"), root)
    _restore(saved)
    before = held(args, kwargs, _shared(saved.get("state")))
    out, said = _call(saved, root, lambda: fn(*args, **kwargs))
    after = held(args, kwargs, _shared(saved.get("state")))
    prints = {**said, **bounded_fingerprints(out, "out"),
              **bounded_fingerprints((args, kwargs), "args"),
              **_exact("out", out), **_exact("args", (args, kwargs)),
              "out.is": {"repr": identity(out, args, kwargs, inspect.unwrap(fn), known=after)},
              "args.is": {"repr": holding(args, kwargs, before, after=after)},
              **_globals_after(saved.get("state"), root),
              "rng": tensor_leaf(torch.get_rng_state()), **_other_rngs()}
    kept = tensors(out, "out")
    modules = [(f"{path}.", module) for path, module in _modules_in((args, kwargs))]
    grads = _backward(out, args, kwargs, modules)
    if grads:
        prints.update(fingerprints(grads, "grads"))
        kept.update(tensors(grads, "grads"))
    return prints, kept


def _method(reference: list[str]):
    """The method a capture names by (module, qualified name), as this tree defines it: a
    method the new code removed or turned into something else cannot be replayed."""
    import importlib  # noqa: PLC0415

    module, qualname = reference
    target: object = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not callable(target) or isinstance(target, type):
        raise RuntimeError(f"{module}.{qualname} is no method in this tree")
    return target


def _exact(prefix: str, value) -> dict:
    """`prefix#`: the whole value's exact digest; `prefix#structure`: the same without the
    tensors' values, which a tolerance comparison must still find equal."""
    from fastci.runner.prune.fingerprints import exact_digest  # noqa: PLC0415

    return {f"{prefix}#": {"hash": exact_digest(value)},
            f"{prefix}#structure": {"hash": exact_digest(value, values=False)}}


def _modules_in(value, path: str = "args", depth: int = 0) -> list:
    """(path, module) for the nn.Modules among a call's arguments: their parameters'
    gradients are part of what the call did."""
    import torch  # noqa: PLC0415

    if isinstance(value, torch.nn.Module):
        return [(path, value)]
    if depth >= 6:
        return []
    if isinstance(value, (tuple, list)):
        return [m for i, v in enumerate(value) for m in _modules_in(v, f"{path}[{i}]", depth + 1)]
    if isinstance(value, dict):
        return [m for k in sorted(value, key=repr)
                for m in _modules_in(value[k], f"{path}[{k!r}]", depth + 1)]
    return []


def _globals_after(recorded: dict | None, root: str) -> dict:
    """The digests of every recorded module's globals after the call, as fingerprints: the
    module's own (`own_globals`), so that the old code's replay and the new code's compare
    equal whichever of their processes launched a kernel under Triton's interpreter first."""
    if not recorded:
        return {}
    digester = _digesters.setdefault(root, Digester(root))
    out = {}
    for name, (_path, names) in sorted(recorded.items()):
        module = sys.modules.get(name)
        if module is None:
            continue
        for key, digest in sorted(own_globals(digester, module, names).items()):
            out[f"globals.{name}.{key}"] = {"repr": str(digest)}
    return out


def _shared(recorded: dict | None) -> list[tuple[str, object]]:
    """What every recorded module holds (`own_objects`), by `module.name`: where a replayed
    call's result, or what it left in its arguments, may come from besides the arguments."""
    return [(f"{name}.{key}", value)
            for name, (_path, names) in sorted((recorded or {}).items())
            if name in sys.modules
            for key, value in own_objects(sys.modules[name], names)]


_EFFECTS = {"subprocess.Popen": "started a child", "os.system": "ran a shell command",
            "os.exec": "replaced the process", "os.posix_spawn": "started a child",
            "os.spawn": "started a child", "os.fork": "forked", "os.forkpty": "forked",
            "socket.connect": "opened a connection", "socket.sendto": "sent on a socket",
            "os.remove": "removed a file", "os.rename": "renamed a file",
            "os.rmdir": "removed a folder", "os.mkdir": "made a folder",
            "os.truncate": "truncated a file", "shutil.rmtree": "removed a tree",
            "os.symlink": "made a link", "os.link": "made a link"}


@contextmanager
def _effects():
    """The effects, outside what fingerprints compare, that a call has while it runs."""
    seen: list[str] = []
    _effect_sinks.append(seen)
    try:
        yield seen
    finally:
        _effect_sinks.remove(seen)


_effect_sinks: list[list[str]] = []
_hooked: list[bool] = []


def _watch_effects() -> None:
    """Audit hooks cannot be removed: one per process (a zygote's children inherit it)."""
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)


def _audit(event: str, args: tuple) -> None:
    for look in _look_sinks:
        look(event, args)
    if not _effect_sinks:
        return
    what = _EFFECTS.get(event)
    if what is None and event == "open" and len(args) > 1:
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
        if writes and not _is_cache(args[0]):
            what = f"wrote {args[0]!r}"
    if what is not None:
        _effect_sinks[-1].append(f"{what} ({event})" if what in _EFFECTS.values() else what)


def _is_cache(path) -> bool:
    """Compilers' caches (Triton's, Inductor's) are written by calls that compile kernels:
    what they hold is the code's own, not an effect the test goes on with."""
    try:
        text = os.fsdecode(path)
    except TypeError:
        return False
    caches = [os.sep + ".triton" + os.sep, "torchinductor"]
    caches += [d for d in (os.environ.get("TRITON_CACHE_DIR"),
                           os.environ.get("TORCHINDUCTOR_CACHE_DIR")) if d]
    return any(part in text for part in caches)


def _check_function(fn, root: str) -> None:
    """The function must come from the tree being replayed."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = os.path.realpath(getattr(module, "__file__", "") or "")
    if not path.startswith(root + os.sep):
        raise RuntimeError(f"{getattr(fn, '__qualname__', fn)} was loaded from {path}, outside "
                           f"the tree being replayed ({root}); is the package installed "
                           "elsewhere?")


def _check_code(module, root: str) -> None:
    """Every repository class in the module must come from the tree being replayed."""
    for sub in module.modules():
        cls = type(sub)
        mod = sys.modules.get(cls.__module__)
        path = os.path.realpath(getattr(mod, "__file__", "") or "")
        if path.startswith(root + os.sep) or "site-packages" in path or not path:
            continue
        if path.startswith(os.path.realpath(sys.base_prefix)):
            continue  # the standard library
        raise RuntimeError(f"{cls.__qualname__} was loaded from {path}, outside the tree "
                           f"being replayed ({root}); is the package installed elsewhere?")


def _recorded_state(state: str | dict | None) -> dict | None:
    """The module state a capture kept: JSON text (one string is what torch.save pickles
    fastest: its pickler calls back into Python for every object of a dict), or the dict
    older captures kept."""
    return json.loads(state) if isinstance(state, str) else state


def _check_state(recorded: dict | None, root: str) -> None:
    """Every repository module must hold here what it held when the test made the call
    (`state.py`): a global the test or a fixture changed is one a fresh process cannot see,
    and code that reads it (the new code, say) would replay what the test would not compute.
    A module this tree cannot import is one the replayed call cannot read either."""
    if not recorded:
        return
    import importlib  # noqa: PLC0415

    for name in recorded:  # all first: importing one fills others (a package's registry)
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - not importable here: not readable either
                continue
    digester = _digesters.setdefault(root, Digester(root))
    differ = [f"{name}.{key}" for name, (_path, names) in sorted(recorded.items())
              if name in sys.modules
              for key in differing(names, own_globals(digester, sys.modules[name], names))]
    if differ:
        raise RuntimeError(f"module state differs from what the test had at the call: "
                           f"{', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''} (the "
                           "test or a fixture set it; a fresh process cannot)")


_digesters: dict[str, Digester] = {}


def _compare(kept: dict, before_path: str) -> dict:
    """Per tensor: within the per-dtype tolerance of the earlier replay's tensors?"""
    import torch  # noqa: PLC0415

    from fastci.kernels.compare import compare  # noqa: PLC0415

    if not os.path.exists(before_path):
        return {"*": "the earlier replay kept no tensors"}
    before = torch.load(before_path, weights_only=True)  # plain tensors: no pickle code
    out = {}
    for path in sorted(set(before) | set(kept)):
        a, b = kept.get(path), before.get(path)
        if a is None or b is None:
            out[path] = "missing on one side"
        elif a.shape != b.shape or a.dtype != b.dtype:
            out[path] = f"{tuple(b.shape)} {b.dtype} became {tuple(a.shape)} {a.dtype}"
        else:
            a, b = a.detach(), b.detach()
            backend = "torch" if a.device.type == "cpu" else "auto"
            result = compare(a, b, equal_nan=True, backend=backend)
            out[path] = "ok" if result.ok else str(result)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
