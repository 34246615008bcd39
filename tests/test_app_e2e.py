"""The GitHub App end to end: payloads in GitHub's shapes in, check runs out.

`fastci.demo_app.AppLoop` starts gunicorn (the webhook, which also serves each job's bundle by
a signed link), two `fastci worker` processes (selection, and one "GPU" that downloads its
bundles over HTTP) on real Redis, a local git remote and the fake GitHub. A push to
the default branch records evidence; a pull request carrying examples/tinyllm's `rope_bug`
change then gets its selection, regressions and background check runs.
"""

from __future__ import annotations

import pytest
from conftest import redis_url

pytestmark = pytest.mark.slow


def test_a_pull_request_gets_its_check_runs(tmp_path, redis):
    from fastci.demo_app import AppLoop

    with AppLoop(tmp_path, "rope_bug", redis_url=redis_url()) as loop:
        assert loop.push_main().status_code == 202
        loop.wait(loop.has_evidence, 300, "evidence for the base")
        answer = loop.open_pull_request()
        assert answer.status_code == 202, answer.text
        runs = loop.wait(loop.runs_done, 400, "the regressions and background check runs")
        expected, head = set(loop.expected), loop.head
        served = (tmp_path / "serve.log").read_text()
    assert not list(redis.scan_iter(f"*{loop.prefix}*"))  # the loop cleans up after itself
    # The "GPU" worker got each commit over HTTP from the webhook service, by a signed link
    # that the access log never prints; the bundles are gone once their jobs ended.
    downloads = [line for line in served.splitlines() if "GET /artifacts/" in line]
    assert len(downloads) >= 3 and all('" 200 ' in line for line in downloads), served[-2000:]
    assert "sig=" not in served and "expires=" not in served
    assert not any((tmp_path / "workspace" / "artifacts").iterdir())

    selection, regressions = runs["FastCI selection"], runs["FastCI regressions"]
    assert selection["head_sha"] == regressions["head_sha"] == head
    assert selection["conclusion"] == "success"
    title = selection["output"]["title"]
    selected, total = (int(x) for x in title.split(" tests selected")[0].split(" of "))
    assert total == 368 and 0 < selected < total
    assert "tinyllm/model/rope.py" in selection["output"]["summary"]
    notes = [a for a in selection["annotations"] if a["path"] == "tinyllm/model/rope.py"]
    assert notes and "executed it" in notes[0]["message"]

    def failing(run) -> set[str]:
        return {a["title"].rsplit(" ", 1)[0] for a in run["annotations"]
                if a["annotation_level"] == "failure"}

    # Blocking failures in "regressions"; the golden-loss convergence tests in "background",
    # which never blocks: together, exactly the change's known failures.
    background = runs["FastCI background"]
    assert regressions["conclusion"] == "failure"
    assert background["conclusion"] == "neutral"
    assert failing(regressions) | failing(background) == expected
    assert failing(background) and all("golden" in t for t in failing(background))
    for run in (selection, regressions, background):  # streamed updates never repeat one
        keys = [(a["path"], a["start_line"], a["title"]) for a in run["annotations"]]
        assert len(keys) == len(set(keys)), run["name"]
    for annotation in regressions["annotations"] + background["annotations"]:
        if annotation["annotation_level"] == "failure":
            assert annotation["path"].startswith("tests/") and annotation["start_line"] > 0
    assert f"**{len(failing(regressions))} failed**" in regressions["output"]["summary"]
    assert "Diff coverage" in regressions["output"]["summary"]
    assert [a["identifier"] for a in regressions["actions"]] == ["run_all", "rerun_failed"]
