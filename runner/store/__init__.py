"""The evidence store: one interface, a SQLite and a Redis backend.

Evidence is a cache keyed by (commit, environment): losing it costs time, never safety.
Callers hold an `EvidenceStore` (the Protocol in `base.py`) and never ask which backend:

    EvidenceStore        the interface every backend implements (contract: test_store_backends)
    SqliteEvidenceStore  one file, the embedded default (.fastci/evidence.db)
    RedisEvidenceStore   a fleet's shared store (redis://host:port/db?prefix=...)
    resolve_store        where the store is: the one rule for the CLI, the plugin and the App
    open_store           the store at a resolved location
    StoreError           the store cannot be used (exit code 4)
    SCHEMA_VERSION       what the backends store; its history is in base.py

`codec.py` holds the row codec both backends share; `retention.py` the rule by which `gc`
keeps snapshots (and everything they reach), which both backends apply.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastci.runner.store.base import SCHEMA_VERSION, EvidenceStore, StoreError
from fastci.runner.store.redis import RedisEvidenceStore, is_redis_url
from fastci.runner.store.sqlite import SqliteEvidenceStore

__all__ = ["SCHEMA_VERSION", "EvidenceStore", "RedisEvidenceStore", "SqliteEvidenceStore",
           "StoreError", "is_redis_url", "open_store", "resolve_store"]


def resolve_store(explicit: str | os.PathLike | None, configured: str | os.PathLike,
                  root: str | os.PathLike) -> Path | str:
    """Where the store is. `explicit` (a --store option, the App's FASTCI_STORE) wins and is
    taken as given, so a relative path is the working directory's; else `configured` (the
    runner's [tool.fastci] store, the App's default), relative to `root` (the repository
    root, the App's workspace). A redis:// URL passes through unchanged."""
    location = explicit or configured
    if is_redis_url(location):
        return str(location)  # a shared store for a fleet of runners
    return Path(explicit) if explicit else Path(root) / configured


def open_store(location: str | os.PathLike, *, create: bool = True) -> EvidenceStore:
    """The store at `location` (from `resolve_store`): a redis:// URL, else an SQLite file.
    With create=False a missing store is a StoreError that says to record first."""
    if is_redis_url(location):
        return RedisEvidenceStore(str(location), create=create)
    return SqliteEvidenceStore(location, create=create)
