"""Pruning what a session fixture computed: its calls of repository functions are captured
once, at its set-up, and count for every test that uses it. Each rule is checked against the
change that makes a test fail.

One small project is recorded once; each test works on its own copy of the repository.
"""

from __future__ import annotations

import pytest
from conftest import Project

PROJECT = {
    "lib/__init__.py": "",
    "lib/config.py": '''
        from dataclasses import dataclass


        @dataclass
        class Config:
            width: int
            depth: int = 2


        def validate(cfg):
            if cfg.width <= 0:
                raise ValueError("width must be positive")
            return cfg


        def load_config(text):
            fields = dict(part.split("=") for part in text.split(","))
            return validate(Config(**{k: int(v) for k, v in fields.items()}))
    ''',
    "tests/conftest.py": '''
        import pytest
        import torch  # noqa: F401 (a suite that uses torch: its calls are captured)

        from lib.config import load_config


        @pytest.fixture(scope="session")
        def config():
            return load_config("width=4")
    ''',
    "tests/test_model.py": '''
        def test_width(config):
            assert config.width == 4


        def test_depth(config):
            assert config.depth == 2
    ''',
}
WIDTH = "tests/test_model.py::test_width"
DEPTH = "tests/test_model.py::test_depth"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return Project.recorded_once(tmp_path_factory.mktemp("base") / "repo", PROJECT, passed=2)


@pytest.fixture
def project(recorded, tmp_path) -> Project:
    return Project.copied(recorded, tmp_path / "repo")


def test_what_a_session_fixture_ran_selects_every_test_that_used_it(project):
    project.edit("lib/config.py", "if cfg.width <= 0:", "if cfg.width <= 4:")
    assert project.fails(WIDTH) and project.fails(DEPTH)
    tests = project.decisions("--no-prune")
    for test_id in (WIDTH, DEPTH):
        assert tests[test_id]["decision"] == "selected"
        assert "lib/config.py::validate" in tests[test_id]["reasons"][0]


def test_an_equivalent_change_to_a_session_fixture_s_call_is_pruned(project):
    project.edit("lib/config.py", "if cfg.width <= 0:", "if not cfg.width > 0:")
    tests = project.decisions()
    for test_id in (WIDTH, DEPTH):
        assert tests[test_id]["decision"] == "skipped", tests[test_id]
        assert "load_config" in tests[test_id]["reasons"][0]


def test_a_session_fixture_s_call_that_returns_otherwise_keeps_its_tests(project):
    project.edit("lib/config.py", "    return cfg", "    return Config(cfg.width, cfg.depth + 1)")
    assert project.fails(DEPTH)
    tests = project.decisions()
    for test_id in (WIDTH, DEPTH):  # test_width passes, but what it was given differs
        assert tests[test_id]["decision"] == "selected", tests[test_id]
        assert "load_config under the new code differs" in tests[test_id]["not_pruned"]
