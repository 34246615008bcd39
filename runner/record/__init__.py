"""Recording: what each test touched while it ran.

The pytest plugin (`plugin`) turns recording on; the `recorder` maps coverage.py's per-test
contexts to blocks and collects outcomes and durations; `capture` keeps module calls for later
replay; `tracing` holds the process-wide hooks (file opens, kernel launches, children).
Nothing here decides anything: it produces a `Recording`.

The plugin is loaded into every pytest run of an environment that has FastCI installed, so
this package imports nothing until a name is asked for.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Recorder": "recorder", "Recording": "recorder",
    "recording_from_json": "recorder", "recording_to_json": "recorder",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
