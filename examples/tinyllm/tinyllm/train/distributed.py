"""Data-parallel training: one process per rank, gradients averaged across ranks.

Launched by torchrun, one process per rank:

    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        -m tinyllm.train.distributed configs/tiny.yaml --steps 8 --out runs/ddp

Every rank builds the same model from the same seed and draws the same global
batch from the seeded sampler, then trains on its own contiguous slice of it.
Gradients are averaged with one all-reduce before each optimizer step, so the
ranks' weights stay identical; a step's loss is the mean of the ranks' losses.
The backend is NCCL when every rank has a GPU of its own, gloo (on the CPU)
otherwise. Only rank 0 reports: it logs the summary and writes metrics.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from tinyllm.config import Config, load_config
from tinyllm.train.metrics import write_metrics
from tinyllm.train.optim import clip_gradients, lr_at, set_lr
from tinyllm.train.trainer import Trainer, make_deterministic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    backend: str
    device: torch.device


def pick_backend(world_size: int) -> str:
    """NCCL needs one GPU per rank; with fewer GPUs than ranks, gloo on the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def init_distributed() -> RankInfo:
    """Join the process group torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    world_size = int(os.environ["WORLD_SIZE"])
    backend = pick_backend(world_size)
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    return RankInfo(dist.get_rank(), dist.get_world_size(), backend, device)


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    """This rank's contiguous share of a global batch."""
    if batch_size % world_size:
        raise ValueError(f"train.batch_size={batch_size} does not split over {world_size} ranks")
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def average_gradients(parameters: list[torch.Tensor], world_size: int) -> None:
    """Replace every gradient by its mean over the ranks (one all-reduce)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def mean_over_ranks(value: torch.Tensor, world_size: int) -> float:
    total = value.detach().clone()
    dist.all_reduce(total)
    return total.item() / world_size


def weights_in_sync(parameters: list[torch.Tensor]) -> bool:
    """True when every rank holds bit-identical weights (elementwise max equals min)."""
    flat = torch.cat([p.detach().flatten() for p in parameters])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return torch.equal(high, low)


def train_data_parallel(cfg: Config, info: RankInfo) -> tuple[Trainer, list[float]]:
    """Run ``cfg.train.steps`` data-parallel steps; returns the trainer and the global losses."""
    trainer = Trainer(cfg, device=info.device)
    shard = rank_slice(cfg.train.batch_size, info.rank, info.world_size)
    parameters = list(trainer.model.parameters())
    losses = []
    for step in range(cfg.train.steps):
        trainer.model.train()
        inputs, targets = trainer.next_batch()
        set_lr(trainer.optimizer, lr_at(step, cfg.train))
        _, loss = trainer.model(inputs[shard], targets[shard])
        trainer.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        average_gradients(parameters, info.world_size)
        clip_gradients(parameters, cfg.train.grad_clip)
        trainer.optimizer.step()
        trainer.step += 1
        losses.append(mean_over_ranks(loss, info.world_size))
    return trainer, losses


def run_summary(cfg: Config, info: RankInfo, losses: list[float], eval_loss: float, in_sync: bool) -> dict:
    """What rank 0 reports for the whole run; the other ranks report nothing."""
    return {
        "world_size": info.world_size,
        "backend": info.backend,
        "device": info.device.type,
        "steps": len(losses),
        "losses": losses,
        "eval_loss": eval_loss,
        "tokens": len(losses) * cfg.train.batch_size * cfg.data.seq_len,
        "weights_in_sync": in_sync,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tinyllm.train.distributed", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--steps", type=int, help="optimizer steps (default: train.steps)")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank 0's metrics.json")
    args = parser.parse_args(argv)
    if "WORLD_SIZE" not in os.environ:
        parser.error("start the ranks with torchrun (python -m torch.distributed.run --nproc_per_node=N -m ...)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    make_deterministic()
    cfg = load_config(args.config)
    if args.steps is not None:
        cfg.train.steps = args.steps
    info = init_distributed()
    try:
        trainer, losses = train_data_parallel(cfg, info)
        eval_loss = trainer.evaluate()
        in_sync = weights_in_sync(list(trainer.model.parameters()))
        if info.rank == 0:
            summary = run_summary(cfg, info, losses, eval_loss, in_sync)
            write_metrics(args.out / "metrics.json", summary)
            logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
            log.info("data-parallel run: %d ranks (%s), %d steps, final loss %.4f, eval loss %.4f",
                     info.world_size, info.backend, summary["steps"], losses[-1], eval_loss)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
