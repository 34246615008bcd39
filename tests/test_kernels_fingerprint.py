"""fastci.kernels.fingerprint: the Triton kernels against the torch reference and a pure-Python
oracle, plus the properties the hash promises.

Without CUDA the kernels run in Triton's interpreter, which must be chosen before the kernel
module is imported, hence the environment line above the imports. (It stays set for the rest of
the session: Triton also reads it while interpreted kernels run.) With CUDA the compiled kernels
run on the GPU and are checked against the same reference.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402

tl = triton.language

from fastci.kernels import fingerprint as fp  # noqa: E402
from fastci.kernels._common import INTERPRETED, layout  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not INTERPRETED:  # conftest.py sets TRITON_INTERPRET=1 before any import
    raise RuntimeError("no CUDA, and Triton was imported before TRITON_INTERPRET=1 was set: "
                       "the Triton path cannot run here, so these tests cannot either")

M64 = (1 << 64) - 1

# (dtype, atol, rtol) for sum and sumsq against the reference, Liger-Kernel style. Hashes,
# absmax, nans and infs are always compared exactly. The kernels sum each block in float32
# (float64 for 64-bit dtypes), the reference sums float32 terms in float64: the difference is
# rounding inside a block, bounded by ~log2(BLOCK) * 2**-24 relative to sum(|x|).
DTYPES = [
    pytest.param(torch.float32, 1e-6, 1e-5, id="float32"),
    pytest.param(torch.float16, 1e-6, 1e-5, id="float16"),
    pytest.param(torch.bfloat16, 1e-6, 1e-5, id="bfloat16"),
    pytest.param(torch.float64, 1e-12, 1e-12, id="float64"),
    pytest.param(torch.int64, 1e-12, 1e-12, id="int64"),
    pytest.param(torch.int32, 1e-6, 1e-5, id="int32"),
    pytest.param(torch.int8, 1e-6, 1e-5, id="int8"),
    pytest.param(torch.uint8, 1e-6, 1e-5, id="uint8"),
    pytest.param(torch.bool, 1e-6, 1e-5, id="bool"),
]
# The interpreter needs ~1.5 s per 1<<18-element case: run the large size for one dtype of
# each word width rather than for all nine.
LARGE_DTYPES = {torch.float32, torch.bfloat16, torch.int64, torch.uint8}


def make(dtype: torch.dtype, shape, seed: int = 0) -> torch.Tensor:
    """Values spread over the dtype's whole range (integers) or a few orders of magnitude."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        x = x * torch.exp2(torch.randint(-8, 9, shape, generator=g).double())
    elif dtype == torch.bool:
        x = torch.randint(0, 2, shape, generator=g).bool()
    else:
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64)
    return x.to(dtype).to(DEVICE)


# name -> builder(dtype) of the tensor actually fingerprinted.
LAYOUTS = {
    "empty": lambda d: make(d, (0,)),
    "empty-2d": lambda d: make(d, (3, 0)),
    "scalar": lambda d: make(d, ()),
    "one": lambda d: make(d, (1,)),
    "seven": lambda d: make(d, (7,)),
    "3x5": lambda d: make(d, (3, 5)),
    "4099": lambda d: make(d, (4099,)),                        # one block + 3
    "transposed": lambda d: make(d, (67, 45)).t(),
    "step-3": lambda d: make(d, (3000,))[::3],
    "permuted-3d": lambda d: make(d, (5, 6, 7)).permute(2, 0, 1),   # collapses to 2 dims
    "sliced-3d": lambda d: make(d, (6, 7, 8))[::2, 1::2, ::3],
    "sliced-4d": lambda d: make(d, (4, 5, 6, 7))[:, ::2, 1:4, ::2],
    "expanded": lambda d: make(d, (1, 33)).expand(20, 33),     # stride 0
    "5d-no-collapse": lambda d: make(d, (2, 3, 2, 3, 2)).permute(4, 2, 0, 3, 1),  # copy path
    "1<<18": lambda d: make(d, (1 << 18,)),     # 64 programs at the default BLOCK
}


def first_divergence(x: torch.Tensor) -> str:
    """Bisect prefixes for the first element where Triton and the reference disagree."""
    flat = x.reshape(-1)
    lo, hi = 0, flat.numel()       # invariant: prefix of length lo agrees, length hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = flat[:mid]
        if fp.tensor_hash(p, backend="triton") == fp.tensor_hash(p, backend="torch"):
            lo = mid
        else:
            hi = mid
    coords = tuple(int(c) for c in torch.unravel_index(torch.tensor(hi - 1), x.shape)) \
        if x.dim() else ()
    return (f"hashes of {flat.numel()} elements differ; the first divergent element is flat "
            f"index {hi - 1} (coordinates {coords}, value {flat[hi - 1].item()!r})")


CASES = [pytest.param(name, *d.values, id=f"{d.id}-{name}") for d in DTYPES for name in LAYOUTS
         if name != "1<<18" or d.values[0] in LARGE_DTYPES]


@pytest.mark.parametrize("name, dtype, atol, rtol", CASES)
def test_triton_matches_reference(name, dtype, atol, rtol):
    x = LAYOUTS[name](dtype)
    tri = fp.fingerprint(x, backend="triton")
    ref = fp.fingerprint(x, backend="torch")

    assert tri.hash == ref.hash, first_divergence(x)
    assert (tri.dtype, tri.shape, tri.numel) == (ref.dtype, tuple(x.shape), x.numel())
    assert (tri.absmax, tri.nans, tri.infs) == (ref.absmax, ref.nans, ref.infs)
    scale = float(x.double().abs().sum())
    assert abs(tri.sum - ref.sum) <= atol + rtol * scale, \
        f"sum {tri.sum!r} vs reference {ref.sum!r} over {x.numel()} elements (sum|x|={scale})"
    assert abs(tri.sumsq - ref.sumsq) <= atol + rtol * ref.sumsq, \
        f"sumsq {tri.sumsq!r} vs reference {ref.sumsq!r} over {x.numel()} elements"
    if x.numel() <= 10_000:      # two more interpreter passes are not worth it at 1<<18
        # Hash and summaries computed alone agree with the fused pass.
        assert fp.tensor_hash(x, backend="triton") == tri.hash
        assert fp.summaries(x, backend="triton") == fp.Summaries(
            tri.sum, tri.sumsq, tri.absmax, tri.nans, tri.infs)


def test_layouts_reach_every_strided_path():
    # The kernels index contiguous tensors directly and strided ones with one code path per
    # collapsed rank (1..4); more dims fall back to a device-side .contiguous().
    expected = {"4099": 0, "step-3": 1, "transposed": 2, "expanded": 2, "sliced-3d": 3,
                "sliced-4d": 4, "5d-no-collapse": 0}
    for name, ndim in expected.items():
        x = LAYOUTS[name](torch.float32)
        lay = layout(x)
        assert lay.ndim == ndim, name
        assert (lay.tensors[0] is x) == (name != "5d-no-collapse"), name


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_non_contiguous_hashes_its_logical_order(backend):
    base = make(torch.float32, (40, 24))
    for view in (base.t(), base[::2, 1::3], base.reshape(4, 10, 24).permute(1, 2, 0)):
        assert fp.tensor_hash(view, backend=backend) == \
            fp.tensor_hash(view.contiguous(), backend=backend)
    # ... and the logical order is what counts, not the storage: a transpose is a new tensor.
    square = make(torch.float32, (16, 16))
    assert fp.tensor_hash(square.t(), backend=backend) != \
        fp.tensor_hash(square, backend=backend)


# ----------------------------------------------------------------------------- oracle


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    return k ^ (k >> 33)


def _mix(w: int, x: int) -> int:
    return _fmix64((((w << 32) | x) ^ ((w >> 32) * 0x9E3779B97F4A7C15)) & M64)


def oracle_hash(x: torch.Tensor) -> int:
    """The documented scheme in plain Python integers, from the tensor's raw bytes."""
    raw = x.reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()
    step = 4 if x.element_size() == 8 else x.element_size()   # 64-bit: two 32-bit words
    words = [int.from_bytes(raw[i:i + step], "little") for i in range(0, len(raw), step)]
    total = sum(_mix(w, v) for w, v in enumerate(words)) & M64
    h = hashlib.blake2b(digest_size=8, person=b"fastci.fp.v1")
    h.update(total.to_bytes(8, "little"))
    h.update(str(x.dtype).removeprefix("torch.").encode())
    h.update(repr(tuple(x.shape)).encode())
    return int.from_bytes(h.digest(), "little")


ORACLE_CASES = {
    "fp32": lambda: make(torch.float32, (37,)),
    "int64-full-range": lambda: make(torch.int64, (3, 11)),
    "bf16-transposed": lambda: make(torch.bfloat16, (9, 5)).t(),
    "bool": lambda: make(torch.bool, (19,)),
    "int8-negative": lambda: torch.arange(-60, 60, 7, dtype=torch.int8, device=DEVICE),
}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", list(ORACLE_CASES))
def test_hash_is_the_documented_scheme(case, backend):
    x = ORACLE_CASES[case]()
    assert fp.tensor_hash(x, backend=backend) == oracle_hash(x)


def test_hash_value_is_pinned():
    # Fingerprints are stored and compared across runs and machines: changing the scheme must
    # be a deliberate act (bump _PERSON), not an accident this test would let through.
    x = torch.arange(10, dtype=torch.int32, device=DEVICE)
    assert fp.tensor_hash(x, backend="torch") == 0xE8C3C209C802714F


@triton.jit
def _mix_kernel(index_ptr, word_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    w = tl.load(index_ptr + i).to(tl.uint64, bitcast=True)
    x = tl.load(word_ptr + i).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + i, fp.mix(w, x).to(tl.int64, bitcast=True))


def test_mix_is_bit_identical_at_huge_word_indices():
    # Word indices past 2**32 only occur in tensors of 16 GiB and more; the mixing function
    # is checked there directly instead.
    indices = [0, 1, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, 3 << 40, (1 << 63) + 5, M64 - 3]
    g = torch.Generator().manual_seed(1)
    words = torch.randint(0, 1 << 32, (len(indices),), generator=g).tolist()
    signed = [v - (1 << 64) if v >= 1 << 63 else v for v in indices]
    idx_t = torch.tensor(signed, dtype=torch.int64, device=DEVICE)
    word_t = torch.tensor(words, dtype=torch.int64, device=DEVICE)
    out = torch.empty_like(idx_t)
    _mix_kernel[(1,)](idx_t, word_t, out, BLOCK=len(indices))
    expected = [_mix(w, v) for w, v in zip(indices, words)]
    assert [v & M64 for v in out.tolist()] == expected
    assert [v & M64 for v in fp.mix_torch(idx_t, word_t).tolist()] == expected
    # Equal words at indices 2**32 apart mix differently (the high index bits are folded in).
    assert len(set(expected[3:5] + expected[:2])) == 4


# ----------------------------------------------------------------------------- properties

BOTH = pytest.mark.parametrize("backend", ["triton", "torch"])


@BOTH
def test_swapping_two_different_elements_changes_the_hash(backend):
    x = make(torch.float32, (257,))
    for i, j in [(0, 1), (3, 200), (255, 256)]:
        y = x.clone()
        y[i], y[j] = x[j], x[i]
        assert fp.tensor_hash(y, backend=backend) != fp.tensor_hash(x, backend=backend), (i, j)


@BOTH
def test_duplicates_do_not_cancel(backend):
    def h(values):
        return fp.tensor_hash(torch.tensor(values, dtype=torch.float32, device=DEVICE),
                              backend=backend)
    assert len({h([1.5, 1.5]), h([-2.0, -2.0]), h([0.0, 0.0]), h([1.5, -2.0])}) == 4
    # Under XOR, any value repeated an even number of times would vanish.
    assert h([1.5, 1.5, 7.0]) != h([-2.0, -2.0, 7.0])


@BOTH
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_every_single_bit_flip_changes_the_hash(dtype, backend):
    x = make(dtype, (33,))
    bits = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
                  [x.element_size()])
    seen = {fp.tensor_hash(x, backend=backend)}
    pos = 17
    for bit in range(8 * x.element_size()):
        y = bits.clone()
        y[pos] ^= torch.tensor(1, dtype=bits.dtype).bitwise_left_shift(bit)
        seen.add(fp.tensor_hash(y.view(dtype), backend=backend))
    assert len(seen) == 1 + 8 * x.element_size()


@BOTH
def test_dtype_and_shape_are_part_of_the_hash(backend):
    zeros = {d: torch.zeros(8, dtype=d, device=DEVICE)
             for d in (torch.float16, torch.bfloat16, torch.int16)}
    hashes = {fp.tensor_hash(z, backend=backend) for z in zeros.values()}
    assert len(hashes) == 3                       # same bits, three dtypes
    f = make(torch.float32, (12,))
    assert fp.tensor_hash(f, backend=backend) != \
        fp.tensor_hash(f.view(torch.int32), backend=backend)
    assert fp.tensor_hash(f, backend=backend) != \
        fp.tensor_hash(f.reshape(3, 4), backend=backend)
    empty = {fp.tensor_hash(torch.empty(s, dtype=d, device=DEVICE), backend=backend)
             for s in [(0,), (0, 3)] for d in (torch.float32, torch.int32)}
    assert len(empty) == 4


@BOTH
def test_nan_and_inf_are_counted_and_kept_out_of_the_sums(backend):
    x = torch.tensor([1.0, float("nan"), -2.0, float("inf"), float("-inf"), float("nan"),
                      3.0, float("nan")], device=DEVICE)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        f = fp.fingerprint(x.to(dtype), backend=backend)
        assert (f.nans, f.infs, f.sum, f.sumsq, f.absmax) == (3, 2, 2.0, 14.0, 3.0), dtype
    assert fp.fingerprint(torch.arange(5, device=DEVICE), backend=backend).nans == 0


@pytest.mark.parametrize("rblock", [16, 1024])
@pytest.mark.parametrize("block", [16, 128, 4096])
def test_block_and_grid_do_not_change_the_hash(block, rblock, monkeypatch):
    # RBLOCK=16 makes the 63 partials of BLOCK=16 take two passes of the reduction tree
    # (63 -> 4 -> 1) without the thousands of programs that would take in the interpreter.
    monkeypatch.setattr(fp, "RBLOCK", rblock)
    x = make(torch.bfloat16, (1000,))
    got = fp.fingerprint(x, backend="triton", block=block)
    assert got.hash == fp.tensor_hash(x, backend="torch")
    ref = fp.summaries(x, backend="torch")
    assert (got.absmax, got.nans, got.infs) == (ref.absmax, ref.nans, ref.infs)
    assert got.sum == pytest.approx(ref.sum, rel=1e-5, abs=1e-6)


def test_auto_backend_and_argument_errors():
    x = make(torch.float32, (5,))
    assert fp.fingerprint(x) == fp.fingerprint(x, backend="triton")
    with pytest.raises(ValueError, match="backend"):
        fp.tensor_hash(x, backend="cuda")
    with pytest.raises(TypeError, match="unsupported dtype"):
        fp.tensor_hash(torch.zeros(3, dtype=torch.complex64, device=DEVICE))
    with pytest.raises(ValueError, match="power of two"):
        fp.tensor_hash(x, backend="triton", block=100)


def test_without_triton_the_torch_path_gives_the_same_hash():
    """FastCI must work where Triton cannot be installed (a laptop): the references serve."""
    import subprocess
    import sys

    script = (
        "import builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name == 'triton' or name.startswith('triton.'):\n"
        "        raise ImportError('triton blocked for this test')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "import torch\n"
        "from fastci.kernels import _triton\n"
        "from fastci.kernels.fingerprint import tensor_hash\n"
        "from fastci.kernels.compare import compare\n"
        "assert not _triton.AVAILABLE\n"
        "print(tensor_hash(torch.arange(10.0)), compare(torch.ones(3), torch.ones(3)).ok)\n"
        "try:\n"
        "    tensor_hash(torch.ones(3), backend='triton')\n"
        "except ValueError as exc:\n"
        "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    expected = fp.tensor_hash(torch.arange(10.0), backend="torch")
    assert out[0] == f"{expected} True"
    assert "needs Triton, which is not installed" in out[1]
