"""The composite action's script, run as GitHub Actions would run it, on a real repository."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

ACTION = Path(__file__).resolve().parents[1] / ".github" / "actions" / "select" / "action.yml"


def _script(inputs: dict[str, str]) -> str:
    step = yaml.safe_load(ACTION.read_text())["runs"]["steps"][0]
    return re.sub(r"\$\{\{ inputs\.(\w+) \}\}", lambda m: inputs[m.group(1)], step["run"])


def test_the_action_outputs_the_selected_ids(library, tmp_path):
    library.edit("calc/norms.py", "return", "return -1 * -1 *")
    outputs, summary = tmp_path / "output", tmp_path / "summary"
    env = {**os.environ, "GITHUB_OUTPUT": str(outputs), "GITHUB_STEP_SUMMARY": str(summary),
           "RUNNER_TEMP": str(tmp_path), "FASTCI_STORE": ".fastci/evidence.db"}
    script = _script({"base": "", "store": ".fastci/evidence.db", "prune": "true"})
    subprocess.run(["bash", "-c", script], cwd=library.root, env=env, check=True)
    text = outputs.read_text()
    ids = text.split("tests<<FASTCI_EOF\n", 1)[1].split("\nFASTCI_EOF", 1)[0].splitlines()
    expected = library.selected()
    assert set(ids) == expected and ids
    assert f"count={len(ids)}" in text
    assert "### FastCI selected" in summary.read_text()
