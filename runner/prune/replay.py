"""Replaying captured module calls in a fresh process, under one tree's code.

    python -m fastci.runner.prune.replay REQUEST.json

The request names the tree (`root`, put first on sys.path, so unpickling a module binds its
class and every function it calls to that tree's code), the captures (digest -> file) and
where to write the results. For each capture: restore torch's settings and RNG, call the
module, fingerprint what it returned, the state it left (parameters, buffers, tensor
attributes, in-place changes to its arguments, the RNG), then back-propagate a fixed upstream
gradient and fingerprint the gradients of parameters and inputs. Anything that fails is
reported per capture, never raised: the caller keeps such tests selected.

With `trace`, coverage records the lines each replay ran (under the new code these become
part of a pruned test's evidence). With `save_tensors` the tensors are kept for a later
tolerance comparison (`compare_to`) by `fastci.kernels.compare`. With `settle` (exact
pruning) the process skips captures whose tests stay selected whatever it finds
(`settle.py`). With `budget` it replays for at most that many seconds (`budget.py`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import TypedDict

from fastci.runner.prune.budget import Deadline
from fastci.runner.prune.settle import SKIPPED, Settled
from fastci.runner.prune.state import Digester, differing

UPSTREAM_SEED = 20261129


class ReplayResult(TypedDict, total=False):
    """What the replay process reports for one capture (as JSON)."""

    fingerprints: dict
    error: str | None
    close: dict  # with `compare_to`: per tensor, within tolerance of the earlier replay?
    lines: dict[str, list[int]]  # with `trace`: the lines the call executed, per path
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
    cov = None
    if request.get("trace"):
        import coverage  # noqa: PLC0415

        cov = coverage.Coverage(data_file=None, source=[root], config_file=False,
                                messages=False)
        cov.start()
    results = _replay_all(request, root, cov)
    overrides = {}
    for path, qualname, names in request.get("overrides", []):
        overrides[f"{path}::{qualname}"] = inherited(path, qualname, names)
    if cov is not None:
        cov.stop()
        data = cov.get_data()
        lines: dict[str, dict[str, list[int]]] = {d: {} for d in results}
        for filename in data.measured_files():
            rel = os.path.relpath(os.path.realpath(filename), root)
            if rel.startswith(".."):
                continue
            for line, contexts in data.contexts_by_lineno(filename).items():
                for context in contexts:
                    if context in lines:
                        lines[context].setdefault(rel, []).append(line)
        for digest, by_path in lines.items():
            results[digest]["lines"] = {p: sorted(set(ls)) for p, ls in by_path.items()}
    with open(request["out"], "w") as f:
        json.dump({"captures": results, "overrides": overrides}, f)
    return 0


def _settled(request: dict) -> Settled | None:
    """With `settle` (exact pruning), which captures this process may skip."""
    plan = request.get("settle")
    if not plan:
        return None
    return Settled(plan["groups"], plan["settled"], plan.get("recorded"))


def _replay_all(request: dict, root: str, cov) -> dict[str, ReplayResult]:
    """Each capture's result, in the request's order: skipped where settled, cut off where
    the budget ran out."""
    settled = _settled(request)
    deadline = Deadline(_budget(request))
    results: dict[str, ReplayResult] = {}
    for digest, path in request["captures"].items():
        if settled is not None and settled.skip(digest):
            results[digest] = {"fingerprints": {}, "error": SKIPPED, "seconds": 0.0,
                               "load_seconds": 0.0}
            continue
        if cov is not None:
            cov.switch_context(digest)
        result = deadline.call(replay, path, root, request.get("save_tensors"),
                               request.get("compare_to"), digest)
        results[digest] = deadline.result() if result is None else result  # type: ignore[assignment]
        if settled is not None:
            settled.replayed(digest, results[digest])
    return results


def _start_up() -> None:
    """What every replay's first call would pay once, paid before the budget's clock starts:
    torch and the fingerprints (a zygote's fork has them already), and the deterministic
    switch a replay sets, whose first use imports dynamo and sympy (a second)."""
    import torch  # noqa: PLC0415

    from fastci.runner.prune import fingerprints  # noqa: F401, PLC0415

    torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled())


def _budget(request: dict) -> float | None:
    """The seconds this process may replay for (`budget.py`); None: no limit."""
    seconds = request.get("budget")
    return None if seconds is None else max(0.0, float(seconds))


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

    from fastci.runner.prune.fingerprints import fingerprints, tensor_leaf, tensors  # noqa: PLC0415

    loading = time.perf_counter()
    saved = torch.load(path, weights_only=False, map_location=None)
    timing["load"] = time.perf_counter() - loading
    module, args, kwargs = saved["module"], saved["args"], saved["kwargs"]
    _check_code(module, root)
    _check_state(saved.get("state"), root)
    settings = saved["settings"]
    torch.set_num_threads(settings["threads"])
    torch.set_default_dtype(getattr(torch, settings["default_dtype"].split(".")[-1]))
    torch.use_deterministic_algorithms(settings["deterministic"])
    torch.set_rng_state(saved["rng"])
    if saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    with torch.set_grad_enabled(settings["grad"]):
        out = module(*args, **kwargs)
    prints = {**fingerprints(out, "out"),
              **fingerprints(module.state_dict(), "state"),
              **fingerprints(_tensor_attributes(module), "attr"),
              **fingerprints((args, kwargs), "args"),
              "rng": tensor_leaf(torch.get_rng_state())}
    kept = {**tensors(out, "out"), **tensors(module.state_dict(), "state")}
    outs = [t for t in tensors(out, "out").values()
            if t.requires_grad and t.is_floating_point()]
    if outs:
        generator = torch.Generator().manual_seed(UPSTREAM_SEED)
        upstream = [torch.randn(t.shape, generator=generator, dtype=torch.float32)
                    .to(dtype=t.dtype, device=t.device) for t in outs]
        torch.autograd.backward(outs, upstream)
        grads = {f"grad.{n}": p.grad for n, p in module.named_parameters()
                 if p.grad is not None}
        grads.update({f"grad.{p}": t.grad for p, t in tensors((args, kwargs), "args").items()
                      if t.grad is not None})
        prints.update(fingerprints(grads, "grads"))
        kept.update(tensors(grads, "grads"))
    return prints, kept


def _tensor_attributes(module) -> dict:
    """Plain tensor attributes (not parameters or buffers) a forward may have written."""
    import torch  # noqa: PLC0415

    out = {}
    for name, sub in module.named_modules():
        for key, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and not key.startswith("_"):
                out[f"{name}.{key}" if name else key] = value
    return out


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
              for key in differing(names, digester.module(sys.modules[name]))]
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
