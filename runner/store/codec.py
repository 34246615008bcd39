"""The row codec both store backends share: what a snapshot and an inventory become as bytes.

One codec, so the SQLite and Redis backends store the same content-addressed pieces (the
same digests for the same evidence) and a format change is made, and versioned, once
(`base.SCHEMA_VERSION`). The payload of one test is `TestRecord.payload()` in evidence.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fastci.runner.analysis.blocks import PARSER_VERSION, Block, FileBlocks, Statement
from fastci.runner.evidence import Snapshot, TestRecord, pack, pack_lines
from fastci.runner.evidence_index import TestIndex

__all__ = ["SnapshotParts", "inventory_from_json", "inventory_to_json", "snapshot_parts"]


@dataclass(frozen=True)
class SnapshotParts:
    """A snapshot as content-addressed pieces, the same for every store backend."""

    tree_digest: str
    tree_data: bytes
    evidence: dict[str, bytes]  # digest -> packed payload
    lines: dict[str, bytes]  # digest -> packed line map
    modules: dict[str, bytes]  # digest -> packed module calls (only pruning reads them)
    tests: list[tuple[TestRecord, str, str | None, str | None]]
    """(test, evidence digest, lines digest, modules digest)"""
    index: bytes  # the packed `TestIndex` of the tests: selection decodes only what it reaches


def snapshot_parts(snap: Snapshot) -> SnapshotParts:
    tree_data = pack(dict(snap.tree))
    evidence, lines, modules, tests = {}, {}, {}, []
    for test in snap.tests.values():
        payload = test.payload()
        digest = hashlib.sha256(payload).hexdigest()
        evidence[digest] = payload
        lines_digest = None
        if test.lines is not None:
            packed = pack_lines(test.lines)
            lines_digest = hashlib.sha256(packed).hexdigest()
            lines[lines_digest] = packed
        modules_digest = None
        packed_modules = test.modules_payload()
        if packed_modules is not None:
            modules_digest = hashlib.sha256(packed_modules).hexdigest()
            modules[modules_digest] = packed_modules
        tests.append((test, digest, lines_digest, modules_digest))
    return SnapshotParts(hashlib.sha256(tree_data).hexdigest(), tree_data, evidence, lines,
                         modules, tests, TestIndex.build(snap.tests).pack())


def inventory_to_json(fb: FileBlocks) -> dict:
    return {
        "parser": PARSER_VERSION, "error": fb.error, "imports": list(fb.imports),
        "blocks": [[b.qualname, b.kind, b.start, b.body_start, b.end, b.fingerprint,
                    list(b.reads),
                    [[s.digest, list(s.defines), list(s.reads), s.kind]
                     for s in b.statements], b.is_jit, list(b.calls), b.header, b.inherits,
                    b.decorators, b.doc, b.registers]
                   for b in fb.blocks],
    }


def inventory_from_json(data: dict) -> FileBlocks | None:
    """The inventory, or None when another version of the parser made it (parse again)."""
    if data.get("parser", 1) != PARSER_VERSION:
        return None
    blocks = tuple(
        Block(qualname=q, kind=k, start=s, body_start=bs, end=e, fingerprint=f,
              reads=tuple(r),
              statements=tuple(Statement(d, tuple(df), tuple(rd), kind)
                               for d, df, rd, kind in st), is_jit=bool(j), calls=tuple(c),
              header=h, inherits=bool(i), decorators=dec, doc=doc, registers=bool(reg))
        for q, k, s, bs, e, f, r, st, j, c, h, i, dec, doc, reg in data["blocks"])
    owner: dict[int, str] = {}
    for block in blocks:  # parents come before children: the innermost block wins
        if block.kind != "module":
            for line in range(block.body_start, block.end + 1):
                owner[line] = block.qualname
    return FileBlocks(blocks=blocks, error=data["error"], imports=tuple(data["imports"]),
                      line_owner=owner)
