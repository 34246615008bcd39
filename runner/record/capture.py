"""Capturing module calls while a test runs, so a later change can be replayed in context.

`torch.nn.Module.__call__` is wrapped for the session. For each call of a module whose class
lives in the repository, the first MAX_REPEATS calls per (instance, call signature) in a
test are kept, each on its own:
the module as torch.save keeps it, the arguments, the RNG and torch's global settings, a
digest of every repository module's globals (`prune/state.py`: what the replay's fresh
process must find), and the fingerprints of what it returned. The call runs under its own
coverage context (`<test>|cap:<n>`), so the evidence says which executed lines ran inside
which captured call.
Module calls made inside a kept module call are not captured again: they stay in its
context, and replaying it runs them too. Calls of a signature past MAX_REPEATS run under
`<test>|in` when nothing encloses them. A per-test byte budget bounds what is kept; a
call past it, or one that cannot be pickled, is
noted as not replayable, and the blocks it ran can then never be pruned.

Only the output fingerprints are taken here (cheap). Gradients, state after the call and the
RNG after it come from replaying the capture in a fresh process under the recorded code, at
the first prune that needs it; that replay must reproduce these output fingerprints, which
is what proves the capture is the call's whole context.

Calls a test makes to plain repository functions are captured the same way (`bindings.py`
says which): the function is kept by its module and name, so the replay calls whichever
tree's code it runs under, and the output fingerprints gain an exact digest of the whole
return value (`fingerprints.exact_digest`), since a function returns configuration, strings
and objects as often as tensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastci.runner.record.bindings import CallBindings

if TYPE_CHECKING:
    from fastci.runner.prune.state import Digester

INSIDE = "|in"
CAPTURED = "|cap:"
DEFAULT_BUDGET = 64 * 2**20
MAX_SIGNATURES = 8  # captured calls per function per test; later new ones run uncaptured
MAX_REPEATS = 8  # captured calls per (callable, signature) per test; later ones run `|in`
BORROW = 10  # a test may add up to this many times its own allowance from earlier savings


@dataclass
class Capture:
    """One captured call (or one that could not be kept, with `why`)."""

    index: int
    module: str  # qualified class name
    digest: str | None = None  # sha256 of the saved call; None: not replayable
    size: int = 0
    why: str | None = None
    out: dict = field(default_factory=dict)  # output fingerprints at record time
    env: dict = field(default_factory=dict)  # variables the session set (TRITON_INTERPRET)
    kind: str = "module"  # or "function": `module` is then the function's qualified name

    def to_json(self) -> dict:
        return {"index": self.index, "module": self.module, "digest": self.digest,
                "size": self.size, "why": self.why, "out": self.out, "env": self.env,
                "kind": self.kind}


class ModuleCapture:
    """The session-wide `Module.__call__` wrapper; the recorder owns one."""

    def __init__(self, recorder, budget: int = DEFAULT_BUDGET, spill: Path | None = None) -> None:
        self.recorder = recorder
        self.root = os.path.realpath(recorder.root)
        self.budget = budget
        self.spill = spill or Path(tempfile.mkdtemp(prefix="fastci-captures-"))
        self._original: Callable[..., Any] | None = None
        self._repo_class: dict[type, bool] = {}
        self._test: str | None = None
        self._seen: dict[tuple, weakref.ref] = {}
        self._seen_calls: set[tuple] = set()  # (function id, signature): functions outlive tests
        self._calls_of: dict[int, int] = {}  # function id -> calls captured in this test
        self._repeats: dict[tuple, int] = {}  # signature key -> its calls captured in this test
        self._used = 0
        self._environ = dict(getattr(recorder, "environ", os.environ))  # as the session began
        self.captures: dict[str, list[Capture]] = {}
        self.uncaptured: dict[str, str] = {}  # test -> why its calls are not captured
        self.allowance: dict[str, float] = {}  # test -> seconds its captures may take
        self.stopped: dict[str, str] = {}  # test -> why capture stopped partway
        self._left = math.inf  # seconds of capture left to the running test
        self._granted = math.inf  # seconds the running test began with (own and borrowed)
        self.saved = 0.0  # seconds of allowance earlier tests left unspent (`begin_test`)
        self.blobs: dict[str, Path] = {}  # digest -> spilled file
        self._digester: Digester | None = None  # made at the first capture
        self._fingerprinting = False  # the fingerprints imported, and told the checkout
        self._module_paths: dict[str, str | None] = {}  # name -> path, None: not digested
        self._torch: Any = None
        # Variables set around each replayed call, not in the replay process's environment
        # (a child's launcher variables, `child_capture.py`).
        self.call_environ: dict[str, str] = {}
        self._child_base: dict[str, str] | None = None
        self._outer: list[tuple] = []  # the running test's state, while a fixture sets up
        self.children = True  # do the test's child processes capture (`capture_children`)?
        self.bindings = CallBindings(self.root, self.call_function)

    # -- lifecycle ---------------------------------------------------------------------------
    def install(self) -> None:
        import torch  # noqa: PLC0415 (installed only once the code under test imported it)

        if self._original is not None:
            return
        self._original = original = torch.nn.Module.__call__
        self._torch = torch
        capture = self

        def __call__(module, *args, **kwargs):
            if _tracing(torch) or capture._test is None \
                    or not capture._is_repo(type(module)):
                return original(module, *args, **kwargs)
            return capture._call(original, module, args, kwargs)

        torch.nn.Module.__call__ = __call__  # type: ignore[method-assign]  # wrapped on purpose

    def uninstall(self) -> None:
        if self._original is not None:
            import torch  # noqa: PLC0415 (torch is optional: installed means imported)

            torch.nn.Module.__call__ = self._original  # type: ignore[method-assign]  # restored
            self._original = None

    @property
    def sys_path(self) -> list[str]:
        return repo_paths(self.root)

    def begin_test(self, nodeid: str) -> None:
        """An uncaptured test (`uncaptured`) runs with the wrapper passing every call
        through: its lines all count as outside any capture, so pruning keeps it.

        A test with an allowance may also spend what earlier tests left of theirs (`saved`),
        up to BORROW times its own: a 0.1 s test's own share (10 ms) covers one capture of
        a model, while a 10 s training test stops capturing at its eighth step and leaves
        most of its second unspent. What the session's captures take in all stays within
        the sum of the tests' allowances."""
        self._test = None if nodeid in self.uncaptured else nodeid
        self._seen, self._seen_calls, self._used = {}, set(), 0
        own = self.allowance.get(nodeid, math.inf)
        if self._test is None or math.isinf(own):
            self._left = self._granted = own
        else:
            self._left = self._granted = own + min(self.saved, BORROW * own)
        self._calls_of, self._repeats = {}, {}
        self.captures[nodeid] = []

    def child_request(self, nodeid: str) -> str | None:
        """What the test's child processes are asked to capture (`child_capture.py`), or
        None: the test is recorded without capture."""
        from fastci.runner.record import child_capture  # noqa: PLC0415

        if nodeid in self.uncaptured or not self.children:
            return None
        if self._child_base is None:
            self._child_base = child_capture.digests(self._environ)
        granted = None if math.isinf(self._granted) else self._granted
        return child_capture.request(self.budget, granted, self._child_base)

    def end_test(self) -> None:
        """What the test's own allowance leaves, after what it spent, stays saved for
        later tests; a test that borrowed pays it back from the savings."""
        if self._test is not None and not math.isinf(self._granted):
            own = self.allowance.get(self._test, 0.0)
            spent = self._granted - self._left
            self.saved = max(0.0, self.saved + own - spent)
        self._test, self._granted = None, math.inf
        self._seen, self._seen_calls = {}, set()

    def begin_shared(self, context: str) -> None:
        """A broader fixture's set-up (`fixture:session:...`), inside some test's: its calls
        are captured for every test that uses the fixture (`recorder._module_evidence`), so
        a configuration a session fixture loads is a call like one in each test's body. It
        is set up once, so it has no allowance of its own; the byte budget holds."""
        self._outer.append((self._test, self._seen, self._seen_calls, self._used, self._left,
                            self._calls_of, self._repeats))
        self._test = context
        self._seen, self._seen_calls, self._used, self._left, self._calls_of, self._repeats = \
            {}, set(), 0, math.inf, {}, {}
        self.captures.setdefault(context, [])

    def end_shared(self) -> None:
        if self._outer:
            (self._test, self._seen, self._seen_calls, self._used, self._left,
             self._calls_of, self._repeats) = self._outer.pop()

    # -- the wrapper -------------------------------------------------------------------------
    def _fingerprints_ready(self) -> None:
        """Import the fingerprints at the first call that may be captured, not as capture
        is installed: they import Triton (0.13 s), which a process that captures nothing (a
        child running a script outside the repository) never needs. Before anything is
        fingerprinted, they learn where the checkout is (`set_checkout`)."""
        if not self._fingerprinting:
            from fastci.runner.prune.fingerprints import set_checkout  # noqa: PLC0415 (imports torch)

            set_checkout(str(self.recorder.root))
            self._fingerprinting = True

    def _is_repo(self, cls: type) -> bool:
        known = self._repo_class.get(cls)
        if known is None:
            module = sys.modules.get(cls.__module__)
            path = getattr(module, "__file__", None)
            real = os.path.realpath(path) if path else ""
            known = real.startswith(self.root + os.sep) and "site-packages" not in real
            self._repo_class[cls] = known
        return known

    def _call(self, original, module, args, kwargs):
        recorder, test = self.recorder, self._test
        assert test is not None  # the wrapper calls this only while a test runs
        enclosing = recorder.context
        if not (enclosing == test or enclosing.startswith(test + "|")):
            return original(module, *args, **kwargs)  # a fixture's call: not this test's
        if self._inside_kept(enclosing):
            return original(module, *args, **kwargs)
        self._fingerprints_ready()
        key = (id(module), _signature(module, args, kwargs))
        ref = self._seen.get(key)
        if ref is not None and ref() is module:
            if enclosing != test:
                return original(module, *args, **kwargs)
            if not self._repeat_kept(test, key):
                return self._run_inside(test, enclosing,
                                        lambda: original(module, *args, **kwargs))
        elif self._spent_all(test):
            return original(module, *args, **kwargs)
        else:
            self._seen[key] = weakref.ref(module)
            self._repeats[key] = 1
        captures = self.captures[test]
        capture = Capture(index=len(captures), module=_qualname(type(module)),
                          env=self._session_environment())
        captures.append(capture)
        with recorder.untraced(), self._timed():
            self._save_module_call(capture, module, args, kwargs)
        return self._run_captured(capture, enclosing,
                                  lambda: original(module, *args, **kwargs))

    def _repeat_kept(self, test: str, key: tuple) -> bool:
        """Whether a later call of a captured signature is captured too (and counted): the
        next step of a training loop has other values, and a change may compute otherwise
        only on them (a clamp bound only the second step's values reach). Past
        MAX_REPEATS, or once the allowance is spent, it runs under `|in`, and a changed
        line it ran keeps the test."""
        calls = self._repeats.get(key, 1)
        if calls >= MAX_REPEATS or self._spent_all(test):
            return False
        self._repeats[key] = calls + 1
        return True

    def _run_inside(self, test: str, enclosing: str, call: Callable[[], Any]) -> Any:
        """Run an uncaptured repeat under `<test>|in`."""
        recorder = self.recorder
        recorder.switch_derived(test, test + INSIDE)
        try:
            return call()
        finally:
            recorder.switch_derived(test, enclosing)

    def _spent_all(self, test: str) -> bool:
        """Whether the running test's capture allowance (`allowance`: a share of its last
        duration) is spent: calls not captured yet then run uncaptured, so their lines
        count as outside any capture, and keep the test when a change reaches them."""
        if self._left > 0:
            return False
        if test not in self.stopped:
            own = self.allowance.get(test, 0.0)
            borrowed = self._granted - own if not math.isinf(self._granted) else 0.0
            also = f", {borrowed:.3g} s of them left unspent by earlier tests" \
                if borrowed > 0 else ""
            self.stopped[test] = (f"capture stopped once its calls had taken "
                                  f"{own + borrowed:.3g} s to capture (capture_share of its "
                                  f"last run{also})")
        return True

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        """Time spent capturing counts against the running test's allowance."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._left -= time.perf_counter() - started

    def _inside_kept(self, enclosing: str) -> bool:
        """Whether `enclosing` is a kept module call's context, or a repeat of a captured
        call (`|in`): a call inside it is not captured again, and its lines count to that
        context. A module call's replay runs the calls inside it; an uncaptured repeat's
        lines keep the test when a change reaches them.
        Saving every nested call cost most of the recording's capture time (a model's
        every block and norm, their parameters saved once more each) and proved nothing
        the enclosing replay does not. Inside a plain function's call, and inside a call
        that could not be kept, module calls are still captured: such a replay fails more
        often (an effect it cannot compare, an object its digest cannot read), and the
        nested capture can then still be replayed on its own."""
        test = self._test
        if test is None:
            return False
        if enclosing == test + INSIDE:
            return True
        head, sep, index = enclosing.rpartition(CAPTURED)
        if not sep or head != test or not index.isdigit():
            return False
        capture = self.captures[head][int(index)]
        return capture.digest is not None and capture.kind == "module"

    def _run_captured(self, capture: Capture, enclosing: str, call: Callable[[], Any],
                      exact: bool = False) -> Any:
        """Run a kept call in its own context, then fingerprint what it returned (with
        `exact`, the whole value's digest too): what the replay must reproduce."""
        recorder, test = self.recorder, self._test
        assert test is not None  # captures are made only while a test runs
        recorder.switch_derived(test, f"{test}{CAPTURED}{capture.index}")
        try:
            out = call()
        finally:
            recorder.switch_derived(test, enclosing)
        if capture.digest is not None:
            with recorder.untraced(), self._timed():
                try:
                    from fastci.runner.prune.fingerprints import (  # noqa: PLC0415 (imports torch)
                        bounded_fingerprints,
                        exact_digest,
                        fingerprints,
                    )

                    if exact:
                        capture.out = {**bounded_fingerprints(out, "out", summaries=False),
                                       "out#": {"hash": exact_digest(out)}}
                    else:
                        capture.out = fingerprints(out, "out", summaries=False)
                    json.dumps(capture.out)  # stored as JSON: prove it here, not at save
                except Exception as exc:  # noqa: BLE001 - any failure: not replayable
                    capture.digest, capture.why = None, f"output not fingerprintable: {exc}"
        return out

    def call_function(self, fn, args, kwargs, reference: tuple[str, str] | None = None):
        """A test's call of a repository function through its bindings (`bindings.py`):
        captured as a module call is, up to MAX_REPEATS calls per signature. A method comes
        with its `reference` (module, qualified name): its class holds the wrapper while
        the test runs, so pickling the method by reference would fail."""
        recorder, test = self.recorder, self._test
        if test is None or _tracing(self._torch):
            return fn(*args, **kwargs)
        enclosing = recorder.context
        if not (enclosing == test or enclosing.startswith(test + "|")):
            return fn(*args, **kwargs)
        if self._inside_kept(enclosing):
            return fn(*args, **kwargs)
        if self._spent_all(test):
            # Nothing more is captured: not even a signature, which pickles every argument
            # (a method's whole object, 23 ms for a 9.5M-parameter trainer, per call of a
            # training loop). Its lines count to the enclosing context, never to a capture.
            return fn(*args, **kwargs)
        self._fingerprints_ready()
        with recorder.untraced(), self._timed():
            signature = _arguments_signature(args, kwargs)
        key = (id(fn), signature)
        if key in self._seen_calls:
            if enclosing != test:
                return fn(*args, **kwargs)
            if not self._repeat_kept(test, key):
                return self._run_inside(test, enclosing, lambda: fn(*args, **kwargs))
        else:
            calls = self._calls_of.get(id(fn), 0)
            if signature is None or calls >= MAX_SIGNATURES:
                # Unpicklable arguments, or a loop over many values (`lr_at(step)` per
                # step): run in the enclosing context, so what it runs counts as outside
                # any capture.
                return fn(*args, **kwargs)
            self._calls_of[id(fn)] = calls + 1
            self._seen_calls.add(key)
            self._repeats[key] = 1
        captures = self.captures[test]
        capture = Capture(index=len(captures), module=f"{fn.__module__}.{fn.__qualname__}",
                          env=self._session_environment(), kind="function")
        captures.append(capture)
        with recorder.untraced(), self._timed():
            from fastci.runner.prune.fingerprints import detached  # noqa: PLC0415 (imports torch)

            self._save(capture, {**({"function": fn} if reference is None
                                    else {"method": list(reference)}),
                                 "args": detached(args), "kwargs": detached(kwargs)})
        return self._run_captured(capture, enclosing, lambda: fn(*args, **kwargs), exact=True)

    def _module_state(self) -> dict[str, list]:
        """Module name -> [its path in the repository, its globals' digests] for every
        repository module imported so far but test files and conftest.py files
        (`prune/state.py`): what the replay must find."""
        from fastci.runner.analysis.discover import is_test_code  # noqa: PLC0415
        from fastci.runner.prune.state import (  # noqa: PLC0415 (the prune package imports this one)
            Digester,
            own_globals,
        )

        recorder = self.recorder
        recorder.scan_modules()  # a module the test imported lazily counts too
        if self._digester is None:
            self._digester = Digester(self.root)
        out, paths = {}, self._module_paths
        for name, module in recorder.repository_modules:
            path = paths.get(name, False)
            if path is False:  # resolved once: 0.8 ms a capture on tinyllm, as much as the digests
                path = os.path.relpath(os.path.realpath(getattr(module, "__file__", None) or ""),
                                       self.root)
                if is_test_code(path):
                    path = None  # pytest's (fixtures, marks, asserts): no fresh import has it
                paths[name] = path
            if path is not None:
                out[name] = [path, own_globals(self._digester, module)]
        return out

    def _session_environment(self) -> dict:
        """Variables set or changed since the session started (a conftest's
        TRITON_INTERPRET=1): code may read them at import, so the replay needs them too.
        Names that look like credentials are never kept."""
        changed = {k: v for k, v in os.environ.items() if self._environ.get(k) != v}
        return {k: v for k, v in sorted(changed.items())
                if not k.startswith(_SESSION_NOISE)
                and not any(w in k.upper() for w in ("TOKEN", "SECRET", "PASSWORD", "KEY"))}

    def _save_module_call(self, capture: Capture, module, args, kwargs) -> None:
        from fastci.runner.prune.fingerprints import detached  # noqa: PLC0415 (imports torch)

        self._save(capture, {"module": module, "args": detached(args),
                             "kwargs": detached(kwargs)})

    def _save(self, capture: Capture, call: dict) -> None:
        """Keep the call (`call`: what is called, and its arguments) with the context a
        fresh process must restore: RNG, torch's settings and the modules' globals."""
        import torch  # noqa: PLC0415 (torch is optional: only suites that use it get here)

        from fastci.runner.prune.fingerprints import saving_grads  # noqa: PLC0415 (imports torch)

        buffer = io.BytesIO()
        try:
            state = self._module_state()
            torch.save({
                **call,
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized()
                else None,
                "settings": {"grad": torch.is_grad_enabled(),
                             "threads": torch.get_num_threads(),
                             "default_dtype": str(torch.get_default_dtype()),
                             "deterministic": torch.are_deterministic_algorithms_enabled(),
                             "autocast": _autocast_settings(torch)},
                "state": json.dumps(state, separators=(",", ":")),  # see replay._recorded_state
                "root": str(self.recorder.root),  # paths under it compare as relative
                "cwd": _working_folder(str(self.recorder.root)),
                **({"environ": self.call_environ} if self.call_environ else {}),
            }, buffer, pickle_module=saving_grads)
        except Exception as exc:  # noqa: BLE001 - an unpicklable module is simply not kept
            capture.why = f"cannot be saved: {type(exc).__name__}: {str(exc)[:200]}"
            return
        data = buffer.getvalue()
        if self._used + len(data) > self.budget:
            capture.why = (f"over the capture budget ({len(data)} bytes; "
                           f"{self.budget // 2**20} MB per test)")
            return
        self._used += len(data)
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self.blobs:
            path = self.spill / digest
            path.write_bytes(data)
            self.blobs[digest] = path
        capture.digest, capture.size = digest, len(data)


def _working_folder(root: str) -> str:
    """The test's working folder at the call: relative to the tree's root ("." for the
    root itself, where a replay runs), or absolute outside it (`monkeypatch.chdir`)."""
    here = os.getcwd()
    relative = os.path.relpath(here, root)
    return here if relative == ".." or relative.startswith(".." + os.sep) else relative


def _tracing(torch) -> bool:
    """Under torch.jit.trace or torch.compile a call records a graph, not values: its
    arguments may be proxies (a shape of tensors), and a replay would not run what the
    traced program runs. Such calls stay in the test's own context: never pruned. Checked
    first, and with nothing else: torch.compile(fullgraph=True) traces this wrapper too, and
    fails on anything it cannot trace (os.path.realpath's lstat)."""
    if torch.compiler.is_compiling():
        return True
    return torch.jit.is_tracing()


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _signature(module, args, kwargs) -> tuple:
    """What makes two calls of one module different contexts: mode, autocast, the module's
    plain attributes (a policy object set between two calls changes its control flow), and
    the arguments' shapes and plain values. Tensor values are not part of it: the steps of a
    training loop share a signature, and each is captured up to MAX_REPEATS (the lines of
    later ones keep a test, `decide.py`)."""
    import torch  # noqa: PLC0415 (torch is optional: only suites that use it get here)

    from fastci.runner.prune.fingerprints import walk  # noqa: PLC0415 (imports torch)

    parts: list = [module.training, torch.is_grad_enabled(), _autocast_state(torch),
                   _attributes(module)]
    for path, leaf in walk((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            parts.append((path, str(leaf.dtype), tuple(leaf.shape), leaf.device.type,
                          leaf.requires_grad))
        elif isinstance(leaf, (int, float, bool, str, type(None))):
            parts.append((path, leaf))
        else:
            parts.append((path, type(leaf).__qualname__))
    return tuple(parts)


def _arguments_signature(args, kwargs) -> tuple | None:
    """What makes two calls of one function different contexts: torch's grad mode and
    autocast, and the whole arguments but the tensors' values (`exact_digest` without
    values: two configs that differ in one field are two contexts, where a module's
    signature would see one type). None: the arguments cannot be pickled (never captured)."""
    import torch  # noqa: PLC0415 (torch is optional: only suites that use it get here)

    from fastci.runner.prune.fingerprints import exact_digest  # noqa: PLC0415 (imports torch)

    try:
        arguments = exact_digest((args, kwargs), values=False)
    except Exception:  # noqa: BLE001 - anything pickle raises: not capturable
        return None
    return torch.is_grad_enabled(), _autocast_state(torch), arguments


def _autocast_state(torch) -> tuple:
    """The devices with autocast on, with their dtypes; () if torch cannot say (part of a
    call's signature: `_autocast_settings` is what a replay trusts)."""
    return tuple(_autocast_settings(torch) or ())


def _autocast_settings(torch) -> list[tuple[str, str]] | None:
    """(device, dtype) for each device with autocast on, as a replay re-enters them; None
    when this torch cannot tell (the replay then refuses the capture, which may have been
    made under autocast). torch before 2.4 asks per device in other words."""
    out = []
    for device in ("cpu", "cuda"):
        try:
            on, dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        except RuntimeError:
            continue  # a device type this build has no autocast for
        except (TypeError, AttributeError):
            try:
                on, dtype = ((torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype())
                             if device == "cpu" else
                             (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()))
            except (RuntimeError, TypeError, AttributeError):
                return None
        if on:
            out.append((device, str(dtype)))
    return out


# Set by pytest, coverage and FastCI's own recorder (its hand-over to children, tagged per
# test) per test or per process: not the code's environment. Kept, they would split the
# replays into one pair of processes per test.
_SESSION_NOISE = ("PYTEST_", "COV_CORE_", "COVERAGE_", "TORCHINDUCTOR_CACHE_DIR", "FASTCI_",
                  "_")

_SKIP_ATTRIBUTES = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                    "_backward_pre_hooks", "_backward_hooks", "_forward_hooks",
                    "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks",
                    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                    "_load_state_dict_post_hooks", "training"}
_PLAIN = (int, float, bool, str, type(None))


def _attributes(module) -> tuple:
    """A shallow, cheap summary of a module's own non-tensor attributes."""
    out: list[tuple] = []
    for key, value in vars(module).items():
        if key in _SKIP_ATTRIBUTES:
            continue
        if isinstance(value, _PLAIN):
            out.append((key, value))
        elif isinstance(value, (tuple, list, frozenset, set)) and len(value) <= 64 and all(
                isinstance(v, _PLAIN) for v in value):
            out.append((key, type(value).__name__, tuple(sorted(map(repr, value)))))
        elif hasattr(value, "__dict__") and not callable(value) and not hasattr(value, "shape"):
            plain = tuple(sorted((k, repr(v)[:64]) for k, v in list(vars(value).items())[:32]
                                 if isinstance(v, _PLAIN)))
            out.append((key, type(value).__qualname__, id(value), plain))
        elif not hasattr(value, "shape"):
            out.append((key, type(value).__qualname__))
    return tuple(out)


def repo_paths(root: str) -> list[str]:
    """The import roots inside the repository (relative), for the replay's sys.path."""
    out = []
    for entry in sys.path:
        real = os.path.realpath(entry or os.getcwd())
        if real == root or real.startswith(root + os.sep):
            rel = os.path.relpath(real, root)
            if rel not in out:
                out.append(rel)
    return out
