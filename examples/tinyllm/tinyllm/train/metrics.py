"""Run metrics: the JSON file a training run leaves behind, and reading it back.

A run (``python -m tinyllm.train``, or rank 0 of a data-parallel run) writes one
``metrics.json`` with its losses, eval loss and token count. The file is
written whole and renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

METRICS_FORMAT = 1
REQUIRED = ("steps", "losses", "eval_loss", "tokens")


class MetricsError(ValueError):
    """A metrics file is missing, foreign or incomplete."""


def write_metrics(path: str | Path, record: dict[str, Any]) -> None:
    """Write ``record`` (plus the format version) as JSON, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": METRICS_FORMAT, **record}, indent=1) + "\n")
    os.replace(tmp, path)


def read_metrics(path: str | Path) -> dict[str, Any]:
    """Read a metrics file back, checking its format and the fields every run writes."""
    path = Path(path)
    if not path.is_file():
        raise MetricsError(f"no metrics file at {path}")
    record = json.loads(path.read_text())
    if not isinstance(record, dict) or record.get("format") != METRICS_FORMAT:
        raise MetricsError(f"{path}: not a tinyllm metrics file (format {METRICS_FORMAT})")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise MetricsError(f"{path}: missing {', '.join(missing)}")
    record["losses"] = [float(x) for x in record["losses"]]
    return record
