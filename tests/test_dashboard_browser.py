"""The dashboard in a real browser: Debian's chromium, driven by Selenium through its
chromedriver, both named explicitly (nothing is downloaded at run time). It signs in through
the fake GitHub's authorize page, checks that a user who reads nothing sees nothing, and takes
a full-page screenshot of each page into the test's tmp_path and into tests/output/dashboard/
(git-ignored; the folder is printed), where a person can look at them.

Without chromium, chromedriver or selenium these tests skip with one line; .ci/run installs
chromium and chromium-driver. FASTCI_CHROMIUM and FASTCI_CHROMEDRIVER point elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import redis_url
from dashboard_world import HIDDEN, READABLE, World

CHROMIUM = os.environ.get("FASTCI_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser")
DRIVER = os.environ.get("FASTCI_CHROMEDRIVER") or shutil.which("chromedriver")
OUTPUT = Path(__file__).resolve().parent / "output" / "dashboard"

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None

if webdriver is None or not CHROMIUM or not DRIVER:
    pytest.skip("no browser: the dashboard's browser tests need selenium, chromium and "
                "chromedriver (apt-get install chromium chromium-driver)",
                allow_module_level=True)


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900", "--hide-scrollbars",
                     "--force-device-scale-factor=1", "--no-first-run"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def world():
    with World(redis_url()) as w:
        w.seed()
        yield w


def screenshot(driver, tmp_path: Path, name: str) -> Path:
    """The whole page, saved under tmp_path and tests/output/dashboard/."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(700, min(int(height) + 40, 6000)))
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path)), name
    OUTPUT.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, OUTPUT / path.name)
    driver.set_window_size(1280, 900)
    return path


def sign_in(driver, world, login: str, tmp_path: Path | None = None) -> None:
    driver.get(world.url + "/dashboard/")
    assert driver.current_url.startswith(world.github.url + "/login/oauth/authorize")
    if tmp_path is not None:
        screenshot(driver, tmp_path, "0-github-sign-in")
    driver.find_element(By.ID, "login").send_keys(login)
    driver.find_element(By.ID, "authorize").click()
    arrives(driver, world.url + "/dashboard/")


def shows(driver, text: str) -> str:
    """The page's text once it holds `text` (after a click's navigation), or as it is."""
    try:
        WebDriverWait(driver, 30).until(
            lambda d: text in d.find_element(By.TAG_NAME, "body").text)
    except Exception:  # noqa: BLE001 - the caller's assertion says what is there
        pass
    return driver.find_element(By.TAG_NAME, "body").text


def arrives(driver, url: str) -> None:
    """A click starts a navigation and returns: wait (a loaded machine is slow) until the
    browser is at `url`, and fail with where it is instead."""
    try:
        WebDriverWait(driver, 30).until(lambda d: d.current_url == url)
    except Exception:  # noqa: BLE001 - the assertion below says where the browser is
        pass
    assert driver.current_url == url


def test_a_signed_in_user_sees_their_repositories_pull_requests_and_queues(
        browser, world, tmp_path):
    sign_in(browser, world, "alice", tmp_path)
    body = browser.find_element(By.TAG_NAME, "body").text
    assert READABLE in body and HIDDEN not in body
    screenshot(browser, tmp_path, "1-repositories")

    browser.find_element(By.LINK_TEXT, READABLE).click()
    arrives(browser, f"{world.url}/dashboard/{READABLE}")
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) == 3
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart rect")  # the per-day bars
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "tests/test_data.py::test_filter_threshold" in body  # the escape
    assert "tests/test_attention.py::test_sparse_mask" in body  # the flaky test
    screenshot(browser, tmp_path, "2-repository")

    browser.find_element(By.LINK_TEXT, "#14").click()
    body = shows(browser, "Pull request #14")
    assert "Pull request #14" in body and "gpu-1.runner-b" in body
    assert browser.find_element(By.LINK_TEXT, "FastCI regressions").get_attribute("href") \
        .startswith(f"https://github.com/{READABLE}/runs/")
    screenshot(browser, tmp_path, "3-pull-request")

    browser.find_element(By.LINK_TEXT, "Queues & workers").click()
    assert f"{world.prefix}-gpu-0" in shows(browser, f"{world.prefix}-gpu-0")
    screenshot(browser, tmp_path, "4-queues-and-workers")

    browser.get(f"{world.url}/dashboard/{HIDDEN}")
    assert "Not found" in browser.find_element(By.TAG_NAME, "h1").text
    print(f"\nscreenshots: {tmp_path} and {OUTPUT}")


def test_a_user_who_reads_nothing_sees_nothing(browser, world, tmp_path):
    sign_in(browser, world, "mallory")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert READABLE not in body and HIDDEN not in body
    assert "GitHub lists no repository" in body
    screenshot(browser, tmp_path, "5-unauthorised-repositories")
    browser.get(f"{world.url}/dashboard/{READABLE}")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Not found" in body and "test_rope" not in body
    screenshot(browser, tmp_path, "6-unauthorised-repository")


def test_a_forged_state_shows_the_reason(browser, world, tmp_path):
    browser.get(world.url + "/dashboard/")
    state = browser.current_url.split("state=")[1]
    browser.get(f"{world.url}/dashboard/callback?code=x&state=forged{state}")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Sign-in refused" in body and "forged" in body
    screenshot(browser, tmp_path, "7-forged-state")
