"""Pieces the fingerprint and compare kernels share: backend choice, dtype table, strided layout.

Kept free of FastCI imports (torch, triton, stdlib only) so the kernels can be vendored alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._triton import AVAILABLE, JITFunction, tl, triton

# Tensors are walked by the reference implementations in chunks of this many elements, so a
# large CPU tensor needs a few 8-byte temporaries of 1 Mi elements rather than of its size.
REF_CHUNK = 1 << 20

# Collapsed dimensions the strided kernels index directly; beyond this the launcher makes the
# tensor contiguous on its own device first (one device-side copy, never a host copy).
MAX_DIMS = 4

BACKENDS = ("auto", "triton", "torch")


@triton.jit
def strided_offsets(idx, size1, size2, size3, stride0, stride1, stride2, stride3,
                    NDIM: tl.constexpr):
    """Element offsets of logical row-major indices `idx` (int64) in a strided tensor.

    NDIM == 0 means flat and contiguous (offset == index, no division at all); otherwise the
    tensor has NDIM collapsed dimensions, dimension 0 outermost, whose size is never needed.
    """
    if NDIM == 0:
        off = idx
    else:
        rest = idx
        off = tl.zeros_like(idx)
        if NDIM >= 4:
            off += (rest % size3) * stride3
            rest = rest // size3
        if NDIM >= 3:
            off += (rest % size2) * stride2
            rest = rest // size2
        if NDIM >= 2:
            off += (rest % size1) * stride1
            rest = rest // size1
        off += rest * stride0
    return off


# Triton decides interpreter-or-compiler when a function is decorated, i.e. when this module
# is imported; what matters afterwards is what the decorator produced, not the environment.
INTERPRETED = not isinstance(strided_offsets, JITFunction)


def use_triton(t: torch.Tensor, backend: str) -> bool:
    """True to run the Triton kernels: CUDA tensors, or CPU tensors under the interpreter."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "torch":
        return False
    runnable = AVAILABLE and (t.is_cuda or (t.device.type == "cpu" and INTERPRETED))
    if backend == "triton" and not AVAILABLE:
        raise ValueError("backend='triton' needs Triton, which is not installed "
                         "(`pip install triton`)")
    if backend == "triton" and not runnable:
        raise ValueError(
            f"backend='triton' cannot run on a {t.device.type} tensor here: use a CUDA tensor, "
            "or set TRITON_INTERPRET=1 before fastci.kernels is first imported")
    return runnable


@dataclass(frozen=True)
class Kind:
    """How a dtype is handed to the kernels: as a same-width integer view of its bits."""

    bits: torch.dtype       # integer view of the storage the kernels load
    word_bits: int          # 8, 16, 32 or 64
    value: tl.dtype         # what the bits are bitcast to for arithmetic
    is_float: bool


KINDS: dict[torch.dtype, Kind] = {
    torch.float64: Kind(torch.int64, 64, tl.float64, True),
    torch.float32: Kind(torch.int32, 32, tl.float32, True),
    torch.float16: Kind(torch.int16, 16, tl.float16, True),
    torch.bfloat16: Kind(torch.int16, 16, tl.bfloat16, True),
    torch.int64: Kind(torch.int64, 64, tl.int64, False),
    torch.int32: Kind(torch.int32, 32, tl.int32, False),
    torch.int16: Kind(torch.int16, 16, tl.int16, False),
    torch.int8: Kind(torch.int8, 8, tl.int8, False),
    torch.uint8: Kind(torch.uint8, 8, tl.uint8, False),
    torch.bool: Kind(torch.uint8, 8, tl.uint8, False),
}

TL_FLOAT = {torch.float32: tl.float32, torch.float64: tl.float64}


def kind_of(t: torch.Tensor) -> Kind:
    try:
        return KINDS[t.dtype]
    except KeyError:
        names = ", ".join(str(d).removeprefix("torch.") for d in KINDS)
        raise TypeError(f"unsupported dtype {t.dtype}; supported: {names}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_block(block: int) -> int:
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, not {block}")
    return block


def num_warps_for(block: int) -> int:
    # 8 warps keep 16 elements per thread at BLOCK=4096 (four 16-byte loads of fp32);
    # small blocks (tests, reductions over partials) do not need more than 4.
    return 8 if block >= 2048 else 4


def _collapse(shape: tuple[int, ...], strides: list[tuple[int, ...]]):
    """Merge dimensions that are mergeable in every tensor; drop size-1 dimensions."""
    dims: list[tuple[int, list[int]]] = []
    for d, size in enumerate(shape):
        if size == 1:
            continue
        st = [s[d] for s in strides]
        if dims and all(prev == cur * size for prev, cur in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * size, st)
        else:
            dims.append((size, st))
    return dims


@dataclass(frozen=True)
class Layout:
    """Launch arguments describing how to walk same-shaped tensors in logical order."""

    tensors: tuple[torch.Tensor, ...]   # possibly made contiguous
    ndim: int                           # 0: all flat-contiguous
    sizes: tuple[int, int, int]         # sizes of collapsed dims 1..3 (dim 0 is implied)
    strides: tuple[tuple[int, int, int, int], ...]


def layout(*tensors: torch.Tensor) -> Layout:
    """Collapse the tensors' common shape; strided access when <= MAX_DIMS dims remain."""
    shape = tuple(tensors[0].shape)
    dims = _collapse(shape, [tuple(t.stride()) for t in tensors])
    if len(dims) > MAX_DIMS:
        tensors = tuple(t.contiguous() for t in tensors)
        dims = _collapse(shape, [tuple(t.stride()) for t in tensors])
    if not dims or (len(dims) == 1 and all(st == 1 for st in dims[0][1])):
        return Layout(tensors, 0, (1, 1, 1), tuple((1, 0, 0, 0) for _ in tensors))
    sizes = [size for size, _ in dims] + [1] * (MAX_DIMS - len(dims))
    strides = tuple(tuple([st[i] for _, st in dims] + [0] * (MAX_DIMS - len(dims)))
                    for i in range(len(tensors)))
    return Layout(tensors, len(dims), (sizes[1], sizes[2], sizes[3]), strides)


def reduce_levels(n: int, rblock: int) -> list[tuple[int, int]]:
    """(n_in, n_out) for each pass of the partials tree: n partials down to one."""
    levels = []
    while True:
        n_out = math.ceil(n / rblock)
        levels.append((n, n_out))
        if n_out == 1:
            return levels
        n = n_out

