"""Definitions whose effect reaches a test by no name it reads: a new function a decorator
registers under a key another held, a new subclass a base's `__init_subclass__` registers, a
subclass of a changed dataclass or mixin, a logger an import-time call configures, a
skipped test whose skip condition flips, and a pytest configuration file FastCI did not
know. An attacker review found each of these skipped while its test failed; each change
here fails its test, and FastCI must select it (and still skip a test that ran none of it).
"""

from __future__ import annotations

import pytest
from soundness_world import PACKAGE, REGISTRY, assert_selects, failing, recorded_once

DEFINITIONS = {
    **PACKAGE,
    "pk/registry.py": REGISTRY + '''

    def build_optimizer(name, lr):
        return OPTIMIZERS[name](lr)
''',
    "pk/optims.py": '''
        from pk.registry import register


        @register("sgd")
        def sgd(lr):
            return {"kind": "sgd", "lr": lr}
    ''',
    "pk/models.py": '''
        MODELS = {}


        class Model:
            arch = None

            def __init_subclass__(cls, **kwargs):
                super().__init_subclass__(**kwargs)
                MODELS[cls.arch] = cls

            def __init__(self, dim):
                self.dim = dim


        class GPT(Model):
            arch = "gpt"

            def num_params(self):
                return 12 * self.dim * self.dim


        def build_model(arch, dim):
            return MODELS[arch](dim)
    ''',
    "pk/config.py": '''
        from dataclasses import asdict, dataclass


        @dataclass
        class BaseConfig:
            dim: int = 64
            dropout: float = 0.0


        @dataclass
        class LlamaConfig(BaseConfig):
            rope_theta: float = 10000.0


        def to_dict(cfg):
            return asdict(cfg)
    ''',
    "pk/mixins.py": '''
        class SizeMixin:
            def size(self):
                return 20
    ''',
    "pk/model.py": '''
        import torch

        from pk.mixins import SizeMixin


        class TinyLM(SizeMixin, torch.nn.Module):
            pass
    ''',
    "pk/log.py": '''
        import logging


        def get_logger(name, level=None):
            log = logging.getLogger(name)
            log.setLevel(level or "INFO")
            return log
    ''',
    "pk/__init__.py": '''
        from pk.log import get_logger

        _root_logger = get_logger("pk")
    ''',
    "pk/train.py": '''
        import logging

        logger = logging.getLogger(__name__)


        def step(i):
            logger.info("step %d done", i)
            return i + 1
    ''',
    "pk/features.py": "FUSED_ADAMW = False\n",
    "tests/test_optim.py": '''
        import pk.optims  # noqa: F401 (registers them)
        from pk.registry import build_optimizer


        def test_sgd():
            assert build_optimizer("sgd", 0.1) == {"kind": "sgd", "lr": 0.1}
    ''',
    "tests/test_models.py": '''
        from pk.models import build_model


        def test_gpt_params():
            assert build_model("gpt", 4).num_params() == 192
    ''',
    "tests/test_config.py": '''
        from pk.config import LlamaConfig, to_dict


        def test_llama_defaults_serialize():
            assert to_dict(LlamaConfig()) == {"dim": 64, "dropout": 0.0, "rope_theta": 10000.0}
    ''',
    "tests/test_model.py": '''
        from pk.model import TinyLM


        def test_eval_switches_off_training():
            assert TinyLM().eval().training is False
    ''',
    "tests/test_train.py": '''
        from pk.train import step


        def test_step_logs_progress(caplog):
            assert step(1) == 2
            assert "step 1 done" in caplog.text
    ''',
    "tests/test_fused.py": '''
        import pytest

        from pk.features import FUSED_ADAMW


        @pytest.mark.skipif(not FUSED_ADAMW, reason="fused path disabled")
        def test_fused_step():
            assert 1 - 0.1 * 0.5 * 2 == pytest.approx(0.95)
    ''',
    "tests/test_other.py": '''
        def test_other():
            assert 1 + 1 == 2
    ''',
}

recorded, repo = recorded_once("definitions", DEFINITIONS)

SGD_NESTEROV = '''

@register("sgd")
def sgd_nesterov(lr):
    return {"kind": "sgd", "lr": lr, "nesterov": True}
'''
GPT_TIED = '''

class GPTTied(GPT):
    def __init__(self, dim):
        super().__init__(dim // 2)


def build_model'''
TRAIN = '''
    def train(self, steps=1):
        return self

    def size(self):'''


@pytest.mark.parametrize("path, old, new, victim, why", [
    # A copy-paste slip: a new optimizer registers under sgd's key.
    ("pk/optims.py", '"lr": lr}\n', '"lr": lr}\n' + SGD_NESTEROV, "tests/test_optim.py::test_sgd",
     "sgd_nesterov was added, with a decorator that may register it"),
    # A new subclass inherits `arch = "gpt"`, and the base's __init_subclass__ puts it first.
    ("pk/models.py", "\n\ndef build_model", GPT_TIED, "tests/test_models.py::test_gpt_params",
     "a base's __init_subclass__ may register it"),
    # The base's field default: the test names only the subclass.
    ("pk/config.py", "dropout: float = 0.0", "dropout: float = 0.1",
     "tests/test_config.py::test_llama_defaults_serialize", "reads LlamaConfig"),
    # A mixin ahead of another base gains a method that shadows the base's: torch's
    # `Module.eval` calls `self.train(False)`.
    ("pk/mixins.py", "\n    def size(self):", TRAIN,
     "tests/test_model.py::test_eval_switches_off_training", "reads TinyLM"),
    # An import-time call's function sets a shared logger's level.
    ("pk/log.py", 'level or "INFO"', 'level or "WARNING"',
     "tests/test_train.py::test_step_logs_progress", None),
    # The skip condition flips: the skipped test runs, and fails.
    ("pk/features.py", "FUSED_ADAMW = False", "FUSED_ADAMW = True",
     "tests/test_fused.py::test_fused_step", "it was skipped in the last run"),
])
def test_a_definition_reached_by_no_name_selects_its_test(repo, path, old, new, victim, why):
    repo.edit(path, old, new)
    assert_selects(repo, victim, "tests/test_other.py::test_other", why)


@pytest.mark.parametrize("name", ["pytest.toml", ".pytest.toml"])
def test_pytest_9_configuration_files_select_everything(repo, name):
    victim = "tests/test_train.py::test_step_logs_progress"
    repo.write({name: '[pytest]\nlog_level = "WARNING"\n'})
    try:
        assert victim in failing(repo, victim)
        decision = repo.decisions()[victim]
        assert f"pytest configuration {name} added" in decision["reasons"], decision
    finally:
        (repo.root / name).unlink()
