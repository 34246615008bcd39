"""What stands between pruning and the oracle, mutant by mutant: the tests that stay selected
though they pass under their mutant, grouped by why pruning kept them, in recorded seconds.

Reads what `bench/selection.py` left in its cache folder (the mutation results and the
evidence repository it recorded), selects again for the mutants with the widest gap, and
prints a table per mutant. The oracle runs only the failing tests. The last line says how
much of the gap no sound pruning by replay can close: passing tests whose captured calls
compute otherwise under their mutant (the change alters behaviour that no assertion checks).

    python bench/selection.py              # first: results and evidence
    python bench/prune_gaps.py [--top 12] [--cache bench/results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mutants import generate  # noqa: E402

from fastci.runner.engine import Engine  # noqa: E402
from fastci.runner.store import open_store  # noqa: E402

ROOT = HERE.parent
SUBJECT = ROOT / "examples" / "tinyllm"


def durations(evidence: Path, head: str) -> dict[str, float]:
    with open_store(str(evidence / ".fastci" / "evidence.db"), create=False) as store:
        key, _ = store.snapshot_envs(head)[0]
        return {t: r.duration for t, r in store.load_snapshot(head, key).tests.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(HERE / "results"))
    ap.add_argument("--top", type=int, default=12, help="mutants with the widest gap")
    args = ap.parse_args()
    cache = Path(args.cache)
    results = cache / "mutation.json"
    evidence = cache / "mutation-work" / "evidence"
    if not results.exists() or not evidence.exists():
        sys.exit(f"no mutation results in {cache}: run bench/selection.py first")
    data = json.loads(results.read_text())
    rows = {r["id"]: r for r in data["mutants"]}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=evidence, check=True,
                          capture_output=True, text=True).stdout.strip()
    took = durations(evidence, head)
    total = sum(took.values())
    gaps = []
    for r in rows.values():
        oracle = 1 - sum(took.get(t, 0.0) for t in r["failing"]) / total
        gaps.append((oracle - r["reduction_pruned"], oracle, r))
    gaps.sort(key=lambda g: -g[0])
    mean = sum(g[2]["reduction_pruned"] for g in gaps) / len(gaps)
    print(f"mean reduction after pruning {mean:.1%}, oracle "
          f"{sum(g[1] for g in gaps) / len(gaps):.1%} ({len(gaps)} mutants, {total:.1f} "
          "recorded test-seconds)\n")
    wanted = {g[2]["id"] for g in gaps[:args.top]}
    mutants = [m for m in generate(SUBJECT, "tinyllm", data["summary"]["mutants"]
                                   - data["summary"]["benign"], data["summary"]["benign"], 0)
               if m.id in wanted]
    engine = Engine(evidence)
    behaviour = 0.0  # seconds of passing tests whose calls compute otherwise, over mutants
    for gap, oracle, row in gaps[:args.top]:
        mutant = next((m for m in mutants if m.id == row["id"]), None)
        print(f"{row['id']} ({row['path']}:{row['line']}): {row['reduction_pruned']:.0%} of "
              f"{oracle:.0%}, gap {gap:.0%}")
        if mutant is None:
            print("   (not generated again: another seed or count)\n")
            continue
        mutant.apply(evidence)
        try:
            planned = engine.plan(head, prune=True)
        finally:
            subprocess.run(["git", "checkout", "-q", "--", mutant.path], cwd=evidence, check=True)
        failing = set(row["failing"])
        why: Counter[str] = Counter()
        for decision in planned.selection.decisions:
            if decision.selected and decision.test_id not in failing:
                reason = decision.not_pruned or f"no pruning candidate: {decision.reasons[0]}"
                why[reason[:110]] += took.get(decision.test_id, 0.0)
                if "under the new code differs" in reason:
                    behaviour += took.get(decision.test_id, 0.0) / total
        for reason, seconds in why.most_common(4):
            print(f"   {seconds:6.2f} s  {reason}")
        print()
    shown = min(args.top, len(gaps))
    print(f"of the {len(gaps)} mutants' mean gap, {behaviour / len(gaps):.1%} are passing tests "
          f"whose captured calls compute otherwise under their mutant (over the {shown} "
          "widest gaps): no pruning by equivalence drops them; its ceiling here is "
          f"{sum(g[1] for g in gaps) / len(gaps) - behaviour / len(gaps):.1%}")


if __name__ == "__main__":
    main()
