"""Fused cross-entropy: a Triton kernel pair and its torch reference.

The forward kernel computes, per row, an online (single pass) logsumexp over
the vocabulary and the loss ``lse - logit[target]``; it saves ``lse`` so the
backward kernel can rebuild the softmax without a second reduction. The
backward writes ``(softmax - onehot(target)) * grad_row`` straight into a
logits-shaped buffer, so the full fp32 softmax is never materialised.

Each program handles a tile of BLOCK_M rows: the vocabularies here are small
(a few hundred entries), and one row per program would leave most of a GPU
tile idle (and makes the Triton CPU interpreter needlessly slow).

Dispatch: the kernel runs for CUDA tensors, and for CPU tensors when
TRITON_INTERPRET=1 was set before triton was imported; otherwise (or when
triton is not installed) the torch reference is used, so the package stays
importable and correct everywhere.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from tinyllm.data.packing import IGNORE_INDEX

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None

# triton.jit picks interpreter or compiler at decoration time, so the
# environment at import time is what counts.
TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Upper bounds on the tile: BLOCK_V columns per loop step, and at most
# MAX_TILE elements (BLOCK_M * BLOCK_V) per program.
MAX_BLOCK_V = 1024
MAX_TILE = 16384


# --------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------


def cross_entropy_reference(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX, reduction: str = "mean"
) -> torch.Tensor:
    """Torch cross-entropy in fp32 over the last dim; the numerical contract for the kernel."""
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=ignore_index,
        reduction=reduction,
    )
    return loss.view(targets.shape) if reduction == "none" else loss


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _ce_forward_kernel(
        logits_ptr, targets_ptr, loss_ptr, lse_ptr,
        n_rows, n_cols, stride_row, ignore_index,
        BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < n_rows
        # Out-of-range rows re-read the last row; their results are never stored.
        safe_rows = tl.minimum(rows, n_rows - 1).to(tl.int64)
        row_ptrs = logits_ptr + safe_rows * stride_row

        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(row_ptrs[:, None] + cols[None, :], mask=cols[None, :] < n_cols, other=float("-inf"))
            x = x.to(tl.float32)
            new_max = tl.maximum(running_max, tl.max(x, axis=1))
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max[:, None]), axis=1)
            running_max = new_max
        lse = running_max + tl.log(running_sum)

        target = tl.load(targets_ptr + safe_rows)
        valid = target != ignore_index
        target_logit = tl.load(row_ptrs + tl.where(valid, target, 0)).to(tl.float32)
        loss = tl.where(valid, lse - target_logit, 0.0)
        tl.store(loss_ptr + rows, loss, mask=row_mask)
        tl.store(lse_ptr + rows, lse, mask=row_mask)

    @triton.jit
    def _ce_backward_kernel(
        logits_ptr, targets_ptr, lse_ptr, grad_loss_ptr, grad_logits_ptr,
        n_rows, n_cols, stride_row, stride_grad_row, ignore_index,
        BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < n_rows
        safe_rows = tl.minimum(rows, n_rows - 1).to(tl.int64)
        row_ptrs = logits_ptr + safe_rows * stride_row
        grad_row_ptrs = grad_logits_ptr + safe_rows * stride_grad_row

        lse = tl.load(lse_ptr + safe_rows)
        target = tl.load(targets_ptr + safe_rows)
        grad_loss = tl.load(grad_loss_ptr + safe_rows).to(tl.float32)
        # Ignored rows contributed a constant 0 to the loss: zero gradient.
        grad_loss = tl.where(target != ignore_index, grad_loss, 0.0)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            col_mask = cols[None, :] < n_cols
            x = tl.load(row_ptrs[:, None] + cols[None, :], mask=col_mask, other=0.0).to(tl.float32)
            probs = tl.exp(x - lse[:, None])
            is_target = (cols[None, :] == target[:, None]).to(tl.float32)
            grad = (probs - is_target) * grad_loss[:, None]
            tl.store(
                grad_row_ptrs[:, None] + cols[None, :],
                grad.to(grad_logits_ptr.dtype.element_ty),
                mask=row_mask[:, None] & col_mask,
            )


def _tile(n_cols: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_V) for a vocabulary of ``n_cols``."""
    block_v = min(triton.next_power_of_2(n_cols), MAX_BLOCK_V)
    block_m = max(1, min(64, MAX_TILE // block_v))
    return block_m, block_v


def _launch_forward(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = logits.shape
    loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    block_m, block_v = _tile(n_cols)
    grid = (triton.cdiv(n_rows, block_m),)
    _ce_forward_kernel[grid](
        logits, targets, loss, lse, n_rows, n_cols, logits.stride(0), ignore_index,
        BLOCK_M=block_m, BLOCK_V=block_v,
    )
    return loss, lse


def _launch_backward(
    logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    n_rows, n_cols = logits.shape
    grad_logits = torch.empty_like(logits)
    block_m, block_v = _tile(n_cols)
    grid = (triton.cdiv(n_rows, block_m),)
    _ce_backward_kernel[grid](
        logits, targets, lse, grad_loss.contiguous(), grad_logits,
        n_rows, n_cols, logits.stride(0), grad_logits.stride(0), ignore_index,
        BLOCK_M=block_m, BLOCK_V=block_v,
    )
    return grad_logits


class TritonCrossEntropy(torch.autograd.Function):
    """Per-row losses from the fused kernel; reductions happen in torch."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        logits = logits.contiguous()
        targets = targets.contiguous()
        loss, lse = _launch_forward(logits, targets, ignore_index)
        ctx.save_for_backward(logits, targets, lse)
        ctx.ignore_index = ignore_index
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        grad_logits = _launch_backward(logits, targets, lse, grad_loss, ctx.ignore_index)
        return grad_logits, None, None


# --------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------


def triton_available(tensor: torch.Tensor) -> bool:
    """Whether the Triton kernel can run on ``tensor``'s device."""
    if triton is None:
        return False
    return tensor.is_cuda or (tensor.device.type == "cpu" and TRITON_INTERPRET)


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    reduction: str = "mean",
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``logits`` [..., V] against ``targets`` [...].

    ``use_triton=None`` picks the kernel when :func:`triton_available`; the
    reference is used otherwise. ``mean`` averages over non-ignored targets
    (NaN when all are ignored, as in torch).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"unknown reduction {reduction!r}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match")
    if use_triton is None:
        use_triton = triton_available(logits)
    if not use_triton:
        return cross_entropy_reference(logits, targets, ignore_index, reduction)
    if not triton_available(logits):
        raise RuntimeError("use_triton=True but triton cannot run on this device (set TRITON_INTERPRET=1 for CPU)")

    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_targets = targets.reshape(-1)
    losses = TritonCrossEntropy.apply(flat_logits, flat_targets, ignore_index)
    if reduction == "none":
        return losses.view(targets.shape)
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (flat_targets != ignore_index).sum()
