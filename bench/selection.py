"""Mutation benchmark: does the selection catch every regression the full suite catches?

For reproducible mutants of examples/tinyllm (see mutants.py) it establishes the ground truth
by running the full suite on each (cached in --cache, keyed by the mutant's content), records
evidence once on the pristine subject, then runs the selection on each mutant and reports:

  safety      killed mutants whose selection contains a failing test / killed mutants, and
              failing tests selected / failing tests
  reduction   1 - expected test-seconds of the selection / of the full suite
  APFDc       of FastCI's order, and of file order over the same selected tests
  latency     of the selection (in-process `Engine.plan`)
  pruning     the same selection after equivalent-context pruning: tests pruned, test-seconds
              saved over trace-diff alone, the replays' cost against the tests they replace,
              and soundness (a pruned test that fails under the mutant is an escape)
  per rule    the same selection with the exact rules off ("before": every importer of a
              function run at import time, every test that ran a changed function) and with
              each one alone: how many selections, and test-seconds, each rule removed, and
              safety before and after, per operator

    python bench/selection.py [--mutants 40] [--benign 8] [--seed 0] [--cache bench/results]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutants import Mutant, generate  # noqa: E402

from fastci.runner.config import EXACT_RULES  # noqa: E402
from fastci.runner.engine import Engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SUBJECT = ROOT / "examples" / "tinyllm"
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
IGNORE = shutil.ignore_patterns("__pycache__", ".fastci", ".pytest_cache", "changes")
HERE = Path(__file__).resolve().parent
# Selections besides the default one (every exact rule on): none of them, and each alone.
RULE_RUNS = {"before": (), **{rule: (rule,) for rule in EXACT_RULES}}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=b@b", "-c", "user.name=bench", *args],
                          cwd=root, check=True, capture_output=True, text=True).stdout


def fresh_copy(dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SUBJECT, dest, ignore=IGNORE)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "subject")
    return dest


def subject_digest() -> str:
    """Ground truth depends on every file of the subject, not only the mutated one."""
    h = hashlib.sha1()
    for path in sorted(SUBJECT.rglob("*")):
        rel = path.relative_to(SUBJECT).as_posix()
        if path.is_file() and not rel.startswith("changes/") and "__pycache__" not in rel:
            h.update(rel.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def collect_order(root: Path) -> list[str]:
    out = subprocess.run(PYTEST + ["--collect-only", f"--rootdir={root}"], cwd=root,
                         capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


@dataclass
class Truth:
    """A suite's outcome under one mutant."""

    failing: list[str]
    status: str  # "ok" (with what crashed or hung), "timeout" or "pytest exit <code>"
    victims: list[str] = field(default_factory=list)
    """Tests that crashed in the suite but pass alone: an earlier test's out-of-bounds
    writes corrupted the heap, and the abort came later. Not failing tests of their own."""


def failing_tests(root: Path, order: list[str], timeout: float) -> Truth:
    """The full suite's failing tests, or ("timeout"/"error") status. A test that kills the
    interpreter (a segfault, an abort), or hangs past `timeout` (one rank of a distributed
    test aborted, the other waits for it), fails, and the suite goes on without it: the
    tests not run yet are run again, until none is left (`failures_plugin.py`). A test
    that crashed is run again alone: one that passes then is a victim, not a failing test."""
    failed: set[str] = set()
    victims: list[str] = []
    done: set[str] = set()
    crashed = hung = 0
    with tempfile.TemporaryDirectory() as tmp:
        run = _Run(root, Path(tmp), timeout)
        while True:
            returncode, reported, started, finished = run(
                [t for t in order if t not in done] if done else None)
            failed.update(_expand(reported, order))
            if returncode in (0, 1):
                break
            dead = [n for n in started if n not in finished]
            if not dead:  # it died outside any test: no test to blame
                if failed:
                    break
                return Truth([], "timeout" if returncode is None else f"pytest exit {returncode}")
            done.update(finished, dead)
            if returncode is None:
                hung += 1
                failed.update(dead)
            elif run(dead)[0] in (0, 5):  # passes alone (5: deselected, nothing ran)
                victims += dead
            else:
                crashed += 1
                failed.update(dead)
            left = [t for t in order if t not in done]
            print(f"    {'hung' if returncode is None else 'crashed'} in {dead[0]}; "
                  f"{len(left)} tests left", flush=True)
            if not left:
                break
    ended = ", ".join(f"{n} {what}" for n, what in (
        (crashed, "crashed"), (len(victims), "crashed only after other tests"), (hung, "hung"))
        if n)
    return Truth(sorted(failed), f"ok ({ended})" if ended else "ok", sorted(victims))


class _Run:
    """One pytest run of the suite (or of `only` its tests), with the failures plugin."""

    def __init__(self, root: Path, tmp: Path, timeout: float) -> None:
        self.root, self.timeout = root, timeout
        self.out, self.only = tmp / "failures.txt", tmp / "only.txt"

    def __call__(self, only: list[str] | None) -> tuple[int | None, list[str], list[str], set]:
        progress = Path(f"{self.out}.progress")
        for stale in (self.out, progress):
            stale.unlink(missing_ok=True)
        env = {**os.environ, "FASTCI_BENCH_FAILURES": str(self.out),
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        if only is not None:
            self.only.write_text("".join(t + "\n" for t in only))
            env["FASTCI_BENCH_ONLY"] = str(self.only)
        returncode = _run_group(PYTEST + ["-p", "failures_plugin", f"--rootdir={self.root}"],
                                self.root, env, self.timeout)
        reported = self.out.read_text().splitlines() if self.out.exists() else []
        started, finished = [], set()
        for line in (progress.read_text().splitlines() if progress.exists() else []):
            kind, _, node = line.partition(" ")
            (started.append if kind == "start" else finished.add)(node)
        return returncode, [r for r in reported if r], started, finished


def _expand(reported: list[str], order: list[str]) -> set[str]:
    out = set()
    for node in reported:
        if "::" in node:
            out.add(node)
        else:  # a test file that failed to import: all its tests fail
            out.update(t for t in order if t.startswith(node + "::"))
    return out


def _run_group(command: list[str], cwd: Path, env: dict, timeout: float) -> int | None:
    """Run pytest in a process group of its own: its return code, or None once it ran past
    `timeout`, when the whole group is killed (a hung test's child processes too)."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def _well_formed(entry: dict) -> bool:
    """Entries cached before node ids were read from the plugin lost what followed a space:
    a parametrized id cut there no longer ends with its "]" (counting brackets threw away
    ids whose parameters hold one, `bucket ids must lie in \\[0, 2\\)`, at every run)."""
    return (all("[" not in t or t.endswith("]") for t in entry["failing"])
            and not entry["status"].startswith("pytest exit")  # from before crashes were run past
            and ("victims" in entry or "crashed" not in entry["status"]))  # ... and verified


def apfdc(order: list[str], costs: dict[str, float], failing: set[str]) -> float | None:
    """Cost-cognizant APFD for one fault revealed by any test in `failing`."""
    total = sum(costs[t] for t in order)
    for i, test in enumerate(order):
        if test in failing:
            remaining = sum(costs[t] for t in order[i:])
            return (remaining - costs[test] / 2) / total if total else 1.0
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=40)
    ap.add_argument("--benign", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--only-ground-truth", action="store_true")
    ap.add_argument("--first-recording", action="store_true",
                    help="select from a repository's first recording (every test captured)")
    ap.add_argument("--shard", default="0/1", metavar="K/N",
                    help="establish ground truth for every N-th mutant from the K-th (run N "
                         "processes to use N cores; each writes its own cache file)")
    args = ap.parse_args()
    cache_dir = Path(args.cache)
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = cache_dir / "mutation-work"
    work.mkdir(exist_ok=True)
    shard, shards = (int(x) for x in args.shard.split("/"))
    truth_file = cache_dir / ("mutation-ground-truth.json" if shards == 1
                              else f"mutation-ground-truth.{shard}.json")
    truth = {}
    for cached in sorted(cache_dir.glob("mutation-ground-truth*.json")):
        truth.update((k, v) for k, v in json.loads(cached.read_text()).items() if _well_formed(v))

    mutants = generate(SUBJECT, "tinyllm", args.mutants, args.benign, args.seed)
    print(f"{len(mutants)} mutants ({sum(m.benign for m in mutants)} benign) of "
          f"{SUBJECT.relative_to(ROOT)}", flush=True)

    gt_repo = fresh_copy(work / f"ground-truth-{shard}")
    order = collect_order(gt_repo)
    start = time.perf_counter()
    pristine = failing_tests(gt_repo, order, timeout=900)
    base_failing, status = pristine.failing, pristine.status
    suite_seconds = time.perf_counter() - start
    if base_failing or status != "ok":
        sys.exit(f"the pristine suite must pass: {status} {base_failing[:5]}")
    digest = subject_digest()
    mine = {k: v for k, v in (json.loads(truth_file.read_text()) if truth_file.exists()
                              else {}).items() if _well_formed(v)}

    def key_of(m: Mutant) -> str:
        return hashlib.sha1(f"{digest}\0{m.path}\0{m.after}".encode()).hexdigest()

    for i, m in enumerate(mutants, 1):
        key = key_of(m)
        if key in truth or (i - 1) % shards != shard:
            continue
        m.apply(gt_repo)
        t0 = time.perf_counter()
        found = failing_tests(gt_repo, order, timeout=max(5 * suite_seconds, 120))
        failed, status = found.failing, found.status
        git(gt_repo, "checkout", "-q", "--", m.path)
        truth[key] = mine[key] = {"id": m.id, "failing": failed, "status": status,
                                  "victims": found.victims}
        truth_file.write_text(json.dumps(mine, indent=1, sort_keys=True))
        print(f"  ground truth {i}/{len(mutants)} {m.id:<40} {len(failed):>3} failing "
              f"({status}, {time.perf_counter() - t0:.0f}s)", flush=True)
    if args.only_ground_truth:
        return

    ev_repo = fresh_copy(work / "evidence")
    # Replays remember kernel launches (`runner/prune/launches.py`): in a folder of this
    # run's own, empty at its start, as the replays cached in its fresh store are.
    # FASTCI_LAUNCH_CACHE=off measures without them.
    if os.environ.get("FASTCI_LAUNCH_CACHE", "").strip().lower() not in ("off", "0"):
        launches = work / "launches"
        shutil.rmtree(launches, ignore_errors=True)
        os.environ["FASTCI_LAUNCH_CACHE"] = str(launches)
    # Twice, as on every push after a repository's first: the second recording knows each
    # test's duration, and captures nothing of those under capture_min_seconds.
    for _ in range(1 if args.first_recording else 2):
        # As `fastci record` runs it: the recording ends by starting the replay zygote.
        subprocess.run(PYTEST + [f"--rootdir={ev_repo}", "--fastci-record"], cwd=ev_repo,
                       check=True, capture_output=True,
                       env={**os.environ, "FASTCI_PREWARM": "1"})
    base = git(ev_repo, "rev-parse", "HEAD").strip()
    engine = Engine(ev_repo)
    settings = engine.settings
    rows = []
    for m in mutants:
        gt = truth[key_of(m)]
        m.apply(ev_repo)
        t0 = time.perf_counter()
        planned = engine.plan(base)
        latency = time.perf_counter() - t0
        t0 = time.perf_counter()
        pruned_plan = engine.plan(base, prune=True)
        prune_seconds = time.perf_counter() - t0
        by_rule = {}
        for name, exact in RULE_RUNS.items():
            engine.settings = replace(settings, exact=exact)
            by_rule[name] = engine.plan(base).selection
        engine.settings = settings
        git(ev_repo, "checkout", "-q", "--", m.path)
        sel = planned.selection
        psel = pruned_plan.selection
        costs = {d.test_id: max(d.expected_seconds, 1e-4) for d in sel.decisions}
        chosen = [d.test_id for d in sel.selected]
        selected_ids = set(chosen)
        # A prefix id (a new test) stands for its parametrizations.
        failing = set(gt["failing"])
        caught = {f for f in failing if f in selected_ids or f.split("[")[0] in selected_ids}
        total_cost = sum(costs.values())
        reduction = 1 - sum(costs[t] for t in chosen) / total_cost if total_cost else 0.0
        file_order = sorted(chosen, key=lambda t: order.index(t) if t in order else len(order))
        pruned = {d.test_id: d.pruned for d in psel.decisions if d.pruned is not None}
        p_chosen = [d.test_id for d in psel.selected]
        p_ids = set(p_chosen)
        p_caught = {f for f in failing if f in p_ids or f.split("[")[0] in p_ids}
        outcome = pruned_plan.pruning
        rows.append({
            "pruned": len(pruned), "candidates": len(pruned) + (len(outcome.kept) if outcome
                                                                 else 0),
            "pruned_seconds": sum(e["test_seconds"] for e in pruned.values()),
            # each capture once (tests share captures), both replays, without process start-up
            "replay_seconds": outcome.replay_seconds if outcome else 0.0,
            "prune_wall": prune_seconds,
            "selected_pruned": len(p_chosen),
            "reduction_pruned": 1 - sum(costs[t] for t in p_chosen) / total_cost
            if total_cost else 0.0,
            "caught_pruned": sorted(p_caught),
            "escaped_by_pruning": sorted(failing & set(pruned)),
            "id": m.id, "operator": m.operator, "benign": m.benign, "status": gt["status"],
            "path": m.path, "line": m.line,
            "killed": bool(failing), "failing": sorted(failing), "caught": sorted(caught),
            "selected": len(chosen), "total": len(sel.decisions), "mode": sel.mode,
            "reduction": reduction, "latency": latency,
            "apfdc": apfdc(chosen, costs, failing) if failing else None,
            "apfdc_file_order": apfdc(file_order, costs, failing) if failing else None,
            "rules": _per_rule(by_rule, sel, costs, failing),
            "missed": sorted(failing - caught),
            "missed_reasons": {t: (sel.decision(t).reasons if sel.decision(t) else ["no decision"])
                               for t in sorted(failing - caught)},
        })
    report(rows, cache_dir / "mutation.json")


def _per_rule(by_rule: dict, after, costs: dict[str, float], failing: set[str]) -> dict:
    """The selection with the exact rules off and with each alone, against `after` (all on):
    selected tests and test-seconds, what each rule removed, whether a failing test stayed."""
    def summary(selection) -> dict:
        ids = {d.test_id for d in selection.selected}
        return {"selected": len(ids), "seconds": sum(costs.get(t, 0.0) for t in ids),
                "caught": sorted(f for f in failing if f in ids or f.split("[")[0] in ids)}

    out = {name: summary(selection) for name, selection in by_rule.items()}
    out["after"] = summary(after)
    before = out["before"]
    for rule in EXACT_RULES:
        out[rule]["removed"] = before["selected"] - out[rule]["selected"]
        out[rule]["removed_seconds"] = before["seconds"] - out[rule]["seconds"]
    total = sum(costs.values())
    for entry in out.values():
        entry["reduction"] = 1 - entry["seconds"] / total if total else 0.0
    return out


def report_rules(rows: list[dict]) -> dict:
    """Per operator: safety and mean reduction before and after the exact rules, and the
    selections (tests) each rule removed, summed over the operator's mutants."""
    table = {}
    for operator in sorted({r["operator"] for r in rows}):
        mine = [r for r in rows if r["operator"] == operator]
        killed = [r for r in mine if r["killed"]]
        table[operator] = {
            "mutants": len(mine), "killed": len(killed),
            "caught_before": sum(bool(r["rules"]["before"]["caught"]) for r in killed),
            "caught_after": sum(bool(r["rules"]["after"]["caught"]) for r in killed),
            "reduction_before": statistics.mean(r["rules"]["before"]["reduction"] for r in mine),
            "reduction_after": statistics.mean(r["rules"]["after"]["reduction"] for r in mine),
            **{f"removed_by_{rule}": sum(r["rules"][rule]["removed"] for r in mine)
               for rule in EXACT_RULES},
        }
    print(f"\n{'operator':<20} {'mutants':>7} {'killed':>6} {'caught before':>13} "
          f"{'caught after':>12} {'reduction before':>16} {'after':>6} "
          + " ".join(f"{'removed by ' + rule:>22}" for rule in EXACT_RULES))
    for operator, t in table.items():
        print(f"{operator[:20]:<20} {t['mutants']:>7} {t['killed']:>6} "
              f"{t['caught_before']:>6}/{t['killed']:<6} {t['caught_after']:>5}/{t['killed']:<6} "
              f"{t['reduction_before']:>16.0%} {t['reduction_after']:>6.0%} "
              + " ".join(f"{t['removed_by_' + rule]:>22}" for rule in EXACT_RULES))
    return table


def report(rows: list[dict], out: Path) -> None:
    killed = [r for r in rows if r["killed"]]
    safe = [r for r in killed if r["caught"]]
    failing = sum(len(r["failing"]) for r in killed)
    caught = sum(len(r["caught"]) for r in killed)
    print(f"\n{'mutant':<40} {'operator':<20} {'fail':>4} {'caught':>6} {'sel':>9} "
          f"{'reduct':>6} {'APFDc':>6} {'file':>6} {'ms':>5}")
    for r in rows:
        ap = f"{r['apfdc']:.2f}" if r["apfdc"] is not None else "-"
        fo = f"{r['apfdc_file_order']:.2f}" if r["apfdc_file_order"] is not None else "-"
        print(f"{r['id'][:40]:<40} {r['operator'][:20]:<20} {len(r['failing']):>4} "
              f"{len(r['caught']):>6} {r['selected']:>4}/{r['total']:<4} {r['reduction']:>6.0%} "
              f"{ap:>6} {fo:>6} {r['latency'] * 1000:>5.0f}")
    escaped = [(r["id"], r["escaped_by_pruning"]) for r in rows if r["escaped_by_pruning"]]
    safe_pruned = [r for r in killed if r["caught_pruned"]]
    pruned_seconds = sum(r["pruned_seconds"] for r in rows)
    replay_seconds = sum(r["replay_seconds"] for r in rows)
    print(f"\n{'mutant':<40} {'sel':>4} {'cand':>5} {'pruned':>6} {'sel after':>9} "
          f"{'reduct':>6} {'test s':>7} {'replay s':>8} {'wall s':>6}")
    for r in rows:
        print(f"{r['id'][:40]:<40} {r['selected']:>4} {r['candidates']:>5} {r['pruned']:>6} "
              f"{r['selected_pruned']:>9} {r['reduction_pruned']:>6.0%} "
              f"{r['pruned_seconds']:>7.2f} {r['replay_seconds']:>8.2f} {r['prune_wall']:>6.1f}")
    apf = [r["apfdc"] for r in killed if r["apfdc"] is not None]
    apf_file = [r["apfdc_file_order"] for r in killed if r["apfdc_file_order"] is not None]
    summary = {
        "mutants": len(rows), "benign": sum(r["benign"] for r in rows),
        "killed": len(killed),
        "safety_mutants": len(safe) / len(killed) if killed else 1.0,
        "safety_tests": caught / failing if failing else 1.0,
        "mean_reduction_all": statistics.mean(r["reduction"] for r in rows),
        "mean_reduction_killed": (statistics.mean(r["reduction"] for r in killed)
                                  if killed else None),
        "mean_reduction_survived": statistics.mean(r["reduction"] for r in rows if not r["killed"])
        if len(killed) < len(rows) else None,
        "mean_apfdc": statistics.mean(apf) if apf else None,
        "mean_apfdc_file_order": statistics.mean(apf_file) if apf_file else None,
        "median_latency_ms": statistics.median(r["latency"] for r in rows) * 1000,
        "pruning": {
            "selected_before": sum(r["selected"] for r in rows),
            "candidates": sum(r["candidates"] for r in rows),
            "pruned": sum(r["pruned"] for r in rows),
            "mean_reduction_all": statistics.mean(r["reduction_pruned"] for r in rows),
            "mean_reduction_killed": statistics.mean(r["reduction_pruned"] for r in killed)
            if killed else None,
            "safety_mutants": len(safe_pruned) / len(killed) if killed else 1.0,
            "escaped": escaped,
            "pruned_test_seconds": pruned_seconds,
            "replay_seconds": replay_seconds,
            "median_wall_s": statistics.median(r["prune_wall"] for r in rows),
            "wall_s": sum(r["prune_wall"] for r in rows),
        },
        "missed": [{"id": r["id"], "tests": r["missed"], "reasons": r["missed_reasons"]}
                   for r in rows if r["missed"]],
        "rules": report_rules(rows),
        "mean_reduction_before_exact_rules": statistics.mean(
            r["rules"]["before"]["reduction"] for r in rows),
    }
    print(f"\nsafety: {len(safe)}/{len(killed)} killed mutants caught by the selection "
          f"({summary['safety_mutants']:.0%}); {caught}/{failing} failing tests selected "
          f"({summary['safety_tests']:.0%})")
    print(f"test-time reduction: mean {summary['mean_reduction_all']:.0%} over all mutants"
          + (f", {summary['mean_reduction_killed']:.0%} over killed" if killed else "")
          + f" ({summary['mean_reduction_before_exact_rules']:.0%} with the exact rules off)")
    if apf:
        print(f"APFDc: FastCI order {summary['mean_apfdc']:.3f}, file order "
              f"{summary['mean_apfdc_file_order']:.3f} (mean over killed mutants)")
    print(f"selection latency: median {summary['median_latency_ms']:.0f} ms")
    p = summary["pruning"]
    print(f"pruning: {p['pruned']} of {p['candidates']} candidates pruned "
          f"({p['selected_before']} tests selected by trace diff over all mutants); "
          f"mean reduction {summary['mean_reduction_all']:.0%} -> {p['mean_reduction_all']:.0%}"
          f"; {p['pruned_test_seconds']:.1f} recorded test-seconds pruned for "
          f"{p['replay_seconds']:.1f} s of replay (each capture replayed once under the old and "
          f"once under the new code, start-up excluded; {p['wall_s']:.1f} s of pruning wall time "
          f"in all); median pruning wall time {p['median_wall_s']:.1f} s")
    print(f"pruning soundness: {len(escaped)} mutants with a pruned failing test; "
          f"killed mutants still caught {len(safe_pruned)}/{len(killed)}")
    for mutant, tests in escaped:
        print(f"ESCAPED BY PRUNING {mutant}: {tests}")
    for miss in summary["missed"]:
        print(f"MISSED {miss['id']}: {miss['tests']}")
    out.write_text(json.dumps({"summary": summary, "mutants": rows}, indent=1))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
