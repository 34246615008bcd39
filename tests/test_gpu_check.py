"""bench/gpu_check.sh: its dry run (Triton's interpreter, tiny sizes, a subset of tinyllm)
passes every step and writes its report; bad arguments are refused with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def gpu_check(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("FASTCI_STORE", None)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, text=True,
                          capture_output=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_the_dry_run_passes_every_step_and_writes_its_report(tmp_path):
    out = tmp_path / "gpu-dry.md"
    proc = gpu_check("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = out.read_text()
    assert report.startswith("# GPU check (dry run on a CPU)")
    for step in ("environment digest", "kernels vs device copy bandwidth", "tinyllm recorded",
                 "CUDA capture replayed and pruned", "demo kernel bug caught"):
        assert f"## {step}: pass" in report, report
    assert "_ce_backward_kernel" in report  # the kernel's launch is in the evidence
    assert "Traceback" not in proc.stderr


def test_bad_arguments_are_refused_clearly():
    proc = gpu_check("--bogus")
    assert proc.returncode == 2 and "unknown argument '--bogus'" in proc.stderr
    proc = gpu_check("--out")
    assert proc.returncode == 2 and "--out needs a file" in proc.stderr
    assert gpu_check("--help").returncode == 0


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="a GPU is present")
def test_without_a_gpu_the_full_check_says_to_dry_run():
    proc = gpu_check()
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
    assert "Traceback" not in proc.stderr
