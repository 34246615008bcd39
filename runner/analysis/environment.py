"""The environment a run happened in, and the digest that keys evidence by it.

Evidence recorded under another Python, torch, triton, CUDA or GPU is not trusted: a test
that passed there proves nothing here. The digest is computed the same way inside a test
process and in a selecting process that never imports torch: versions come from package
metadata, CUDA from torch's version file, the GPU model from the driver.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import re
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from importlib import metadata
from pathlib import Path

# Files whose content decides which packages a test environment gets.
MANIFEST_NAMES = (
    "requirements.txt", "requirements-dev.txt", "requirements-test.txt", "constraints.txt",
    "pyproject.toml", "setup.py", "setup.cfg", "Pipfile", "Pipfile.lock", "poetry.lock",
    "uv.lock", "pdm.lock", "environment.yml", "environment.yaml", "conda-lock.yml",
)
MANIFEST_PATTERNS = ("requirements*.txt", "constraints*.txt", "*.lock")


def is_manifest(path: str) -> bool:
    """A dependency manifest anywhere in the tree (changing one selects every test)."""
    name = path.rsplit("/", 1)[-1]  # fnmatchcase: pathlib's match, 40x cheaper per path
    return name in MANIFEST_NAMES or any(fnmatchcase(name, p) for p in MANIFEST_PATTERNS)


@dataclass(frozen=True)
class Environment:
    python: str
    torch: str | None
    triton: str | None
    cuda: str | None
    gpu: str | None
    platform: str
    lock_hash: str | None = None  # hash of the dependency manifests at record time
    gpus: int | None = None  # GPUs the driver shows: the world size `--nproc_per_node=gpu` gets
    nccl: str | None = None  # the NCCL build torch's GPU ranks talk through

    @property
    def digest(self) -> str:
        """Identity of the runtime; the lock hash is compared separately (see selection).
        What decides the ranks a distributed test runs with (GPU count, NCCL) is covered;
        absent, it leaves the digest of evidence recorded before it was known unchanged."""
        runtime = {k: v for k, v in asdict(self).items()
                   if k != "lock_hash" and not (k in _RANKS and v is None)}
        return hashlib.sha256(json.dumps(runtime, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Environment":
        return cls(**json.loads(text))

    def describe(self) -> str:
        parts = [f"python {self.python}", f"torch {self.torch or '-'}",
                 f"triton {self.triton or '-'}", f"cuda {self.cuda or '-'}"]
        if self.gpu:
            parts.append(f"{self.gpus} x {self.gpu}" if self.gpus and self.gpus > 1 else self.gpu)
        if self.nccl:
            parts.append(f"nccl {self.nccl}")
        return ", ".join(parts)


_RANKS = ("gpus", "nccl")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _torch_cuda() -> str | None:
    """CUDA version torch was built with, read from torch/version.py without importing
    torch (the import costs a second, and selection must answer in well under one)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else None


def _gpu_model() -> str | None:
    """The first GPU's model from the NVIDIA driver's proc files (no CUDA initialisation)."""
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def _gpu_count() -> int | None:
    return len(list(Path("/proc/driver/nvidia/gpus").glob("*/information"))) or None


def _nccl() -> str | None:
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        version = _version(dist)
        if version:
            return version
    return None


def lock_hash(files: dict[str, bytes]) -> str | None:
    """Hash of the manifest files' contents, by path; None when the tree has none."""
    manifests = sorted((p, c) for p, c in files.items() if is_manifest(p))
    if not manifests:
        return None
    h = hashlib.sha256()
    for path, content in manifests:
        h.update(path.encode() + b"\0" + content + b"\0")
    return h.hexdigest()[:16]


def current(lock: str | None = None) -> Environment:
    """This process's environment, the same whether torch is loaded or not."""
    return Environment(
        python=platform.python_version(), torch=_version("torch"), triton=_version("triton"),
        cuda=_torch_cuda(), gpu=_gpu_model(),
        platform=f"{platform.system()}-{platform.machine()}", lock_hash=lock,
        gpus=_gpu_count(), nccl=_nccl())
