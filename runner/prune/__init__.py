"""Equivalent-context pruning: drop a selected test whose changed code, replayed in its own
recorded context, computes exactly what it computed before.

`decide` picks the candidates and judges them; `replay` is the child process that re-runs
captured calls under one tree's code; `fingerprints` hashes what a call took and returned.
Only a selection that may prune imports `decide`. The package itself imports none of them:
a recording child that hashes a captured call imports `fingerprints` alone, and `decide`
would bring the selection, the execution and the recorder with it (0.5 s in each child).
"""
