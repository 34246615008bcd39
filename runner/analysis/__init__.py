"""Analysis: what a tree holds and what a change changed.

`blocks` parses Python into fingerprinted blocks; `inventory` caches a whole tree's blocks by
blob sha and builds its import graph; `changes` diffs two trees into a `ChangeSet`, and
`statements` compares a changed function statement by statement; `environment` describes
where a run happened; `discover` finds tests statically.
All of it reads sources and git trees, never runs repository code.
"""

from fastci.runner.analysis.blocks import Block, FileBlocks, parse_blocks
from fastci.runner.analysis.changes import ChangeSet, analyse, diff_trees
from fastci.runner.analysis.environment import Environment

__all__ = [
    "Block", "ChangeSet", "Environment", "FileBlocks", "analyse", "diff_trees", "parse_blocks",
]
