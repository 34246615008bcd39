"""Which object a replayed call returned, beside its value (`identity`).

Two replays that return equal values may still differ where the test can tell: new code
that returns a copy where the old returned a view of its input (or the shared config
object itself) computes the same numbers, and a test that writes through the result, or
compares it with `is`, fails. So each replay describes its result by where it came from:
an argument or something reached through one, a view of named memory (and where in it),
a module's own tensor, one of its code's globals, or a new object, element by element
through the containers and plain objects it is made of. `replay.py` fingerprints that
description beside the values.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import os
import sys
import types

_VALUES = (type(None), bool, int, float, complex, str, bytes, frozenset)
ELEMENTS = 65536  # a returned container's elements whose identity is compared, at most
_DEPTH = 6  # ... and how deep
_COMPARISONS = 1 << 22  # memory ranges a description looks a view up in, at most
_UNMATCHED = itertools.count()


def identity(out, args, kwargs, fn, module=None, shared=(), known: _Known | None = None
             ) -> str:
    """Which object the call returned, beside its value: an argument itself or anything
    reached through one (an element of its list, tuple or dict, a field or attribute, a
    module's parameter, buffer or tensor attribute), a view of the memory of a tensor or
    numpy array among those (and where in it), a module's own parameter or buffer, one of
    its code's globals (a shared config), or a new one. Equal values compare equal;
    `get_config() is get_config()` and a view written through do not, so new code that
    returns a copy where the old returned the shared object (or `x.flatten().clone()` where
    it returned `x.view(-1)`, or `a[:-1]` where it returned `a[1:]`) differs here. A
    returned tuple, list, dict, dataclass or plain object (torch's pure-Python ones too, an
    optimizer, a dataset) is described by what it holds, so a view inside a tuple (or kept
    in an output object's attribute) counts as one too. Immutable scalars have no identity
    worth comparing. `known`: what `held` found after the call, when the caller has it (one
    walk for this and `holding`)."""
    if known is None:
        known = _Known.of(args, kwargs, module, fn, shared)
    else:
        known.name_globals(fn)
    return _identity_of(out, known, [ELEMENTS], [])


def held(args, kwargs, shared=()) -> _Known:
    """What the arguments and `shared` (the repository's modules' globals, by name) hold, by
    identity, before a call (`holding` after it)."""
    return _Known.of(args, kwargs, None, None, shared)


def holding(args, kwargs, before: _Known, shared=(), after: _Known | None = None) -> str:
    """Which object each place reached through the arguments and the modules' globals holds
    after the call, named by where it was before the call, or new: new code that puts an
    equal copy where the old kept the object (`self.model = copy.deepcopy(self.model)`, a
    module's registry that keeps a copy of its argument, a config given a copy of a module's
    defaults) compares equal by value, yet the test's own reference no longer sees what is
    done to the other. The places that hold what they held are counted, not listed: the
    modules' globals are many."""
    if after is None:
        after = held(args, kwargs, shared)
    places = sorted((path, before.names.get(key, "new")) for key, path in after.names.items())
    moved = [f"{path}={was}" for path, was in places if path != was]
    if not after.complete:  # a place past the walk may hold a copy: nothing proved
        return _unmatched("places past what was walked")
    return "\n".join([*moved, f"{len(places) - len(moved)} places hold what they held"])


@dataclasses.dataclass
class _Known:
    """What a description names: the objects reached through the call's arguments (first
    path first, breadth first), the memory they view, and its code's globals. `complete`
    is False where the walk stopped short (its bound, an attribute that raised): an object
    found nowhere is then not proved new, and describes as a mark no replay matches."""

    names: dict[int, str] = dataclasses.field(default_factory=dict)
    memory: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)
    starts: dict[int, tuple[int, int, str]] = dataclasses.field(default_factory=dict)
    shared: dict[int, str] = dataclasses.field(default_factory=dict)
    held: list = dataclasses.field(default_factory=list)  # alive while ids are compared
    complete: bool = True
    comparisons: int = _COMPARISONS

    @classmethod
    def of(cls, args, kwargs, module, fn, shared=()) -> _Known:
        known = cls()
        queue: collections.deque = collections.deque()
        for i, value in enumerate(args):
            known._add(f"args[{i}]", value, 0, queue)
        for key, value in kwargs.items():
            known._add(f"kwargs[{key!r}]", value, 0, queue)
        if module is not None:
            for name, value in _module_tensors(module):
                known._add(f"state {name}", value, _DEPTH, queue)
        known._walk(queue)
        # What the repository's modules hold, with a budget of its own: a call that hands
        # out (or keeps) a module's tensor, a view of it or its config's inner dict.
        for name, value in shared:
            known._add(f"global {name}", value, 0, queue)
        known._walk(queue)
        known.name_globals(fn)
        return known

    def name_globals(self, fn) -> None:
        """The function's globals by their names (a shared config it returns)."""
        for name, value in sorted(getattr(fn, "__globals__", {}).items()):
            self.shared.setdefault(id(value), f"global {name}")

    def _walk(self, queue: collections.deque) -> None:
        """Breadth first through what the queued objects hold, ELEMENTS at most."""
        budget = ELEMENTS
        while queue:
            name, value, depth = queue.popleft()
            if isinstance(value, (tuple, list, dict)) and len(value) > budget:
                self.complete = False  # (a list of a million token ids is not walked)
                continue
            try:
                items = _held_by(value)
            except Exception:  # noqa: BLE001 - an attribute that raises: not walked
                self.complete = False
                continue
            if items and depth >= _DEPTH:
                self.complete = False
                continue
            budget -= len(items)
            for key, inner in items:
                self._add(f"{name}{key}", inner, depth + 1, queue)

    def _add(self, name: str, value, depth: int, queue) -> None:
        if isinstance(value, _VALUES) or id(value) in self.names:
            return
        self.names[id(value)] = name
        self.held.append(value)
        memory = _memory(value)
        if memory is not None and memory[0] not in self.starts:
            self.starts[memory[0]] = (memory[0], memory[1], name)
            self.memory.append((memory[0], memory[1], name))
        queue.append((name, value, depth))

    def view_of(self, out) -> str | None:
        """`out` as a view of named memory, with where it starts in it and its layout (a
        view of the same memory elsewhere is another object); None when it views none."""
        memory = _memory(out)
        if memory is None:
            return None
        start, _, first = memory
        found = self.starts.get(start)
        if found is None or not found[0] <= first < found[1]:
            found = None
            for candidate in self.memory:  # a numpy array over a tensor's memory, or back
                self.comparisons -= 1
                if self.comparisons < 0:
                    return _unmatched("too many views to compare")
                if candidate[0] <= first < candidate[1]:
                    found = candidate
                    break
        if found is None:
            return None
        return f"a view of {found[2]} at byte {first - found[0]} {_layout(out)}"


def _identity_of(out, known: _Known, budget: list[int], above: list[int]) -> str:
    """`out` described (`identity`); `above`: the ids of the objects it was reached
    through."""
    if isinstance(out, _VALUES):
        return "a value"
    if not isinstance(out, tuple):  # a tuple is a value: only what it holds has identity
        name = known.names.get(id(out)) or known.view_of(out) or known.shared.get(id(out))
        if name is not None:
            return name
        if not known.complete:
            return _unmatched("an object the arguments may hold past what was walked")
        if hasattr(type(out), "__next__"):  # `iter(items)`, `map(f, xs)`, a generator
            return _unmatched("an iterator, which reads what it iterates over as it is used")
    wide = isinstance(out, (tuple, list, dict)) and len(out) > budget[0]
    try:
        items = None if wide else _elements(out)
    except Exception:  # noqa: BLE001 - an attribute that raises: nothing proved
        return _unmatched("an object whose attributes cannot be read")
    if items is None and not wide:
        return "a new object"
    if id(out) in above:
        return f"the object {len(above) - above.index(id(out))} up"  # a back-reference
    budget[0] -= len(items) if items is not None else budget[0] + 1
    if items is None or len(above) >= _DEPTH or budget[0] < 0:
        # Too deep or too wide to compare: a mark no other replay can match, so the call
        # is never proved unchanged by it (the test stays selected).
        return _unmatched("a container too large to compare")
    above.append(id(out))
    described = [(key, _identity_of(value, known, budget, above)) for key, value in items]
    above.pop()
    # Values have no identity (their equality is the value fingerprints' to check): a
    # tokenizer's vocabulary of ten thousand strings describes as nothing.
    inner = ", ".join(f"{key}: {what}" for key, what in described if what != "a value")
    return f"a new {type(out).__name__} ({inner})"


def _unmatched(why: str) -> str:
    """A description no other replay can match: the call is never proved unchanged by it."""
    return f"{why} ({os.getpid()}:{next(_UNMATCHED)})"


def _held_by(value) -> list[tuple[str, object]]:
    """What an object holds, for the walk of the arguments: a module's tensors and the
    plain attributes of it and its submodules (`.config`, a list of cached keys: `.name`),
    or `_elements`. A logger or handler holds nothing to walk: it reaches the process's
    whole logging configuration (every library's loggers), which `process.settings`
    compares."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.nn.Module):
        return [(f".{name}", tensor) for name, tensor in _module_tensors(value)] + \
            [(f".{name}", held) for name, held in _module_attributes(value, torch)]
    if isinstance(value, (logging.Logger, logging.Handler, logging.Manager)):
        return []
    return _elements(value) or []


def _module_attributes(module, torch) -> list[tuple[str, object]]:
    """The plain attributes of a module and its submodules (not its parameters, buffers,
    submodules, hooks or flags, which torch keeps under underscored names)."""
    out = []
    for name, sub in module.named_modules(remove_duplicate=False):
        for key, value in vars(sub).items():
            if key.startswith("_") or key == "training" or isinstance(
                    value, (torch.Tensor, torch.nn.Module)) or isinstance(value, _VALUES):
                continue
            out.append((f"{name}.{key}" if name else key, value))
    return out


def _module_tensors(module) -> list[tuple[str, object]]:
    """A module's parameters and buffers (non-persistent ones too, which a state dict
    leaves out: a rotary cache) and its plain tensor attributes, by name."""
    return [*module.named_parameters(remove_duplicate=False),
            *module.named_buffers(remove_duplicate=False),
            *tensor_attributes(module).items()]


def _elements(out) -> list[tuple[str, object]] | None:
    """What an object holds, keyed as a path shows it: a container's elements (`[0]`,
    `['key']`), a dataclass's fields and a plain object's attributes (`.name`), torch's
    pure-Python objects included (an optimizer's parameter groups, a dataset's tensors).
    None for an object whose identity is its own: a tensor or a numpy array (its memory
    is compared), a module (its parameters are), a class, a function, or an object
    written in C."""
    if isinstance(out, (tuple, list, collections.deque)):
        return [(f"[{i}]", value) for i, value in enumerate(out)]
    if isinstance(out, dict):  # (a frozenset's repr has its hash order: not a path)
        return [(f"[{key!r}]" if isinstance(key, _VALUES) and not isinstance(key, frozenset)
                 else f"[<{type(key).__name__} {i}>]", value)
                for i, (key, value) in enumerate(out.items())]
    if isinstance(out, functools.partial):  # what it will call, and with what
        return [(".func", out.func), (".args", out.args), (".keywords", out.keywords)]
    if isinstance(out, _OPAQUE) or _is_module(out) or _memory(out) is not None \
            or _array_type(type(out)) or type(out).__module__.startswith("triton."):
        # (Triton's objects are kernels and their launchers: code, with caches a call
        # never hands out; walking a kernel's 244 objects was most of a replay's walk)
        return None
    if dataclasses.is_dataclass(out):
        return [(f".{f.name}", getattr(out, f.name, None)) for f in dataclasses.fields(out)]
    attributes = _attributes(out)
    if attributes is None:
        return None
    return [(f".{name}", value) for name, value in attributes.items()]


# Objects whose identity is their own: code, classes and modules (a callable instance, a
# rotary cache or a tokenizer with `__call__`, is read like any other object).
_OPAQUE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.BuiltinMethodType, types.ModuleType, types.WrapperDescriptorType,
           types.MethodWrapperType, types.MethodDescriptorType)


def _is_module(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _attributes(value) -> dict | None:
    """An instance's attributes, `__dict__` and `__slots__` (a KV cache with slots); None
    for an object with neither (written in C)."""
    found = getattr(value, "__dict__", None)
    found = dict(found) if isinstance(found, dict) else None
    for klass in type(value).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__") or found is not None and slot in found:
                continue
            try:
                held = object.__getattribute__(value, slot)
            except AttributeError:  # a slot never set
                continue
            found = {} if found is None else found
            found[slot] = held
    return found


def _array_type(cls: type) -> bool:
    """A tensor or an array type (meta tensors and numpy scalars have no memory to compare,
    and nothing inside them to describe)."""
    return cls.__module__.split(".", 1)[0] in ("torch", "numpy") and any(
        base.__name__ in ("Tensor", "ndarray", "generic") for base in cls.__mro__)


def _memory(value) -> tuple[int, int, int] | None:
    """(start, end, first byte) of the memory a tensor or numpy array views: the whole
    allocation (a tensor's storage, the outermost array's extent), so that every view of
    one memory has the same, and where this one begins in it. None without memory (a
    meta tensor, an empty one)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        try:
            if value.device.type == "meta" or value.numel() == 0:
                return None
            storage = value.untyped_storage()
            start = storage.data_ptr()
            return (start, start + storage.nbytes(), value.data_ptr()) if start else None
        except Exception:  # noqa: BLE001 - a tensor subclass without storage: no view to see
            return None
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.size == 0:
            return None
        root = value
        while isinstance(root.base, numpy.ndarray):
            root = root.base
        first = root.__array_interface__["data"][0]
        low = first + sum(s * (n - 1) for n, s in zip(root.shape, root.strides) if s < 0)
        high = first + sum(s * (n - 1) for n, s in zip(root.shape, root.strides) if s > 0)
        return low, high + root.itemsize, value.__array_interface__["data"][0]
    return None


def _layout(view) -> str:
    """A view's shape and strides (torch's in elements, numpy's in bytes)."""
    strides = view.stride() if callable(getattr(view, "stride", None)) else view.strides
    return f"{tuple(view.shape)}/{tuple(strides)}"


def tensor_attributes(module) -> dict:
    """Plain tensor attributes (not parameters or buffers) a forward may have written."""
    import torch  # noqa: PLC0415

    out = {}
    for name, sub in module.named_modules():
        for key, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and not key.startswith("_"):
                out[f"{name}.{key}" if name else key] = value
    return out
