"""The GPU check, step by step (run through bench/gpu_check.sh). Each step prints a line and
adds a section to the Markdown report; the exit status is 1 if any step failed.

1. environment: the evidence's environment digest, which must name the GPU;
2. kernels: bench/kernels.py, the fingerprint kernels' bandwidth against a measured
   device-to-device copy (its preflight checks the compiled kernels against torch first);
3. record: examples/tinyllm's suite recorded on CUDA (a copy in a temporary git
   repository); the cross-entropy tests run the compiled Triton kernel against its torch
   reference, and their evidence must name the kernel launched;
4. prune: the demo's `refactor_identical` change, `fastci select`: module calls captured on
   CUDA are replayed under both trees, and equivalent tests pruned;
5. kernel bug: the demo's `kernel_backward_bug` change, `fastci run`: its failing tests must
   fail, with the compiled kernel.

`--dry-run` checks the wiring on a CPU: Triton's interpreter, tiny kernel sizes, a subset of
the suite, and a GPU is not required by any step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINYLLM = ROOT / "examples" / "tinyllm"
# One attention test (one captured call to replay: each costs seconds in the interpreter)
# and the cross-entropy kernel's tests (the bug's failing tests among them).
DRY_SUBSET = ["tests/test_attention.py::test_output_shape[1]",
              "tests/test_kernel_cross_entropy.py"]
PYTEST = ["-q", "-p", "no:cacheprovider"]


class Report:
    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.sections: list[str] = []
        self.failed: list[str] = []

    def step(self, name: str, ok: bool, summary: str, detail: str = "",
             seconds: float = 0.0) -> None:
        mark = "pass" if ok else "FAIL"
        print(f"gpu_check: [{mark}] {name} ({seconds:.0f} s): {summary}", flush=True)
        if not ok:
            self.failed.append(name)
        body = f"## {name}: {mark}\n\n{summary} ({seconds:.1f} s)\n"
        if detail:
            body += f"\n```\n{detail.strip()[-4000:]}\n```\n"
        self.sections.append(body)


def run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FASTCI_STORE"}
    try:
        return subprocess.run(cmd, cwd=cwd, text=True, capture_output=True, timeout=timeout,
                              env=env)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, str(exc.stdout or ""),
                                           f"timed out after {timeout:.0f} s")


def fastci(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "fastci", *args], cwd, timeout)


def step_environment(report: Report) -> None:
    from fastci.runner.analysis.environment import current

    started = time.perf_counter()
    env = current("")
    ok = bool(env.gpu) or report.dry_run
    report.step("environment digest", ok,
                f"digest `{env.digest}`, GPU `{env.gpu or 'none'}`, CUDA `{env.cuda or '-'}`, "
                f"torch `{env.torch}`, triton `{env.triton}`"
                + ("" if env.gpu else " (no GPU named: dry run)" if report.dry_run else
                   ": the digest does not name a GPU"),
                env.to_json(), time.perf_counter() - started)


def step_kernels(report: Report, out: Path, sizes: list[str]) -> None:
    started = time.perf_counter()
    csv = out.with_suffix(".kernels.csv")
    proc = run([sys.executable, str(ROOT / "bench" / "kernels.py"), "--sizes-mib", *sizes,
                "--csv", str(csv)], ROOT, 300)
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    worst = [x for x in lines if "worst" in x.lower()]
    summary = "; ".join(worst[:6]) or (lines[-1] if lines else "no output")
    report.step("kernels vs device copy bandwidth", proc.returncode == 0, summary,
                proc.stdout + proc.stderr, time.perf_counter() - started)


def make_repo(workdir: Path) -> Path:
    repo = workdir / "tinyllm"
    shutil.copytree(TINYLLM, repo, ignore=shutil.ignore_patterns(
        "__pycache__", ".fastci", ".pytest_cache", "changes"))
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "gpu@fastci.invalid"],
                 ["config", "user.name", "gpu check"], ["config", "commit.gpgsign", "false"],
                 ["add", "-A"], ["commit", "-q", "-m", "tinyllm"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def step_record(report: Report, repo: Path, subset: list[str]) -> bool:
    from fastci.runner.store import open_store

    started = time.perf_counter()
    proc = fastci("record", "-q", "--", *PYTEST, *subset, cwd=repo, timeout=420)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        report.step("tinyllm recorded", False, f"fastci record exited {proc.returncode}",
                    proc.stdout + proc.stderr, seconds)
        return False
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, text=True,
                          capture_output=True).stdout.strip()
    with open_store(str(repo / ".fastci" / "evidence.db"), create=False) as store:
        key, env = store.snapshot_envs(head)[0]
        snap = store.load_snapshot(head, key)
    assert snap is not None
    tests = list(snap.tests.values())
    on_cuda = sum(t.cuda for t in tests)
    xent = [t for t in tests if "test_kernel_cross_entropy" in t.test_id]
    launched = sorted({k for t in xent for k in t.kernels})
    passed = sum(t.outcome == "passed" for t in xent)
    ok = bool(xent) and bool(launched) and passed == len(xent) and \
        (on_cuda > 0 or report.dry_run)
    report.step("tinyllm recorded", ok,
                f"{len(tests)} tests recorded ({on_cuda} on CUDA, GPU `{env.gpu or 'none'}`); "
                f"cross-entropy kernel vs torch reference: {passed}/{len(xent)} passed, "
                f"kernels launched: {', '.join(launched) or 'none'}",
                proc.stdout[-1500:], seconds)
    return ok


def apply(repo: Path, patch: str) -> None:
    subprocess.run(["git", "apply", str(TINYLLM / "changes" / patch)], cwd=repo, check=True,
                   capture_output=True)


def revert(repo: Path) -> None:
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=repo, check=True)
    subprocess.run(["git", "clean", "-qfd", "-e", ".fastci"], cwd=repo, check=True)


def step_kernel_bug(report: Report, repo: Path, subset: list[str]) -> None:
    import yaml

    started = time.perf_counter()
    changes = yaml.safe_load((TINYLLM / "changes" / "changes.yaml").read_text())["changes"]
    expected = set(next(c for c in changes if c["name"] == "kernel_backward_bug")
                   ["failing_tests"])
    apply(repo, "kernel_backward_bug.patch")
    try:
        out = repo / ".fastci" / "run.json"
        proc = fastci("run", "-q", "--no-prune", "--no-background", "--json", str(out), "--",
                      *PYTEST, cwd=repo, timeout=300)
        data = json.loads(out.read_text()) if out.exists() else {"results": []}
    finally:
        revert(repo)
    failed = {r["test_id"] for r in data["results"] if r["outcome"] in ("failed", "error")}
    ran = {r["test_id"] for r in data["results"]}
    wanted = expected & ran if subset else expected
    ok = proc.returncode == 1 and bool(wanted) and wanted <= failed
    report.step("demo kernel bug caught", ok,
                f"fastci run exited {proc.returncode}; {len(ran)} tests ran, {len(failed)} "
                f"failed; the change's known failing tests caught: "
                f"{len(wanted & failed)}/{len(wanted)}",
                proc.stdout[-1500:] + proc.stderr[-1500:], time.perf_counter() - started)


def step_prune(report: Report, repo: Path) -> None:
    started = time.perf_counter()
    apply(repo, "refactor_identical.patch")
    try:
        proc = fastci("select", "-q", "--format", "json", cwd=repo, timeout=300)
    finally:
        revert(repo)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        report.step("CUDA capture replayed and pruned", False,
                    f"fastci select exited {proc.returncode}", proc.stderr,
                    time.perf_counter() - started)
        return
    pruned = data["summary"]["pruned"]
    notes = [n for n in data.get("notes", []) if "prun" in n]
    ok = proc.returncode == 0 and pruned > 0
    report.step("CUDA capture replayed and pruned", ok,
                f"{pruned} tests pruned, {data['summary']['selected']} selected; "
                + ("; ".join(notes) or "no pruning note"), "",
                time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", required=True, help="the Markdown report to write")
    args = parser.parse_args(argv)
    report = Report(args.dry_run)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    subset = DRY_SUBSET if args.dry_run else []
    step_environment(report)
    step_kernels(report, out, ["1"] if args.dry_run else ["256", "1024", "4096"])
    with tempfile.TemporaryDirectory(prefix="fastci-gpu-check-") as tmp:
        repo = make_repo(Path(tmp))
        if step_record(report, repo, subset):
            step_prune(report, repo)  # selects only: the recorded evidence stays the base
            step_kernel_bug(report, repo, subset)
    total = time.perf_counter() - started
    title = "GPU check (dry run on a CPU)" if args.dry_run else "GPU check"
    head = (f"# {title}, {time.strftime('%Y-%m-%d %H:%M')}\n\n"
            f"`bash bench/gpu_check.sh{' --dry-run' if args.dry_run else ''}` on "
            f"{platform.node()} ({platform.processor() or platform.machine()}), "
            f"{total:.0f} s in all; "
            + ("every step passed." if not report.failed else
               f"FAILED: {', '.join(report.failed)}.") + "\n")
    out.write_text("\n".join([head, *report.sections]))
    print(f"gpu_check: wrote {out} ({total:.0f} s)")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
