"""Kernel launches remembered across replays, under Triton's interpreter.

Interpreting a Triton kernel on the CPU costs most of a model call's replay: tinyllm's
cross-entropy kernel is 70% of a `TinyLM` call, replayed once under the evidence's code and
once under the new code, where most changes leave the kernel and its inputs as they were.
The interpreter runs a launch's programs one after another over its arguments' storages,
so what a launch writes is a function of the kernel's code, the values it reads
and its arguments' bytes. A launch is therefore remembered under a key made of all of them:

- the source, defaults and closure of the launched function and of every jit function or
  helper it reaches through its globals, its modules' attributes and its closures (as the
  interpreter reads them, from the tree being replayed);
- the values of the module-level names those read, at the moment of the launch (a global
  the replayed call reassigned counts as it is then); a value the key cannot describe
  exactly (a dict, an object, a numpy scalar) leaves the launch unremembered;
- every argument: a tensor by dtype, shape, strides, offset, which distinct storage it
  views, and the bytes of that whole storage (a kernel's pointers may reach anywhere in
  it); a namedtuple by its fields too; anything else by type and value;
- the grid, the function that computes it, numpy's error state, and the versions of Python,
  torch, Triton and numpy with the `TRITON_*` variables.

A launch is remembered only if every load, store and atomic it made fell inside its
arguments' storages (the interpreter's memory functions are watched while it runs): a
pointer loaded from a table, or a read past a tensor's end, reaches memory the key does
not hold. A launch whose key cannot be made completely (pre-run hooks, a tensor off the
CPU, storages that overlap, more than MAX_BYTES) runs as usual. An output allocated with
`torch.empty` holds whatever memory held, and its bytes are part of the key: where they
differ from process to process the launch is interpreted again (a miss, never a wrong hit).
A hit rewrites the jit functions the remembered launch called (rewriting copies the
interpreter's names into their modules, which a replay's module globals show), writes the
bytes the launch changed, and returns.

Entries are written between replayed calls (a write inside one is an effect that keeps its
test selected, `replay._audit`), one file each, content-addressed, by rename, in a folder
only its user may write to (a process trusts what it reads there as it trusts its own
results). Only the developer's machine passes a folder
(`replayers.py`): a runner's pack never carries one.
"""

from __future__ import annotations

import contextlib
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
MAX_PENDING = 256 * 2**20  # bytes of entries one process keeps until it writes them
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
        self._pending_bytes = 0
        self._written = 0  # entries written since the folder was last trimmed
        self._sources: dict[int, tuple[object, str]] = {}  # id -> (the function, its digest)
        self._restore: list[Callable[[], None]] = []
        self._reached: list = []  # the jit functions the launch being keyed reaches
        self._called: set[int] | None = None  # ids of jit functions called, during a miss
        self._runtime: list = []
        self._memory: Any = None  # the interpreter's native memory functions

    def install(self) -> bool:
        """Wrap the interpreter's launches; False where there is no interpreter, or where
        the folder is not this user's alone (another user's entries would be results this
        process trusts)."""
        if not private_folder(self.folder):
            return False
        try:
            import numpy  # noqa: PLC0415 (the interpreter's own dependency)
            import torch  # noqa: PLC0415
            import triton  # noqa: PLC0415
            from triton.runtime import interpreter  # noqa: PLC0415
            interpreted = interpreter.InterpretedFunction
            run, call = interpreted.__dict__["run"], interpreted.__dict__["__call__"]
            memory = interpreter.__dict__["_interpreter"]  # where kernels read and write
        except Exception:  # noqa: BLE001 - no interpreter here: nothing to remember
            return False
        functions = {n for n in dir(memory) if not n.startswith("_")
                     and callable(getattr(memory, n)) and not isinstance(getattr(memory, n), type)}
        if not functions <= KNOWN or not set(MEMORY) <= functions:
            return False
        self._memory = memory
        self._runtime = [sys.version, torch.__version__, triton.__version__,
                         numpy.__version__, sorted((k, v) for k, v in os.environ.items()
                                                   if k.startswith("TRITON_"))]
        memo = self

        def launch(kernel, *args, grid, warmup, **kwargs):
            if warmup:
                return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            return memo.launch(kernel, run, args, kwargs, grid)

        def device_call(jit, *args, **kwargs):  # a jit function called from a kernel
            if memo._called is not None:
                memo._called.add(id(jit))
            return call(jit, *args, **kwargs)

        launch.__wrapped__ = run  # type: ignore[attr-defined]  # functions take attributes
        interpreted.run, interpreted.__call__ = launch, device_call

        def restore() -> None:
            interpreted.run, interpreted.__call__ = run, call

        self._restore.append(restore)
        return True

    def uninstall(self) -> None:
        while self._restore:
            self._restore.pop()()

    # -- one launch ------------------------------------------------------------------------
    def launch(self, kernel, run, args: tuple, kwargs: dict, grid):
        try:
            key, storages = self._key(kernel, args, kwargs, grid)
        except _Unkeyable:
            return run(kernel, *args, grid=grid, warmup=False, **kwargs)
        found = self._pending.get(key)
        if found is None:
            found = _read(self.folder / key[:2] / key)
        entry = None if found is None else _decode(found, [s.nbytes() for s in storages],
                                                   len(self._reached))
        if entry is not None and self._stand_in(entry, storages):
            self.hits += 1
            return None
        self.misses += 1
        return self._interpret(key, storages, kernel, run, args, kwargs, grid)

    def _stand_in(self, entry: tuple[dict[int, bytes], list[int]], storages: list) -> bool:
        """Do what interpreting the launch would: rewrite the jit functions it called (which
        copies the interpreter's names into their modules, as a replay's module globals
        show), then write the bytes it changed. False: interpret it after all."""
        written, called = entry
        try:
            for index in called:
                self._reached[index].rewrite()
        except Exception:  # noqa: BLE001 - the interpreter will meet (and report) it too
            return False
        for index, data in written.items():
            _bytes_view(storages[index]).copy_(_from_bytes(data))
        return True

    def _interpret(self, key: str, storages: list, kernel, run, args, kwargs, grid):
        """Interpret the launch, watching every memory access it makes: it is remembered
        only if each one fell inside its arguments' storages (a pointer loaded from a
        table, or read past a tensor's end, reaches memory the key does not hold)."""
        before = [_bytes_view(s).clone() for s in storages]
        watch = _Accesses(storages)
        self._called = {id(kernel)}
        try:
            with watch.watching(self._memory):
                result = run(kernel, *args, grid=grid, warmup=False, **kwargs)
        finally:
            called, self._called = self._called, None
        if result is not None or not watch.inside:
            return result
        changed = {i: _bytes_view(s).numpy().tobytes() for i, s in enumerate(storages)
                   if not _bytes_view(s).equal(before[i])}
        data = _encode(changed, [i for i, jit in enumerate(self._reached)
                                 if id(jit) in called])
        if self._pending_bytes + len(data) <= MAX_PENDING:
            self._pending[key] = data
            self._pending_bytes += len(data)
        return result

    def _key(self, kernel, args: tuple, kwargs: dict, grid) -> tuple[str, list]:
        try:
            return self._make_key(kernel, args, kwargs, grid)
        except _Unkeyable:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever describing it raised: not keyed
            raise _Unkeyable(f"{type(exc).__name__}: {exc}") from None

    def _make_key(self, kernel, args: tuple, kwargs: dict, grid) -> tuple[str, list]:
        import numpy  # noqa: PLC0415

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
        if sum(s.nbytes() for s in storages) > MAX_BYTES:
            raise _Unkeyable("storages too large")
        _no_overlap(storages)
        parts: dict[str, Any] = {
            "runtime": self._runtime, "numpy_errors": sorted(numpy.geterr().items()),
            "code": self._code(fn, set()),
            "options": repr(sorted((getattr(kernel, "kwargs", None) or {}).items())),
            "arguments": described, "grid": self._grid(grid, bound),
            "storages": [[s.nbytes(), _digest(s)] for s in storages]}
        try:
            text = json.dumps(parts, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise _Unkeyable(str(exc)) from None
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
        """The function's source, defaults and closure, and the values of the globals it
        reads, then the same for each jit function or helper those reach."""
        if id(fn) in seen:
            return []
        seen.add(id(fn))
        names = _names(fn.__code__)
        out: list = [fn.__qualname__, self._source(fn),
                     _value(getattr(fn, "__defaults__", None)),
                     _value(sorted((getattr(fn, "__kwdefaults__", None) or {}).items())),
                     [self._global(c.cell_contents, names, seen)
                      for c in (getattr(fn, "__closure__", None) or ())]]
        namespace = getattr(fn, "__globals__", {})
        for name in sorted(names):
            if name not in namespace:
                continue  # a builtin, or an attribute name read off another value
            out.append([name, self._global(namespace[name], names, seen)])
        return out

    def _global(self, value, names: set[str], seen: set[int]):
        if inspect.ismodule(value) and _installed_module(value):
            # by name: the interpreter patches triton.language while it runs, and the
            # runtime stamp fixes what an installed library holds
            return ["module", value.__name__]
        if inspect.ismodule(value):  # `helpers.SCALE`, `pkg.sub.f`: the names it reads there
            if id(value) in seen:
                return ["module", value.__name__]
            seen.add(id(value))
            return ["module", value.__name__,
                    [[n, self._global(getattr(value, n), names, seen)]
                     for n in sorted(names) if n in vars(value)]]
        inner = getattr(value, "fn", None)
        if inner is not None and hasattr(inner, "__code__"):  # a jit function it calls
            if hasattr(value, "rewrite") and all(j is not value for j in self._reached):
                self._reached.append(value)
            return ["jit", self._code(inner, seen)]
        if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value):
            return self._function(value, seen)
        return _value(value)  # anything else by value, or not keyed at all

    def _function(self, fn, seen: set[int] | None = None) -> list:
        """An installed library's function or class by name; a repository helper by its
        code, whose globals count too."""
        if _installed(fn):
            return ["installed", getattr(fn, "__module__", ""),
                    getattr(fn, "__qualname__", repr(fn))]
        if not hasattr(fn, "__code__"):
            raise _Unkeyable(f"cannot describe {fn!r}")
        return ["python", self._code(fn, set() if seen is None else seen)]

    def _source(self, fn) -> str:
        found = self._sources.get(id(fn))
        if found is None or found[0] is not fn:
            try:
                digest = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
            except Exception as exc:  # noqa: BLE001 - OSError, TypeError, a tokenizer error
                raise _Unkeyable(f"no source: {exc}") from None
            found = self._sources[id(fn)] = (fn, digest)  # kept: its id is not reused
        return found[1]

    # -- entries ---------------------------------------------------------------------------
    def flush(self, trim: bool = True) -> int:
        """Write the launches remembered since the last flush; how many were written.
        `trim`: then keep the folder under MAX_FOLDER."""
        written = 0
        for key, data in self._pending.items():
            target = self.folder / key[:2] / key
            tmp = None
            try:
                if target.exists():
                    continue
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, target)
                written += 1
            except OSError:
                if tmp is not None:  # a cache: a failed write costs a later replay's time
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
        self._pending.clear()
        self._pending_bytes = 0
        if trim and (written or self._written):
            _trim(self.folder)
        self._written = 0 if trim else self._written + written
        return written


class _Accesses:
    """The memory a launch reads and writes, checked against its arguments' storages."""

    def __init__(self, storages: list) -> None:
        import numpy  # noqa: PLC0415

        spans = sorted((s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages)
        self._starts = numpy.array([a for a, _ in spans], dtype=numpy.uint64)
        self._ends = numpy.array([b for _, b in spans], dtype=numpy.uint64)
        self.inside = True

    def check(self, pointers, size: int, mask=None) -> None:
        import numpy  # noqa: PLC0415

        try:
            addresses = numpy.asarray(pointers, dtype=numpy.uint64)
            if mask is not None:
                addresses = addresses[numpy.broadcast_to(numpy.asarray(mask, dtype=bool),
                                                         addresses.shape)]
            addresses = addresses.ravel()
            if not addresses.size:
                return
            at = numpy.searchsorted(self._starts, addresses, side="right").astype(int) - 1
            ok = (at >= 0) & (addresses + numpy.uint64(size) <= self._ends[at.clip(0)])
            self.inside = self.inside and bool(ok.all())
        except Exception:  # noqa: BLE001 - an access it cannot read: not remembered
            self.inside = False

    @contextlib.contextmanager
    def watching(self, memory):
        """Wrap the interpreter's memory functions (`memory`, its native module) in place:
        the module object stays the one the interpreter's names copy into kernel modules."""
        real = {name: getattr(memory, name) for name in MEMORY}

        def load(ptrs, mask, other, dtype):
            self.check(ptrs, _itemsize(dtype), mask)
            return real["load"](ptrs, mask, other, dtype)

        def store(ptrs, value, mask):
            self.check(ptrs, _itemsize(getattr(value, "dtype", None)), mask)
            return real["store"](ptrs, value, mask)

        def atomic_cas(ptr, cmp, val, sem):
            self.check(ptr, _itemsize(getattr(val, "dtype", None)))
            return real["atomic_cas"](ptr, cmp, val, sem)

        def atomic_rmw(op, ptr, val, mask, sem):
            self.check(ptr, _itemsize(getattr(val, "dtype", None)), mask)
            return real["atomic_rmw"](op, ptr, val, mask, sem)

        watched = {"load": load, "store": store, "atomic_cas": atomic_cas,
                   "atomic_rmw": atomic_rmw}
        for name, fn in watched.items():
            setattr(memory, name, fn)
        try:
            yield
        finally:
            for name, fn in real.items():
                setattr(memory, name, fn)


# The interpreter's native functions: those that touch memory, and the arithmetic rest. A
# Triton whose interpreter module has any other function is not used (memory could be read
# some way the watch does not see).
MEMORY = ("load", "store", "atomic_cas", "atomic_rmw")
KNOWN = frozenset(MEMORY) | {"fma_fp32", "fma_fp64"}


def _itemsize(dtype) -> int:
    import numpy  # noqa: PLC0415

    return numpy.dtype(dtype).itemsize


def _no_overlap(storages: list) -> None:
    """Distinct storages over one memory (two `frombuffer` views): a store through one
    changes what a load through the other reads, which equal bytes cannot say."""
    spans = sorted((s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages if s.nbytes())
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise _Unkeyable("argument storages overlap")


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
        if value.device.type != "cpu" or value.layout != torch.strided:
            raise _Unkeyable("a tensor off the CPU, or not strided")
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
        return ["tuple", _kind(value), [_argument(v, storages) for v in value]]
    return _value(value)


def _kind(value) -> list:
    """A tuple's own type: a namedtuple's fields decide what `p.a` reads."""
    kind = type(value)
    return [] if kind in (tuple, list) else [kind.__module__, kind.__qualname__,
                                             list(getattr(kind, "_fields", ()))]


def _value(value, depth: int = 0):
    """A plain value, described so that two equal descriptions mean two equal values;
    anything else cannot be keyed."""
    if isinstance(value, _PLAIN) and type(value) in _PLAIN:
        return [type(value).__name__, repr(value)]
    if isinstance(value, (tuple, list)) and depth < 8:
        return [type(value).__name__, _kind(value), [_value(v, depth + 1) for v in value]]
    kind = type(value)
    if kind.__module__.startswith(("triton", "torch")) and kind.__name__ in (
            "constexpr", "dtype", "pointer_type", "block_type"):
        inner = getattr(value, "value", value)
        return [kind.__module__, kind.__name__,
                repr(inner) if inner is value else _value(inner, depth + 1)]
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


def _encode(changed: dict[int, bytes], called: list[int]) -> bytes:
    header = json.dumps({"written": {str(i): len(b) for i, b in sorted(changed.items())},
                         "called": called}).encode()
    return _HEADER.pack(len(header)) + header + b"".join(b for _, b in sorted(changed.items()))


def _decode(data: bytes, sizes: list[int], reached: int
            ) -> tuple[dict[int, bytes], list[int]] | None:
    """The storages an entry writes and the jit functions (among those the launch reaches)
    it called, or None for an entry that does not fit this launch."""
    try:
        (size,) = _HEADER.unpack_from(data)
        header = json.loads(data[_HEADER.size:_HEADER.size + size])
        at = _HEADER.size + size
        written = {}
        for index, length in sorted((int(i), n) for i, n in header["written"].items()):
            if not 0 <= index < len(sizes) or length != sizes[index]:
                return None
            written[index] = data[at:at + length]
            at += length
        called = [int(i) for i in header["called"]]
        if at != len(data) or not all(0 <= i < reached for i in called):
            return None
        return written, called
    except (struct.error, ValueError, TypeError, AttributeError, KeyError):
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


def private_folder(folder: Path) -> bool:
    """Is `folder` (created here if missing, mode 0700) a directory of this user's that no
    one else may write to?"""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError:
        return False
    return folder.is_dir() and info.st_uid == os.getuid() and not info.st_mode & 0o022


def default_folder() -> Path | None:
    """Where a developer's replays remember launches: FASTCI_LAUNCH_CACHE ("off": nowhere),
    else the user's cache folder."""
    chosen = os.environ.get("FASTCI_LAUNCH_CACHE")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastci" / "launches"
