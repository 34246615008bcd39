"""The evidence store: one interface, a SQLite and a Redis backend.

Evidence is a cache keyed by (commit, environment): losing it costs time, never safety.
"""
