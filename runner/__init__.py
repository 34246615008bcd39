"""The engine: it records runtime evidence, analyses changes, selects, prunes and runs tests.
It knows nothing of GitHub.

The subpackages follow the flow of one change:

    record/     evidence while tests run (pytest plugin, recorder, module-call capture)
    analysis/   what a tree holds and what a change changed (blocks, inventory, changes)
    selection/  which tests a change can affect, why, and in which order (pure functions)
    prune/      equivalent-context pruning (replays and their fingerprints)
    store/      where evidence lives (one Protocol; SQLite and Redis backends)
    execution/  running a selection: shards, carry-forward, flaky reruns, coverage delta

and the modules beside them are shared by all: `errors` (the one error root), `config`
(settings), `evidence` (the recorded data model), `git` (the one git edge) and `engine`
(the imperative shell that composes the rest for the CLI and the App).
"""
