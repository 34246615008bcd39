"""Train a model from a config file.

    python -m tinyllm.train configs/tiny.yaml [--steps N] [--device cpu|cuda]
        [--checkpoint PATH] [--metrics PATH]

Logs every ``train.log_every`` steps, prints a one-line summary at the end, and
optionally saves a resumable checkpoint and writes the run's metrics as JSON
(tinyllm.train.metrics). ``--steps`` shortens the run: the schedule is then
laid out over the shorter run, so the warmup steps match a full run's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from tinyllm.config import ConfigError, load_config
from tinyllm.train.metrics import write_metrics
from tinyllm.train.trainer import Trainer, make_deterministic


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tinyllm.train", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="experiment YAML (configs/*.yaml)")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: train.steps)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", type=Path, help="save a resumable checkpoint here at the end")
    parser.add_argument("--metrics", type=Path, help="write the run's metrics here (JSON)")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    return args


def summary_line(record: dict) -> str:
    return (f"trained {record['steps']} steps on {record['device']}: final loss "
            f"{record['losses'][-1]:.4f}, eval loss {record['eval_loss']:.4f}, {record['tokens']} tokens")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    make_deterministic()
    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.steps is not None:
        cfg.train.steps = args.steps
    trainer = Trainer(cfg, device=args.device)
    result = trainer.train()
    record = {
        "config": str(args.config),
        "device": trainer.device.type,
        "steps": trainer.step,
        "losses": result.losses,
        "eval_loss": trainer.evaluate(),
        "tokens": result.tokens,
    }
    if args.checkpoint is not None:
        trainer.save(args.checkpoint)
    if args.metrics is not None:
        write_metrics(args.metrics, record)
    print(summary_line(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
