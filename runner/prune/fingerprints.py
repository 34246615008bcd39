"""Fingerprints of whatever a module call takes or returns: nested tuples, lists, dicts and
plain objects, with `fastci.kernels` fingerprints at the tensor leaves.

A fingerprint tree is a flat dict `{path: leaf}` (`out[0]`, `out.logits`, `grad.weight`):
a tensor leaf is its 64-bit hash (hex) with dtype, shape and the tolerance summaries; any
other leaf is its type and a short repr. Two trees are equal exactly when every leaf is.
Imported only by processes that already imported torch.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import sys
import types
from pathlib import PurePath
from typing import Any, Iterator

import torch

from fastci.kernels._common import dtype_name
from fastci.kernels.fingerprint import fingerprint, tensor_hash

MAX_DEPTH = 6
MAX_REPR = 120
_CHECKOUT: tuple[str, ...] = ()  # the tree's root in this process, and its real path


def set_checkout(*roots: str) -> None:
    """Where the code under test lives in this process: strings and paths under it count as
    relative to it, so a value that names a file of the tree (`base_dir` of a loaded
    config) fingerprints alike in the test's checkout and in a replay's copy of the tree
    (the evidence's code is replayed in a folder of its own; a replay also names the
    recording's checkout, which a path the test passed still points into). Module state is
    digested the same way (`state.py`)."""
    global _CHECKOUT
    found = {r.rstrip(os.sep) for r in roots if r} | {os.path.realpath(r) for r in roots if r}
    _CHECKOUT = tuple(sorted((r for r in found if len(r) > 1), key=len, reverse=True))
    _hiding.clear()  # which classes are the tree's depends on where it is


def _unrooted(text: str) -> str:
    for root in _CHECKOUT:
        if root in text:
            text = text.replace(root, "<root>")
    return text
_PRIMITIVES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def walk(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, leaf) for every leaf of a nested value, tensors included, in a fixed order."""
    if isinstance(value, torch.Tensor) or isinstance(value, _PRIMITIVES) or depth >= MAX_DEPTH:
        yield path, value
    elif isinstance(value, (tuple, list)):
        if not value:
            yield path, value
        for i, item in enumerate(value):
            yield from walk(item, f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        if not value:
            yield path, value
        for key in sorted(value, key=repr):
            yield from walk(value[key], f"{path}[{key!r}]", depth + 1)
    elif isinstance(value, torch.nn.Module):
        yield path, f"<module {type(value).__qualname__}>"  # its state is fingerprinted apart
    elif hasattr(value, "__dict__") and not callable(value):
        yield path, f"<{type(value).__qualname__}>"
        for key in sorted(vars(value)):
            yield from walk(vars(value)[key], f"{path}.{key}", depth + 1)
    else:
        yield path, f"<{type(value).__qualname__}>"


def tensor_leaf(t: torch.Tensor, summaries: bool = True) -> dict:
    """The hash (with dtype and shape), and with `summaries` the tolerance statistics."""
    t = t.detach()
    if t.is_sparse or t.is_quantized or t.device.type == "meta" or t.is_complex():
        return {"error": f"cannot fingerprint a {t.layout} {t.dtype} tensor on {t.device}"}
    backend = "torch" if t.device.type == "cpu" else "auto"
    if not summaries:  # recording: the hash alone proves a replay reproduced the call
        return {"hash": f"{tensor_hash(t, backend=backend):016x}",
                "dtype": dtype_name(t.dtype), "shape": [int(d) for d in t.shape]}
    fp = fingerprint(t, backend=backend)
    return {"hash": f"{fp.hash:016x}", "dtype": fp.dtype, "shape": list(fp.shape),
            "sum": _finite(fp.sum), "sumsq": _finite(fp.sumsq), "absmax": _finite(fp.absmax),
            "nans": fp.nans, "infs": fp.infs}


def fingerprints(value: Any, prefix: str, summaries: bool = True) -> dict[str, dict]:
    out = {}
    for path, leaf in walk(value, prefix):
        if isinstance(leaf, torch.Tensor):
            out[path] = tensor_leaf(leaf, summaries)
        elif isinstance(leaf, float) and not math.isfinite(leaf):
            out[path] = {"repr": repr(leaf)}
        elif isinstance(leaf, (str, bytes)):
            out[path] = {"repr": _unrooted(repr(leaf))[:MAX_REPR]}
        else:
            out[path] = {"repr": _unrooted(repr(leaf) if isinstance(leaf, _PRIMITIVES)
                                           or isinstance(leaf, (tuple, list, dict))
                                           else str(leaf))[:MAX_REPR]}
    return out


# Exactly these types (not subclasses) pickle by value, hold no tree path and hide no
# state: `exact_digest` lets them through at once. Their items are asked for on their own.
_PICKLED_AS_IS = frozenset({int, float, bool, complex, bytes, type(None), tuple, list, dict})
_PICKLING = ("__getstate__", "__reduce__", "__reduce_ex__", "__getnewargs__",
             "__getnewargs_ex__")
_hiding: dict[type, bool] = {}


def _hides_state(cls: type) -> bool:
    """Whether a class of the tree under test decides itself what pickling keeps of it (a
    tokenizer that drops its lookup cache): what pickle saves and compares is then not its
    whole state, and new code that leaves the dropped part otherwise replays equal. The
    methods `dataclass(slots=True)` writes keep every field."""
    known = _hiding.get(cls)
    if known is None:
        known = False
        for base in cls.__mro__[:-1]:
            module = sys.modules.get(base.__module__)
            path = os.path.realpath(getattr(module, "__file__", None) or "")
            if not _CHECKOUT or not any(path.startswith(r + os.sep) for r in _CHECKOUT):
                continue
            own = vars(base)
            if any(name in own and getattr(own[name], "__module__", None) != "dataclasses"
                   for name in _PICKLING):
                known = True
                break
        _hiding[cls] = known
    return known


def exact_digest(value: Any, values: bool = True) -> str:
    """A sha256 of the whole value: pickled, with each tensor standing as its hash, dtype,
    shape, strides, device and requires_grad. Unlike `fingerprints` it has no depth or
    length limit, so two values with one digest are equal all the way down (a function's
    return is often a config, a long string or an object graph). Sets are written in sorted
    order: their iteration order follows string hashes, which differ per process (every
    nn.Module holds one, `_non_persistent_buffers_set`), so a replay never matched a
    recorded model. Other equal values can still differ here: that keeps a test, never
    prunes one. Raises when the value cannot be pickled (a lambda, a lock): the call is then
    not replayable. Without `values` tensors stand by all but their hash: the structure a
    tolerance comparison still requires to be equal."""
    import io  # noqa: PLC0415
    import pickle  # noqa: PLC0415

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            kind = type(obj)
            if kind in _PICKLED_AS_IS:  # pickle asks for every object: most are these
                return None
            if kind is str:  # a path under the tree, wherever the tree is
                return ("str", _unrooted(obj)) if any(r in obj for r in _CHECKOUT) else None
            if _CHECKOUT:
                if isinstance(obj, PurePath):  # (pickled as its parts: no part holds a root)
                    return type(obj).__name__, _unrooted(str(obj))
            if type(obj) in (set, frozenset):  # (pickle calls no reducer_override for sets)
                return type(obj).__name__, _in_order(obj)
            if _hides_state(type(obj)):
                raise TypeError(f"{type(obj).__qualname__} pickles part of its state "
                                "(its own __getstate__ or __reduce__): a replay could not "
                                "see the rest")
            if isinstance(obj, torch.Tensor):
                t = obj.detach()
                if values:
                    leaf = tensor_leaf(t, summaries=False)
                    if "error" in leaf:
                        raise TypeError(leaf["error"])
                    value = leaf["hash"]
                else:
                    value = ""
                # its gradient (a call that clips or sets it), and what Python attributes
                # it carries (`p.no_decay = True`): pickled in turn, through this method
                return ("tensor", value, str(t.dtype), tuple(t.shape), tuple(t.stride()),
                        t.device.type, t.layout, obj.requires_grad, _grad(obj),
                        _tensor_attributes(obj))
            return None

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=4).dump(value)
    return _short_hash(buffer.getvalue())


def _grad(t: torch.Tensor) -> torch.Tensor | None:
    """A leaf's gradient (a non-leaf has none of its own, and asking warns)."""
    return t.grad if t.is_leaf else None


def _tensor_attributes(t: torch.Tensor) -> dict:
    """The Python attributes set on a tensor or parameter (`sequence_parallel`, `no_decay`)."""
    try:
        return dict(t.__dict__)
    except AttributeError:  # a tensor subclass without a __dict__
        return {}


def _with_grad(rebuild, args: tuple, grad: torch.Tensor) -> torch.Tensor:
    """Unpickles a tensor that `saving_grads` saved with its gradient."""
    tensor = rebuild(*args)
    tensor.grad = grad
    return tensor


class _GradPickler(pickle.Pickler):
    """Pickles a leaf tensor with its gradient, which a tensor's own pickling drops: a
    call that clips or reads gradients (`clip_grad_norm_`) replays on what the test had."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.is_leaf and obj.grad is not None:
            reduced = obj.__reduce_ex__(2)
            if len(reduced) != 2:
                raise TypeError(f"a {type(obj).__qualname__} with a gradient pickles in a "
                                "form its gradient cannot join")
            return _with_grad, (reduced[0], reduced[1], obj.grad)
        return NotImplemented


saving_grads = types.ModuleType("fastci_saving_grads")
saving_grads.__doc__ = "A `pickle_module` for torch.save that keeps tensors' gradients."
saving_grads.Pickler = _GradPickler  # type: ignore[attr-defined]


def _in_order(items: set | frozenset) -> list:
    try:
        return sorted(items)
    except TypeError:  # mixed or unorderable: by type and repr (an address in it only keeps)
        return sorted(items, key=lambda x: (type(x).__qualname__, repr(x)))


def hash_leaf(data: bytes | str) -> dict:
    """A fingerprint leaf compared by equality only: a digest of `data`."""
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    return {"hash": _short_hash(data)}


def _short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def bounded_fingerprints(value: Any, prefix: str, limit: int = 1000,
                         summaries: bool = True) -> dict[str, dict]:
    """`fingerprints`, or {} when the value has more than `limit` leaves (a dataset a
    function returned): a function's call is compared by its exact digest as well, and a
    fingerprint per element would swamp the evidence and what a runner may return."""
    import itertools  # noqa: PLC0415

    if sum(1 for _ in itertools.islice(walk(value, prefix), limit + 1)) > limit:
        return {}
    return fingerprints(value, prefix, summaries)


def tensors(value: Any, prefix: str) -> dict[str, torch.Tensor]:
    return {p: t for p, t in walk(value, prefix) if isinstance(t, torch.Tensor)}


def detached(value: Any, depth: int = 0, memo: dict | None = None) -> Any:
    """A view of a call's arguments that torch.save accepts: tensors become leaves (a
    non-leaf tensor that requires grad cannot be pickled), keeping requires_grad, their
    gradient and their Python attributes. Each stays a view of its memory, so arguments
    that share it share it in the replay too (`ema_(w, w)`, a buffer and its slice), and
    one object passed twice is one object there."""
    memo = {} if memo is None else memo
    known = memo.get(id(value))
    if known is not None:
        return known[1]
    if isinstance(value, torch.Tensor):
        copy = value.detach()
        if value.requires_grad and (copy.is_floating_point() or copy.is_complex()):
            copy.requires_grad_(True)
            if value.is_leaf and value.grad is not None:
                copy.grad = value.grad.detach()
        copy.__dict__.update(_tensor_attributes(value))
        memo[id(value)] = (value, copy)
        return copy
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        out: Any = tuple(detached(v, depth + 1, memo) for v in value)
    elif isinstance(value, list):
        out = [detached(v, depth + 1, memo) for v in value]
    elif isinstance(value, dict):
        out = {k: detached(v, depth + 1, memo) for k, v in value.items()}
    else:
        return value
    memo[id(value)] = (value, out)
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
