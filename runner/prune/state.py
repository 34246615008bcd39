"""The repository's module state a captured call could read, as digests.

A replay runs a captured call in a fresh process, where every repository module holds what
importing it gives. The test that made the call may have changed that state first: a
configuration dict set by the test or a fixture (`MODE["factor"] = 5.0`), a class attribute,
a function monkeypatched into a module. When the evidence's code never read that state, its
replay still reproduces what the test computed; but the new code may read it, and then the
replay computes under the fresh state what the test would not (a change to
`return x * MODE["factor"]` replays equal, and fails in the test). So each capture keeps a
digest of every repository module's globals at the moment of the call, and each replay,
after loading the call, takes the same digests of the modules as its tree imports them: a
module whose digest differs keeps the test selected, naming it.

A digest reads values without running their code: plain data by value (strings with the
repository's root taken out, so that two checkouts agree), containers to a bounded depth and
length, tensors and arrays by their bytes, functions, classes and modules by their qualified
names, a repository class's plain class attributes, and other objects by their type and
their attributes. What it cannot read (an object with no attributes to see, a container past
the bounds) counts by its type alone: a change in such state goes unseen, which the README
lists among what stays uncovered.

Plain standard library (torch and numpy are only recognised if already imported): the
recording side and the replay process both use it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Iterable

MAX_DEPTH = 4
MAX_ITEMS = 256  # of a container: the rest count by their number
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

    def modules(self, modules: Iterable[tuple[str, ModuleType]]) -> dict[str, str]:
        """Module name -> digest of its globals (dunder names left out: they name the
        checkout, and the import system keeps them; so are names no source can write, which
        pytest's assertion rewriting adds to test modules)."""
        return {name: self.module(module) for name, module in modules}

    def module(self, module: ModuleType) -> str:
        namespace = object.__getattribute__(module, "__dict__")
        own = namespace.get("__name__")
        parts = []
        for key, value in list(namespace.items()):
            if key.startswith("__") and key.endswith("__") or not key.isidentifier():
                continue  # a checkout's names, or pytest's assertion rewriter's "@py_..."
            parts.append(f"{key}={self.value(value, 0, own)}")
        return hashlib.blake2b("\n".join(parts).encode(errors="surrogatepass"),
                               digest_size=12).hexdigest()

    def value(self, value: object, depth: int, module: str | None = None) -> str:
        kind = type(value)
        if kind is str:
            return repr(value.replace(self.root, "<root>"))  # type: ignore[attr-defined]
        if isinstance(value, _PLAIN):
            return repr(value)
        if isinstance(value, _NAMED):
            named = f"<{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}>"
            if kind is type and module is not None and value.__module__ == module:
                return named + self._class_data(value, depth)  # type: ignore[arg-type]
            if isinstance(value, ModuleType):
                return f"<module {getattr(value, '__name__', '')}>"
            return named
        if depth >= MAX_DEPTH:
            return f"<{kind.__qualname__} …>"
        if kind in (list, tuple) or isinstance(value, (list, tuple)):
            items = list(value)  # type: ignore[call-overload]
            inner = ",".join(self.value(v, depth + 1) for v in items[:MAX_ITEMS])
            return f"{kind.__qualname__}[{len(items)}]({inner})"
        if isinstance(value, dict):
            pairs = list(value.items())[:MAX_ITEMS]
            inner = ",".join(f"{self.value(k, depth + 1)}:{self.value(v, depth + 1)}"
                             for k, v in pairs)
            return f"{kind.__qualname__}[{len(value)}]{{{inner}}}"
        if isinstance(value, (set, frozenset)):
            inner = ",".join(sorted(self.value(v, depth + 1) for v in list(value)[:MAX_ITEMS]))
            return f"{kind.__qualname__}[{len(value)}]{{{inner}}}"
        array = self._array(value)
        if array is not None:
            return array
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict) and attributes:
            return f"<{kind.__module__}.{kind.__qualname__}>" + self.value(
                attributes, depth + 1)
        return self._repr(value)

    def _repr(self, value: object) -> str:
        """An object with no attributes to read (a torch.device, a lock, a C type): its
        repr, without addresses (never the same in two processes), or its type alone."""
        kind = type(value)
        try:
            text = _ADDRESS.sub("", repr(value))[:_REPR_CHARS]
        except Exception:  # noqa: BLE001 - a repr that fails: the type alone
            text = ""
        return f"<{kind.__module__}.{kind.__qualname__} {text.replace(self.root, '<root>')}>"

    def _class_data(self, cls: type, depth: int) -> str:
        """A module's own class: its plain class attributes (a test may set them)."""
        data = {k: v for k, v in vars(cls).items()
                if not (k.startswith("__") and k.endswith("__")) and isinstance(
                    v, (*_PLAIN, str, list, tuple, dict, set, frozenset))}
        return self.value(data, depth + 1) if data else ""

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


def _tensor_digest(torch, value) -> str:
    try:
        data = value.detach().cpu().contiguous().reshape(-1)
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    except Exception:  # noqa: BLE001 - a tensor without plain bytes (sparse, meta)
        return "?"
    return hashlib.blake2b(raw, digest_size=12).hexdigest()


__all__ = ["Digester"]
