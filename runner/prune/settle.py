"""When a replay may stop early: a capture whose every test is already kept selected.

A test can be pruned only when every capture it needs replays identically. Under exact
pruning a capture whose replay under the new code differs from what a test recorded of it
settles that test: whatever the evidence's code replays to, the test stays
selected (either the old replay reproduces the recording, and then old and new differ, or
it does not, and the replay is not trusted). Once every test that needs a capture is
settled, replaying it can change no decision, so the replay processes skip it.

The new tree's process learns which tests are settled and appends their numbers to a file
in the scratch folder; the evidence's tree's process, which runs beside it, reads the
file before each capture and skips the same ones. Skipping only ever keeps tests selected:
a skipped capture comes back as an error, and an error keeps its tests.

Plain data only (no torch): the replay process and `decide.py` both use it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

SKIPPED = "not replayed: every test that needs it stays selected already"


def differences(before: Mapping[str, dict], after: Mapping[str, dict]) -> list[str]:
    """Fingerprint paths that differ (or exist on one side only, or failed), in order."""
    out = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a is None or b is None or "error" in a or "error" in b or a != b:
            out.append(path)
    return out


def unlike_recorded(prints: Mapping[str, dict], recorded: Mapping[str, dict]) -> list[str]:
    """Where a replay's fingerprints differ from what the test recorded. The recording kept
    some fields of each leaf (hashes, not the tolerance summaries): compare those."""
    return differences({k: {f: v.get(f) for f in recorded[k]} if "error" not in v else v
                        for k, v in prints.items() if k in recorded}, recorded)


def order(digests: Iterable[str], groups: list[list[str]],
          seconds: list[float] | None = None) -> list[str]:
    """The new tree's replay order: first the captures worth the most test time, each test's
    seconds (`seconds`, per group; 1 each without) shared among the captures it needs, so
    that a budget that runs out has spent itself where pruning saves the most; then those
    more tests need, which a change that alters them settles soonest."""
    need: dict[str, int] = {}
    worth: dict[str, float] = {}
    for i, group in enumerate(groups):
        share = (seconds[i] if seconds is not None else 1.0) / max(1, len(group))
        for digest in group:
            need[digest] = need.get(digest, 0) + 1
            worth[digest] = worth.get(digest, 0.0) + share
    return sorted(digests, key=lambda d: (-round(worth.get(d, 0.0), 6), -need.get(d, 0), d))


def orders(todo_old: Iterable[str], todo_new: Iterable[str], groups: list[list[str]],
           budgeted: bool, seconds: list[float] | None = None
           ) -> tuple[list[str], list[str]]:
    """The two trees' replay orders. Without a budget the evidence's tree runs from the
    other end: by the time it reaches what the new tree replays first, that has settled what
    it could. Under a budget both run in the same order: a call is decided only when both
    trees replayed it, and from opposite ends two processes cut off at the same time have
    few calls in common (on tinyllm's model changes, none of 43 `TinyLM` calls)."""
    new = order(todo_new, groups, seconds)
    ranked = order(todo_old, groups, seconds)
    return (ranked if budgeted else list(reversed(ranked))), new


class Settled:
    """Which captures a replay process may skip. `groups`: the captures each candidate test
    needs; `recorded` (the new tree's process only): per group, what that test recorded of
    each of its calls. Two tests may share a capture yet have recorded different results of
    it (the evidence's code replays to one of them at most), so a result settles the tests
    whose own recording it contradicts, never the capture as a whole."""

    def __init__(self, groups: list[list[str]], settled_file: str,
                 recorded: list[Mapping[str, Mapping[str, dict]]] | None = None) -> None:
        self.groups = [set(g) for g in groups]
        self.settled_file = settled_file
        self.recorded = recorded or []
        self.settled: set[int] = set()

    def skip(self, digest: str) -> bool:
        """Is every test that needs `digest` settled already? A capture no group names is
        never skipped."""
        self.read()
        mine = [i for i, g in enumerate(self.groups) if digest in g]
        return bool(mine) and all(i in self.settled for i in mine)

    def replayed(self, digest: str, result: Mapping) -> None:
        """Note a capture's result under the new code: the tests whose recording of it the
        result contradicts (or all that need it, if it failed) are settled."""
        newly = [i for i, (g, rec) in enumerate(zip(self.groups, self.recorded))
                 if digest in g and i not in self.settled and digest in rec and (
                     result.get("error") or
                     unlike_recorded(result.get("fingerprints") or {}, rec[digest]))]
        if newly:
            self.settled.update(newly)
            with open(self.settled_file, "a") as f:
                f.write("".join(f"{i}\n" for i in newly))

    def read(self) -> set[int]:
        """The tests settled so far, by this process or the one beside it."""
        try:
            with open(self.settled_file) as f:
                self.settled |= {int(line) for line in f if line.strip().isdigit()}
        except OSError:
            pass  # nothing settled yet
        return self.settled
