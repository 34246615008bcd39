"""Webhook payloads mutated from the project's fixtures, as hypothesis strategies.

A mutation picks a field anywhere in a payload and deletes it, retypes it, or puts there a
raw JSON token that Python's json module reads into something surprising (1e400 -> inf, NaN,
integers past 64 bits, lone surrogates, nesting deeper than the decoder recurses). The result
is the body bytes, so the tokens survive into what the webhook receives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fastci.testing import FIXTURES

FILES = sorted((FIXTURES / "payloads").glob("*/*.json"))
RAW = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "-1", "0", "1.5", "-0.0", "1e3",
       str(2**63), str(2**64 + 1), "123456789012345678901234567890", '"5"', '"-1"', "true",
       "false", "null", "[]", "{}", '[{}]', '"\\ud800"', '"\\udfff x"', '"a\\u0000b"',
       '"' + "a" * 3000 + '"', '"0283d46537193f1fed7d46859f15c5304b9836f"',
       '"0283D46537193F1FED7D46859F15C5304B9836F9"', '"owner/name/extra"', '"noslash"',
       "[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.text(max_size=8), children, max_size=3), max_leaves=10)


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every (key or index) path in a JSON document, parents before children."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for key, child in items:
        out.append(prefix + (key,))
        out += paths(child, prefix + (key,))
    return out


def _at(doc: Any, path: tuple) -> tuple[Any, Any]:
    for key in path[:-1]:
        doc = doc[key]
    return doc, path[-1]


@st.composite
def mutated(draw, files: list[Path] = FILES) -> tuple[str, bytes]:
    """(event, body): a fixture with one to three fields deleted, retyped or replaced."""
    path = draw(st.sampled_from(files))
    doc = json.loads(path.read_bytes())
    raw: dict[str, str] = {}
    for _ in range(draw(st.integers(1, 3))):
        where = paths(doc)
        if not where:
            break
        parent, key = _at(doc, draw(st.sampled_from(where)))
        operation = draw(st.sampled_from(["delete", "raw", "value", "wrap", "stringify"]))
        if operation == "delete":
            del parent[key]
        elif operation == "raw":
            marker = f"__raw{len(raw)}__"
            raw[marker] = draw(st.sampled_from(RAW))
            parent[key] = marker
        elif operation == "value":
            parent[key] = draw(json_values)
        elif operation == "wrap":
            parent[key] = [parent[key]]
        else:
            parent[key] = json.dumps(parent[key])
    body = json.dumps(doc)
    for marker, token in raw.items():
        body = body.replace(json.dumps(marker), token)
    return path.parent.name, body.encode()
