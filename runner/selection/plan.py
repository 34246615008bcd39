"""A selection as pytest runs it: which collected items to keep, in which order.

The plan names tests by node id, or by a prefix for tests found statically at the head
(`tests/test_x.py::test_new` covers all its parametrizations). A collected item the plan
does not know at all is new to FastCI, so it runs (first: new tests are risky).
"""

from __future__ import annotations

PLAN_SCHEMA = "fastci.plan/1"


def make_plan(order: list[str], known: list[str], only: bool = False) -> dict:
    """`only`: run nothing but `order` (a shard: new tests belong to the shard that got them)."""
    return {"schema": PLAN_SCHEMA, "order": list(order), "known": sorted(known), "only": only}


def _base(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def apply_plan(plan: dict, nodeids: list[str]) -> tuple[list[str], list[str]]:
    """(items to run in order, items to deselect)."""
    rank = {test_id: i for i, test_id in enumerate(plan["order"])}
    known = set(plan["known"])
    known_bases = {_base(k) for k in known}
    ranked, new, drop = [], [], []
    for position, nodeid in enumerate(nodeids):
        if nodeid in rank:
            ranked.append((rank[nodeid], position, nodeid))
            continue
        prefix = _base(nodeid)
        if prefix in rank:
            ranked.append((rank[prefix], position, nodeid))
        elif plan.get("only"):
            drop.append(nodeid)
        elif nodeid not in known and prefix not in known_bases:
            new.append(nodeid)
        elif nodeid not in known:
            new.append(nodeid)  # a new parametrization of a known test function
        else:
            drop.append(nodeid)
    return new + [n for _, _, n in sorted(ranked)], drop
