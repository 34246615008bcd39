"""`python -m tinyllm.train`: the training command, run as a user runs it, in its own process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tinyllm.train.metrics import MetricsError, read_metrics, write_metrics

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4  # all within tiny.yaml's 5 warmup steps: the same losses as the full golden run


def train_command(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "tinyllm.train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.convergence
def test_training_command_matches_the_golden_warmup(tmp_path, device, load_golden, tiny_config):
    golden = load_golden("tiny")
    proc = train_command("configs/tiny.yaml", "--steps", str(STEPS), "--device", device.type,
                         "--metrics", str(tmp_path / "metrics.json"), "--checkpoint", str(tmp_path / "last.pt"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(tmp_path / "metrics.json")
    assert proc.stdout.splitlines()[-1] == (
        f"trained {STEPS} steps on {device.type}: final loss {metrics['losses'][-1]:.4f}, "
        f"eval loss {metrics['eval_loss']:.4f}, {STEPS * tiny_config.train.batch_size * tiny_config.data.seq_len} tokens"
    )
    tol = golden["tolerance"][device.type]
    torch.testing.assert_close(
        torch.tensor(metrics["losses"], dtype=torch.float64),
        torch.tensor(golden["losses"][:STEPS], dtype=torch.float64),
        atol=tol["atol"],
        rtol=tol["rtol"],
    )
    checkpoint = torch.load(tmp_path / "last.pt", weights_only=True)
    assert checkpoint["step"] == STEPS


@pytest.mark.correctness
def test_metrics_round_trip_and_refuse_foreign_files(tmp_path):
    record = {"steps": 2, "losses": [5.0, 4.5], "eval_loss": 4.4, "tokens": 512}
    write_metrics(tmp_path / "run" / "metrics.json", record)
    assert read_metrics(tmp_path / "run" / "metrics.json") == {"format": 1, **record}
    (tmp_path / "other.json").write_text('{"steps": 2}')
    with pytest.raises(MetricsError, match="not a tinyllm metrics file"):
        read_metrics(tmp_path / "other.json")
    with pytest.raises(MetricsError, match="no metrics file"):
        read_metrics(tmp_path / "missing.json")
