"""fastci.kernels.compare: the fused Triton comparison against the torch reference (identical
results), against torch.isclose, and on hand-computed cases.

As in test_kernels_fingerprint.py, the interpreter is chosen before the kernels are imported
when there is no CUDA device.
"""

from __future__ import annotations

import os

import pytest
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402,F401

from fastci.kernels import compare as cp  # noqa: E402
from fastci.kernels._common import INTERPRETED  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not INTERPRETED:  # conftest.py sets TRITON_INTERPRET=1 before any import
    raise RuntimeError("no CUDA, and Triton was imported before TRITON_INTERPRET=1 was set: "
                       "the Triton path cannot run here, so these tests cannot either")

# The interpreter evaluates both sides of tl.where with numpy, which warns about the inf - inf
# and overflowing subtractions whose results the kernel then discards.
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

INF, NAN = float("inf"), float("nan")

# (dtype, atol, rtol) handed to compare(), Liger-Kernel style: assert_close's defaults, so the
# perturbations below land on both sides of the threshold.
DTYPES = [pytest.param(d, *cp.default_tolerances(d), id=str(d).removeprefix("torch."))
          for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                    torch.int64, torch.int32, torch.uint8, torch.bool)]
LARGE_DTYPES = {torch.float32, torch.bfloat16}


def make_pair(dtype: torch.dtype, shape, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(actual, expected): expected random, actual off by relative errors from 1e-8 to 1e-1
    (floats) or by -1/0/+1 (integers), with NaN, Inf, signed zeros and denormals planted."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        b = torch.randint(0, 2, shape, generator=g).bool()
        a = b ^ (torch.rand(shape, generator=g) < 0.2)
        return a.to(DEVICE), b.to(DEVICE)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        b = torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)
        a = b + torch.randint(-1, 2, shape, generator=g).to(dtype)     # wraps at the ends
        return a.to(DEVICE), b.to(DEVICE)
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    err = torch.randn(shape, generator=g, dtype=torch.float64)
    err = err * torch.pow(10.0, torch.randint(-8, 0, shape, generator=g).double())
    a, b = (b * (1 + err)).to(dtype), b.to(dtype)
    specials = [(NAN, NAN), (NAN, 1.0), (1.0, NAN), (INF, INF), (INF, -INF), (-INF, 2.0),
                (3.0, INF), (-0.0, 0.0), (torch.finfo(dtype).tiny / 4, -torch.finfo(dtype).tiny)]
    fa, fb = a.view(-1), b.view(-1)
    for k, (va, vb) in enumerate(specials[:fa.numel() // 2]):
        fa[2 * k + 1], fb[2 * k + 1] = va, vb
    return a.to(DEVICE), b.to(DEVICE)


def strided_like(x: torch.Tensor) -> torch.Tensor:
    """The same logical tensor stored column-major (different strides, same values)."""
    return x.t().contiguous().t()


# name -> builder(dtype) -> (a, b); a and b may have different layouts.
LAYOUTS = {
    "empty": lambda d: make_pair(d, (0,)),
    "scalar": lambda d: make_pair(d, ()),
    "one": lambda d: make_pair(d, (1,)),
    "seven": lambda d: make_pair(d, (7,)),
    "3x5": lambda d: make_pair(d, (3, 5)),
    "2051": lambda d: make_pair(d, (2051,)),                  # one block + 3
    "a-column-major": lambda d: (lambda a, b: (strided_like(a), b))(*make_pair(d, (37, 29))),
    "both-step-3": lambda d: tuple(t[::3] for t in make_pair(d, (3000,))),
    "b-expanded": lambda d: (lambda a, b: (a, b[:1].expand(20, 33)))(*make_pair(d, (20, 33))),
    "both-sliced-3d": lambda d: tuple(t[::2, 1::2, ::3] for t in make_pair(d, (6, 7, 8))),
    "a-sliced-4d": lambda d: (lambda a, b: (a[:, ::2, 1:4, ::2], b[:, ::2, 1:4, ::2].contiguous()))(
        *make_pair(d, (4, 5, 6, 7))),
    "5d-no-collapse": lambda d: tuple(t.permute(4, 2, 0, 3, 1)
                                      for t in make_pair(d, (2, 3, 2, 3, 2))),
    "1<<17": lambda d: make_pair(d, (1 << 17,)),             # 64 programs at BLOCK=2048
}

CASES = [pytest.param(name, *d.values, id=f"{d.id}-{name}") for d in DTYPES for name in LAYOUTS
         if name != "1<<17" or d.values[0] in LARGE_DTYPES]


@pytest.mark.parametrize("equal_nan", [False, True])
@pytest.mark.parametrize("name, dtype, atol, rtol", CASES)
def test_triton_matches_reference(name, dtype, atol, rtol, equal_nan):
    a, b = LAYOUTS[name](dtype)
    tri = cp.compare(a, b, atol=atol, rtol=rtol, equal_nan=equal_nan, backend="triton")
    ref = cp.compare(a, b, atol=atol, rtol=rtol, equal_nan=equal_nan, backend="torch")
    assert tri == ref, f"triton: {tri}\ntorch:  {ref}"
    assert (tri.shape, tri.numel) == (tuple(a.shape), a.numel())


def isclose_oracle(a, b, atol, rtol, equal_nan):
    bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    where = bad.reshape(-1).nonzero()
    return int(bad.sum()), (int(where[0, 0]) if len(where) else None)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("equal_nan", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bool])
def test_mismatches_agree_with_torch_isclose(dtype, equal_nan, backend):
    # float16/bfloat16 are left out: isclose computes their threshold in half precision,
    # compare() in float32, so the two may disagree on elements right at the threshold.
    a, b = make_pair(dtype, (41, 23), seed=3)
    atol, rtol = cp.default_tolerances(dtype)
    got = cp.compare(a, b, equal_nan=equal_nan, backend=backend)
    count, first = isclose_oracle(a, b, atol, rtol, equal_nan)
    assert 0 < got.mismatches < a.numel()                  # the data straddles the threshold
    assert (got.mismatches, got.first_mismatch) == (count, first), \
        f"{got}\ntorch.isclose: {count} mismatches, first at flat index {first}"


def f32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_hand_computed_float32_case(backend):
    denorm = torch.finfo(torch.float32).smallest_normal * 2.0 ** -23     # 2**-149
    two_up = torch.nextafter(torch.tensor(2.0), torch.tensor(INF)).item()
    a = torch.tensor([1.0, two_up, 3.5, 4.0, -0.0, denorm, INF, NAN, NAN], device=DEVICE)
    b = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, -denorm, INF, 1.0, NAN], device=DEVICE)
    got = cp.compare(a, b, backend=backend)
    assert got.max_abs_diff == 0.5
    assert got.max_rel_diff == f32(f32(0.5) / f32(3.0))
    assert got.max_ulp == 0x40600000 - 0x40400000           # 3.5 vs 3.0
    assert (got.mismatches, got.first_mismatch) == (3, 2)   # 3.5 vs 3, NaN vs 1, NaN vs NaN
    assert not got.ok
    assert cp.compare(a, b, equal_nan=True, backend=backend).mismatches == 2
    # +/- the smallest denormal are 2 ulps apart across zero; -0 and +0 are 0 apart.
    assert cp.compare(a[5:6], b[5:6], backend=backend).max_ulp == 2
    assert cp.compare(a[4:5], b[4:5], backend=backend).max_ulp == 0


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_infinities(backend):
    a = torch.tensor([INF, INF, 1.0, -INF], device=DEVICE)
    b = torch.tensor([-INF, 1.0, INF, -INF], device=DEVICE)
    got = cp.compare(a, b, backend=backend)
    assert (got.mismatches, got.first_mismatch) == (3, 0)   # -inf vs -inf is equal
    assert got.max_abs_diff == INF and got.max_rel_diff == INF
    assert got.max_ulp == 2 * 0x7F800000                   # +inf to -inf
    wide = cp.compare(a.double()[:1], b.double()[:1], backend=backend)
    assert wide.max_ulp == 2 * 0x7FF0000000000000          # needs all 64 bits, unsigned


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_integer_extremes(backend):
    big = torch.iinfo(torch.int64)
    got = cp.compare(torch.tensor([big.max, 5], device=DEVICE),
                     torch.tensor([big.min, 5], device=DEVICE), backend=backend)
    assert got.max_ulp == (1 << 64) - 1
    assert got.max_abs_diff == float((1 << 64) - 1)
    assert got.max_rel_diff == 2.0
    assert (got.mismatches, got.first_mismatch) == (1, 0)
    u8 = cp.compare(torch.tensor([255, 0, 7], dtype=torch.uint8, device=DEVICE),
                    torch.tensor([0, 255, 7], dtype=torch.uint8, device=DEVICE),
                    backend=backend)
    assert (u8.max_ulp, u8.max_abs_diff, u8.max_rel_diff, u8.mismatches) == (255, 255.0, 255.0, 2)


def test_message_says_how_many_and_where():
    b = torch.zeros(3, 5, device=DEVICE)
    a = b.clone()
    a[2, 1] = 1.0
    a[2, 4] = -1.0
    got = cp.compare(a, b, backend="triton")
    assert (got.mismatches, got.first_mismatch, got.first_mismatch_at) == (2, 11, (2, 1))
    assert "2/15 elements differ" in str(got) and "(2, 1)" in str(got)
    assert cp.compare(b, b, backend="triton").first_mismatch_at is None


@pytest.mark.parametrize("rblock", [16, 1024])
@pytest.mark.parametrize("block", [16, 128, 2048])
def test_block_and_grid_do_not_change_the_result(block, rblock, monkeypatch):
    # RBLOCK=16 sends the 63 partials of BLOCK=16 through two passes of the tree (63 -> 4 -> 1).
    monkeypatch.setattr(cp, "RBLOCK", rblock)
    a, b = make_pair(torch.bfloat16, (1000,))
    assert cp.compare(a, b, backend="triton", block=block) == cp.compare(a, b, backend="torch")


def test_default_tolerances_are_assert_closes():
    # torch keeps its table private; checked here (skipped if it moves), never imported by cp.
    default_tolerances = getattr(pytest.importorskip("torch.testing._comparison"),
                                 "default_tolerances", None)
    if default_tolerances is None:
        pytest.skip("torch.testing._comparison.default_tolerances is gone")
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64,
                  torch.uint8, torch.bool):
        rtol, atol = default_tolerances(dtype)
        assert cp.default_tolerances(dtype) == (atol, rtol), dtype
    got = cp.compare(*make_pair(torch.bfloat16, (5,)), backend="torch")
    assert (got.atol, got.rtol) == (1e-5, 1.6e-2)


def test_argument_errors():
    x = torch.zeros(4, device=DEVICE)
    with pytest.raises(ValueError, match="same shape"):
        cp.compare(x, torch.zeros(5, device=DEVICE))
    with pytest.raises(ValueError, match="same shape"):
        cp.compare(x, x.double())
    with pytest.raises(ValueError, match="backend"):
        cp.compare(x, x, backend="gpu")
    with pytest.raises(TypeError, match="unsupported dtype"):
        cp.compare(x.to(torch.complex64), x.to(torch.complex64))
