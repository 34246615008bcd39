"""The text of `fastci explain` (and of `/fastci explain`): a test's decision, its reasons,
the pruning evidence and what was recorded for it."""

from __future__ import annotations

from fastci.runner.evidence import ABSENT, FOLDER
from fastci.runner.selection.report import Selection


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    return f"{value / 60:.1f}min"


_seconds = seconds


def explain(sel: Selection, test_id: str, evidence=None, not_pruned: str | None = None) -> str:
    d = sel.decision(test_id)
    assert d is not None, f"no decision for {test_id}: callers resolve the id first"
    lines = [f"{test_id}: {'SELECTED' if d.selected else 'skipped'}"
             + (f" (rank {d.rank} of {len(sel.selected)})" if d.selected else ""),
             f"  risk {d.risk:.3f}, expected {_seconds(d.expected_seconds)}, "
             f"dimension {d.dimension}{', new' if d.new else ''}",
             f"  base {(sel.base or '-')[:12]} -> head {sel.head[:12]} (mode {sel.mode})",
             "  why:"]
    lines += [f"    - {reason}" for reason in d.reasons]
    if d.pruned:
        lines.append(f"  pruning evidence ({d.pruned['mode']}):")
        for call in d.pruned["replayed"]:
            lines.append(f"    {call['module']} (capture {call['capture'][:12]}, "
                         f"{call['fingerprints']} fingerprints, "
                         f"replayed in {_seconds(call['replay_seconds'])}):")
            for path, before in list(call["before"].items())[:8]:
                after = call["after"].get(path)
                mark = "==" if after == before else "!="
                lines.append(f"      {path}: {before} {mark} {after}")
            if len(call["before"]) > 8:
                lines.append(f"      … and {len(call['before']) - 8} more, all equal")
        for checked in d.pruned.get("classes", ()):
            lines.append(f"    {checked['class']} only gained {', '.join(checked['added'])}, "
                         "overriding nothing it inherits")
    elif not_pruned:
        lines.append(f"  not pruned: {not_pruned}")
    if evidence is not None:
        nblocks = sum(len(q) for q in evidence.blocks.values())
        lines.append("  evidence:")
        lines.append(f"    last outcome {evidence.outcome} in {_seconds(evidence.duration)}"
                     + (f", carried from {evidence.carried_from[:12]}"
                        if evidence.carried_from else ""))
        lines.append(f"    executed {nblocks} blocks in {len(evidence.blocks)} files")
        for path in sorted(evidence.blocks)[:10]:
            lines.append(f"      {path}: {', '.join(evidence.blocks[path][:6])}"
                         + (" …" if len(evidence.blocks[path]) > 6 else ""))
        read = sorted(p for p, sha in evidence.files.items() if sha not in (ABSENT, FOLDER))
        missing = sorted(p for p, sha in evidence.files.items() if sha == ABSENT)
        found = sorted(f"{p}/" for p, sha in evidence.files.items() if sha == FOLDER)
        if read:
            lines.append(f"    read {len(read)} data files: " + ", ".join(read[:8]))
        if found:
            lines.append(f"    found {len(found)} folders: " + ", ".join(found[:8]))
        if missing:
            lines.append(f"    looked for {len(missing)} missing paths: "
                         + ", ".join(missing[:8]))
        if evidence.kernels:
            lines.append("    launched kernels: " + ", ".join(sorted(evidence.kernels)))
        if evidence.dynamic:
            read = [f"{path}::{name}" for path, names in sorted(evidence.dynamic.items())
                    for name in names]
            lines.append(f"    read by string: {', '.join(read[:8])}"
                         + (" …" if len(read) > 8 else "") + "  (::* is a whole module)")
        if evidence.code:
            where = evidence.code.get("object") or ""
            lines.append(f"    its code: a {evidence.code.get('kind')} item in "
                         f"{evidence.code.get('path')}" + (f" ({where})" if where else ""))
        lines += _children_and_readers(evidence)
    return "\n".join(lines)


def _children_and_readers(evidence) -> list[str]:
    """What child processes added, what could not be merged, and how files were seen."""
    out = []
    in_children = sum(len(q) for q in evidence.child_blocks.values())
    if in_children:
        out.append(f"    {in_children} of the blocks ran in child processes (never pruned)")
    for reason in evidence.spawns[:5]:
        what = "compiled code unseen" if reason.startswith("torch.compile") else \
            "child evidence not merged"
        out.append(f"    {what} (select on any change): {reason}")
    if evidence.ranks:
        out.append("    process groups: " + ", ".join(evidence.ranks))
    out.append("    files seen through " + ("the kernel's file events (every reader)"
                                            if evidence.file_events else
                                            "Python's open() only (native readers unseen)"))
    return out
