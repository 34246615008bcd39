"""Equivalent-context pruning: drop a selected test whose changed code, replayed in its own
recorded context, computes exactly what it computed before.

`decide` picks the candidates and judges them; `replay` is the child process that re-runs
captured calls under one tree's code; `fingerprints` hashes what a call took and returned.
Only a selection that may prune imports this package.
"""

from fastci.runner.prune.decide import PruneOutcome, candidates, prune

__all__ = ["PruneOutcome", "candidates", "prune"]
