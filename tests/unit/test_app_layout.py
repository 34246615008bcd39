"""app/ follows the flow: one module per job around shared steps, each importable on its
own, no private name reached across modules, no import cycle (lazy imports included), and
imports that flow one way (fastci -> app -> runner -> kernels)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
MODULES = sorted(p.stem for p in APP.glob("*.py") if p.stem != "__init__")


def imports(module: str) -> list[tuple[str, list[str]]]:
    """(imported app module, names) for every import in `module`, at any depth."""
    tree = ast.parse((APP / f"{module}.py").read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level == 1:
                if node.module is None:  # from . import x, y
                    out += [(n, []) for n in names]
                else:
                    out.append((node.module, names))
            elif node.module and node.module.startswith("fastci.app"):
                rest = node.module.removeprefix("fastci.app").lstrip(".")
                out += [(rest, names)] if rest else [(n, []) for n in names]
        elif isinstance(node, ast.Import):
            out += [(a.name.removeprefix("fastci.app."), []) for a in node.names
                    if a.name.startswith("fastci.app.")]
    return out


def test_the_jobs_have_modules_of_their_own():
    for job in ("jobs", "pull_request", "shards", "background", "refresh", "planning",
                "context", "runs", "commands"):
        assert job in MODULES
    assert len((APP / "jobs.py").read_text().splitlines()) < 60  # only the entry point


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_on_its_own(module):
    proc = subprocess.run([sys.executable, "-c", f"import fastci.app.{module}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_no_private_name_crosses_a_module():
    crossing = [(m, target, n) for m in MODULES for target, names in imports(m)
                for n in names if n.startswith("_")]
    assert not crossing


def test_app_modules_import_in_no_cycle():
    graph = {m: {t for t, _ in imports(m) if t in MODULES} for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, (*path, module))
        done.add(module)

    for module in MODULES:
        visit(module, ())


def test_imports_flow_one_way():
    """The engine (runner/) and the kernels never import the App or the CLI."""
    root = APP.parent
    for folder, forbidden in (("runner", ("fastci.app", "fastci.cli", "fastci.demo")),
                              ("kernels", ("fastci.app", "fastci.runner", "fastci.cli"))):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith(forbidden), (path, node.module)
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        assert not alias.name.startswith(forbidden), (path, alias.name)
