"""Shared fixtures for the tinyllm suite.

On machines without CUDA the Triton kernels run in the Triton interpreter,
which must be switched on before triton is first imported; hence the
environment is set here, before any tinyllm import.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Required by torch.use_deterministic_algorithms for cuBLAS on CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tinyllm.config import load_config  # noqa: E402
from tinyllm.data.pipeline import build_dataset, build_tokenizer, load_documents, load_domain_terms  # noqa: E402
from tinyllm.train.trainer import seed_everything  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
DATA_DIR = ROOT / "data"
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
TEST_SEED = 0

# The models are tiny: thread-pool overhead outweighs any parallel speed-up,
# and a fixed thread count keeps CPU reduction order identical run to run.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _deterministic():
    """Every test starts from the same RNG state, whatever ran before it."""
    seed_everything(TEST_SEED)
    torch.use_deterministic_algorithms(True)
    yield


@pytest.fixture(scope="session")
def config_dir() -> Path:
    return CONFIG_DIR


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN_DIR


@pytest.fixture
def load_golden(golden_dir):
    def _load(name: str) -> dict:
        return json.loads((golden_dir / f"{name}.json").read_text())

    return _load


@pytest.fixture
def tiny_config():
    """A fresh Config per test, so tests may modify it."""
    return load_config(CONFIG_DIR / "tiny.yaml")


@pytest.fixture(scope="session")
def corpus_documents() -> list[str]:
    return load_documents(DATA_DIR / "corpus.txt")


@pytest.fixture(scope="session")
def domain_terms() -> list[str]:
    return load_domain_terms(DATA_DIR / "domain_terms.txt")


@pytest.fixture(scope="session")
def tokenizer():
    """The tokenizer every bundled config trains (they share data and vocab size)."""
    cfg = load_config(CONFIG_DIR / "tiny.yaml")
    return build_tokenizer(cfg.data, cfg.model.vocab_size)


@pytest.fixture(scope="session")
def tiny_dataset(tokenizer):
    cfg = load_config(CONFIG_DIR / "tiny.yaml")
    return build_dataset(cfg.data, tokenizer)


DIMENSIONS = ("correctness", "convergence", "perf")


def pytest_collection_modifyitems(config, items):
    """Every test belongs to exactly one dimension, so CI can select by -m."""
    for item in items:
        dims = {mark.name for mark in item.iter_markers() if mark.name in DIMENSIONS}
        if len(dims) != 1:
            raise pytest.UsageError(f"{item.nodeid} must carry exactly one of {DIMENSIONS}, has {sorted(dims)}")
