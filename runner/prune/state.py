"""The repository's module state a captured call could read, as digests.

A replay runs a captured call in a fresh process, where every repository module holds what
importing it gives. The test that made the call may have changed that state first: a
configuration dict set by the test or a fixture (`MODE["factor"] = 5.0`), a class attribute,
a function monkeypatched into a module. When the evidence's code never read that state, its
replay still reproduces what the test computed; but the new code may read it, and then the
replay computes under the fresh state what the test would not (a change to
`return x * MODE["factor"]` replays equal, and fails in the test). So each capture keeps a
digest of each global of every repository module at the moment of the call, and each
replay, after loading the call, takes the same digests of the modules as its tree imports
them: a global whose digest differs keeps the test selected, naming it.

A digest reads values without running their code: plain data by value (strings with the
repository's root taken out, so that two checkouts agree), containers to a bounded depth and
length, tensors and arrays by their bytes, functions and classes by their qualified names
(a repository class, whatever its metaclass, with the data its class attributes hold, and a
module's function with its attributes), an instance of a repository class by its attributes
(`__slots__` too), and any other object by its repr without addresses (a library's objects
fill caches lazily: a logger's level cache, a Triton kernel's compiled variants). What that
cannot read (state a repr hides, a container past the bounds) goes unseen, which the
README lists among what stays uncovered.

Plain standard library (torch and numpy are only recognised if already imported): the
recording side and the replay process both use it.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import os
import re
import sys
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType

MAX_DEPTH = 4
MAX_ITEMS = 256  # of a container: the rest count by their number
# What a list, tuple, dict or set adds to the depth: a quarter, so that configurations nested
# sixteen deep are read whole. An object adds two with its attributes' dict (two objects
# deep), as a model's submodules and tensors cost far more to read.
NESTING = 0.25
_OBJECT = 2 - NESTING
_PLAIN = (bool, int, float, complex, bytes, type(None))
_NAMED = (FunctionType, BuiltinFunctionType, MethodType, type, ModuleType)
_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+")
_REPR_CHARS = 256
_TENSORS_KEPT = 512


class Digester:
    """Digests of module globals, for one process and one repository root."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        # id -> (the tensor, its version, digest): the tensor is held, so its id is never
        # another's while the entry stands; an in-place change bumps the version
        self._tensors: dict[int, tuple[object, int, str]] = {}
        self._classes: dict[type, bool] = {}
        # (class, depth) -> (its attribute values and names, held, and the text they gave)
        self._class_texts: dict[tuple[type, float], tuple[tuple, tuple, str]] = {}
        self._open: set[int] = set()  # the containers being read (one that holds itself)
        # namespace id -> (the namespace, held so its id stays its own; global name -> (the
        # value, its digest, or None for a name left out)), for values whose digest their
        # identity settles (`_settled`): a capture digests every global of every repository
        # module, and nearly all are functions, classes and constants
        self._namespaces: dict[int, tuple[dict, dict[str, tuple[object, str | None]]]] = {}

    def module(self, module: ModuleType) -> dict[str, str]:
        """Global name -> digest of its value. Left out: dunder names (they name the checkout,
        and the import system keeps them), names no source can write (pytest's assertion
        rewriting adds them to test modules), and modules (a package gains its submodules
        in whatever order they are imported)."""
        namespace = object.__getattribute__(module, "__dict__")
        own = namespace.get("__name__")
        held = self._namespaces.get(id(namespace))
        if held is None:
            held = self._namespaces[id(namespace)] = (namespace, {})
        memo, out = held[1], {}
        for key, value in list(namespace.items()):
            known = memo.get(key)
            if known is not None and known[0] is value and not (
                    type(value) is FunctionType and value.__dict__):  # it gained attributes
                if known[1] is not None:
                    out[key] = known[1]
                continue
            if key.startswith("__") and key.endswith("__") or not key.isidentifier() \
                    or isinstance(value, ModuleType):
                # a checkout's names, pytest's assertion rewriter's "@py_...", and modules
                # (a package gains its submodules as they are imported, in any order)
                memo[key] = (value, None)
                continue
            out[key] = digest = hashlib.blake2b(self.value(value, 0, own).encode(
                errors="surrogatepass"), digest_size=8).hexdigest()
            if _settled(value, own):
                memo[key] = (value, digest)
            else:
                memo.pop(key, None)
        return out

    def value(self, value: object, depth: float, module: str | None = None) -> str:
        kind = type(value)
        if kind is str:
            return repr(value.replace(self.root, "<root>"))  # type: ignore[attr-defined]
        if isinstance(value, _PLAIN):
            return repr(value)
        if isinstance(value, _NAMED):
            named = f"<{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}>"
            if isinstance(value, type) and module is not None and value.__module__ == module:
                return named + self._class_data(value, depth, module)
            if kind is FunctionType and module is not None and value.__module__ == module \
                    and value.__dict__:
                # a function's attributes: a warn-once flag, a count, a registry it keeps
                data = {k: v for k, v in value.__dict__.items()
                        if not (k.startswith("__") and k.endswith("__"))}
                return named + (self.value(data, depth + 1) if data else "")
            if isinstance(value, ModuleType):
                return f"<module {getattr(value, '__name__', '')}>"
            return named
        if depth >= MAX_DEPTH:
            return f"<{kind.__qualname__} …>"
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            if id(value) in self._open:  # a container that holds itself
                return f"<{kind.__qualname__} again>"
            self._open.add(id(value))
            try:
                return self._container(value, depth)
            finally:
                self._open.discard(id(value))
        array = self._array(value)
        if array is not None:
            return array
        generator = _generator_state(value)
        if generator is not None:
            return generator
        if isinstance(value, logging.Logger):
            # By name: its level is the logging configuration's (caplog.set_level sets the
            # root's), which a replay does not restore; what a call logs is compared apart,
            # and a call that branched on the level would not replay the test's lines.
            return f"<logger {value.name}>"
        if self._ours(kind):
            attributes = _attributes(value)
            if attributes:
                return f"<{kind.__module__}.{kind.__qualname__}>" + self.value(
                    attributes, depth + _OBJECT)
        return self._repr(value)

    def _container(self, value: list | tuple | dict | set | frozenset, depth: float) -> str:
        """Its first MAX_ITEMS items, and how many it holds."""
        kind = type(value)
        if isinstance(value, (list, tuple)):
            inner = ",".join(self.value(v, depth + NESTING) for v in value[:MAX_ITEMS])
            return f"{kind.__qualname__}[{len(value)}]({inner})"
        if isinstance(value, dict):
            pairs = list(value.items())[:MAX_ITEMS]
            inner = ",".join(f"{self.value(k, depth + NESTING)}:{self.value(v, depth + NESTING)}"
                             for k, v in pairs)
            return f"{kind.__qualname__}[{len(value)}]{{{inner}}}"
        inner = ",".join(sorted(self.value(v, depth + NESTING) for v in list(value)[:MAX_ITEMS]))
        return f"{kind.__qualname__}[{len(value)}]{{{inner}}}"

    def _ours(self, kind: type) -> bool:
        """Is this class the repository's? Its instances are read attribute by attribute;
        another library's objects by their repr, which shows what the library chose to
        show and not its lazily filled caches (a logger's, a Triton kernel's)."""
        known = self._classes.get(kind)
        if known is None:
            path = getattr(sys.modules.get(kind.__module__), "__file__", None) or ""
            known = self._classes[kind] = os.path.realpath(path).startswith(
                self.root + os.sep) and "site-packages" not in path
        return known

    def _repr(self, value: object) -> str:
        """An object with no attributes to read (a torch.device, a lock, a C type): its
        repr, without addresses (never the same in two processes), or its type alone."""
        kind = type(value)
        try:
            text = _ADDRESS.sub("", repr(value))[:_REPR_CHARS]
        except Exception:  # noqa: BLE001 - a repr that fails: the type alone
            text = ""
        return f"<{kind.__module__}.{kind.__qualname__} {text.replace(self.root, '<root>')}>"

    def _class_data(self, cls: type, depth: float, module: str) -> str:
        """A module's own class, whatever its metaclass (`abc.ABC`, an `Enum`): its class
        attributes that hold data (a test may set them, a method may write them through
        `type(self)`: a count, a tensor, an object), not its functions and descriptors
        (code, compared apart; while recording, a bound method is FastCI's wrapper). A
        class nested in it is read the same way. Its bases and metaclass come first: new
        bases (a mixin) change which method an instance runs, where no block the test
        executed changed. Remembered while the class holds the very same attributes, all
        immutable (a configuration dataclass's defaults): what a capture digests most
        often."""
        if depth >= MAX_DEPTH:
            return ""
        lineage = "(" + ",".join(f"{c.__module__}.{c.__qualname__}"
                                 for c in (type(cls), *cls.__mro__[1:])) + ")"
        return lineage + self._class_attributes(cls, depth, module)

    def _class_attributes(self, cls: type, depth: float, module: str) -> str:
        attributes = vars(cls)
        values = tuple(attributes.values())
        known = self._class_texts.get((cls, depth))
        if known is not None and len(known[0]) == len(values) \
                and all(map(operator.is_, known[0], values)) and known[1] == tuple(attributes):
            return known[2]
        data = {k: v for k, v in attributes.items()
                if not (k.startswith("__") and k.endswith("__")) and _data(v)}
        text = ",".join(f"{k}:" + (self.value(v, depth + 1, module) if isinstance(v, type)
                                   else self.value(v, depth + 1))
                        for k, v in data.items())
        text = f"{{{text}}}" if data else ""
        if all(type(v) in _IMMUTABLE for v in data.values()):
            self._class_texts[(cls, depth)] = (values, tuple(attributes), text)
        return text

    def _array(self, value: object) -> str | None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            version = getattr(value, "_version", -1)
            known = self._tensors.get(id(value))
            if known is not None and known[0] is value and known[1] == version:
                return known[2]
            text = f"<tensor {value.dtype} {tuple(value.shape)} {_tensor_digest(torch, value)}>"
            if len(self._tensors) >= _TENSORS_KEPT:
                self._tensors.clear()
            self._tensors[id(value)] = (value, version, text)
            return text
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray):
            data = numpy.ascontiguousarray(value)
            digest = hashlib.blake2b(data.tobytes() if data.dtype != object else
                                     repr(data.tolist()).encode(), digest_size=12).hexdigest()
            return f"<ndarray {data.dtype} {data.shape} {digest}>"
        return None


def _generator_state(value: object) -> str | None:
    """A random generator by its state, which its repr hides: Python's `random.Random`,
    numpy's `Generator` and `RandomState`, a `torch.Generator`. None for anything else."""
    import random  # noqa: PLC0415

    try:
        if isinstance(value, random.Random):
            state = repr(value.getstate())
        else:
            numpy = sys.modules.get("numpy")
            torch = sys.modules.get("torch")
            if numpy is not None and isinstance(value, numpy.random.Generator):
                state = repr(value.bit_generator.state)
            elif numpy is not None and isinstance(value, numpy.random.RandomState):
                state = repr(value.get_state(legacy=False))
            elif torch is not None and isinstance(value, torch.Generator):
                state = value.get_state().numpy().tobytes().hex()
            else:
                return None
    except Exception:  # noqa: BLE001 - unread: a mark no other process matches
        return f"<{type(value).__qualname__} unread {os.getpid()}:{id(value)}>"
    digest = hashlib.blake2b(state.encode(), digest_size=12).hexdigest()
    return f"<{type(value).__qualname__} {digest}>"


def _data(value: object) -> bool:
    """Whether a class attribute holds data rather than code: not a function, method or
    other descriptor (`property`, `staticmethod`, `cached_property`), not a module."""
    return not (hasattr(type(value), "__get__") or isinstance(value, ModuleType))


def _attributes(value: object) -> dict:
    """An instance's attributes: its `__dict__`, and what its class's `__slots__` hold."""
    found = dict(getattr(value, "__dict__", None) or {})
    for klass in type(value).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and slot not in found:
                try:
                    found[slot] = object.__getattribute__(value, slot)
                except AttributeError:  # a slot never set
                    continue
    return found


def _settled(value: object, module: str | None) -> bool:
    """Whether a value's digest follows from its identity: immutable plain data, and
    functions and classes, which are digested by name, but the module's own classes (their
    class attributes are digested, and a test may set them) and functions that hold
    attributes (digested too; `Digester.module` looks again once one gains them)."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return True
    if kind is FunctionType and value.__dict__:
        return False
    if isinstance(value, _NAMED):
        return not (isinstance(value, type) and value.__module__ == module)
    return False


_IMMUTABLE = frozenset((bool, int, float, complex, bytes, str, type(None)))


def differing(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The globals whose value differs from what was recorded, that the recording lacks
    (the test deleted them), or that only the recording has: a name a test or fixture added
    (`mod.OVERRIDE = 3`), which a fresh process lacks, and which new code may read where it
    exists (`try: OVERRIDE` / `except NameError`). Both sides digest through `own_globals`,
    so the names Triton's interpreter copies in are on neither."""
    return sorted(k for k in now.keys() | recorded.keys() if recorded.get(k) != now.get(k))


def own_globals(digester: Digester, module: ModuleType,
                recorded: dict[str, str] | None = None) -> dict[str, str]:
    """The module's global digests, less the names Triton's interpreter copied in from its
    own namespace at the process's first launch of a kernel in that module: no state of the
    module's own, and present in one process and not another by the order calls ran in (a
    recording that launched before the call, a replay that did not). A name the recording
    digested is kept (`recorded`): the module's own, under a name the interpreter has too."""
    now = digester.module(module)
    injected = _injected(module, recorded or {})
    return {k: v for k, v in now.items() if k not in injected}


def own_objects(module: ModuleType, recorded: dict[str, str] | None = None
                ) -> list[tuple[str, object]]:
    """What a module holds that a call may hand out or keep, by name: its own globals (the
    names `own_globals` digests) and the data its own classes hold (`Cls.BASE`, nested
    classes' too), for `identity` to name a returned view of a module's tensor, or a
    config's inner dict, by where it lives."""
    injected = _injected(module, recorded or {})
    own = getattr(module, "__name__", "")
    out: list[tuple[str, object]] = []
    classes = []
    for key, value in sorted(vars(module).items(), key=operator.itemgetter(0)):
        if key in injected or key.startswith("__") and key.endswith("__") \
                or isinstance(value, ModuleType):
            continue
        out.append((key, value))
        if isinstance(value, type) and value.__module__ == own:
            classes.append((key, value, 0))
    while classes:
        path, cls, depth = classes.pop()
        for key, value in vars(cls).items():
            if key.startswith("__") and key.endswith("__") or not _data(value):
                continue
            out.append((f"{path}.{key}", value))
            if isinstance(value, type) and value.__module__ == own and depth < MAX_DEPTH:
                classes.append((f"{path}.{key}", value, depth + 1))
    return out


def _injected(module: ModuleType, recorded: dict[str, str]) -> set[str]:
    """The names Triton's interpreter copied into the module (`own_globals`)."""
    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is None:
        return set()
    theirs = vars(interpreter)
    return {k for k, v in vars(module).items()
            if k not in recorded and k in theirs and v is theirs[k]}


def _tensor_digest(torch, value) -> str:
    try:
        data = value.detach().cpu().contiguous().reshape(-1)
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    except Exception:  # noqa: BLE001 - a tensor without plain bytes (sparse, meta)
        return "?"
    return hashlib.blake2b(raw, digest_size=12).hexdigest()


__all__ = ["Digester", "differing", "own_globals", "own_objects"]
