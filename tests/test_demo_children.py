"""tinyllm's children and native readers, end to end: one recording, one selection per change.

examples/tinyllm has a torchrun test (two ranks; only rank 0 writes the run's metrics), a
DataLoader test whose filters run only in its two workers, a test that runs the training
command in a subprocess, and a test whose checkpoint torch reads natively (a memory map, never
Python's `open`). Each of the demo changes made for them must select exactly the tests whose
processes ran it. The sets are built so that an unsound merge selects another one: children's
evidence dropped (the torchrun, DataLoader and command tests go unselected), credited to another
test (an extra test), rank 0's evidence lost (the rank-0 change selects nothing), or children
still marking their test for every change (the parent-only change selects the DataLoader test).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Project

from fastci.runner.store import open_store

TINYLLM = Path(__file__).resolve().parents[1] / "examples" / "tinyllm"
CHANGES = TINYLLM / "changes"

DDP = "tests/test_distributed.py::test_data_parallel_training_matches_golden"
LOADER = "tests/test_dataloader.py::test_workers_filter_and_tokenize_the_corpus"
COMMAND = "tests/test_train_command.py::test_training_command_matches_the_golden_warmup"
ROUND_TRIP = "tests/test_train_command.py::test_metrics_round_trip_and_refuse_foreign_files"
WEIGHTS = "tests/test_checkpointing.py::test_checked_in_weights_reproduce_the_golden_eval_loss"

# Each demo change, and the tests whose processes run the code it changes.
EXPECTED = {
    "rank0_summary_bug": {DDP},  # run_summary: rank 0 of the torchrun test, no one else
    "worker_filter_bug": {LOADER},  # symbol_ratio: the DataLoader's two workers only
    "metrics_reader_bug": {DDP, COMMAND, ROUND_TRIP},  # read_metrics: test processes only
    "weights_asset_edit": {WEIGHTS},  # the checkpoint torch.from_file maps
}


def _tinyllm(tmp_path: Path) -> Project:
    repo = tmp_path / "tinyllm"
    shutil.copytree(TINYLLM, repo, ignore=shutil.ignore_patterns(
        "__pycache__", ".fastci", ".pytest_cache", "changes"))
    project = Project.at(repo)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "tinyllm"]):
        project.git(*args)
    return project


def _selected(project: Project) -> dict[str, list[str]]:
    return {t["id"]: t["reasons"] for t in project.select()["tests"]
            if t["decision"] == "selected"}


@pytest.mark.slow
def test_each_change_selects_exactly_the_tests_whose_processes_ran_it(tmp_path):
    project = _tinyllm(tmp_path)
    project.record()
    head = project.git("rev-parse", "HEAD")
    with open_store(str(project.root / ".fastci" / "evidence.db"), create=False) as store:
        key, _ = store.snapshot_envs(head)[0]
        tests = store.load_snapshot(head, key).tests
    # What the children left in their tests' evidence.
    backend = "nccl" if _gpus() >= 2 else "gloo"
    assert tests[DDP].ranks == (f"{backend}:2",)
    assert "run_summary" in tests[DDP].blocks["tinyllm/train/distributed.py"]
    assert "read_metrics" in tests[DDP].blocks["tinyllm/train/metrics.py"]
    assert "main" in tests[COMMAND].blocks["tinyllm/train/__main__.py"]
    # The ranks, the command and the DataLoader's workers (forks of the test's process)
    # captured their calls (child_capture.py): what ran there may be pruned, where it ran
    # inside a captured call; the workers' filters ran outside any.
    assert not tests[DDP].child_blocks and not tests[COMMAND].child_blocks
    assert not tests[LOADER].child_blocks
    assert "symbol_ratio" in tests[LOADER].blocks["tinyllm/data/filters.py"]
    assert "tests/golden/tiny_weights.f32" in tests[WEIGHTS].files and tests[WEIGHTS].file_events
    kernels = {"tinyllm/kernels/cross_entropy.py::_ce_forward_kernel",
               "tinyllm/kernels/cross_entropy.py::_ce_backward_kernel"}
    if _triton():  # only the ranks and the command's process launch them
        assert kernels <= set(tests[DDP].kernels) and kernels <= set(tests[COMMAND].kernels)

    selections = {}
    for name, expected in EXPECTED.items():
        project.git("apply", str(CHANGES / f"{name}.patch"))
        selections[name] = _selected(project)
        assert set(selections[name]) == expected, (name, selections[name])
        project.git("checkout", "--", ".")
    assert selections["rank0_summary_bug"][DDP][0].startswith(
        "executed changed code: tinyllm/train/distributed.py::run_summary (modified")
    assert selections["weights_asset_edit"][WEIGHTS][0] == \
        "read a changed file: tests/golden/tiny_weights.f32 (changed)"

    if _triton():  # a kernel bug selects the tests whose children launched the kernel
        project.git("apply", str(CHANGES / "kernel_backward_bug.patch"))
        chosen = _selected(project)
        project.git("checkout", "--", ".")
        for test in (DDP, COMMAND):
            assert any(r.startswith("launched a Triton kernel") for r in chosen[test]), \
                (test, chosen.get(test))

    # Code only the training command's own process runs selects that test alone.
    project.edit("tinyllm/train/__main__.py", 'f"trained {record', 'f"Trained {record')
    assert set(_selected(project)) == {COMMAND}
    project.git("checkout", "--", ".")


def _triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


NATIVE_READ = """
import sys
from pathlib import Path

from tinyllm.config import load_config
from tinyllm.model.transformer import build_model
from tinyllm.train.checkpointing import load_flat_weights

asset = Path("tests/golden/tiny_weights.f32").resolve()
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0]))
                 if event == "open" and str(args[0]).endswith(asset.name) else None)
model = build_model(load_config("configs/tiny.yaml").model)
load_flat_weights(asset, model)
native = list(opened)
asset.read_bytes()  # the control: a read through Python's open is seen
print(native, len(opened) - len(native), float(model.norm.weight.abs().sum()) > 0)
"""


def test_the_checkpoint_asset_is_read_by_native_code_not_pythons_open():
    """The weights test's asset is seen only through the kernel's file events: the audit hook
    the recorder listens to is never raised for it (and is, for a Python read of it)."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", NATIVE_READ], cwd=TINYLLM, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(TINYLLM)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[]", "1", "True"], proc.stdout
