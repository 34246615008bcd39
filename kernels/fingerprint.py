"""Tensor fingerprints: a bit-exact 64-bit hash and tolerance summaries in one pass over memory.

Laid out like Liger-Kernel: Triton kernels, their launchers, and a pure-torch reference of the
same arithmetic side by side. The reference runs CPU tensors (unless TRITON_INTERPRET=1 was set
before this module was imported); the kernels run CUDA tensors. Both produce the same hash bit
for bit, because the hash is built only from wrapping integer arithmetic.

Hash scheme (all arithmetic modulo 2**64):

* The tensor's storage is read as unsigned words, in logical row-major order (strides are
  honoured, so a non-contiguous tensor and its `.contiguous()` copy agree). 8/16/32-bit dtypes
  give one word per element, zero-extended (bool reads as uint8); 64-bit dtypes give two 32-bit
  words per element, low half first, so word j of element i has word index w = 2*i + j.
* Each word x with word index w is mixed with its position:
      key = ((w << 32) | x) ^ ((w >> 32) * 0x9E3779B97F4A7C15)
      m   = fmix64(key)        # MurmurHash3's finalizer: ^>>33, *0xFF51AFD7ED558CCD,
                               #                         ^>>33, *0xC4CEB9FE1A85EC53, ^>>33
  For a fixed w, key is injective in x and fmix64 is a bijection, so changing any single element
  always changes the sum below; because key carries w, equal values at different positions mix
  differently (order matters, duplicates do not cancel as they would under XOR).
* total = sum of m over all words. Addition mod 2**64 is associative and commutative, so the
  total does not depend on BLOCK, the grid, or the order partial sums are combined in.
* hash = first 8 bytes (little-endian) of BLAKE2b(person="fastci.fp.v1") over total (8 bytes,
  little-endian), the dtype name and the shape, so a float16 and an int16 zero tensor differ,
  and so do reshapes of the same storage.

This is an integrity check, not a cryptographic hash: collisions are ~2**-64 for accidental
changes, but someone who wants one can construct it.

Summaries are over finite elements only (NaN and +/-Inf are counted instead), so one NaN in
the data does not turn the sums into NaN and `==` on fingerprints stays meaningful. Elements are
converted to float32 (float64 for 64-bit dtypes) and squared in that precision, so squares
overflow to inf above |x| ~ 1.8e19 in both implementations alike. The Triton path sums each
BLOCK in that precision and the per-block partials in float64 in a fixed tree order (no
atomics); the reference sums in float64. Sum and sumsq agree to within 1e-5 * sum(|x|) resp.
1e-5 * sumsq; absmax, nans and infs are exact.

Cost (an estimate, not a measurement: no GPU was available when this was written): per 32-bit
word the hash does two 64-bit multiplies by constants (about three 32-bit IMADs each) and a few
shifts/XORs, so for 2-byte dtypes at H200 bandwidth (~4.8 TB/s, ~2.4e12 words/s) it is close
to the integer ALU limit; bench/kernels.py reports whether it reaches 80% of copy bandwidth.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ._common import (
    REF_CHUNK,
    TL_FLOAT,
    check_block,
    dtype_name,
    kind_of,
    layout,
    num_warps_for,
    reduce_levels,
    strided_offsets,
    use_triton,
)
from ._triton import tl, triton

# 4096 elements per program: 16 KiB of fp32 in flight per program and 16 elements per thread at
# 8 warps. Chosen from the usual range for bandwidth-bound Triton kernels; NOT measured here
# (no GPU on the machine this was written on) - bench/kernels.py measures it.
BLOCK = 4096
# Partials folded per program in each pass of the reduction tree.
RBLOCK = 1024

FMIX_C1 = 0xFF51AFD7ED558CCD
FMIX_C2 = 0xC4CEB9FE1A85EC53
GOLDEN = 0x9E3779B97F4A7C15
# The same constants as kernels can read them (jit code sees only tl.constexpr globals).
_C1, _C2, _GOLDEN = tl.constexpr(FMIX_C1), tl.constexpr(FMIX_C2), tl.constexpr(GOLDEN)
MASK64 = (1 << 64) - 1
_PERSON = b"fastci.fp.v1"

# Rows of the partials buffer (int64 storage; rows 3..5 are read through a float64 view).
_HASH, _NANS, _INFS, _SUM, _SUMSQ, _ABSMAX = range(6)


@dataclass(frozen=True)
class Summaries:
    """Order-insensitive statistics for tolerance comparison (finite elements only)."""

    sum: float
    sumsq: float
    absmax: float
    nans: int
    infs: int


@dataclass(frozen=True)
class Fingerprint:
    """What `fingerprint` returns: enough to tell "bit-identical" from "close" from "different"."""

    hash: int           # 64-bit unsigned, bit-exact content + dtype + shape
    dtype: str
    shape: tuple
    numel: int
    sum: float
    sumsq: float
    absmax: float
    nans: int
    infs: int


# --------------------------------------------------------------------------- Triton kernels


@triton.jit
def _fmix64(k):
    k = k ^ (k >> 33)
    k = k * _C1
    k = k ^ (k >> 33)
    k = k * _C2
    k = k ^ (k >> 33)
    return k


@triton.jit
def mix(word_index, word):
    """uint64 word index and uint64 word (< 2**32) -> uint64 mixed value (see module doc)."""
    key = ((word_index << 32) | word) ^ ((word_index >> 32) * _GOLDEN)
    return _fmix64(key)


@triton.jit
def _fingerprint_kernel(bits_ptr, part_ptr, part_f_ptr, n_part, numel,
                        size1, size2, size3, stride0, stride1, stride2, stride3,
                        NDIM: tl.constexpr, WORD_BITS: tl.constexpr, VALUE: tl.constexpr,
                        IS_FLOAT: tl.constexpr, ACC: tl.constexpr,
                        HASH: tl.constexpr, STATS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    off = strided_offsets(idx, size1, size2, size3, stride0, stride1, stride2, stride3, NDIM)
    bits = tl.load(bits_ptr + off, mask=mask, other=0)

    if HASH:
        u = bits.to(tl.uint64)      # sign-extends signed views; the masks below undo that
        w = idx.to(tl.uint64)
        if WORD_BITS == 64:
            h = mix(2 * w, u & 0xFFFFFFFF) + mix(2 * w + 1, u >> 32)
        else:
            h = mix(w, u & ((1 << WORD_BITS) - 1))
        h = tl.where(mask, h, 0)
        tl.store(part_ptr + pid, tl.sum(h, axis=0).to(tl.int64, bitcast=True))

    if STATS:
        # Masked-off lanes loaded bits 0, the value +0, which adds nothing to any statistic.
        x = bits.to(VALUE, bitcast=True).to(ACC)
        if IS_FLOAT:
            nan = x != x
            inf = tl.abs(x) == float("inf")
            tl.store(part_ptr + 1 * n_part + pid, tl.sum(nan.to(tl.int32), axis=0))
            tl.store(part_ptr + 2 * n_part + pid, tl.sum(inf.to(tl.int32), axis=0))
            x = tl.where(nan | inf, 0.0, x)
        else:
            tl.store(part_ptr + 1 * n_part + pid, 0)
            tl.store(part_ptr + 2 * n_part + pid, 0)
        tl.store(part_f_ptr + 3 * n_part + pid, tl.sum(x, axis=0).to(tl.float64))
        tl.store(part_f_ptr + 4 * n_part + pid, tl.sum(x * x, axis=0).to(tl.float64))
        tl.store(part_f_ptr + 5 * n_part + pid, tl.max(tl.abs(x), axis=0).to(tl.float64))


@triton.jit
def _fingerprint_reduce_kernel(in_ptr, in_f_ptr, n_in, out_ptr, out_f_ptr, n_out,
                               HASH: tl.constexpr, STATS: tl.constexpr, RBLOCK: tl.constexpr):
    """One pass of the partials tree: each program folds RBLOCK partials in a fixed order."""
    pid = tl.program_id(0)
    i = pid * RBLOCK + tl.arange(0, RBLOCK)
    m = i < n_in
    if HASH:
        h = tl.load(in_ptr + i, mask=m, other=0).to(tl.uint64, bitcast=True)
        tl.store(out_ptr + pid, tl.sum(h, axis=0).to(tl.int64, bitcast=True))
    if STATS:
        for row in tl.static_range(1, 3):
            c = tl.load(in_ptr + row * n_in + i, mask=m, other=0)
            tl.store(out_ptr + row * n_out + pid, tl.sum(c, axis=0))
        for row in tl.static_range(3, 5):
            s = tl.load(in_f_ptr + row * n_in + i, mask=m, other=0.0)
            tl.store(out_f_ptr + row * n_out + pid, tl.sum(s, axis=0))
        a = tl.load(in_f_ptr + 5 * n_in + i, mask=m, other=0.0)
        tl.store(out_f_ptr + 5 * n_out + pid, tl.max(a, axis=0))


# --------------------------------------------------------------------------- launchers


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.element_size() == 8 else torch.float32


def fingerprint_device(t: torch.Tensor, *, do_hash: bool = True, do_stats: bool = True,
                       block: int = BLOCK) -> torch.Tensor:
    """Run the Triton kernels and return the packed (6, 1) int64 result on t's device.

    No host synchronisation: the benchmark times this, and `_unpack` turns it into numbers.
    Rows: total (uint64 bits), nans, infs, then float64 bits of sum, sumsq, absmax.
    """
    kind = kind_of(t)
    block = check_block(block)
    if t.numel() == 0:
        raise ValueError("fingerprint_device needs a non-empty tensor (nothing to launch)")
    lay = layout(t.view(kind.bits))
    (bits,) = lay.tensors
    (strides,) = lay.strides
    n = t.numel()
    n_part = triton.cdiv(n, block)
    part = torch.empty((6, n_part), dtype=torch.int64, device=t.device)
    _fingerprint_kernel[(n_part,)](
        bits, part, part.view(torch.float64), n_part, n, *lay.sizes, *strides,
        NDIM=lay.ndim, WORD_BITS=kind.word_bits, VALUE=kind.value, IS_FLOAT=kind.is_float,
        ACC=TL_FLOAT[_acc_dtype(t)], HASH=do_hash, STATS=do_stats, BLOCK=block,
        num_warps=num_warps_for(block))
    for n_in, n_out in reduce_levels(n_part, RBLOCK):
        out = torch.empty((6, n_out), dtype=torch.int64, device=t.device)
        _fingerprint_reduce_kernel[(n_out,)](
            part, part.view(torch.float64), n_in, out, out.view(torch.float64), n_out,
            HASH=do_hash, STATS=do_stats, RBLOCK=RBLOCK, num_warps=4)
        part = out
    return part


def _unpack(packed: torch.Tensor) -> tuple[int, Summaries]:
    host = packed.reshape(6).cpu()
    ints = host.tolist()
    floats = host.view(torch.float64).tolist()
    return (ints[_HASH] & MASK64,
            Summaries(floats[_SUM], floats[_SUMSQ], floats[_ABSMAX], ints[_NANS], ints[_INFS]))


def _triton(t: torch.Tensor, do_hash: bool, do_stats: bool, block: int
            ) -> tuple[int, Summaries]:
    if t.numel() == 0:
        return 0, Summaries(0.0, 0.0, 0.0, 0, 0)
    return _unpack(fingerprint_device(t, do_hash=do_hash, do_stats=do_stats, block=block))


# --------------------------------------------------------------------------- torch reference


def _i64(c: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic on int64)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix_torch(word_index: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    """Reference of `mix` on int64 tensors holding uint64 bits; wrapping int64 ops match."""
    k = ((word_index << 32) | word) ^ (_lsr(word_index, 32) * _i64(GOLDEN))
    k = k ^ _lsr(k, 33)
    k = k * _i64(FMIX_C1)
    k = k ^ _lsr(k, 33)
    k = k * _i64(FMIX_C2)
    return k ^ _lsr(k, 33)


def _sum_u64(m: torch.Tensor) -> int:
    """Exact sum of uint64 bits mod 2**64: 32-bit halves summed in int64 cannot overflow."""
    lo = int((m & 0xFFFFFFFF).sum())
    hi = int(_lsr(m, 32).sum())
    return (lo + (hi << 32)) & MASK64


def _total_torch(t: torch.Tensor) -> int:
    kind = kind_of(t)
    flat = t.reshape(-1).view(kind.bits)        # copies only if t is not contiguous
    total = 0
    for start in range(0, flat.numel(), REF_CHUNK):
        x = flat[start:start + REF_CHUNK].to(torch.int64)
        w = torch.arange(start, start + x.numel(), dtype=torch.int64, device=t.device)
        if kind.word_bits == 64:
            m = mix_torch(2 * w, x & 0xFFFFFFFF) + mix_torch(2 * w + 1, _lsr(x, 32))
        else:
            m = mix_torch(w, x & ((1 << kind.word_bits) - 1))
        total = (total + _sum_u64(m)) & MASK64
    return total


def _summaries_torch(t: torch.Tensor) -> Summaries:
    kind = kind_of(t)
    acc = _acc_dtype(t)
    flat = t.reshape(-1)
    s = sq = amax = 0.0
    nans = infs = 0
    for start in range(0, flat.numel(), REF_CHUNK):
        x = flat[start:start + REF_CHUNK].to(acc)
        if kind.is_float:
            nan, inf = torch.isnan(x), torch.isinf(x)
            nans += int(nan.sum())
            infs += int(inf.sum())
            x = torch.where(nan | inf, 0.0, x)
        s += float(x.sum(dtype=torch.float64))
        sq += float((x * x).sum(dtype=torch.float64))
        amax = max(amax, float(x.abs().max()))
    return Summaries(s, sq, amax, nans, infs)


# --------------------------------------------------------------------------- public API


def _digest(total: int, t: torch.Tensor) -> int:
    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    h.update(total.to_bytes(8, "little"))
    h.update(dtype_name(t.dtype).encode())
    h.update(repr(tuple(t.shape)).encode())
    return int.from_bytes(h.digest(), "little")


def tensor_hash(t: torch.Tensor, *, backend: str = "auto", block: int = BLOCK) -> int:
    """64-bit unsigned hash of t's bits, logical order, dtype and shape (see module doc)."""
    kind_of(t)
    if use_triton(t, backend):
        total, _ = _triton(t, do_hash=True, do_stats=False, block=block)
    else:
        total = _total_torch(t)
    return _digest(total, t)


def summaries(t: torch.Tensor, *, backend: str = "auto", block: int = BLOCK) -> Summaries:
    """sum, sumsq, absmax over finite elements, and NaN / Inf counts."""
    kind_of(t)
    if use_triton(t, backend):
        return _triton(t, do_hash=False, do_stats=True, block=block)[1]
    return _summaries_torch(t)


def fingerprint(t: torch.Tensor, *, backend: str = "auto", block: int = BLOCK) -> Fingerprint:
    """Hash and summaries; the Triton path reads t once for both."""
    kind_of(t)
    if use_triton(t, backend):
        total, stats = _triton(t, do_hash=True, do_stats=True, block=block)
    else:
        total, stats = _total_torch(t), _summaries_torch(t)
    return Fingerprint(hash=_digest(total, t), dtype=dtype_name(t.dtype), shape=tuple(t.shape),
                       numel=t.numel(), sum=stats.sum, sumsq=stats.sumsq, absmax=stats.absmax,
                       nans=stats.nans, infs=stats.infs)
