"""Slash commands and fork gating, through the jobs themselves (in this process), against
the fake GitHub and real Redis, on a small real repository with recorded evidence."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from conftest import LIBRARY, app_key_file, app_remote, payload_path, redis_or_skip, redis_url
from fakegithub import FakeGitHub, iso

from fastci.app import events, jobs
from fastci.app.events import EDITED, Work
from fastci.app.queue import Queues, queue
from fastci.app.settings import load

REPO, INSTALLATION, APP_ID, NUMBER = "octo/calc", 41, 5150, 3


@pytest.fixture
def world(tmp_path, monkeypatch):
    client = redis_or_skip()
    _, base, head, workspace = app_remote(
        tmp_path, REPO, LIBRARY, ("calc/norms.py", "return", "return  "))  # formatting
    keys, key_file = app_key_file(tmp_path)
    prefix = f"fastci-cmd-{uuid.uuid4().hex[:8]}"
    for name, value in {"FASTCI_APP_ID": str(APP_ID), "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file),
                        "FASTCI_WORKSPACE": str(workspace), "FASTCI_QUEUE_PREFIX": prefix,
                        "FASTCI_CLONE_URL": str(tmp_path / "remote") + "/{repo}",
                        "FASTCI_REDIS_URL": redis_url()}.items():
        monkeypatch.setenv(name, value)
    with FakeGitHub() as fake:
        monkeypatch.setenv("FASTCI_GITHUB_URL", fake.url)
        fake.register_app(APP_ID, keys.public)
        fake.add_repo(REPO, installation_id=INSTALLATION)
        yield fake, client, prefix, base, head
    for key in client.scan_iter(f"*{prefix}*"):
        client.delete(key)


def command(fake, body: str, user: str) -> tuple[Work, int]:
    comment = fake.add_comment(REPO, NUMBER, body, user=user)
    return Work("command", REPO, INSTALLATION, number=NUMBER, comment_id=comment,
                sender=user, body=body), comment


def replies(fake) -> list[str]:
    return [c["body"] for c in fake.comments(REPO, NUMBER) if not c["body"].startswith("/")]


def delivered(client, prefix: str, action: str, head: str, base: str, seconds_ago: float,
              head_repo: str = "mallory/calc") -> None:
    """A pull_request event for `head`, `seconds_ago` before now by its updated_at, routed and
    enqueued as the webhook does (its job is left queued)."""
    payload = json.loads(payload_path("pull_request", "opened-from-fork.json").read_bytes())
    pr = payload["pull_request"]
    payload.update(action=action, number=NUMBER)
    payload["repository"]["full_name"] = REPO
    pr.update(number=NUMBER, updated_at=iso(time.time() - seconds_ago))
    pr["head"]["sha"], pr["base"]["sha"] = head, base
    pr["head"]["repo"]["full_name"] = head_repo
    work = events.route("pull_request", payload)
    queues, delivery = Queues(client, prefix), str(uuid.uuid4())
    assert queues.claim(delivery)
    queues.enqueue(work, delivery)


def reruns(client, prefix: str) -> list[Work]:
    """The runs commands enqueued (not the events' own jobs)."""
    return [Work.from_json(j.args[0]) for j in queue(f"{prefix}-cpu", client).jobs
            if j.args[1].startswith("command-")]


def test_a_fork_waits_for_ok_to_test_from_a_writer(world):
    fake, client, prefix, base, head = world
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base, head_repo="mallory/calc")
    fake.set_permission(REPO, "mallory", "read")
    fake.set_permission(REPO, "maintainer", "write")
    pr = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head, base_sha=base,
              head_repo="mallory/calc", sender="mallory")
    assert jobs.handle(pr.to_json(), "d1")["status"] == "action_required"
    [run] = fake.check_runs(REPO)
    assert run["conclusion"] == "action_required"
    assert "/fastci ok-to-test" in run["output"]["summary"]
    assert not (load().workspace / "mirrors").exists()  # its code was never fetched

    # The fork's author cannot approve itself.
    work, comment = command(fake, "/fastci ok-to-test", "mallory")
    assert jobs.handle(work.to_json(), "d2") == {"command": "ok-to-test", "allowed": False}
    assert "write access" in replies(fake)[-1]
    assert [r["content"] for r in fake.reactions(comment)] == ["eyes"]
    assert not client.exists(f"{prefix}:ok-to-test:{REPO}:{head}")

    # A maintainer can; the approval is for the head when the comment was written (the
    # pull request was opened at it a minute before), and the run is queued.
    delivered(client, prefix, "opened", head, base, 60)
    work, _ = command(fake, "/fastci ok-to-test", "maintainer")
    assert jobs.handle(work.to_json(), "d3")["approved"] == head
    assert client.get(f"{prefix}:ok-to-test:{REPO}:{head}") == b"maintainer"
    assert f"approved `{head[:12]}`" in replies(fake)[-1]
    [queued] = reruns(client, prefix)
    assert queued.head_sha == head


@pytest.mark.parametrize("event_arrived", [True, False])
def test_a_force_push_between_the_comment_and_the_job_is_not_approved(world, event_arrived):
    """Mallory's fork is reviewed at `head`; the maintainer comments ok-to-test; before the
    command's job runs, Mallory force-pushes another commit. Whether or not the push's event
    reached FastCI yet, nothing is approved and nothing runs, and the reply says why."""
    fake, client, prefix, base, head = world
    evil = "e" * 40
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base, head_repo="mallory/calc")
    fake.set_permission(REPO, "maintainer", "write")
    delivered(client, prefix, "opened", head, base, 60)
    work, _ = command(fake, "/fastci ok-to-test", "maintainer")
    fake.push(REPO, NUMBER, evil)  # the force-push, after the comment
    if event_arrived:
        delivered(client, prefix, "synchronize", evil, base, -1)
    assert jobs.handle(work.to_json(), "f1") == {"command": "ok-to-test", "allowed": True,
                                                 "approved": None}
    answer = replies(fake)[-1]
    assert "the head moved after your comment, so nothing was approved" in answer
    assert f"you approved `{head[:12]}`, and the head is now `{evil[:12]}`" in answer
    assert f"/fastci ok-to-test {evil[:12]}" in answer
    assert not list(client.scan_iter(f"{prefix}:ok-to-test:*"))
    assert reruns(client, prefix) == []


def test_an_explicit_sha_approves_that_head_only(world):
    fake, client, prefix, base, head = world
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base, head_repo="mallory/calc")
    fake.set_permission(REPO, "maintainer", "write")
    work, _ = command(fake, "/fastci ok-to-test " + "f" * 12, "maintainer")
    assert jobs.handle(work.to_json(), "x1")["approved"] is None
    assert "`ffffffffffff` is not this pull request's head" in replies(fake)[-1]
    work, _ = command(fake, "/fastci ok-to-test main~1", "maintainer")
    assert jobs.handle(work.to_json(), "x2")["approved"] is None
    assert "is not a commit sha" in replies(fake)[-1]
    assert not list(client.scan_iter(f"{prefix}:ok-to-test:*"))
    # No event of the pull request was seen: a bare ok-to-test cannot tell what was seen.
    work, _ = command(fake, "/fastci ok-to-test", "maintainer")
    assert jobs.handle(work.to_json(), "x3")["approved"] is None
    assert "cannot tell which commit was this pull request's head" in replies(fake)[-1]
    assert f"/fastci ok-to-test {head[:12]}" in replies(fake)[-1]
    work, _ = command(fake, f"/fastci ok-to-test {head[:12].upper()}", "maintainer")
    assert jobs.handle(work.to_json(), "x4")["approved"] == head
    assert f"approved `{head[:12]}`" in replies(fake)[-1]
    assert [w.head_sha for w in reruns(client, prefix)] == [head]


def test_a_redelivered_command_changes_nothing_and_posts_nothing(world):
    fake, client, prefix, base, head = world
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base, head_repo="mallory/calc")
    fake.set_permission(REPO, "maintainer", "write")
    delivered(client, prefix, "opened", head, base, 60)
    work, comment = command(fake, "/fastci ok-to-test", "maintainer")
    assert jobs.handle(work.to_json(), "r1")["approved"] == head
    posted = fake.comments(REPO, NUMBER)
    client.delete(f"{prefix}:ok-to-test:{REPO}:{head}")  # to see whether it is set again
    assert jobs.handle(work.to_json(), "r2") == {"command": "ok-to-test", "duplicate": True}
    assert fake.comments(REPO, NUMBER) == posted
    assert not client.exists(f"{prefix}:ok-to-test:{REPO}:{head}")
    assert len(reruns(client, prefix)) == 1
    assert [r["content"] for r in fake.reactions(comment)] == ["eyes"]


def test_help_unknown_and_refusals(world):
    fake, client, prefix, base, head = world
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base)
    fake.set_permission(REPO, "writer", "write")
    fake.set_permission(REPO, "reader", "read")
    work, _ = command(fake, "/fastci help", "writer")
    jobs.handle(work.to_json(), "h1")
    assert "/fastci run all" in replies(fake)[-1]
    work, _ = command(fake, "/fastci deploy everything", "writer")
    jobs.handle(work.to_json(), "h2")
    assert "I don't know `/fastci deploy everything`" in replies(fake)[-1]
    assert "/fastci explain" in replies(fake)[-1]
    # What a writer typed comes back as inline code that holds exactly it, backticks too.
    work, _ = command(fake, "/fastci deploy `now` ``or never``", "writer")
    jobs.handle(work.to_json(), "h2b")
    from markdown_it import MarkdownIt

    spans = [c.content for t in MarkdownIt("commonmark").parse(replies(fake)[-1])
             if t.type == "inline" for c in t.children if c.type == "code_inline"]
    assert spans[0] == "/fastci deploy `now` ``or never``"
    work, _ = command(fake, "/fastci run all", "reader")
    assert jobs.handle(work.to_json(), "h3")["allowed"] is False
    assert "write access" in replies(fake)[-1]
    work, _ = command(fake, "/fastci run all", "stranger")  # no permission entry at all
    assert jobs.handle(work.to_json(), "h4")["allowed"] is False


def test_explain_answers_with_the_selection(world):
    fake, client, prefix, base, head = world
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base)
    fake.set_permission(REPO, "writer", "admin")
    work, _ = command(fake, "/fastci explain tests/test_norms.py::test_rms", "writer")
    jobs.handle(work.to_json(), "e1")
    answer = replies(fake)[-1]
    assert "tests/test_norms.py::test_rms: skipped" in answer
    assert "nothing it executed or read changed" in answer
    # On GitHub: a code block (its fence at a line start, after the @mention) that names the
    # pull request's head commit, not the worktree it was planned on.
    from markdown_it import MarkdownIt

    [block] = [t for t in MarkdownIt("commonmark").parse(answer) if t.type == "fence"]
    assert "tests/test_norms.py::test_rms: skipped" in block.content
    assert f"head {head[:12]}" in block.content and "WORKTREE" not in answer
    work, _ = command(fake, "/fastci explain tests/nope.py::test_x", "writer")
    jobs.handle(work.to_json(), "e2")
    assert "no test `tests/nope.py::test_x`" in replies(fake)[-1]


def test_an_edited_comment_gets_a_reply_and_runs_nothing(world):
    """A writer edits "Looks good." into a command: the job says edits are not commands and
    enqueues nothing."""
    fake, client, prefix, base, head = world
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base)
    fake.set_permission(REPO, "writer", "write")
    comment = fake.add_comment(REPO, NUMBER, "Looks good.\n/fastci run all", user="writer")
    work = Work("command", REPO, INSTALLATION, number=NUMBER, comment_id=comment,
                sender="writer", body="/fastci run all", mode=EDITED)
    assert jobs.handle(work.to_json(), "ed1") == {"command": "run-all", "allowed": True,
                                                  "edited": True}
    assert "edits are not commands" in replies(fake)[-1]
    assert "`/fastci run all`" in replies(fake)[-1]
    from rq import Queue

    assert Queue(f"{prefix}-cpu", connection=client).count == 0


@pytest.mark.parametrize("asked", ["/fastci run all", "/fastci retest"])
def test_run_all_on_an_unapproved_fork_says_it_needs_ok_to_test_and_runs_nothing(world, asked):
    fake, client, prefix, base, head = world
    fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base, head_repo="mallory/calc")
    fake.set_permission(REPO, "maintainer", "write")
    work, _ = command(fake, asked, "maintainer")
    assert jobs.handle(work.to_json(), "u1")["ran"] is False
    answer = replies(fake)[-1]
    assert "running every test" not in answer
    assert "is not approved for FastCI's runners, so nothing runs" in answer
    assert f"`/fastci ok-to-test {head[:12]}` first, then `{asked}` again" in answer
    assert reruns(client, prefix) == []
    # Once approved, the same command runs.
    work, _ = command(fake, f"/fastci ok-to-test {head}", "maintainer")
    jobs.handle(work.to_json(), "u2")
    work, _ = command(fake, asked, "maintainer")
    assert "ran" not in jobs.handle(work.to_json(), "u3")
    assert len(reruns(client, prefix)) == 2
