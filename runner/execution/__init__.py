"""Execution: running a selection and keeping its evidence.

`shard` splits a selection over workers and runs one shard; `carry` stores a run's fresh
evidence and carries the skipped tests' evidence forward; `flaky` confirms a failure by one
rerun; `coverage_delta` measures diff coverage against the base.
"""
