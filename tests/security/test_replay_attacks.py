"""Pruning's replays run the change's code: in the App they run on a runner worker, as the
sandbox user, never beside the App's key (issue 11, route 4 and build step 4).

The pull request makes three equivalent changes to torch modules whose calls the base
recorded. One (`Scale`) also probes, from inside its forward, for the App's key, the worker's
environment and the mirror, and writes down what it got and as whom it ran: a file written is
an effect no fingerprint compares, so its test stays selected (were it not, the files the old
code never looked at would keep it, `said.files`). Another (`Shift`) forges the
replay's results at exit, claiming lines of a file outside the tree. The third (`Bias`) is
only equivalent, and is pruned. The selection side, in this process, prunes through a real
`fastci worker --gpu 0` on a Redis of the test's own.
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest
from attack_world import (
    APP_ID,
    INSTALLATION,
    PASSWORD,
    SANDBOX_USER,
    Runner,
    github_with_pull,
    key_file,
    selection_side,
    skip_unless_sandbox,
)
from conftest import Project, RedisServer

from fastci.app.events import Work
from fastci.testing.runs import run_job

pytestmark = pytest.mark.slow
REPO, NUMBER = "octo/replayed", 8

LAYERS = '''
import torch
from torch import nn


class Scale(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        y = x * self.weight
        return y + 1.0


class Shift(nn.Module):
    def forward(self, x):
        return x + 2.0


class Bias(nn.Module):
    def forward(self, x):
        return x - 1.0
'''
TESTS = '''
import torch

from net.layers import Bias, Scale, Shift


def test_scale():
    torch.manual_seed(0)
    m = Scale(4)
    x = torch.randn(3, 4, requires_grad=True)
    m(x).sum().backward()
    assert torch.equal(m(torch.zeros(1, 4)), torch.ones(1, 4))


def test_shift(monkeypatch):
    monkeypatch.setenv("NET_MODE", "shift")  # its replays get a process of their own
    assert torch.equal(Shift()(torch.zeros(2)), torch.full((2,), 2.0))


def test_bias():
    assert torch.equal(Bias()(torch.zeros(2)), torch.full((2,), -1.0))
'''
PROBE = '''
    def forward(self, x):
        import json, os
        got = {{"uid": os.getuid(), "fastci_env": sorted(k for k in os.environ
                                                       if "FASTCI" in k or "REDIS" in k)}}
        for name, path in {probes!r}.items():
            try:
                with open(path, "rb") as f:
                    got[name] = f.read(64).decode(errors="replace")
            except OSError:
                got[name] = None
        with open({marker!r}, "w") as f:
            json.dump(got, f)
        y = self.weight * x
        return y + 1.0
'''
FORGE = '''
    def forward(self, x):
        import atexit, json, sys

        def forge():
            request = json.load(open(sys.argv[1]))
            out = json.load(open(request["out"]))
            for result in out["captures"].values():
                result["lines"] = {"../../../etc/passwd": [1]}
            json.dump(out, open(request["out"], "w"))

        atexit.register(forge)
        return 2.0 + x
'''


@pytest.fixture(params=["sandboxed", "as the worker", "sandboxed, recorded by the App"])
def world(tmp_path, monkeypatch, request):
    skip_unless_sandbox()
    server = RedisServer(tmp_path, "--requirepass", PASSWORD)
    url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
    prefix = f"fastci-replay-{uuid.uuid4().hex[:8]}"
    keys, key = key_file(tmp_path)
    workspace = tmp_path / "workspace"
    drop = Path(tempfile.mkdtemp(prefix="fastci-replay-probe-"))
    os.chmod(drop, 0o1777)  # the sandbox user may write its findings here, and only here
    marker = drop / "probe.json"
    remote = Project(tmp_path / "remote" / REPO)
    remote.write({"net/__init__.py": "", "net/layers.py": LAYERS, "tests/test_net.py": TESTS})
    base = remote.commit("base")
    by_app = "recorded by the App" in request.param
    if not by_app:  # a trusted recording (the CLI on the App's store), else a push's full run
        remote.fastci("record", "-q", "--store", str(workspace / "evidence.db"), "--", "-q",
                      "-p", "no:cacheprovider")
    probes = {"key": str(key), "parent environ": f"/proc/{os.getpid()}/environ",
              "store": str(workspace / "evidence.db"),
              "mirror config": str(workspace / "mirrors" / "octo__replayed.git" / "config")}
    layers = remote.root / "net" / "layers.py"
    text = layers.read_text()
    text = text.replace("    def forward(self, x):\n        y = x * self.weight\n"
                        "        return y + 1.0\n",
                        textwrap.dedent(PROBE.format(probes=probes, marker=str(marker)))
                        .replace("\n", "\n    ").rstrip() + "\n", 1)
    text = text.replace("    def forward(self, x):\n        return x + 2.0\n",
                        textwrap.indent(textwrap.dedent(FORGE).strip("\n"), "    ") + "\n")
    text = text.replace("return x - 1.0", "return -1.0 + x")
    layers.write_text(text)
    head = remote.commit("equivalent changes, with a probe and a forgery")
    selection_side(monkeypatch, tmp_path, key, workspace, prefix, url, APP_ID)
    runner = None
    try:
        with github_with_pull(monkeypatch, keys.public, REPO, INSTALLATION, NUMBER, head,
                              base, APP_ID) as fake:
            sandbox = {"FASTCI_SANDBOX_USER": SANDBOX_USER,
                       "FASTCI_SANDBOX_HIDE": os.path.expanduser("~")}
            runner = Runner(tmp_path, {**os.environ, **(
                sandbox if request.param.startswith("sandboxed") else {})})
            if by_app:  # the base's evidence, captures included, comes back from the runner
                pushed = Work("refresh", REPO, INSTALLATION, head_sha=base, base_ref="main")
                recorded = run_job(pushed.to_json(), "delivery-push")
                assert recorded["status"] in ("recorded", "audited"), (
                    recorded, runner.log.read_text()[-3000:])
            yield fake, base, head, marker, runner
    finally:
        if runner is not None:
            runner.stop()
        server.stop()
        marker.unlink(missing_ok=True)
        drop.rmdir()


def select(fake, base, head, runner) -> tuple[dict, dict]:
    work = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat")
    outcome = run_job(work.to_json(), f"delivery-{uuid.uuid4().hex[:8]}")
    assert outcome["status"] == "completed", (outcome, runner.log.read_text()[-3000:])
    return outcome, {r["name"]: r for r in fake.check_runs(REPO)}["FastCI selection"]


@pytest.mark.parametrize("world", ["sandboxed", "sandboxed, recorded by the App"],
                         indirect=True)
def test_the_app_prunes_through_a_sandboxed_runner_and_the_change_reaches_nothing(world):
    fake, base, head, marker, runner = world
    outcome, selection = select(fake, base, head, runner)
    summary, text = selection["output"]["summary"], selection["output"]["text"]
    # Bias's change is equivalent: pruned on the runner's replays. Scale's probe wrote down
    # what it found: kept, though it returns the same values.
    assert "1 pruned" in selection["output"]["title"], summary
    assert "### Pruned" in text and "test_bias" in text.split("### Pruned")[1]
    assert "`tests/test_net.py::test_scale` not pruned: replaying Scale under the new code " \
        "failed: RuntimeError: the call has an effect a replay cannot compare: wrote " \
        in summary, summary
    # The head's forward ran there, as the sandbox user, and found nothing to take: in its
    # replay, and in the shard that then ran test_scale (recording it: the child hand-over
    # variables name the test's folders, no secret).
    found = json.loads(marker.read_text())
    assert found["uid"] == pwd_uid(SANDBOX_USER) != os.getuid()
    assert [k for k in found["fastci_env"] if not k.startswith("FASTCI_CHILD_")] == []
    for probe in ("key", "parent environ", "store", "mirror config"):
        assert found[probe] is None, (probe, found[probe])
    # Shift's replay forged its results: rejected, so the test stays selected and runs.
    assert "test_shift" in summary and "rejected" in summary, summary
    assert outcome["selected"] == 2 and outcome["failed"] == 0
    assert not list(runner.dir.iterdir())  # the replay job's folder is gone


@pytest.mark.parametrize("world", ["as the worker"], indirect=True)
def test_without_the_sandbox_the_replayed_change_reads_the_workers_secrets(world):
    """The probe is real: replayed as the worker's own user, it reads the key and environ."""
    fake, base, head, marker, runner = world
    select(fake, base, head, runner)
    found = json.loads(marker.read_text())
    assert found["uid"] == os.getuid()
    assert found["key"] and "PRIVATE KEY" in found["key"]
    assert found["parent environ"] is not None


def pwd_uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid
