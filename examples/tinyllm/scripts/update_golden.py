"""Regenerate the golden files in tests/golden/ on CPU.

Run this only after an intentional numerical change (new corpus, new
initialisation, a deliberate change to the model), and commit the new files
together with that change so the diff shows what moved.

Besides the golden losses of each config it writes the tiny run's trained
weights (tiny_weights.f32, the flat format C inference code reads), the data
pipeline's statistics, and the golden losses of a data-parallel run of the
tiny config (ddp_tiny.json: two ranks under torchrun, gloo on the CPU).

Usage: python scripts/update_golden.py [name ...]   (default: every config, and ddp_tiny)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Same execution mode as the test suite: the Triton kernel in the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tinyllm.config import load_config  # noqa: E402
from tinyllm.data.pipeline import build_dataset, build_tokenizer  # noqa: E402
from tinyllm.train.checkpointing import export_flat_weights  # noqa: E402
from tinyllm.train.metrics import read_metrics  # noqa: E402
from tinyllm.train.trainer import Trainer  # noqa: E402

GOLDEN_DIR = ROOT / "tests" / "golden"
GOLDEN_CONFIGS = ("tiny", "sparse", "shared_ffn", "layernorm")
# CPU goldens reproduce bit for bit on one machine; the slack absorbs other
# CPUs' vector widths. CUDA runs use different kernels (cuBLAS, compiled
# Triton), so they are only held to the shape of the curve.
TOLERANCE = {"cpu": {"atol": 1e-4, "rtol": 1e-5}, "cuda": {"atol": 5e-2, "rtol": 1e-2}}
DDP_GOLDEN = "ddp_tiny"
DDP_STEPS = 8
DDP_RANKS = 2


def golden_run(name: str) -> dict:
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    trainer = Trainer(cfg, device="cpu")
    result = trainer.train()
    if name == "tiny":
        export_flat_weights(trainer.model, GOLDEN_DIR / "tiny_weights.f32")
    return {
        "config": f"configs/{name}.yaml",
        "device": "cpu",
        "steps": cfg.train.steps,
        "losses": result.losses,
        "eval_loss": trainer.evaluate(),
        "tolerance": TOLERANCE,
    }


def pipeline_stats() -> dict:
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    tokenizer = build_tokenizer(cfg.data, cfg.model.vocab_size)
    return dataclasses.asdict(build_dataset(cfg.data, tokenizer).stats)


def data_parallel_run() -> dict:
    """The tiny config on DDP_RANKS ranks under torchrun, as tests/test_distributed.py runs it."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={DDP_RANKS}",
             "--log-dir", str(Path(out) / "torchrun"), "-m", "tinyllm.train.distributed", "configs/tiny.yaml",
             "--steps", str(DDP_STEPS), "--out", str(Path(out) / "run")],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}, check=True,
        )
        metrics = read_metrics(Path(out) / "run" / "metrics.json")
    return {
        "config": "configs/tiny.yaml",
        "device": "cpu",
        "world_size": metrics["world_size"],
        "backend": metrics["backend"],
        "steps": metrics["steps"],
        "losses": metrics["losses"],
        "eval_loss": metrics["eval_loss"],
        "tolerance": TOLERANCE,
    }


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in names or [*GOLDEN_CONFIGS, DDP_GOLDEN]:
        payload = data_parallel_run() if name == DDP_GOLDEN else golden_run(name)
        (GOLDEN_DIR / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
        print(f"{name}: final loss {payload['losses'][-1]:.6f}, eval {payload['eval_loss']:.6f}")
    stats = pipeline_stats()
    (GOLDEN_DIR / "pipeline_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(f"pipeline_stats: {stats}")


if __name__ == "__main__":
    main(sys.argv[1:])
