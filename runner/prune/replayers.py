"""Where replays run: in local child processes, or on a runner, in its sandbox.

Pruning (`decide.py`) writes out the trees and the captures it needs into a scratch folder
and asks a `Replayer` to run a list of steps there. A step is a list of `ReplayItem`s that may
run side by side; steps run in order (a tolerance replay compares against the tensors the
step before it saved). Each item ends as the JSON `replay.py` writes:
{"captures": {digest: result}, "overrides": {...}}; an item that could not run ends as a
result per capture with an `error`, which keeps its tests selected.

`LocalReplayer` is the CLI's: the developer's own tree, replayed in child processes with no
credentials in their environment. The App replays nothing itself (its worker holds the App's
key and the change's code must not run beside it): it packs the scratch folder with
`pack` and hands it to a runner job (`fastci.runner.execution.replays.run_replays`), which
runs the same items as the sandbox user; the selection side validates what comes back
(`fastci.runner.execution.validate.replay_outputs`) before it compares any fingerprint.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from fastci.runner.execution.shard import scrubbed_environment
from fastci.runner.prune import zygote
from fastci.runner.prune.budget import OUT_OF_TIME
from fastci.runner.prune.launches import default_folder
from fastci.runner.prune.settle import Settled

REPLAY_TIMEOUT = 600
PYTEST_SESSION = ("PYTEST_VERSION", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_")
COLD_START = 3.0  # seconds a fresh interpreter takes to import torch: below it, none starts
GRACE = 0.5  # seconds past the deadline a local process gets to write what it replayed
MAX_OUTPUT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class SettlePlan:
    """What lets a replay process skip captures that can change no decision (`settle.py`)."""

    groups: list[list[str]]
    settled: Path
    recorded: list[dict[str, dict]] = field(default_factory=list)  # per group (new tree)


@dataclass(frozen=True)
class ReplayItem:
    """One replay process: the tree `root`, the captures to replay there, and what to do."""

    name: str
    root: Path
    captures: dict[str, Path]
    sys_path: list[str] = field(default_factory=list)
    trace: bool = True
    overrides: list = field(default_factory=list)  # [path, qualname, names] to check
    env: dict[str, str] = field(default_factory=dict)
    save: Path | None = None  # keep tensors here (tolerance)
    compare: Path | None = None  # compare against the tensors kept here
    # exact pruning: the captures each candidate test needs, the file where the new tree's
    # process notes the tests it settled, and (new tree only) what each test recorded
    settle: SettlePlan | None = None
    budget: float | None = None  # seconds it may replay for (`budget.py`); None: no limit
    until: float | None = None  # local replays: time.monotonic() by which they end
    launches: Path | None = None  # local replays: where kernel launches are remembered
    watch: tuple[str, ...] = ()  # the tree's data files: which each call reads is noted

    def left(self) -> float | None:
        """Seconds until `until`, or None without one."""
        return None if self.until is None else self.until - time.monotonic()

    def request(self, out: Path, base: Path | None = None) -> dict:
        """The JSON `replay.py` reads (writing its results to `out`); with `base`, every
        path relative to it."""
        def at(path: Path | None) -> str | None:
            if path is None:
                return None
            return str(path if base is None else path.relative_to(base))

        return {"root": at(self.root), "captures": {d: at(p) for d, p in self.captures.items()},
                "overrides": [list(c) for c in self.overrides], "sys_path": self.sys_path,
                "trace": self.trace, "env": self.env, "out": at(out), "budget": self.budget,
                "watch": list(self.watch),
                # the machine's clock: never in a pack for a runner (`base`)
                "until": self.until if base is None else None,
                "launches": None if base is not None or self.launches is None
                else str(self.launches),
                "save_tensors": at(self.save), "compare_to": at(self.compare),
                "settle": None if self.settle is None else {
                    "groups": self.settle.groups, "settled": at(self.settle.settled),
                    "recorded": self.settle.recorded}}

    def failed(self, why: str) -> dict:
        return {"captures": {d: {"error": why} for d in self.captures}}

    def out_of_time(self) -> dict:
        """Nothing replayed: the deadline passed before a process could start replaying."""
        return self.failed(f"{OUT_OF_TIME} (waiting for a replay process)")


Steps = list[list[ReplayItem]]


class Replayer(Protocol):
    in_place: bool
    """May a replay run the working tree where it is (else every tree is written out)?"""

    def run(self, scratch: Path, steps: Steps) -> dict[str, dict]:
        """Run the steps in order; item name -> its output (never raises for an item)."""
        ...


class LocalReplayer:
    """Replays in child processes of this one: the developer's machine, their own tree.

    Warm (the default; FASTCI_WARM_REPLAYS=0 turns it off): each replay is a fork of a
    zygote that imported torch once and stays for a while (`zygote.py`), instead of a fresh
    interpreter that imports it again. Anything the zygote cannot serve runs cold.

    Kernel launches under Triton's interpreter are remembered across replays in `launches`
    (`launches.py`; by default the user's cache folder, FASTCI_LAUNCH_CACHE=off: nowhere)."""

    in_place = True

    def __init__(self, warm: bool | None = None, launches: Path | None | bool = True) -> None:
        self.warm = os.environ.get("FASTCI_WARM_REPLAYS", "1") != "0" if warm is None \
            else warm
        self.launches = default_folder() if launches is True else launches or None

    def run(self, scratch: Path, steps: Steps) -> dict[str, dict]:
        outputs: dict[str, dict] = {}
        if self.launches is not None:
            steps = [[replace(item, launches=item.launches or self.launches) for item in step]
                     for step in steps]
        for step in steps:  # a step's items side by side: each thread waits on its process
            with ThreadPoolExecutor(max_workers=max(1, len(step))) as pool:
                outputs.update(pool.map(lambda item: (item.name, self._replay(scratch, item)),
                                        step))
        return outputs

    def _replay(self, scratch: Path, item: ReplayItem) -> dict:
        left = item.left()
        if left is not None and left <= 0:
            output = item.out_of_time()
        else:
            output = _warm(scratch, item) if self.warm else _finish(item, *_start(scratch, item))
        settle_failures(item, output)
        return output


def _environment(item: ReplayItem | None = None) -> dict[str, str]:
    return replay_environment(item.env if item else {})


def replay_environment(session: dict[str, str], base: dict[str, str] | None = None
                       ) -> dict[str, str]:
    """A replay's environment: no credentials (as test processes get none), no coverage
    hand-over of an enclosing run, and the variables the test session had set. `base`: the
    environment it starts from (this process's). What pytest sets for its own session (a
    selection run from a test) is no replay's, and would key a zygote per test."""
    return {**{k: v for k, v in scrubbed_environment(base).items()
               if not k.startswith(("COV_CORE", *PYTEST_SESSION))},
            **session, "PYTHONDONTWRITEBYTECODE": "1"}


def _warm(scratch: Path, item: ReplayItem) -> dict:
    out = scratch / f"{item.name}.json"
    request_file = scratch / f"{item.name}-request.json"
    request_file.write_text(json.dumps(item.request(out)))
    log = scratch / f"{item.name}.log"
    # The zygote imports torch (and through it Triton) in the replay's own environment:
    # variables read at import (TRITON_INTERPRET) must already hold there, so each
    # environment gets a zygote of its own.
    env = _environment(item)
    status = zygote.replay(zygote.socket_path(env), env, request_file, item.root, env, log,
                           REPLAY_TIMEOUT, within=_within(item))
    if status is None:  # no zygote could serve it: a cold process, if there is time for one
        left = item.left()
        if left is not None and left < COLD_START:
            return item.out_of_time()
        return _finish(item, *_start(scratch, item))
    text = log.read_text(errors="replace") if log.exists() else ""
    return read_output(item, status, text, out)


def _within(item: ReplayItem) -> float | None:
    """Seconds a local replay may still take (to its deadline, and a grace to write what
    it replayed), or None without a deadline."""
    left = item.left()
    return None if left is None else max(0.0, left) + GRACE


def _start(scratch: Path, item: ReplayItem) -> tuple[subprocess.Popen, Path]:
    out = scratch / f"{item.name}.json"
    request = item.request(out)
    request_file = scratch / f"{item.name}-request.json"
    request_file.write_text(json.dumps(request))
    proc = subprocess.Popen([sys.executable, "-m", "fastci.runner.prune.replay",
                             str(request_file)], cwd=item.root, env=_environment(item),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, out


def _finish(item: ReplayItem, proc: subprocess.Popen, out: Path) -> dict:
    within = _within(item)
    try:
        output, _ = proc.communicate(timeout=REPLAY_TIMEOUT if within is None else within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return item.failed(f"the replay took over {REPLAY_TIMEOUT} s") if within is None \
            else item.out_of_time()
    return read_output(item, proc.returncode, output.decode(errors="replace"), out)


def settle_failures(item: ReplayItem, output: dict) -> None:
    """After the new tree's process ends: every test that needs a capture it did not replay
    (the process crashed, timed out or wrote nothing, or the call failed) is settled, as the
    process would have noted had it lived. The evidence's tree's process beside it then
    skips what only those tests need, instead of replaying to the end for nothing.

    Local replays only: on a runner the file lies in the sandbox's folder, where the
    replayed code could have put a link in its place for the worker to write through."""
    plan = item.settle
    if plan is None or not plan.recorded:  # not the new tree's item, or not exact pruning
        return
    captures = output.get("captures")
    failed = {d for d, r in captures.items() if not isinstance(r, dict) or r.get("error")} \
        if isinstance(captures, dict) else set(item.captures)  # a success has error None
    noted = Settled([], str(plan.settled)).read()  # what the process noted before it ended
    newly = [i for i, group in enumerate(plan.groups)
             if i not in noted and failed.intersection(group)]
    if newly:
        try:
            fd = os.open(plan.settled, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                         0o644)
            with os.fdopen(fd, "w") as f:
                f.write("".join(f"{i}\n" for i in newly))
        except OSError:
            pass  # the other process then replays on: slower, never less sound


def read_output(item: ReplayItem, returncode: int, output: str, out: Path) -> dict:
    """What a finished replay process wrote, or a per-capture error saying why nothing. The
    replayed code could have left a link in its place (and be running still): the file is
    opened without following one, and its size read from what was opened."""
    if returncode != 0:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return item.failed(f"the replay process exited with {returncode}: {tail[0][:300]}")
    try:
        fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return item.failed(f"the replay wrote no results ({exc.strerror})")
    with os.fdopen(fd, "rb") as f:
        found = os.fstat(f.fileno())
        if not stat.S_ISREG(found.st_mode):
            return item.failed("the replay's results are not a plain file; not read")
        if found.st_size > MAX_OUTPUT_BYTES:
            return item.failed(f"the replay wrote over {MAX_OUTPUT_BYTES} bytes")
        data = f.read(MAX_OUTPUT_BYTES + 1)
    try:
        loaded = json.loads(data)
    except ValueError as exc:
        return item.failed(f"the replay's output cannot be read: {exc}"[:300])
    return loaded if isinstance(loaded, dict) else item.failed("the replay's output is not "
                                                               "a mapping")


# -- replay packs: the scratch folder as one file, for a runner ---------------------------
def pack(scratch: Path, steps: Steps, dest: Path) -> list[list[dict]]:
    """Write the trees and captures the steps need into a tar.gz at `dest`; return the
    steps as JSON with every path relative to the pack (what a runner job gets)."""
    roots = sorted({item.root for step in steps for item in step})
    captures = sorted({p for step in steps for item in step for p in item.captures.values()})
    for path in [*roots, *captures]:
        if not path.is_relative_to(scratch):
            raise ValueError(f"{path} is outside the replay's scratch folder")
    with tarfile.open(dest, "w:gz") as tar:
        for path in [*roots, *captures]:
            tar.add(path, arcname=str(path.relative_to(scratch)), filter=_plain)
    return [[{"name": item.name, **item.request(scratch / f"{item.name}.json", scratch)}
             for item in step] for step in steps]


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Regular files and folders only, owned by nobody in particular."""
    if not (info.isfile() or info.isdir()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def items_from(steps: list[list[dict]], base: Path) -> Steps:
    """The steps a runner job received, with their paths under `base` (the unpacked pack).
    Paths must stay inside it: a step is data, and nothing in it may point elsewhere."""
    def at(rel) -> Path:
        if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/") or \
                "\0" in rel:
            raise ValueError(f"not a path inside the pack: {str(rel)[:100]!r}")
        return base / rel

    out: Steps = []
    for step in steps:
        items = []
        for raw in step:
            name = str(raw["name"])
            if not name.replace("-", "").replace("_", "").isalnum() or len(name) > 64:
                raise ValueError(f"not a replay name: {name[:64]!r}")
            items.append(ReplayItem(
                name=name, root=at(raw["root"]),
                captures={str(d): at(p) for d, p in dict(raw["captures"]).items()},
                sys_path=[str(p) for p in raw.get("sys_path", [])],
                trace=bool(raw.get("trace")), overrides=list(raw.get("overrides", [])),
                env={str(k): str(v) for k, v in dict(raw.get("env", {})).items()},
                save=at(raw["save_tensors"]) if raw.get("save_tensors") else None,
                compare=at(raw["compare_to"]) if raw.get("compare_to") else None,
                settle=_settle(raw.get("settle"), at), budget=_seconds(raw.get("budget"))))
        out.append(items)
    return out


def _seconds(raw) -> float | None:
    """A step's budget, checked: a finite number of seconds, or none."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw < 1e9:
        raise ValueError(f"a replay step's budget is not a number of seconds: {str(raw)[:40]!r}")
    return float(raw)


def _settle(raw, at) -> SettlePlan | None:
    """A step's `settle`, checked: lists of digests, a path in the pack, recorded leaves as
    plain mappings (a runner only compares them)."""
    if not raw:
        return None
    groups = raw["groups"]
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        raise ValueError("a replay step's groups are not lists of captures")
    groups = [[str(d) for d in group] for group in groups]
    recorded = raw.get("recorded") or []
    if not isinstance(recorded, list):
        raise ValueError("a replay step's recorded fingerprints are not a list")
    recorded = [{str(d): {str(k): dict(v) for k, v in dict(prints).items()}
                 for d, prints in dict(calls).items()} for calls in recorded]
    return SettlePlan(groups, at(raw["settled"]), recorded)

__all__ = ["LocalReplayer", "ReplayItem", "Replayer", "SettlePlan", "Steps", "items_from",
           "pack", "read_output", "settle_failures"]
