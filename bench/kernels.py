"""GPU throughput of fastci.kernels (tensor hash, summaries, fused fingerprint, fused compare)
against the device's own copy bandwidth, for 256 MiB .. 4 GiB tensors of float32 and bfloat16.

    python bench/kernels.py [--sizes-mib 256 512 1024 2048 4096] [--csv PATH]

First a correctness preflight on the device (Triton vs the torch reference on the same CUDA
tensors: hashes bit-identical, comparisons identical, summaries within 1e-5), because the
kernels' tests run in Triton's CPU interpreter and this is where the compiled path gets checked.
Then triton.testing.do_bench (median) times:

  copy         dst.copy_(src) of the same bytes: the bandwidth ceiling, counted read + write
  hash         the hash-only kernel + reduction tree, no host sync (bytes read)
  summaries    the summaries-only kernel + tree, no host sync
  fingerprint  both in one pass, no host sync
  compare      the fused comparison of two tensors, no host sync (bytes of both read)
  *-api        fingerprint() / compare() as called: launches, device-to-host copy of the
               packed result, host-side digest - what a caller actually waits for

and prints GB/s (1e9 bytes) and the percentage of copy bandwidth; the target for the kernel
rows is >= 80%. A CSV with the GPU's name goes to --csv (default
bench/results/kernels-<gpu>.csv). Expected, not yet measured: 1-2 minutes on an H200, most of
it Triton compilation and do_bench's fixed 125 ms per row; peak memory about 2x the largest
size.

Without CUDA it runs the preflight in the interpreter on tiny tensors and exits 0 when that
passes: timings from the interpreter would say nothing about a GPU, so none are taken.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import re
import sys
from pathlib import Path

import torch

SIZES_MIB = [256, 512, 1024, 2048, 4096]
DTYPES = [torch.float32, torch.bfloat16]
TARGET = 0.80
RESULTS = Path(__file__).resolve().parent / "results"     # git-ignored


def preflight(device: str, n: int) -> list[str]:
    """Triton vs torch reference on `device`; returns the failures (empty when all agree)."""
    from fastci.kernels import compare as cp
    from fastci.kernels import fingerprint as fp

    g = torch.Generator().manual_seed(0)

    def rand(dtype, shape):
        if dtype.is_floating_point:
            return torch.randn(shape, generator=g).to(dtype).to(device)
        if dtype == torch.bool:
            return (torch.rand(shape, generator=g) < 0.5).to(device)
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64
                             ).to(dtype).to(device)

    side = max(int(n ** 0.5), 8)
    cases = {
        "float32 contiguous": rand(torch.float32, (n + 3,)),
        "float32 transposed": rand(torch.float32, (side, side + 1)).t(),
        "bfloat16 contiguous": rand(torch.bfloat16, (n + 3,)),
        "bfloat16 4-d slice": rand(torch.bfloat16, (8, 10, 12, side))[:, ::2, 1:9, ::3],
        "float16 contiguous": rand(torch.float16, (n,)),
        "float64 contiguous": rand(torch.float64, (n,)),
        "int64 contiguous": rand(torch.int64, (n,)),
        "uint8 step 3": rand(torch.uint8, (3 * n,))[::3],
        "bool contiguous": rand(torch.bool, (n,)),
    }
    failures = []
    for name, x in cases.items():
        tri, ref = fp.fingerprint(x, backend="triton"), fp.fingerprint(x, backend="torch")
        scale = float(x.double().abs().sum())
        if tri.hash != ref.hash:
            failures.append(f"{name}: hash {tri.hash:#x} != reference {ref.hash:#x}")
        if (tri.absmax, tri.nans, tri.infs) != (ref.absmax, ref.nans, ref.infs):
            failures.append(f"{name}: absmax/nans/infs {tri} != {ref}")
        if abs(tri.sum - ref.sum) > 1e-6 + 1e-5 * scale or \
                abs(tri.sumsq - ref.sumsq) > 1e-6 + 1e-5 * ref.sumsq:
            failures.append(f"{name}: sum/sumsq {tri.sum}, {tri.sumsq} vs reference "
                            f"{ref.sum}, {ref.sumsq}")
        y = x.clone(memory_format=torch.contiguous_format)     # x may be strided; y is not
        if y.dtype == torch.bool:
            y.view(-1)[::5] ^= True
        elif y.is_floating_point():
            y.view(-1)[::5] *= 1.001
            y.view(-1)[7] = float("nan")
        else:
            y.view(-1)[::5] += 1
        c_tri, c_ref = cp.compare(y, x, backend="triton"), cp.compare(y, x, backend="torch")
        if c_tri != c_ref:
            failures.append(f"{name}: compare\n  triton: {c_tri}\n  torch:  {c_ref}")
    return failures


def gpu_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def bench(sizes_mib: list[int], csv_path: str | None) -> int:
    import triton
    from triton.testing import do_bench

    from fastci.kernels import compare as cp
    from fastci.kernels import fingerprint as fp

    gpu = torch.cuda.get_device_name()
    failures = preflight("cuda", 1 << 20)
    print(f"{gpu}: preflight {'FAILED' if failures else 'passed'} "
          f"(Triton vs torch reference on the device)")
    for f in failures:
        print("  " + f)

    def timed(fn) -> float:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")

    rows = []

    def measure(dtype, mib: int) -> None:
        """One dtype and size. x and y live in this call, so they are freed when it returns,
        before the next size allocates."""
        nbytes = mib << 20
        x = torch.randn(nbytes // (torch.finfo(dtype).bits // 8), device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        copy_ms = timed(lambda: y.copy_(x))
        copy_gbs = 2 * nbytes / copy_ms / 1e6
        y.view(-1)[::1000] += 1          # y is now x with every 1000th element off
        atol, rtol = cp.default_tolerances(dtype)
        ops = [
            ("copy", 2, None),
            ("hash", 1, lambda: fp.fingerprint_device(x, do_stats=False)),
            ("summaries", 1, lambda: fp.fingerprint_device(x, do_hash=False)),
            ("fingerprint", 1, lambda: fp.fingerprint_device(x)),
            ("compare", 2, lambda: cp.compare_device(y, x, atol, rtol)),
            ("fingerprint-api", 1, lambda: fp.fingerprint(x)),
            ("compare-api", 2, lambda: cp.compare(y, x)),
        ]
        for op, reads, fn in ops:
            ms = copy_ms if fn is None else timed(fn)
            gbs = reads * nbytes / ms / 1e6
            row = {"gpu": gpu, "dtype": str(dtype).removeprefix("torch."),
                   "size_mib": mib, "op": op, "ms": round(ms, 4), "gb_per_s": round(gbs, 1),
                   "pct_of_copy": round(100 * gbs / copy_gbs, 1)}
            rows.append(row)
            print(f"{row['dtype']:9} {mib:>5}MiB {op:16} {ms:9.4f} {gbs:8.1f} "
                  f"{row['pct_of_copy']:6.1f}%")

    header = f"{'dtype':9} {'size':>8} {'op':16} {'ms':>9} {'GB/s':>8} {'% copy':>7}"
    print(header)
    print("-" * len(header))
    for dtype in DTYPES:
        for mib in sizes_mib:
            measure(dtype, mib)
            torch.cuda.empty_cache()

    kernel_ops = ("hash", "summaries", "fingerprint", "compare")
    worst = {op: min(r["pct_of_copy"] for r in rows if r["op"] == op) for op in kernel_ops}
    print("\nworst % of copy bandwidth (target >= {:.0f}%): ".format(100 * TARGET)
          + ", ".join(f"{op} {pct:.1f}%{'' if pct >= 100 * TARGET else ' BELOW'}"
                      for op, pct in worst.items()))

    path = Path(csv_path) if csv_path else RESULTS / f"kernels-{gpu_slug(gpu)}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) + ["torch", "triton", "python"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "torch": torch.__version__, "triton": triton.__version__,
                             "python": platform.python_version()})
    print(f"wrote {path}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=SIZES_MIB)
    parser.add_argument("--csv", help="output CSV (default: bench/results/kernels-<gpu>.csv)")
    args = parser.parse_args(argv)

    if torch.cuda.is_available():
        return bench(args.sizes_mib, args.csv)

    # Triton picks interpreter or compiler when fastci.kernels is imported, hence before it.
    os.environ["TRITON_INTERPRET"] = "1"
    print("No CUDA device: nothing to time (the Triton interpreter's speed says nothing about a "
          "GPU's).\nRunning the Triton-vs-reference preflight in the interpreter on tiny "
          "tensors instead.")
    failures = preflight("cpu", 3000)
    for f in failures:
        print("  " + f)
    print("interpreter preflight " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
