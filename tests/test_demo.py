"""The bundled example: its own suite is green, and `fastci demo` runs the loop on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tinyllm"


def test_every_bundled_change_names_its_patch_and_expected_failures():
    changes = yaml.safe_load((EXAMPLE / "changes" / "changes.yaml").read_text())["changes"]
    names = {c["name"] for c in changes}
    assert {"docstring_edit", "refactor_identical", "config_default", "data_filter_threshold",
            "rope_bug", "kernel_backward_bug", "sparse_attention_change", "test_edit",
            "dependency_bump", "rank0_summary_bug", "worker_filter_bug", "metrics_reader_bug",
            "weights_asset_edit"} <= names
    for change in changes:
        assert (EXAMPLE / "changes" / change["patch"]).is_file()
        assert change["expect_failures"] == bool(change["failing_tests"])


def test_demo_selects_and_catches_on_a_subset_of_changes(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fastci", "demo", "--workdir", str(tmp_path),
         "--only", "sparse_attention_change", "--only", "docstring_edit",
         "--only", "worker_filter_bug"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "docstring_edit: selected 0/368" in out
    # A bug only DataLoader workers run: the one test whose workers ran it, and it fails.
    assert "worker_filter_bug: selected 1/368" in out
    assert "known failures missed: 0" in out
    row = next(line for line in out.splitlines() if line.startswith("sparse_attention_change"))
    assert " 7/7 " in row  # every known failure caught
    row = next(line for line in out.splitlines() if line.startswith("worker_filter_bug"))
    assert " 1/1 " in row
    html = (tmp_path / "report.html").read_text()
    assert "<svg" in html and "sparse_attention_change" in html and "worker_filter_bug" in html


def test_demo_rejects_an_unknown_change(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastci", "demo", "--workdir", str(tmp_path),
                           "--only", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown change(s) nope" in proc.stderr
    assert "Traceback" not in proc.stderr
