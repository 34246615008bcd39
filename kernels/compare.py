"""Fused comparison of two same-shaped tensors: one pass for every error measure at once.

Replaces the usual `(a - b).abs().max()`, relative error, `isclose().sum()` sequence (one full
read of both tensors per statistic, plus temporaries the size of the tensor) with a single
Triton pass, and keeps a pure-torch reference of the same arithmetic beside it. Both paths give
identical results: every statistic is a max, an integer count or a min index (order-free), and
every per-element value is computed with the same IEEE operations in the same precision (the
kernel asks for correctly rounded division, which Triton's plain `/` is not on NVIDIA GPUs, and
is compiled without FMA contraction so `atol + rtol*|b|` rounds exactly as torch's separate
multiply and add). Here that is checked in Triton's interpreter only; bench/kernels.py checks it
on a GPU before timing anything.

Per element, in float32 for float16/bfloat16/float32 and in float64 for float64 and integers:

* abs diff   |a - b|, 0 where a == b (so inf vs the same inf is 0, and -0 vs +0 is 0).
* rel diff   |a - b| / max(|b|, tiny), tiny = the smallest normal number of the input dtype
             (1 for integers); inf where |a - b| is inf.
* ulp        floats: bit patterns mapped to a monotonic integer line (sign-magnitude ->
             two's complement, +0 and -0 both 0), distance |ia - ib| (so the largest finite
             float and inf are 1 apart); integers: |a - b| exactly. Reported as an unsigned int.
* close      a == b, or both finite and |a - b| <= atol + rtol * |b| (torch.isclose's rule); with
             equal_nan=True also NaN vs NaN. Anything else is a mismatch, in particular NaN vs a
             number always, inf vs -inf, and inf vs a finite number.

Positions where either side is NaN are left out of the three maxima (they would poison them)
and show up only in `mismatches` (unless equal_nan and both are NaN).
"""

from __future__ import annotations

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

# Two tensors in flight per program, so half the fingerprint's block: 8 KiB of fp32 each.
# Not measured here (no GPU on the machine this was written on); bench/kernels.py measures it.
BLOCK = 2048
RBLOCK = 1024

INT64_MAX = (1 << 63) - 1
MASK64 = (1 << 64) - 1

# Rows of the partials buffer (int64 storage; rows 3..4 through a float64 view).
_ULP, _MISMATCHES, _FIRST, _ABS, _REL = range(5)

# torch.testing.assert_close defaults, as (atol, rtol).
_DEFAULT_TOLERANCES = {
    torch.float16: (1e-5, 1e-3),
    torch.bfloat16: (1e-5, 1.6e-2),
    torch.float32: (1e-5, 1.3e-6),
    torch.float64: (1e-7, 1e-7),
}


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) as torch.testing.assert_close would pick them; exact for integers."""
    return _DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass(frozen=True)
class Comparison:
    dtype: str
    shape: tuple
    numel: int
    atol: float
    rtol: float
    equal_nan: bool
    max_abs_diff: float
    max_rel_diff: float
    max_ulp: int
    mismatches: int
    first_mismatch: int | None      # flat index in logical (row-major) order

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    @property
    def first_mismatch_at(self) -> tuple[int, ...] | None:
        """Coordinates of the first mismatch, for messages."""
        if self.first_mismatch is None:
            return None
        coords, rest = [], self.first_mismatch
        for size in reversed(self.shape):
            coords.append(rest % size)
            rest //= size
        return tuple(reversed(coords))

    def __str__(self) -> str:
        head = (f"{self.mismatches}/{self.numel} elements differ beyond atol={self.atol:g} "
                f"rtol={self.rtol:g}")
        if self.first_mismatch is not None:
            head += f" (first at index {self.first_mismatch_at})"
        return (f"{head}; max abs diff {self.max_abs_diff:g}, max rel diff "
                f"{self.max_rel_diff:g}, max ulp {self.max_ulp}")


# --------------------------------------------------------------------------- Triton kernels


@triton.jit
def _compare_kernel(a_ptr, b_ptr, params_ptr, part_ptr, part_f_ptr, n_part, numel,
                    size1, size2, size3,
                    a_stride0, a_stride1, a_stride2, a_stride3,
                    b_stride0, b_stride1, b_stride2, b_stride3,
                    NDIM: tl.constexpr, WORD_BITS: tl.constexpr, VALUE: tl.constexpr,
                    IS_FLOAT: tl.constexpr, ACC: tl.constexpr, EQUAL_NAN: tl.constexpr,
                    BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    a_off = strided_offsets(idx, size1, size2, size3,
                            a_stride0, a_stride1, a_stride2, a_stride3, NDIM)
    b_off = strided_offsets(idx, size1, size2, size3,
                            b_stride0, b_stride1, b_stride2, b_stride3, NDIM)
    # Masked-off lanes load bits 0 on both sides: equal, so they count nowhere.
    a_bits = tl.load(a_ptr + a_off, mask=mask, other=0)
    b_bits = tl.load(b_ptr + b_off, mask=mask, other=0)
    atol = tl.load(params_ptr)
    rtol = tl.load(params_ptr + 1)
    tiny = tl.load(params_ptr + 2)

    if IS_FLOAT:
        a = a_bits.to(VALUE, bitcast=True).to(ACC)
        b = b_bits.to(VALUE, bitcast=True).to(ACC)
        a_nan = a != a
        b_nan = b != b
        same = a == b
        skip = same | a_nan | b_nan
        diff = tl.where(skip, 0.0, tl.abs(a - b))
        denom = tl.where(skip, 1.0, tl.maximum(tl.abs(b), tiny))
        # Triton's plain fp32 '/' is not correctly rounded on NVIDIA; torch's is.
        quot = tl.fdiv(diff, denom, ieee_rounding=True)
        rel = tl.where(diff == float("inf"), float("inf"), quot)
        finite = (tl.abs(a) < float("inf")) & (tl.abs(b) < float("inf"))
        close = same | (finite & (diff <= atol + rtol * tl.abs(b)))
        if EQUAL_NAN:
            close = close | (a_nan & b_nan)
        # Sign-magnitude bits -> monotonic integers (+0 and -0 both map to 0).
        sa = a_bits.to(tl.int64)
        sb = b_bits.to(tl.int64)
        ka = tl.where(sa >= 0, sa, -(sa & ((1 << (WORD_BITS - 1)) - 1)))
        kb = tl.where(sb >= 0, sb, -(sb & ((1 << (WORD_BITS - 1)) - 1)))
        ulp = tl.where(ka >= kb, ka - kb, kb - ka)
        ulp = tl.where(a_nan | b_nan, 0, ulp)
    else:
        ia = a_bits.to(VALUE, bitcast=True).to(tl.int64)
        ib = b_bits.to(VALUE, bitcast=True).to(tl.int64)
        # |a - b| wraps into the sign bit when it is >= 2**63; it is read back as unsigned.
        ulp = tl.where(ia >= ib, ia - ib, ib - ia)
        diff = ulp.to(tl.float64)
        diff = tl.where(ulp < 0, diff + 18446744073709551616.0, diff)
        b = ib.to(tl.float64)
        rel = tl.fdiv(diff, tl.maximum(tl.abs(b), tiny), ieee_rounding=True)
        close = diff <= atol + rtol * tl.abs(b)      # diff == 0 exactly when ia == ib

    bad = mask & ~close
    tl.store(part_ptr + pid, tl.max(ulp.to(tl.uint64, bitcast=True), axis=0).to(tl.int64,
                                                                                 bitcast=True))
    tl.store(part_ptr + 1 * n_part + pid, tl.sum(bad.to(tl.int32), axis=0))
    tl.store(part_ptr + 2 * n_part + pid, tl.min(tl.where(bad, idx, 9223372036854775807), axis=0))
    tl.store(part_f_ptr + 3 * n_part + pid, tl.max(diff, axis=0).to(tl.float64))
    tl.store(part_f_ptr + 4 * n_part + pid, tl.max(rel, axis=0).to(tl.float64))


@triton.jit
def _compare_reduce_kernel(in_ptr, in_f_ptr, n_in, out_ptr, out_f_ptr, n_out,
                           RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    i = pid * RBLOCK + tl.arange(0, RBLOCK)
    m = i < n_in
    ulp = tl.load(in_ptr + i, mask=m, other=0).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + pid, tl.max(ulp, axis=0).to(tl.int64, bitcast=True))
    bad = tl.load(in_ptr + n_in + i, mask=m, other=0)
    tl.store(out_ptr + n_out + pid, tl.sum(bad, axis=0))
    first = tl.load(in_ptr + 2 * n_in + i, mask=m, other=9223372036854775807)
    tl.store(out_ptr + 2 * n_out + pid, tl.min(first, axis=0))
    for row in tl.static_range(3, 5):
        v = tl.load(in_f_ptr + row * n_in + i, mask=m, other=0.0)
        tl.store(out_f_ptr + row * n_out + pid, tl.max(v, axis=0))


# --------------------------------------------------------------------------- launchers


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16, torch.float32) \
        else torch.float64


def _params(dtype: torch.dtype, atol: float, rtol: float, device) -> torch.Tensor:
    """atol, rtol, tiny in the compute dtype - one tensor so both paths round them alike.

    tiny is the smallest positive normal of a float dtype and 1 for integers (the smallest
    non-zero |b| they can hold), so an integer 1 vs 0 has relative difference 1.
    """
    tiny = torch.finfo(dtype).tiny if dtype.is_floating_point else 1.0
    return torch.tensor([atol, rtol, tiny], dtype=_acc_dtype(dtype), device=device)


def compare_device(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float,
                   equal_nan: bool = False, *, block: int = BLOCK) -> torch.Tensor:
    """Run the Triton kernels; the packed (5, 1) int64 result stays on the device (no sync).

    Rows: max ulp (uint64 bits), mismatches, first mismatch (INT64_MAX if none), then float64
    bits of max abs diff and max rel diff.
    """
    kind = kind_of(a)
    block = check_block(block)
    if a.numel() == 0:
        raise ValueError("compare_device needs non-empty tensors (nothing to launch)")
    lay = layout(a.view(kind.bits), b.view(kind.bits))
    a_bits, b_bits = lay.tensors
    n = a.numel()
    n_part = triton.cdiv(n, block)
    part = torch.empty((5, n_part), dtype=torch.int64, device=a.device)
    _compare_kernel[(n_part,)](
        a_bits, b_bits, _params(a.dtype, atol, rtol, a.device), part, part.view(torch.float64),
        n_part, n, *lay.sizes, *lay.strides[0], *lay.strides[1],
        NDIM=lay.ndim, WORD_BITS=kind.word_bits, VALUE=kind.value, IS_FLOAT=kind.is_float,
        ACC=TL_FLOAT[_acc_dtype(a.dtype)], EQUAL_NAN=equal_nan, BLOCK=block,
        num_warps=num_warps_for(block), enable_fp_fusion=False)
    for n_in, n_out in reduce_levels(n_part, RBLOCK):
        out = torch.empty((5, n_out), dtype=torch.int64, device=a.device)
        _compare_reduce_kernel[(n_out,)](part, part.view(torch.float64), n_in,
                                         out, out.view(torch.float64), n_out,
                                         RBLOCK=RBLOCK, num_warps=4)
        part = out
    return part


def _unpack(packed: torch.Tensor) -> tuple[float, float, int, int, int | None]:
    host = packed.reshape(5).cpu()
    ints = host.tolist()
    floats = host.view(torch.float64).tolist()
    first = ints[_FIRST]
    return (floats[_ABS], floats[_REL], ints[_ULP] & MASK64, ints[_MISMATCHES],
            None if first == INT64_MAX else first)


# --------------------------------------------------------------------------- torch reference

_SIGN = -(1 << 63)


def _umax(x: torch.Tensor) -> int:
    """Max of int64 tensors holding uint64 bits: flipping the sign bit makes signed order
    agree with unsigned order (torch has no uint64 max)."""
    return (int((x ^ _SIGN).max()) ^ _SIGN) & MASK64


def _compare_chunk_torch(a: torch.Tensor, b: torch.Tensor, params: torch.Tensor,
                         equal_nan: bool):
    """(diff, rel, ulp, bad) per element of one flat chunk; mirrors `_compare_kernel`."""
    kind = kind_of(a)
    atol, rtol, tiny = params[0], params[1], params[2]
    acc = params.dtype
    if kind.is_float:
        af, bf = a.to(acc), b.to(acc)
        a_nan, b_nan = torch.isnan(af), torch.isnan(bf)
        same = af == bf
        skip = same | a_nan | b_nan
        diff = torch.where(skip, 0.0, (af - bf).abs())
        denom = torch.where(skip, 1.0, torch.maximum(bf.abs(), tiny))
        rel = torch.where(torch.isinf(diff), float("inf"), diff / denom)
        finite = torch.isfinite(af) & torch.isfinite(bf)
        close = same | (finite & (diff <= atol + rtol * bf.abs()))
        if equal_nan:
            close = close | (a_nan & b_nan)
        mag = (1 << (kind.word_bits - 1)) - 1
        sa = a.view(kind.bits).to(torch.int64)
        sb = b.view(kind.bits).to(torch.int64)
        ka = torch.where(sa >= 0, sa, -(sa & mag))
        kb = torch.where(sb >= 0, sb, -(sb & mag))
        ulp = torch.where(ka >= kb, ka - kb, kb - ka)
        ulp = torch.where(a_nan | b_nan, 0, ulp)
    else:
        ia, ib = a.to(torch.int64), b.to(torch.int64)
        ulp = torch.where(ia >= ib, ia - ib, ib - ia)
        diff = ulp.to(torch.float64)
        diff = torch.where(ulp < 0, diff + 18446744073709551616.0, diff)
        bf = ib.to(torch.float64)
        rel = diff / torch.maximum(bf.abs(), tiny)
        close = diff <= atol + rtol * bf.abs()
    return diff, rel, ulp, ~close


def _compare_torch(a, b, atol, rtol, equal_nan):
    params = _params(a.dtype, atol, rtol, a.device)
    fa, fb = a.reshape(-1), b.reshape(-1)       # copies only if not contiguous
    max_abs = max_rel = 0.0
    max_ulp = mismatches = 0
    first = None
    for start in range(0, fa.numel(), REF_CHUNK):
        diff, rel, ulp, bad = _compare_chunk_torch(fa[start:start + REF_CHUNK],
                                                   fb[start:start + REF_CHUNK], params, equal_nan)
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(rel.max()))
        max_ulp = max(max_ulp, _umax(ulp))
        n_bad = int(bad.sum())
        if n_bad and first is None:
            first = start + int(bad.nonzero()[0, 0])
        mismatches += n_bad
    return max_abs, max_rel, max_ulp, mismatches, first


# --------------------------------------------------------------------------- public API


def compare(a: torch.Tensor, b: torch.Tensor, *, atol: float | None = None,
            rtol: float | None = None, equal_nan: bool = False, backend: str = "auto",
            block: int = BLOCK) -> Comparison:
    """Compare `a` (actual) against `b` (expected) elementwise; see the module doc.

    a and b must share dtype, shape and device. Tolerances left as None take
    torch.testing.assert_close's defaults for the dtype.
    """
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"compare needs the same shape, dtype and device; got "
                         f"{tuple(a.shape)} {a.dtype} {a.device} vs "
                         f"{tuple(b.shape)} {b.dtype} {b.device}")
    kind_of(a)
    on_triton = use_triton(a, backend)
    d_atol, d_rtol = default_tolerances(a.dtype)
    atol = d_atol if atol is None else float(atol)
    rtol = d_rtol if rtol is None else float(rtol)
    stats: tuple[float, float, int, int, int | None]  # max abs, max rel, max ulp, count, first
    if a.numel() == 0:
        stats = (0.0, 0.0, 0, 0, None)
    elif on_triton:
        stats = _unpack(compare_device(a, b, atol, rtol, equal_nan, block=block))
    else:
        stats = _compare_torch(a, b, atol, rtol, equal_nan)
    max_abs, max_rel, max_ulp, mismatches, first = stats
    return Comparison(dtype=dtype_name(a.dtype), shape=tuple(a.shape), numel=a.numel(),
                      atol=atol, rtol=rtol, equal_nan=equal_nan, max_abs_diff=max_abs,
                      max_rel_diff=max_rel, max_ulp=max_ulp, mismatches=mismatches,
                      first_mismatch=first)
