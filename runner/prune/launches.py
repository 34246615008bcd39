"""Kernel launches remembered across replays, under Triton's interpreter.

Interpreting a Triton kernel on the CPU costs most of a model call's replay: tinyllm's
cross-entropy kernel is 70% of a `TinyLM` call, replayed once under the evidence's code and
once under the new code, where most changes leave the kernel and its inputs as they were.
The interpreter runs a launch's programs one after another over copies of its arguments'
storages, so what a launch writes is a function of the kernel's code, the values it reads
and its arguments' bytes. A launch is therefore remembered under a key made of all of them:

- the source of the launched function and of every jit function it reaches through its
  globals (as the interpreter reads them, from the tree being replayed);
- the values of the module-level names those functions read, at the moment of the launch
  (a global the replayed call reassigned counts as it is then);
- every argument: a tensor by dtype, shape, strides, offset and the bytes of its whole
  storage (a kernel's pointers may reach anywhere in it), anything else by type and value;
- the grid, the function that computes it, and the versions of Python, torch, Triton and
  numpy.

A launch whose key cannot be made completely (an argument of an unknown kind, pre-run
hooks, a tensor off the CPU, storages past MAX_BYTES) runs as usual and is not remembered.
A hit writes the remembered bytes into the storages the launch changed, and returns.

Entries are written when the replay process ends, outside every replayed call (a write
inside one is an effect that keeps its test selected, `replay._audit`), one file each,
content-addressed, by rename. Only the developer's machine passes a folder (`replayers.py`):
a runner's pack never carries one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

MAX_BYTES = 64 * 2**20  # argument storages one launch may hash and keep
MAX_FOLDER = 512 * 2**20  # past it, the oldest entries go
_HEADER = struct.Struct("<I")
_PLAIN = (int, float, bool, str, bytes, type(None))
_INSTALLED = ("triton", "torch", "numpy", "builtins", "math", "functools", "typing")


class _Unkeyable(Exception):
    """Something the key cannot describe completely: the launch runs, unremembered."""


class LaunchMemo:
    """Wraps the interpreter's launches while installed; `hits` and `misses` count them."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.hits = 0
        self.misses = 0
        self._pending: dict[str, bytes] = {}
        self._sources: dict[int, str] = {}
        self._restore: Callable[[], None] | None = None
        self._reached: list = []  # the jit functions the launch being keyed reaches
        self._runtime = ""

    def install(self) -> bool:
        try:
            import numpy  # noqa: PLC0415 (the interpreter's own dependency)
            import torch  # noqa: PLC0415
            import triton  # noqa: PLC0415
            from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415
        except Exception:  # noqa: BLE001 - no interpreter here: nothing to remember
            return False
        self._runtime = json.dumps([sys.version, torch.__version__, triton.__version__,
                                    numpy.__version__,
                                    sorted((k, v) for k, v in os.environ.items()
                                           if k.startswith("TRITON_"))])
        original = InterpretedFunction.__dict__["run"]
        memo = self

        def run(kernel, *args, grid, warmup, **kwargs):
            if warmup:
                return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            return memo.launch(kernel, original, args, kwargs, grid)

        run.__wrapped__ = original  # type: ignore[attr-defined]  # functions take attributes
        InterpretedFunction.run = run

        def restore() -> None:
            InterpretedFunction.run = original

        self._restore = restore
        return True

    def uninstall(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None

    # -- one launch ------------------------------------------------------------------------
    def launch(self, kernel, original, args: tuple, kwargs: dict, grid):
        try:
            key, storages = self._key(kernel, args, kwargs, grid)
        except _Unkeyable:
            return original(kernel, *args, grid=grid, warmup=False, **kwargs)
        found = self._pending.get(key)
        if found is None:
            found = _read(self.folder / key[:2] / key)
        if found is not None:
            written = _decode(found, len(storages))
            if written is not None:
                for index, data in written.items():
                    _bytes_view(storages[index]).copy_(_from_bytes(data))
                for jit in self._reached:
                    # Rewriting a jit function for the interpreter copies the interpreter's
                    # names into its module, which a replay's module globals then show.
                    getattr(jit, "rewrite", lambda: None)()
                self.hits += 1
                return None
        self.misses += 1
        before = [_bytes_view(s).clone() for s in storages]
        result = original(kernel, *args, grid=grid, warmup=False, **kwargs)
        if result is None:
            changed = {i: _bytes_view(s).numpy().tobytes() for i, s in enumerate(storages)
                       if not _bytes_view(s).equal(before[i])}
            self._pending[key] = _encode(changed)
        return result

    def _key(self, kernel, args: tuple, kwargs: dict, grid) -> tuple[str, list]:
        if getattr(kernel, "pre_run_hooks", None):
            raise _Unkeyable("pre-run hooks")
        fn = kernel.fn
        spec = inspect.getfullargspec(fn)
        # what the grid executor passes on: the keywords the function takes
        kept = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
        try:
            bound = inspect.getcallargs(fn, *args, **kept)
        except TypeError as exc:
            raise _Unkeyable(str(exc)) from None
        storages: list = []
        self._reached = [kernel]
        described = [(name, _argument(bound[name], storages)) for name in sorted(bound)]
        parts: dict[str, Any] = {
            "runtime": self._runtime, "code": self._code(fn, set()),
            "options": repr(sorted((getattr(kernel, "kwargs", None) or {}).items())),
            "arguments": described, "grid": self._grid(grid, bound),
            "storages": [[s.nbytes(), _digest(s)] for s in storages]}
        try:
            text = json.dumps(parts, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise _Unkeyable(str(exc)) from None
        if sum(s.nbytes() for s in storages) > MAX_BYTES:
            raise _Unkeyable("storages too large")
        return hashlib.sha256(text.encode()).hexdigest(), storages

    def _grid(self, grid, bound: dict):
        if not callable(grid):
            return _value(grid)
        try:
            value = grid(dict(bound))
        except Exception as exc:  # noqa: BLE001 - the launch itself will say
            raise _Unkeyable(f"grid: {exc}") from None
        return [self._function(grid), _value(value)]

    def _code(self, fn, seen: set[int]) -> list:
        """The function's source and the values of the globals it reads, then the same for
        each jit function those reach."""
        if id(fn) in seen:
            return []
        seen.add(id(fn))
        out: list = [fn.__qualname__, self._source(fn)]
        namespace = getattr(fn, "__globals__", {})
        names = _names(fn.__code__)
        for name in sorted(names):
            if name not in namespace:
                continue  # a builtin, or an attribute name read off another value
            value = namespace[name]
            out.append([name, self._global(value, names, seen)])
        return out

    def _global(self, value, names: set[str], seen: set[int]):
        if inspect.ismodule(value) and _installed_module(value):
            # by name: the interpreter patches triton.language while it runs, and the
            # runtime stamp fixes what an installed library holds
            return ["module", value.__name__]
        if inspect.ismodule(value):  # `helpers.SCALE`: the names it reads there
            return ["module", value.__name__,
                    [[n, self._global(getattr(value, n), set(), seen)]
                     for n in sorted(names) if hasattr(value, n)]]
        inner = getattr(value, "fn", None)
        if inner is not None and hasattr(inner, "__code__"):  # a jit function it calls
            self._reached.append(value)
            return ["jit", self._code(inner, seen)]
        if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value):
            if _installed(value):
                return ["installed", getattr(value, "__module__", ""),
                        getattr(value, "__qualname__", repr(value))]
            if not hasattr(value, "__code__"):
                raise _Unkeyable(f"cannot describe {value!r}")
            return ["python", self._code(value, seen)]  # a helper: its globals count too
        try:
            return _value(value)
        except _Unkeyable:
            if _installed(type(value)):  # an installed library's object: the environment's
                return ["object", type(value).__module__, type(value).__qualname__]
            raise

    def _function(self, fn) -> list:
        if _installed(fn):
            return ["installed", fn.__module__, getattr(fn, "__qualname__", repr(fn))]
        if not hasattr(fn, "__code__"):
            raise _Unkeyable(f"cannot describe {fn!r}")
        return ["python", self._code(fn, set())]

    def _source(self, fn) -> str:
        found = self._sources.get(id(fn))
        if found is None:
            try:
                found = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
            except (OSError, TypeError) as exc:
                raise _Unkeyable(f"no source: {exc}") from None
            self._sources[id(fn)] = found
        return found

    # -- entries ---------------------------------------------------------------------------
    def flush(self) -> int:
        """Write the launches remembered in this process; how many were written."""
        written = 0
        for key, data in self._pending.items():
            target = self.folder / key[:2] / key
            if target.exists():
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, target)
                written += 1
            except OSError:
                continue  # a cache: a failed write costs only a later replay's time
        self._pending.clear()
        if written:
            _trim(self.folder)
        return written


def _installed(value) -> bool:
    """Code of an installed library the replay's environment fixes (the runtime stamp)."""
    module = getattr(value, "__module__", None) or ""
    return module.split(".", 1)[0] in _INSTALLED


def _installed_module(module) -> bool:
    return module.__name__.split(".", 1)[0] in _INSTALLED


def _names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _argument(value, storages: list):
    import torch  # noqa: PLC0415

    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.is_sparse:
            raise _Unkeyable("a tensor off the CPU")
        storage = value.untyped_storage()
        for index, seen in enumerate(storages):
            if seen.data_ptr() == storage.data_ptr() and seen.nbytes() == storage.nbytes():
                break
        else:
            index = len(storages)
            storages.append(storage)
        return ["tensor", str(value.dtype), list(value.shape), list(value.stride()),
                value.storage_offset(), index]
    if isinstance(value, tuple):
        return ["tuple", [_argument(v, storages) for v in value]]
    return _value(value)


def _value(value):
    """A plain value, described so that two equal descriptions mean two equal values."""
    if isinstance(value, _PLAIN):
        return [type(value).__name__, repr(value)]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_value(v) for v in value]]
    kind = type(value)
    if kind.__module__.startswith(("triton", "torch")) and kind.__name__ in (
            "constexpr", "dtype", "pointer_type", "block_type"):
        inner = getattr(value, "value", value)
        return [kind.__module__, kind.__name__, repr(inner) if inner is value else _value(inner)]
    raise _Unkeyable(f"cannot describe a {kind.__qualname__}")


def _bytes_view(storage):
    import torch  # noqa: PLC0415

    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _from_bytes(data: bytes):
    import torch  # noqa: PLC0415

    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)


def _digest(storage) -> str:
    return hashlib.sha256(_bytes_view(storage).numpy().data).hexdigest()


def _encode(changed: dict[int, bytes]) -> bytes:
    header = json.dumps({str(i): len(b) for i, b in sorted(changed.items())}).encode()
    return _HEADER.pack(len(header)) + header + b"".join(b for _, b in sorted(changed.items()))


def _decode(data: bytes, count: int) -> dict[int, bytes] | None:
    """The storages an entry writes, or None for an entry that does not fit this launch."""
    try:
        (size,) = _HEADER.unpack_from(data)
        header = json.loads(data[_HEADER.size:_HEADER.size + size])
        at = _HEADER.size + size
        out = {}
        for index, length in sorted(((int(i), n) for i, n in header.items())):
            if not 0 <= index < count:
                return None
            out[index] = data[at:at + length]
            at += length
        return out if at == len(data) else None
    except (struct.error, ValueError, TypeError, AttributeError):
        return None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _trim(folder: Path) -> None:
    """Drop the oldest entries while the folder holds more than MAX_FOLDER bytes."""
    try:
        entries = [(p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob("*/*")
                   if not p.name.startswith(".tmp-")]
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= MAX_FOLDER:
            break
        try:
            path.unlink()
            total -= size
        except OSError:
            continue


def default_folder() -> Path | None:
    """Where a developer's replays remember launches: FASTCI_LAUNCH_CACHE ("off": nowhere),
    else the user's cache folder."""
    chosen = os.environ.get("FASTCI_LAUNCH_CACHE")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastci" / "launches"
