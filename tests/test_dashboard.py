"""The dashboard over plain HTTP (no browser): the sign-in through the fake GitHub's OAuth
endpoints, and every refusal: not signed in, a forged or expired state, a repository the user
cannot read. tests/test_dashboard_browser.py drives the same pages in chromium."""

from __future__ import annotations

import time
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from conftest import redis_url
from dashboard_world import CLIENT_ID, CLIENT_SECRET, HIDDEN, READABLE, World

from fastci.app import charts, dashboard, ledger, oauth
from fastci.runner.selection.report import Decision, Selection, TestResult


@pytest.fixture
def world():
    with World(redis_url()) as w:
        w.seed()
        yield w


def start(world, next_path: str = "/dashboard/") -> tuple[requests.Session, str]:
    """A browser session sent to GitHub's authorize page; returns it and the state sent."""
    browser = requests.Session()
    answer = browser.get(world.url + next_path, allow_redirects=False)
    assert answer.status_code == 302
    login = answer.headers["Location"]
    assert urlsplit(login).path == "/dashboard/login"
    answer = browser.get(world.url + login, allow_redirects=False)
    assert answer.status_code == 302
    authorize = urlsplit(answer.headers["Location"])
    assert f"{authorize.scheme}://{authorize.netloc}" == world.github.url
    assert authorize.path == "/login/oauth/authorize"
    query = parse_qs(authorize.query)
    assert query["client_id"] == [CLIENT_ID]
    assert query["redirect_uri"] == [world.url + "/dashboard/callback"]
    return browser, query["state"][0]


def approve(world, login: str, state: str) -> str:
    """GitHub's authorize form, submitted by `login`: the callback URL it sends back to."""
    answer = requests.post(world.github.url + "/login/oauth/authorize", allow_redirects=False,
                           data={"login": login, "client_id": CLIENT_ID, "state": state,
                                 "redirect_uri": world.url + "/dashboard/callback"})
    assert answer.status_code == 302
    return answer.headers["Location"]


def sign_in(world, login: str, next_path: str = "/dashboard/") -> requests.Session:
    browser, state = start(world, next_path)
    answer = browser.get(approve(world, login, state), allow_redirects=False)
    assert answer.status_code == 302, answer.text
    assert answer.headers["Location"] == next_path
    return browser


def test_a_browser_that_is_not_signed_in_is_sent_to_sign_in(world):
    for path in ("/dashboard/", f"/dashboard/{READABLE}", f"/dashboard/{READABLE}/pull/14",
                 "/dashboard/queues", f"/dashboard/{HIDDEN}"):
        answer = requests.get(world.url + path, allow_redirects=False)
        assert answer.status_code == 302, path
        target = urlsplit(answer.headers["Location"])
        assert target.path == "/dashboard/login"
        assert parse_qs(target.query)["next"] == [path]


def test_sign_in_comes_back_to_the_page_asked_for_with_a_safe_cookie(world):
    browser, state = start(world, f"/dashboard/{READABLE}")
    answer = browser.get(approve(world, "alice", state), allow_redirects=False)
    assert answer.headers["Location"] == f"/dashboard/{READABLE}"
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/dashboard" in cookie
    assert "Secure" not in cookie  # http here; FASTCI_PUBLIC_URL=https://... makes it Secure
    assert CLIENT_SECRET not in cookie and "ghu_" not in cookie
    page = browser.get(world.url + f"/dashboard/{READABLE}")
    assert page.status_code == 200
    assert "GPU-hours per day" in page.text and "<svg" in page.text
    assert "tests/test_data.py::test_filter_threshold" in page.text  # the shadow run's escape
    assert "<script" not in page.text and "http://" not in page.text.split("<main>")[0]


def test_a_user_sees_only_the_repositories_github_says_they_can_read(world):
    alice = sign_in(world, "alice")
    index = alice.get(world.url + "/dashboard/").text
    assert READABLE in index and HIDDEN not in index
    mallory = sign_in(world, "mallory")
    index = mallory.get(world.url + "/dashboard/").text
    assert READABLE not in index and HIDDEN not in index
    assert "GitHub lists no repository" in index
    assert mallory.get(world.url + f"/dashboard/{READABLE}").status_code == 404
    # the owner reads both (GitHub lists an account's own repositories)
    octo = sign_in(world, "octo").get(world.url + "/dashboard/").text
    assert READABLE in octo and HIDDEN in octo


def test_an_unreadable_repository_is_answered_as_one_that_does_not_exist(world):
    alice = sign_in(world, "alice")
    hidden = alice.get(world.url + f"/dashboard/{HIDDEN}")
    missing = alice.get(world.url + "/dashboard/octo/no-such-repo")
    hidden_pull = alice.get(world.url + f"/dashboard/{HIDDEN}/pull/11")
    missing_pull = alice.get(world.url + "/dashboard/octo/no-such-repo/pull/11")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.text == missing.text == hidden_pull.text == missing_pull.text
    assert "secret" not in hidden.text


def test_a_forged_state_is_refused_with_the_reason(world):
    browser, state = start(world)
    callback = approve(world, "alice", "forged-" + state)
    answer = browser.get(callback, allow_redirects=False)
    assert answer.status_code == 400
    assert "forged" in answer.text
    # no state at all, and a callback with no sign-in started in this browser
    assert browser.get(world.url + "/dashboard/callback?code=x", allow_redirects=False
                       ).status_code == 400
    stranger = requests.get(approve(world, "alice", state), allow_redirects=False)
    assert stranger.status_code == 400 and "no sign-in was started" in stranger.text


def test_a_state_is_used_once(world):
    browser, state = start(world)
    callback = approve(world, "alice", state)
    assert browser.get(callback, allow_redirects=False).status_code == 302
    again = browser.get(callback, allow_redirects=False)
    assert again.status_code == 400 and "replayed" in again.text


def test_an_expired_state_is_refused_with_the_reason(world, monkeypatch):
    browser, state = start(world)
    monkeypatch.setattr(oauth, "STATE_TTL", -1)
    answer = browser.get(approve(world, "alice", state), allow_redirects=False)
    assert answer.status_code == 400 and "expired" in answer.text


def test_a_bad_code_is_refused_with_githubs_reason(world):
    browser, state = start(world)
    callback = approve(world, "alice", state)
    query = parse_qs(urlsplit(callback).query)
    answer = browser.get(f"{world.url}/dashboard/callback?code=not-a-code&state="
                         f"{query['state'][0]}", allow_redirects=False)
    assert answer.status_code == 400
    assert "incorrect or expired" in answer.text


def test_the_sign_in_goes_back_only_to_dashboard_pages(world):
    browser, state = start(world, "/dashboard/")
    browser.get(world.url + "/dashboard/login?next=https://evil.example/x",
                allow_redirects=False)
    login = browser.get(world.url + "/dashboard/login?next=//evil.example/x",
                        allow_redirects=False)
    state = parse_qs(urlsplit(login.headers["Location"]).query)["state"][0]
    answer = browser.get(approve(world, "alice", state), allow_redirects=False)
    assert answer.headers["Location"] == "/dashboard/"


def test_the_pull_request_page_shows_the_selection_shards_and_check_runs(world):
    alice = sign_in(world, "alice")
    page = alice.get(world.url + f"/dashboard/{READABLE}/pull/14").text
    assert "tests/test_rope.py::test_rotary_matches_reference[float32]" in page
    assert "executes changed block tinyllm/rope.py::apply_rotary" in page
    assert "tests/test_model.py::test_block_equivalence" in page  # pruned
    assert "gpu-1.runner-b" in page and "fastci-gpu-1" in page
    assert f"https://github.com/{READABLE}/runs/" in page


def test_signing_out_ends_the_session(world):
    alice = sign_in(world, "alice")
    assert alice.post(world.url + "/dashboard/logout").status_code == 200
    assert alice.get(world.url + "/dashboard/", allow_redirects=False).status_code == 302


def test_the_queues_page_hides_jobs_of_repositories_the_user_cannot_read(world):
    assert dashboard.shown(f"pull_request {READABLE}#3", [READABLE]) == \
        f"pull_request {READABLE}#3"
    assert dashboard.shown(f"pull_request {HIDDEN}#3", [READABLE]) == \
        "a job of another repository"
    assert dashboard.shown(f"record {HIDDEN}@abc", [READABLE]) == "a job of another repository"
    page = sign_in(world, "alice").get(world.url + "/dashboard/queues").text
    assert f"{world.prefix}-cpu" in page and f"{world.prefix}-gpu-0" in page


# -- the ledger and the pure views -------------------------------------------------------------

def test_the_ledger_keeps_a_pull_requests_run(redis):
    prefix = f"ledgertest{time.time_ns()}"
    ctx = SimpleNamespace(redis=redis, queues=SimpleNamespace(prefix=prefix), origins={},
                          requests={})
    work = SimpleNamespace(repo="Octo/Widgets", number=3, mode="select")
    selection = Selection(base="b" * 40, head="h" * 40, decisions=(
        Decision("t::a", True, ("executes changed block m.py::f",), 0.9, 2.0, 1),
        Decision("t::b", False, ("nothing it executed changed",), 0.0, 30.0)))
    run = SimpleNamespace(name="FastCI regressions", html_url="https://github.com/x/runs/1",
                          conclusion="success")
    try:
        ledger.record_pull_request(ctx, work, "h" * 40, selection, list(selection.selected),
                                   [TestResult("t::a", "passed", 1.5)], None, [run], False)
        [entry] = ledger.runs(redis, prefix, "octo/widgets")
        assert entry["selection"]["expected_seconds_saved"] == 30.0
        assert entry["selection"]["tests"][0]["reasons"] == ["executes changed block m.py::f"]
        assert entry["check_runs"][0]["url"] == "https://github.com/x/runs/1"
        assert dashboard.saved_seconds(entry) == 30.0
    finally:
        redis.delete(ledger.key(prefix, "octo/widgets"))


def test_time_to_first_failure_is_the_earliest_over_the_shards():
    results = {r.test_id: r for r in (TestResult("a", "passed", 10), TestResult("b", "failed", 5),
                                      TestResult("c", "failed", 2), TestResult("d", "passed", 1))}
    shards = [{"tests": ["a", "b"]}, {"tests": ["d", "c"]}]
    assert ledger.first_failure(shards, results) == 3.0
    assert ledger.first_failure([{"tests": ["a", "d"]}], results) is None


def test_charts_scale_to_round_numbers_and_say_when_empty():
    assert [charts.nice_max(v) for v in (0, 0.7, 3, 7.5, 180)] == [1, 1, 5, 10, 200]
    chart = charts.stacked_bars(["a", "b"], [("run", "#000", [1.0, 3.0]),
                                             ("saved", "#fff", [1.0, 0.0])], "x")
    assert [r.title for r in chart.rects] == ["a: 1 run", "a: 1 saved", "b: 3 run"]
    assert chart.rects[2].h == pytest.approx((chart.baseline - charts.TOP) * 3 / 5)
    assert charts.line(["a"], [None], "x").empty


def test_state_checks():
    assert oauth.check_state("abc", "abc", time.time()) is None
    assert "no OAuth state" in oauth.check_state(None, "abc", time.time())
    assert "forged" in oauth.check_state("abd", "abc", time.time())
    assert "expired" in oauth.check_state("abc", "abc", time.time() - oauth.STATE_TTL - 1)
