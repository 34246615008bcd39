"""Data-parallel training under torchrun: two ranks, one process each.

The regression launches the real thing (``python -m torch.distributed.run``),
gloo on the CPU, NCCL where each rank has a GPU of its own, and checks what
rank 0 alone reports against the golden losses of tests/golden/ddp_tiny.json
(scripts/update_golden.py).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tinyllm.train.distributed import pick_backend, rank_slice
from tinyllm.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RANKS = 2


def torchrun(log_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run`` on this machine, the project importable; the
    agent's folders go under ``log_dir``, not the system's temporary folder. Ranks on the
    CPU (gloo) run the Triton kernel in the interpreter, as the suite does without CUDA,
    also on a machine whose one GPU cannot hold both ranks."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if pick_backend(RANKS) == "gloo":
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
         "--log-dir", str(log_dir), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.correctness
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_rank_slices_split_the_batch_without_overlap(world_size):
    slices = [rank_slice(8, rank, world_size) for rank in range(world_size)]
    covered = [i for s in slices for i in range(8)[s]]
    assert covered == list(range(8))


@pytest.mark.correctness
def test_a_batch_that_does_not_split_over_the_ranks_is_refused():
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        rank_slice(8, 0, 3)


@pytest.mark.correctness
def test_nccl_only_when_every_rank_has_a_gpu():
    enough = torch.cuda.is_available() and torch.cuda.device_count() >= RANKS
    assert pick_backend(RANKS) == ("nccl" if enough else "gloo")


@pytest.mark.convergence
def test_data_parallel_training_matches_golden(tmp_path, load_golden, tiny_config):
    golden = load_golden("ddp_tiny")
    out = tmp_path / "run"
    proc = torchrun(tmp_path / "torchrun", "-m", "tinyllm.train.distributed", "configs/tiny.yaml",
                    "--steps", str(golden["steps"]), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Rank 0 alone writes the metrics and logs the summary.
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]
    assert proc.stdout.count("data-parallel run: 2 ranks") == 1, proc.stdout
    metrics = read_metrics(out / "metrics.json")
    assert metrics["world_size"] == RANKS
    assert metrics["backend"] == pick_backend(RANKS)
    assert metrics["weights_in_sync"] is True
    assert metrics["steps"] == golden["steps"]
    assert metrics["tokens"] == golden["steps"] * tiny_config.train.batch_size * tiny_config.data.seq_len
    tol = golden["tolerance"][metrics["device"]]
    torch.testing.assert_close(
        torch.tensor(metrics["losses"], dtype=torch.float64),
        torch.tensor(golden["losses"], dtype=torch.float64),
        atol=tol["atol"],
        rtol=tol["rtol"],
    )
    assert metrics["eval_loss"] == pytest.approx(golden["eval_loss"], abs=tol["atol"], rel=tol["rtol"])
