"""[tool.fastci] settings and their FASTCI_* overrides."""

from __future__ import annotations

import re

import pytest

from fastci.runner.config import ConfigError, Settings, load


def write(tmp_path, text):
    (tmp_path / "pyproject.toml").write_text(text)
    return tmp_path


def test_defaults_without_a_pyproject(tmp_path):
    assert load(tmp_path, environ={}) == Settings()


def test_values_from_pyproject_and_environment(tmp_path):
    root = write(tmp_path, '[tool.fastci]\nblocking = ["correctness", "perf"]\n'
                           'failure_half_life = 4\n')
    settings = load(root, environ={"FASTCI_STORE": "/tmp/x.db"})
    assert settings.blocking == ("correctness", "perf")
    assert settings.failure_half_life == 4.0 and settings.store == "/tmp/x.db"
    assert settings.is_blocking("perf") and not settings.is_blocking("convergence")
    assert load(root, environ={"FASTCI_BLOCKING": "a, b"}).blocking == ("a", "b")


def test_dimension_comes_from_the_first_dimension_marker(tmp_path):
    settings = load(tmp_path, environ={})
    assert settings.dimension_of(["parametrize", "perf"]) == "perf"
    assert settings.dimension_of(["slow"]) == "correctness"


@pytest.mark.parametrize("text, message", [
    ("[tool.fastci]\nblockng = []\n", "unknown [tool.fastci] key(s): blockng"),
    ("[tool.fastci]\nblocking = 3\n", "blocking must be a list"),
    ("[tool.fastci]\nfailure_half_life = 'soon'\n", "failure_half_life must be a number"),
    ("[tool.fastci]\nstore = 1\n", "store must be a string"),
    ("[tool.fastci\n", "not valid TOML"),
    ("[tool.fastci]\ncapture_children = 'sometimes'\n", "capture_children must be 'on' or 'off'"),
])
def test_bad_settings_name_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(write(tmp_path, text), environ={})


def test_the_recorder_setting_picks_the_line_recorder(tmp_path):
    import sys

    from fastci.runner.record.lines import choose

    assert load(tmp_path).recorder == "auto"
    assert load(tmp_path, {"FASTCI_RECORDER": "coverage"}).recorder == "coverage"
    with pytest.raises(ConfigError, match="recorder must be one of"):
        load(tmp_path, {"FASTCI_RECORDER": "settrace"})
    assert choose("coverage") == ("coverage", "forced by the recorder setting")
    if sys.version_info < (3, 12):  # no sys.monitoring: coverage, whatever was asked
        assert choose("auto") == ("coverage", "sys.monitoring needs Python 3.12+")
        assert choose("sysmon")[0] == "coverage"
    else:
        assert choose("auto")[0] == choose("sysmon")[0] == "sysmon"
