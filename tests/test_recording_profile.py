"""`FASTCI_RECORD_PROFILE`: recording's parts timed, the evidence unchanged.

A profiled recording must record what an unprofiled one records (the timers sit around the
recorder's parts, and a read by string still classifies the caller's site, not the
timer's), and it must write each part's seconds and calls. Unset, the plugin never imports
the profiling module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LIBRARY, Project

_NOISE = {"duration", "peak_memory"}


def _record(project: Project, out: Path, profile: Path | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(project.root)}
    env.pop("FASTCI_STORE", None)
    env.pop("FASTCI_RECORD_PROFILE", None)
    if profile is not None:
        env["FASTCI_RECORD_PROFILE"] = str(profile)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fastci-record",
         f"--fastci-out={out}", f"--rootdir={project.root}"],
        cwd=project.root, text=True, capture_output=True, env=env, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    tests = {}
    for test in data["tests"]:
        test = {k: v for k, v in test.items() if k not in _NOISE}
        if test.get("modules"):  # the pickles' bytes come from torch, not the recorder
            test["modules"] = {**test["modules"], "captures": [
                {k: v for k, v in c.items() if k in ("index", "module", "lines", "why")}
                for c in test["modules"]["captures"]]}
        tests[test["test_id"]] = test
    return {"tests": tests, "import_time": data["import_time"],
            "session_files": data["session_files"]}


def _profiled(project: Project, tmp_path: Path) -> dict:
    plain = _record(project, tmp_path / "plain.json", None)
    timed = _record(project, tmp_path / "timed.json", tmp_path / "profile.json")
    assert timed == plain
    return json.loads((tmp_path / "profile.json").read_text())["parts"]


def test_a_profiled_recording_records_the_same_and_times_its_parts(tmp_path):
    project = Project(tmp_path / "repo")
    project.write(LIBRARY)
    project.commit("library")
    parts = _profiled(project, tmp_path)
    for part in ("contexts (switches)", "audit hook (open, spawn, list)",
                 "memo and module scan", "end of session: evidence"):
        assert parts[part]["calls"] > 0 and parts[part]["seconds"] >= 0, part
    assert not any(p.startswith("capture:") for p in parts)  # no torch: nothing captured


def test_a_profiled_recording_times_capture_apart(tmp_path):
    pytest.importorskip("torch")
    from test_prune import NET

    project = Project(tmp_path / "repo")
    project.write(NET)
    project.commit("net")
    parts = _profiled(project, tmp_path)
    for part in ("capture: torch.save", "capture: fingerprints", "capture: signatures",
                 "capture: context switches", "capture: bookkeeping"):
        assert parts[part]["calls"] > 0, part
    assert "(test code)" not in parts  # the modules' own forward is not a cost


def test_the_plugin_imports_no_profiling_unless_asked(tmp_path):
    project = Project(tmp_path / "repo")
    project.write({"tests/test_one.py": """
        import sys


        def test_one():
            assert "fastci.runner.record.profile" not in sys.modules
    """})
    project.commit("one")
    env = {k: v for k, v in os.environ.items() if k != "FASTCI_RECORD_PROFILE"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--fastci-record", f"--fastci-out={tmp_path / 'out.json'}"],
                          cwd=project.root, text=True, capture_output=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:]


COMPILED = {
    "pkg/__init__.py": "",
    "pkg/layer.py": (
        "import torch\n\n\n"
        "class Double(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2\n"),
    "tests/test_compiled.py": (
        "import torch\n\n"
        "from pkg.layer import Double\n\n\n"
        "def test_a_module_compiles_as_one_graph():\n"
        "    compiled = torch.compile(Double(), backend='eager', fullgraph=True)\n"
        "    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))\n"),
}


def test_a_profiled_recording_leaves_torch_compile_fullgraph_working(tmp_path):
    """torch.compile traces the capture's check inside every module call; a timer there is
    a graph break, and fullgraph=True then fails the test (einops' own suite did): the
    profile must measure the suite as it is, not a suite it broke."""
    pytest.importorskip("torch")
    project = Project(tmp_path / "repo")
    project.write(COMPILED)
    project.commit("compiled")
    env = {**os.environ, "PYTHONPATH": str(project.root),
           "FASTCI_RECORD_PROFILE": str(tmp_path / "profile.json")}
    env.pop("FASTCI_STORE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fastci-record",
         f"--fastci-out={tmp_path / 'out.json'}", f"--rootdir={project.root}"],
        cwd=project.root, text=True, capture_output=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((tmp_path / "profile.json").read_text())["parts"]
